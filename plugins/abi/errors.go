package abi

// ErrorClass classifies why an effect failed. It is the one list of error
// classes in agenthost: the host, the runtime, the store and the API all
// use these values.
type ErrorClass string

// Error classes (docs/DESIGN.md §7).
const (
	ClassPluginTrap          ErrorClass = "plugin_trap"
	ClassPluginTimeout       ErrorClass = "plugin_timeout"
	ClassPluginOOM           ErrorClass = "plugin_oom"
	ClassPluginOutputTooBig  ErrorClass = "plugin_output_too_large"
	ClassPluginProtocol      ErrorClass = "plugin_protocol"
	ClassPluginDenied        ErrorClass = "plugin_denied"
	ClassPluginFailed        ErrorClass = "plugin_failed"
	ClassLost                ErrorClass = "lost"
	ClassCancelled           ErrorClass = "cancelled"
	ClassExecutorUnavailable ErrorClass = "executor_unavailable"
	ClassLimitExceeded       ErrorClass = "limit_exceeded"
	ClassDeadlineExceeded    ErrorClass = "deadline_exceeded"
	ClassApprovalDenied      ErrorClass = "approval_denied"
	// ClassInvalidArguments: the model called a tool with arguments that
	// fail the tool's input_schema; the call settled at once as a tool
	// error the model sees, and the plugin was never called.
	ClassInvalidArguments ErrorClass = "invalid_arguments"
)

// ErrorClasses lists every class, in the order of docs/DESIGN.md §7.
var ErrorClasses = []ErrorClass{
	ClassPluginTrap, ClassPluginTimeout, ClassPluginOOM, ClassPluginOutputTooBig,
	ClassPluginProtocol, ClassPluginDenied, ClassPluginFailed, ClassLost,
	ClassCancelled, ClassExecutorUnavailable, ClassLimitExceeded,
	ClassDeadlineExceeded, ClassApprovalDenied, ClassInvalidArguments,
}

// Valid reports whether c is one of ErrorClasses.
func (c ErrorClass) Valid() bool {
	for _, k := range ErrorClasses {
		if c == k {
			return true
		}
	}
	return false
}

// Retriable reports whether a failure of class c may be dispatched again
// under a retry policy by default: faults of one instance or one attempt
// (a trap, a timeout, running out of memory, a lost effect, an executor
// that could not be reached) are retriable; a plugin's own verdict, a
// refusal, a protocol violation or a limit is not.
func (c ErrorClass) Retriable() bool {
	switch c {
	case ClassPluginTrap, ClassPluginTimeout, ClassPluginOOM, ClassLost, ClassExecutorUnavailable:
		return true
	}
	return false
}

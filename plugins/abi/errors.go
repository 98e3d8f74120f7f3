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
	// ClassRateLimited: the provider behind the plugin refused the call
	// for now (HTTP 429, or a quota that resets): the plugin answered
	// failed with error.class "rate_limited", and, when the provider
	// said, error.retry_after_ms. The call did not happen, so it is
	// retriable, and the Loop counts it against the policy's
	// max_rate_limited_attempts rather than max_attempts.
	ClassRateLimited ErrorClass = "rate_limited"
)

// ErrorClasses lists every class, in the order of docs/DESIGN.md §7.
var ErrorClasses = []ErrorClass{
	ClassPluginTrap, ClassPluginTimeout, ClassPluginOOM, ClassPluginOutputTooBig,
	ClassPluginProtocol, ClassPluginDenied, ClassPluginFailed, ClassRateLimited, ClassLost,
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
// that could not be reached) and a provider's "not now" (rate_limited)
// are retriable; a plugin's own verdict, a refusal, a protocol violation
// or a limit is not.
func (c ErrorClass) Retriable() bool {
	switch c {
	case ClassPluginTrap, ClassPluginTimeout, ClassPluginOOM, ClassRateLimited, ClassLost, ClassExecutorUnavailable:
		return true
	}
	return false
}

// PluginClasses lists the classes a plugin may name in a failed reply's
// error.class. Every other class is the host's to give.
var PluginClasses = []ErrorClass{ClassPluginFailed, ClassRateLimited}

// HostClass is the class a host settles a failed reply with: the class
// the error names when it is one of PluginClasses, and plugin_failed
// otherwise (no class, or one this host does not take from a plugin, such
// as a class a later host adds: the reply still settles, as the plain
// failure it is to an older host).
func (e *ReplyError) HostClass() ErrorClass {
	if e != nil && e.Class == ClassRateLimited {
		return ClassRateLimited
	}
	return ClassPluginFailed
}

// HostRetriable reports whether a host may retry the failure: the
// error's retriable, or its class being rate_limited, which is
// retriable whatever retriable says (the provider did not do the work).
func (e *ReplyError) HostRetriable() bool {
	return e != nil && (e.Retriable || e.HostClass() == ClassRateLimited)
}

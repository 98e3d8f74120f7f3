package loop

import "errors"

// Errors returned by Apply. Each is wrapped with context; check them with
// errors.Is.
var (
	// ErrTerminal: the Run has ended; it accepts no more events.
	ErrTerminal = errors.New("loop: run is terminal")
	// ErrStaleAttempt: the event names an attempt that is not the effect's
	// current one. The outcome must be dropped and logged.
	ErrStaleAttempt = errors.New("loop: stale attempt")
	// ErrAlreadySettled: the effect attempt was settled before. The first
	// settlement won; this one changes nothing.
	ErrAlreadySettled = errors.New("loop: effect already settled")
	// ErrUnknownEffect: no effect of this Run has that ID.
	ErrUnknownEffect = errors.New("loop: unknown effect")
	// ErrUnknownToolCall: no tool call of the current step has that ID.
	ErrUnknownToolCall = errors.New("loop: unknown tool call")
	// ErrNotAwaiting: the Run is not waiting for this input or approval.
	ErrNotAwaiting = errors.New("loop: run is not waiting for that")
	// ErrLimit: the event would break one of the Run's limits.
	ErrLimit = errors.New("loop: limit exceeded")
	// ErrInvalidEvent: the event is malformed, or not legal in the Run's
	// current state.
	ErrInvalidEvent = errors.New("loop: invalid event")
	// ErrInvalidID: an ID does not match [A-Za-z0-9_-]{1,64}.
	ErrInvalidID = errors.New("loop: invalid id")
	// ErrNoChange: the event is legal but changes nothing (a timer with
	// nothing due, a repeated cancel). The caller need not commit it.
	ErrNoChange = errors.New("loop: event changes nothing")
)

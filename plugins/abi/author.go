package abi

import (
	"encoding/json"
	"fmt"
)

// Helpers for plugin authors writing in Go. Each builds a reply that
// ValidateEffectReply or ValidateCancelReply accepts, given valid
// arguments; write it with Extism's output as JSON.

// Done returns a done reply carrying outcome, encoded as JSON: a
// ModelOutcome for a model effect, a ToolOutcome for a tool effect. If
// outcome cannot be encoded (a json.RawMessage that is not JSON, say), Done
// returns a failed reply, not retriable, that says why: a plugin never
// writes a reply the host cannot read.
func Done(outcome any) EffectReply {
	raw, err := json.Marshal(outcome)
	if err != nil {
		return Failed(fmt.Sprintf("abi: cannot encode the outcome: %v", err), false)
	}
	return EffectReply{State: StateDone, Outcome: raw}
}

// DoneTool returns a done reply for a tool effect, with the tool's result.
// isError marks a result the model should read as the tool's error.
func DoneTool(content string, isError bool) EffectReply {
	return Done(ToolOutcome{Content: content, IsError: isError})
}

// DoneModel returns a done reply for a model effect.
func DoneModel(m ModelOutcome) EffectReply { return Done(m) }

// Failed returns a failed reply. message must not be blank. retriable lets
// the missing-effect policy dispatch the effect again.
func Failed(message string, retriable bool) EffectReply {
	return EffectReply{State: StateFailed, Error: &ReplyError{Message: message, Retriable: retriable}}
}

// RateLimited returns the failed reply of an attempt that the provider
// behind the plugin refused for now (HTTP 429, a quota that resets):
// error.class "rate_limited", retriable, and retryAfterMS, the wait the
// provider asked for in milliseconds (0 when it did not say; a negative
// value is sent as 0). message must not be blank.
func RateLimited(message string, retryAfterMS int64) EffectReply {
	return EffectReply{State: StateFailed, Error: &ReplyError{Message: message, Retriable: true,
		Class: ClassRateLimited, RetryAfterMS: max(retryAfterMS, 0)}}
}

// Pending returns a pending reply: the host calls poll again after
// pollAfterMS milliseconds (0 lets the host choose), passing handle back.
// handle may be empty; the plugin must find its record by (effect.id,
// attempt) in any case.
func Pending(handle string, pollAfterMS int64) EffectReply {
	return EffectReply{State: StatePending, Handle: handle, PollAfterMS: pollAfterMS}
}

// Unknown returns the reply of poll or attach for an effect attempt the
// plugin holds no record of. The host then applies the missing-effect
// policy. start must never answer it.
func Unknown() EffectReply { return EffectReply{State: StateUnknown} }

// Cancelled returns the cancel reply for an attempt the plugin stopped, or
// never started.
func Cancelled() CancelReply { return CancelReply{State: StateCancelled} }

// CancelDone returns the cancel reply for an attempt that finished before
// it could be stopped: the effect settles with outcome. It fails only when
// outcome cannot be encoded as JSON.
func CancelDone(outcome any) (CancelReply, error) {
	raw, err := json.Marshal(outcome)
	if err != nil {
		return CancelReply{}, fmt.Errorf("abi: cannot encode the outcome: %w", err)
	}
	return CancelReply{State: StateDone, Outcome: raw}, nil
}

// ToolArguments decodes effect.request.arguments of a tool effect into v.
// Missing or null arguments decode as {}: a model may leave them out for a
// tool that takes none.
func (e Effect) ToolArguments(v any) error {
	var req ToolRequest
	if !absent(e.Request) {
		if err := json.Unmarshal(e.Request, &req); err != nil {
			return fmt.Errorf("abi: effect %s: request is not {\"arguments\": {…}}: %w", e.ID, err)
		}
	}
	args := req.Arguments
	if absent(args) {
		args = json.RawMessage("{}")
	}
	if err := json.Unmarshal(args, v); err != nil {
		return fmt.Errorf("abi: effect %s: arguments: %w", e.ID, err)
	}
	return nil
}

// ModelRequest decodes effect.request of a model effect: the builder's
// request.
func (e Effect) ModelRequest() (ModelRequest, error) {
	var req ModelRequest
	if err := json.Unmarshal(e.Request, &req); err != nil {
		return ModelRequest{}, fmt.Errorf("abi: effect %s: request is not a model request: %w", e.ID, err)
	}
	return req, nil
}

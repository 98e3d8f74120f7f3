package loop

import (
	"encoding/json"

	"github.com/agenthost/agenthost/plugins/abi"
)

// EventType names an event.
type EventType string

// Event types.
const (
	EventRunCreated       EventType = "run_created"
	EventRunStarted       EventType = "run_started"
	EventModelStepPlanned EventType = "model_step_planned"
	EventEffectDispatched EventType = "effect_dispatched"
	EventEffectPending    EventType = "effect_pending"
	EventEffectSettled    EventType = "effect_settled"
	// EventEffectDeferred records that recovery first found the executor
	// of an executing attempt unavailable and deferred it (at At), so that
	// max_defer counts from then across restarts.
	EventEffectDeferred   EventType = "effect_deferred"
	EventApprovalRecorded EventType = "approval_recorded"
	EventInputProvided    EventType = "input_provided"
	EventCancelRequested  EventType = "cancel_requested"
	EventTimerFired       EventType = "timer_fired"
	// EventStepFailed: the builder could not plan the next model step
	// (Failure says why); the Run ends failed.
	EventStepFailed   EventType = "step_failed"
	EventRunCompleted EventType = "run_completed"
	EventRunFailed    EventType = "run_failed"
	EventRunCancelled EventType = "run_cancelled"
)

// Event is one fact about a Run. Only the fields of its Type are set. Every
// event carries the time it was made (At, Unix milliseconds), as data: the
// Loop reads no clock.
type Event struct {
	Type EventType `json:"type"`
	At   int64     `json:"at"`
	// Seq is the event's position in the Run's log (1-based). Apply sets it
	// on the events it accepts; the store keeps it.
	Seq int64 `json:"seq,omitempty"`

	Spec      *Spec                  `json:"spec,omitempty"`      // RunCreated
	Step      int                    `json:"step,omitempty"`      // ModelStepPlanned
	Request   json.RawMessage        `json:"request,omitempty"`   // ModelStepPlanned: the builder's request, stored once
	EffectID  string                 `json:"effect,omitempty"`    // Effect*
	Attempt   int                    `json:"attempt,omitempty"`   // Effect*
	Epoch     uint64                 `json:"epoch,omitempty"`     // EffectDispatched: the owner's epoch
	Plugin    *PluginRef             `json:"plugin,omitempty"`    // EffectDispatched: the plugin version that carries the attempt out; EffectPending, EffectSettled: the version that took it over, when another
	Handle    string                 `json:"handle,omitempty"`    // EffectPending
	Outcome   *Outcome               `json:"outcome,omitempty"`   // EffectSettled
	Approvals []abi.ApprovalDecision `json:"approvals,omitempty"` // ApprovalRecorded
	Input     string                 `json:"input,omitempty"`     // InputProvided
	Reason    string                 `json:"reason,omitempty"`    // CancelRequested
	Result    string                 `json:"result,omitempty"`    // RunCompleted
	Failure   *Failure               `json:"failure,omitempty"`   // StepFailed, RunFailed, RunCancelled
}

// PluginRef names the plugin version an effect attempt was dispatched to:
// its ID in the config, the version its describe declares, and the
// sha256 of its file. An effect_dispatched event carries it when the
// executor is a plugin (not an MCP server's tool nor an agent's); logs
// written before it have none.
type PluginRef struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
}

// RunCreated makes the event that creates a Run.
func RunCreated(spec Spec, at int64) Event {
	return Event{Type: EventRunCreated, At: at, Spec: &spec}
}

// Settled makes the event that settles one effect attempt.
func Settled(effectID string, attempt int, o Outcome, at int64) Event {
	return Event{Type: EventEffectSettled, At: at, EffectID: effectID, Attempt: attempt, Outcome: &o}
}

// Terminal reports whether the event ends a Run.
func (e Event) Terminal() bool {
	return e.Type == EventRunCompleted || e.Type == EventRunFailed || e.Type == EventRunCancelled
}

package loop

import "github.com/agenthost/agenthost/plugins/abi"

// ActionType names an action.
type ActionType string

// Actions that Decide returns.
const (
	// ActionStart: the Run is pending; start it (commit RunStarted) once it
	// is at the head of its session's queue.
	ActionStart ActionType = "start"
	// ActionPlanModelStep: call the builder and commit ModelStepPlanned for
	// Step.
	ActionPlanModelStep ActionType = "plan_model_step"
	// ActionDispatch: commit EffectDispatched(EffectID, Attempt), then call
	// the executor's start.
	ActionDispatch ActionType = "dispatch"
	// ActionCancelEffect: call the executor's cancel for the executing
	// attempt of EffectID and settle it with the reply.
	ActionCancelEffect ActionType = "cancel_effect"
	// ActionAwaitApproval: the tool calls ToolCallIDs wait for a person.
	ActionAwaitApproval ActionType = "await_approval"
	// ActionAwaitInput: the Run waits for the user's answer to Prompt.
	ActionAwaitInput ActionType = "await_input"
	// ActionWakeAt: deliver TimerFired at or after At.
	ActionWakeAt ActionType = "wake_at"
	// ActionComplete: commit RunCompleted with Result.
	ActionComplete ActionType = "complete"
	// ActionFail: commit RunFailed with Failure.
	ActionFail ActionType = "fail"
	// ActionFinishCancelled: commit RunCancelled.
	ActionFinishCancelled ActionType = "finish_cancelled"
)

// Action is one thing the caller must do. Only the fields of its Type are
// set.
type Action struct {
	Type        ActionType
	Step        int
	EffectID    string
	Kind        abi.EffectKind
	Attempt     int
	ToolCallIDs []string
	Prompt      string
	At          int64
	Result      string
	Failure     *Failure
}

// Decide returns what the caller must do next for run. It is a pure
// function: the same snapshot always gives the same Actions, in the same
// order. A terminal Run gives none. A non-terminal Run gives at least one
// Action unless an effect of it is executing (in flight): that is the
// "never stuck" invariant the fuzz test checks.
func Decide(run Run) []Action {
	if run.Seq == 0 || run.Status.Terminal() {
		return nil
	}
	if v := run.Verdict; v != nil {
		var acts []Action
		for _, e := range run.Effects {
			if e.State == EffectExecuting {
				acts = append(acts, Action{Type: ActionCancelEffect, EffectID: e.ID, Kind: e.Kind, Attempt: e.Attempt})
			}
		}
		if len(acts) > 0 {
			return append(acts, run.effectTimeouts()...)
		}
		switch v.Status {
		case StatusCompleted:
			return []Action{{Type: ActionComplete, Result: v.Result}}
		case StatusCancelled:
			return []Action{{Type: ActionFinishCancelled, Failure: v.Failure}}
		default:
			return []Action{{Type: ActionFail, Failure: v.Failure}}
		}
	}
	if run.Status == StatusPending {
		return []Action{{Type: ActionStart}}
	}
	var acts []Action
	switch {
	case run.needsModelStep():
		acts = append(acts, Action{Type: ActionPlanModelStep, Step: run.Step + 1})
	case run.Awaiting != nil && len(run.Effects) == 0:
		acts = append(acts, Action{Type: ActionAwaitInput, Prompt: run.Awaiting.Prompt})
	default:
		window := run.Limits.MaxParallelToolCalls - run.countState(abi.KindTool, EffectExecuting)
		var gated []string
		for _, e := range run.Effects {
			switch e.State {
			case EffectReady:
				if e.Kind == abi.KindTool {
					if window <= 0 {
						continue
					}
					window--
				}
				acts = append(acts, Action{Type: ActionDispatch, EffectID: e.ID, Kind: e.Kind, Attempt: e.Attempt + 1})
			case EffectAwaitingApproval:
				gated = append(gated, e.ToolCallID)
			case EffectBackoff:
				acts = append(acts, Action{Type: ActionWakeAt, EffectID: e.ID, At: e.NotBefore})
			}
		}
		if len(gated) > 0 {
			acts = append(acts, Action{Type: ActionAwaitApproval, ToolCallIDs: gated})
		}
		acts = append(acts, run.effectTimeouts()...)
	}
	return append(acts, run.deadlineWakes()...)
}

// effectTimeouts asks to be woken when an executing attempt runs out of
// time.
func (r Run) effectTimeouts() []Action {
	if r.Limits.EffectTimeoutMS <= 0 {
		return nil
	}
	var acts []Action
	for _, e := range r.Effects {
		if e.State == EffectExecuting {
			acts = append(acts, Action{Type: ActionWakeAt, EffectID: e.ID, At: e.DispatchedAt + r.Limits.EffectTimeoutMS})
		}
	}
	return acts
}

// InFlight reports whether an effect of the Run is executing.
func (r Run) InFlight() bool {
	for _, e := range r.Effects {
		if e.State == EffectExecuting {
			return true
		}
	}
	return false
}

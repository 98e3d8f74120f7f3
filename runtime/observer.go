package runtime

import (
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Observer receives what the runtime does, for metrics. cmd implements it
// with Prometheus; the runtime imports no metrics library. Every method
// must return quickly and never block: it is called on the commit path.
//
// The calls that report one Run's commits (RunStatus, EffectSettled,
// Usage) are made under that Run's advance lock, just after each commit:
// they arrive in commit order, creation first, and all of them before
// Execute or Wait returns the Run's end. Calls for different Runs
// interleave.
type Observer interface {
	// Committed reports one commit attempt and how long the store took.
	Committed(d time.Duration, err error)
	// RunStatus reports a Run's status change (from is "" at creation).
	RunStatus(tenant string, from, to loop.Status)
	// RunEnded reports a Run that a commit ended (completed, failed or
	// cancelled): the agent it ran as (its pinned name, DefaultAgent for
	// a Run without a pin) and the time from its creation to its end on
	// the runtime's clock. It follows the RunStatus of the same commit.
	RunEnded(tenant, agent string, status loop.Status, d time.Duration)
	// EffectSettled reports an effect attempt's outcome; class is empty
	// unless it failed or was cancelled with a class.
	EffectSettled(tenant string, kind abi.EffectKind, state loop.OutcomeState, class abi.ErrorClass)
	// Usage reports the model tokens a commit added to a tenant's Runs.
	Usage(tenant string, u abi.Usage)
	// RecoveryDecision reports a decision recovery took for an effect.
	RecoveryDecision(decision string)
	// WatchdogReport reports a Run the watchdog found stuck.
	WatchdogReport(tenant string)
}

// NopObserver observes nothing.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) Committed(time.Duration, error)                                          {}
func (NopObserver) RunStatus(string, loop.Status, loop.Status)                              {}
func (NopObserver) RunEnded(string, string, loop.Status, time.Duration)                     {}
func (NopObserver) EffectSettled(string, abi.EffectKind, loop.OutcomeState, abi.ErrorClass) {}
func (NopObserver) Usage(string, abi.Usage)                                                 {}
func (NopObserver) RecoveryDecision(string)                                                 {}
func (NopObserver) WatchdogReport(string)                                                   {}

// observeCommit tells the observer what a commit changed: status, the
// Run's end and usage by comparing the snapshots before and after it,
// settlements from the committed EffectSettled events (a closed step
// leaves the snapshot with its effects), and attempts a timer settled (an
// effect timeout) by comparing effects present in both.
func (rt *Runtime) observeCommit(before, after loop.Run, batch []loop.Event) {
	o := rt.opts.Observer
	if before.Status != after.Status {
		o.RunStatus(after.Tenant, before.Status, after.Status)
	}
	if !before.Status.Terminal() && after.Status.Terminal() {
		o.RunEnded(after.Tenant, agentName(&after), after.Status,
			time.Duration(max(after.UpdatedAt-after.CreatedAt, 0))*time.Millisecond)
	}
	// The Run's own usage: what its children used is theirs, observed on
	// their own commits, and only rolled up into this Run's Usage.
	if d := (abi.Usage{InputTokens: after.OwnUsage().InputTokens - before.OwnUsage().InputTokens,
		OutputTokens: after.OwnUsage().OutputTokens - before.OwnUsage().OutputTokens}); d.InputTokens != 0 || d.OutputTokens != 0 {
		o.Usage(after.Tenant, d)
	}
	settled := map[string]bool{}
	timer := false
	for _, ev := range batch {
		switch {
		case ev.Type == loop.EventEffectSettled && ev.Outcome != nil:
			rt.stats.EffectsSettled.Add(1)
			settled[ev.EffectID] = true
			kind := abi.KindTool
			if ref, err := loop.ParseEffectID(ev.EffectID); err == nil && ref.Kind == "model" {
				kind = abi.KindModel
			}
			o.EffectSettled(after.Tenant, kind, ev.Outcome.State, outcomeClass(ev.Outcome))
		case ev.Type == loop.EventTimerFired:
			timer = true
		}
	}
	if !timer {
		return
	}
	for _, e := range after.Effects {
		old := before.Effect(e.ID)
		if settled[e.ID] || e.Outcome == nil || old == nil || old.State != loop.EffectExecuting ||
			(e.State != loop.EffectSettled && e.State != loop.EffectBackoff) {
			continue
		}
		o.EffectSettled(after.Tenant, e.Kind, e.Outcome.State, outcomeClass(e.Outcome))
	}
}

func outcomeClass(o *loop.Outcome) abi.ErrorClass {
	if o.Error != nil {
		return o.Error.Class
	}
	return ""
}

// agentName is the name of the agent a Run runs as: its pin's, or
// DefaultAgent for a Run created before agents were pinned.
func agentName(run *loop.Run) string {
	if run.Agent != nil && run.Agent.Name != "" {
		return run.Agent.Name
	}
	return DefaultAgent
}

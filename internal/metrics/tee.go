package metrics

import (
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Tee is a runtime.Observer that hands every report to each of its
// observers in order (runtime.Options takes one Observer; serve gives it
// the metrics and the API's usage ledger through a Tee).
type Tee []runtime.Observer

var _ runtime.Observer = Tee(nil)

// Committed implements runtime.Observer.
func (t Tee) Committed(d time.Duration, err error) {
	for _, o := range t {
		o.Committed(d, err)
	}
}

// RunStatus implements runtime.Observer.
func (t Tee) RunStatus(tenant string, from, to loop.Status) {
	for _, o := range t {
		o.RunStatus(tenant, from, to)
	}
}

// RunEnded implements runtime.Observer.
func (t Tee) RunEnded(tenant, agent string, status loop.Status, d time.Duration) {
	for _, o := range t {
		o.RunEnded(tenant, agent, status, d)
	}
}

// EffectSettled implements runtime.Observer.
func (t Tee) EffectSettled(tenant string, kind abi.EffectKind, state loop.OutcomeState, class abi.ErrorClass) {
	for _, o := range t {
		o.EffectSettled(tenant, kind, state, class)
	}
}

// Usage implements runtime.Observer.
func (t Tee) Usage(tenant string, u abi.Usage) {
	for _, o := range t {
		o.Usage(tenant, u)
	}
}

// RecoveryDecision implements runtime.Observer.
func (t Tee) RecoveryDecision(decision string) {
	for _, o := range t {
		o.RecoveryDecision(decision)
	}
}

// WatchdogReport implements runtime.Observer.
func (t Tee) WatchdogReport(tenant string) {
	for _, o := range t {
		o.WatchdogReport(tenant)
	}
}

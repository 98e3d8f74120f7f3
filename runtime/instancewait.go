package runtime

import (
	"context"
	"sync"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// Waits for an instance: an executor that is a CapacityWaiter (the
// plugin host) tells the runtime, through the call's context, when a
// call has to wait for a free plugin instance and when the wait ends, so
// that GET /v1/runs/{id} can show which effect waits for which plugin
// (docs/DESIGN.md §5, "Model budgets"), as it shows a wait for a model
// budget.

type capacityWaitKey struct{}

// WithCapacityWaitReport returns ctx carrying report, for
// CapacityWaitBegan: the runtime hands it with the context of each
// executor call, to learn when the call waits for capacity. report is
// given the name of the plugin the call waits for, and returns the
// function that says the wait ended.
func WithCapacityWaitReport(ctx context.Context, report func(plugin string) (ended func())) context.Context {
	return context.WithValue(ctx, capacityWaitKey{}, report)
}

// CapacityWaitBegan says that the call made under ctx waits, from now,
// for capacity (a free instance) of plugin: a CapacityWaiter calls it
// when the call cannot begin at once, and calls the function it returns,
// once, when the wait ends (the call got its instance, or gave up). A
// context that carries no report (WithCapacityWaitReport) gives a
// function that does nothing.
func CapacityWaitBegan(ctx context.Context, plugin string) (ended func()) {
	if report, ok := ctx.Value(capacityWaitKey{}).(func(string) func()); ok && report != nil {
		return report(plugin)
	}
	return func() {}
}

// InstanceWait is an executor call waiting in this process for an
// instance of its plugin.
type InstanceWait struct {
	// Plugin is the plugin's name in the host: its ID in the config.
	Plugin string
	// Since is when the call began to wait.
	Since time.Time
}

// instanceWaits holds the executor calls of this process that wait for a
// plugin instance, by assignment key. Its mu is a leaf.
type instanceWaits struct {
	// mu guards byKey; it is a leaf.
	mu    sync.Mutex
	byKey map[string]InstanceWait // the calls waiting now
}

// report returns the report (WithCapacityWaitReport) of the call of key:
// it records the wait from now on clock until the wait ends.
func (w *instanceWaits) report(key string, clock Clock) func(plugin string) func() {
	return func(plugin string) func() {
		w.mu.Lock()
		if w.byKey == nil {
			w.byKey = map[string]InstanceWait{}
		}
		w.byKey[key] = InstanceWait{Plugin: plugin, Since: clock.Now()}
		w.mu.Unlock()
		var once sync.Once
		return func() {
			once.Do(func() {
				w.mu.Lock()
				delete(w.byKey, key)
				w.mu.Unlock()
			})
		}
	}
}

func (w *instanceWaits) get(key string) (InstanceWait, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	iw, ok := w.byKey[key]
	return iw, ok
}

// InstanceWait reports whether the current attempt of run's effect
// effectID waits in this process for an instance of its executor's
// plugin (a start, poll or attach call). Only the node that makes the
// call knows: another answers false.
func (rt *Runtime) InstanceWait(run loop.Run, effectID string) (InstanceWait, bool) {
	e := run.Effect(effectID)
	if e == nil || e.State != loop.EffectExecuting {
		return InstanceWait{}, false
	}
	return rt.instanceWaits.get(assignment(run, e.ID, e.Attempt))
}

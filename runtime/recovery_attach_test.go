package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// queuedAttach stands in for a plugin host whose instances are all busy:
// its Attach waits for an instance of plugin, as host.Executor does
// (runtime.CapacityWaitBegan), until the test lets it through.
type queuedAttach struct {
	runtime.Executor
	plugin  string
	waiting chan<- struct{} // told once the attach waits
	release <-chan struct{} // closed to give it its instance
}

func (q queuedAttach) WaitsForCapacity() {}

func (q queuedAttach) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	ended := runtime.CapacityWaitBegan(ctx, q.plugin)
	q.waiting <- struct{}{}
	select {
	case <-q.release:
	case <-ctx.Done():
		ended()
		return abi.EffectReply{}, ctx.Err()
	}
	ended()
	return q.Executor.Attach(ctx, c)
}

// TestARecoveryAttachShowsItsWaitForAnInstance: recovery's attach, like a
// start or a poll, tells the runtime while it waits for a plugin
// instance, so that the Run shows which effect waits for which plugin
// (InstanceWait) while the attaches of a restart queue for instances.
func TestARecoveryAttachShowsItsWaitForAnInstance(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s, want waiting on the slow job", res.Kind)
	}
	e.Crash(e.Runtime)
	waiting, release := make(chan struct{}, 1), make(chan struct{})
	for i := range e.Tenant.Tools {
		e.Tenant.Tools[i].Executor = queuedAttach{Executor: e.Tenant.Tools[i].Executor, plugin: "jobs", waiting: waiting, release: release}
	}
	b := e.Recover("node-b")
	select {
	case <-waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("recovery did not attach the slow job within 20 s")
	}
	run, err := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	effect := res.Run.ID + ".t1.0"
	w, ok := b.InstanceWait(run, effect)
	if !ok || w.Plugin != "jobs" {
		t.Fatalf("InstanceWait of %s during recovery's attach: %+v, %t; want a wait for plugin jobs", effect, w, ok)
	}
	close(release)
	run = e.UntilTerminal(b, res.Run.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted {
		t.Fatalf("run %s, want completed", run.Status)
	}
	if _, ok := b.InstanceWait(run, effect); ok {
		t.Fatal("the wait is still reported after the attach got its instance")
	}
}

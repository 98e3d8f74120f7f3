package runtime_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// heldCalls is an Executor whose calls wait until release is closed,
// counting the calls running at once.
type heldCalls struct {
	runtime.Executor
	release         chan struct{}
	running, most   atomic.Int64
	started, ranOut atomic.Int64
}

func (h *heldCalls) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	n := h.running.Add(1)
	defer h.running.Add(-1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	h.started.Add(1)
	<-h.release
	return h.Executor.Start(ctx, c)
}

// The executor calls in flight are bounded (Options.MaxCallsInFlight):
// with 40 Runs each calling a tool that does not answer, only 3 calls run
// and the other Runs wait for a slot; once the tool answers, every Run
// completes, each tool called once.
func TestExecutorCallsInFlightAreBounded(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	store := conformance.NewMemStore(clock, conformance.KVLimits{})
	tools := &conformance.ScriptedTools{SlowPolls: 1}
	held := &heldCalls{Executor: tools, release: make(chan struct{})}
	tenant := benchTenant(tools)
	for i := range tenant.Tools {
		tenant.Tools[i].Executor = held
	}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		MaxCallsInFlight: 3, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Halt)
	const runs = 40
	for i := range runs {
		if _, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), RunID: fmt.Sprintf("r%d", i),
			Input: `call:echo({"text":"x"})|answer:$results`}); err != nil {
			t.Fatal(err)
		}
	}
	conformance.Eventually(t, "three tool calls to run", func() bool { return held.running.Load() == 3 })
	// Every Run gets as far as a dispatch (its model step's, or its tool
	// call's once the model answered), whose call then waits for a slot in
	// its driver: a queue of drivers (MaxDrivers), not a goroutine a call.
	conformance.Eventually(t, "every Run to dispatch an effect", func() bool {
		for i := range runs {
			r, err := store.LoadRun(ctx, "acme", fmt.Sprintf("r%d", i))
			if err != nil || len(r.Executing()) != 1 {
				return false
			}
		}
		return true
	})
	if n := held.started.Load(); n != 3 {
		t.Fatalf("%d tool calls started with 3 slots", n)
	}
	close(held.release)
	conformance.Eventually(t, "every Run to complete", func() bool {
		for i := range runs {
			r, err := store.LoadRun(ctx, "acme", fmt.Sprintf("r%d", i))
			if err != nil || r.Status != loop.StatusCompleted {
				return false
			}
		}
		return true
	})
	if m := held.most.Load(); m > 3 {
		t.Fatalf("%d tool calls ran at once, over MaxCallsInFlight 3", m)
	}
	if n := held.started.Load(); n != runs {
		t.Fatalf("%d tool calls for %d Runs", n, runs)
	}
}

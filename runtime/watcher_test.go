package runtime_test

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// TestTenThousandPendingEffectsAddNoGoroutines drives 1,250 Runs whose model
// asks for 8 slow tool calls each: 10,000 effects answer pending and wait
// in the Watcher. The goroutine count must come back to where it started:
// a pending effect costs a heap slot, not a goroutine.
//
// Under -race (about 10x slower) it runs 125 Runs, 1,000 effects; make test
// also runs the full 10,000 without -race.
func TestTenThousandPendingEffectsAddNoGoroutines(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	runs := 1250
	if raceEnabled {
		runs = 125
	}
	clock := conformance.NewFakeClock(time.Time{})
	store := conformance.NewMemStore(clock, conformance.KVLimits{})
	defer store.Close()
	tools := &conformance.ScriptedTools{SlowPolls: 1}
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 8, MaxParallelToolCalls: 8}}
	for _, tl := range tools.Tools() {
		tenant.Tools = append(tenant.Tools, runtime.Tool{Descriptor: tl, Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: tools})
	}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, LeaseTTL: time.Hour, PollMin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rt.Stop(ctx)
	base := goruntime.NumGoroutine()
	const perRun = 8
	script := "call:" + strings.Repeat("slow(),", perRun-1) + "slow()|answer:done"
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: script})
			if err != nil || res.Kind != runtime.ResultWaiting || len(res.Waiting.Pending) != perRun {
				t.Errorf("run %d: %v %s %+v", i, err, res.Kind, res.Waiting)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := rt.Stats().WatcherQueueDepth; n != runs*perRun {
		t.Fatalf("watcher holds %d items, want %d", n, runs*perRun)
	}
	conformance.Eventually(t, "goroutines to settle", func() bool { return goruntime.NumGoroutine() <= base+4 })
	t.Logf("%d pending effects; goroutines: %d at start, %d now", rt.Stats().WatcherQueueDepth, base, goruntime.NumGoroutine())
}

package runtime_test

import (
	"context"
	"fmt"
	"math/rand"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

type batches struct {
	mu  sync.Mutex
	got [][]runtime.WatchItem
}

func (b *batches) fire(batch []runtime.WatchItem) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, batch)
}

func (b *batches) keys() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ks []string
	for _, batch := range b.got {
		for _, it := range batch {
			ks = append(ks, it.Key)
		}
	}
	return ks
}

func (b *batches) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

func TestWatcherFiresWhatFallsDueTogetherInOneBatch(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := runtime.NewWatcher(clock, b.fire)
	now := clock.Now()
	w.Schedule(runtime.WatchItem{Key: "b", At: now.Add(2 * time.Second)})
	w.Schedule(runtime.WatchItem{Key: "a", At: now.Add(time.Second)})
	w.Schedule(runtime.WatchItem{Key: "late", At: now.Add(time.Hour)})
	if clock.Pending() != 1 {
		t.Fatalf("the watcher armed %d timers, want one for the earliest item", clock.Pending())
	}
	clock.Advance(3 * time.Second)
	conformance.Eventually(t, "a batch", func() bool { return b.count() == 1 })
	if got := strings.Join(b.keys(), ","); got != "a,b" {
		t.Fatalf("batch %q, want a,b in instant order", got)
	}
	if w.Len() != 1 {
		t.Fatalf("len %d after the batch, want 1 (late)", w.Len())
	}
	clock.Advance(time.Hour)
	conformance.Eventually(t, "the late batch", func() bool { return b.count() == 2 })
	if got := strings.Join(b.keys(), ","); got != "a,b,late" {
		t.Fatalf("batches %q, want a,b then late", got)
	}
}

func TestWatcherReplacesByKeyAndCancels(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := runtime.NewWatcher(clock, b.fire)
	now := clock.Now()
	w.Schedule(runtime.WatchItem{Key: "x", At: now.Add(time.Second)})
	w.Schedule(runtime.WatchItem{Key: "x", At: now.Add(10 * time.Second)})
	w.Schedule(runtime.WatchItem{Key: "gone", At: now.Add(time.Second)})
	w.Cancel("gone")
	clock.Advance(5 * time.Second)
	if w.Len() != 1 {
		t.Fatalf("len %d, want the rescheduled x only", w.Len())
	}
	clock.Advance(5 * time.Second)
	conformance.Eventually(t, "x to fire", func() bool { return b.count() == 1 })
	if got := strings.Join(b.keys(), ","); got != "x" {
		t.Fatalf("fired %q", got)
	}
}

func TestWatcherStopDropsEveryRegistration(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := runtime.NewWatcher(clock, b.fire)
	for i := 0; i < 100; i++ {
		w.Schedule(runtime.WatchItem{Key: fmt.Sprint(i), At: clock.Now().Add(time.Duration(i+1) * time.Second)})
	}
	w.Stop()
	if w.Len() != 0 || clock.Pending() != 0 {
		t.Fatalf("after Stop: len %d, armed timers %d", w.Len(), clock.Pending())
	}
	if w.Schedule(runtime.WatchItem{Key: "new", At: clock.Now()}) {
		t.Fatal("a stopped watcher accepted a registration")
	}
	clock.Advance(time.Hour)
	if b.count() != 0 {
		t.Fatal("a stopped watcher fired")
	}
}

// TestWatcherHammer schedules, replaces and cancels from many goroutines
// while time moves and near items fire, and checks that every far item
// that was not cancelled fires exactly once, and no cancelled one fires.
func TestWatcherHammer(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	start := clock.Now()
	var mu sync.Mutex
	fired := map[string]int{}
	w := runtime.NewWatcher(clock, func(batch []runtime.WatchItem) {
		mu.Lock()
		defer mu.Unlock()
		for _, it := range batch {
			fired[it.Key]++
		}
	})
	var wg sync.WaitGroup
	kept := make([][]string, 8)
	cancelled := make([][]string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			far := func() time.Time { return start.Add(time.Hour + time.Duration(rng.Intn(3600))*time.Second) }
			for i := 0; i < 500; i++ {
				// A near item fires while the hammer runs.
				near := fmt.Sprintf("near-g%d-%d", g, i)
				w.Schedule(runtime.WatchItem{Key: near, At: clock.Now().Add(time.Duration(rng.Intn(50)+1) * time.Millisecond)})
				kept[g] = append(kept[g], near)
				key := fmt.Sprintf("far-g%d-%d", g, i)
				w.Schedule(runtime.WatchItem{Key: key, At: far()})
				switch rng.Intn(3) {
				case 0:
					w.Cancel(key)
					cancelled[g] = append(cancelled[g], key)
					continue
				case 1:
					w.Schedule(runtime.WatchItem{Key: key, At: far()})
				}
				kept[g] = append(kept[g], key)
			}
		}(g)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
			clock.Advance(7 * time.Millisecond)
		}
	}
	if clock.Now().Sub(start) >= time.Hour {
		t.Fatal("the hammer ran so long that far items fell due; raise their distance")
	}
	clock.Advance(3 * time.Hour)
	want := 0
	for _, k := range kept {
		want += len(k)
	}
	conformance.Eventually(t, "every kept item to fire", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fired) >= want
	})
	mu.Lock()
	defer mu.Unlock()
	for _, k := range kept {
		for _, key := range k {
			if fired[key] != 1 {
				t.Fatalf("%s fired %d times", key, fired[key])
			}
		}
	}
	for _, k := range cancelled {
		for _, key := range k {
			if fired[key] != 0 {
				t.Fatalf("cancelled %s fired", key)
			}
		}
	}
	if w.Len() != 0 {
		t.Fatalf("%d items left", w.Len())
	}
}

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

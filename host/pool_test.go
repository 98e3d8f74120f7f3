package host

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

func TestPoolBoundHonoursContext(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) { s.Limits.PoolSize, s.Limits.MaxInstances = 1, 1 })
	pl, err := x.Plugin().pool("acme")
	if err != nil {
		t.Fatal(err)
	}
	held, err := pl.acquire(context.Background(), "start")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = x.Start(ctx, toolCall("acme", "r.t1.0", 1, "echo", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call beyond the pool bound: %v; want the caller's deadline", err)
	}
	var pe *runtime.PluginError
	if errors.As(err, &pe) {
		t.Fatalf("waiting for an instance is not the plugin's fault: %v", err)
	}
	// Another tenant is not blocked by acme's pool.
	doneIn(t)(x.Start(context.Background(), toolCall("globex", "r.t1.0", 1, "echo", map[string]string{"text": "x"})))
	pl.release(context.Background(), held, true)
	doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t1.1", 1, "echo", map[string]string{"text": "x"})))
	if st := x.Plugin().Stats("acme"); st.Created != 1 || st.Idle != 1 {
		t.Fatalf("the released instance should serve again: %+v", st)
	}
}

func TestPoolIdleEviction(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) { s.Limits.IdleTimeout = time.Minute })
	doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t1.0", 1, "echo", map[string]string{"text": "x"})))
	if st := x.Plugin().Stats("acme"); st.Idle != 1 {
		t.Fatalf("stats %+v", st)
	}
	inUse := e.h.MemoryInUse()
	waitFor(t, "the idle sweep to be armed", time.Minute, func() bool { return e.clock.Pending() == 1 })
	e.clock.Advance(30 * time.Second)
	if st := x.Plugin().Stats("acme"); st.Idle != 1 {
		t.Fatalf("evicted too early: %+v", st)
	}
	e.clock.Advance(31 * time.Second)
	waitFor(t, "the idle instance to be evicted", time.Minute, func() bool {
		st := x.Plugin().Stats("acme")
		return st.Idle == 0 && st.Evicted == 1
	})
	if e.h.MemoryInUse() >= inUse {
		t.Fatalf("memory in use %d did not drop from %d", e.h.MemoryInUse(), inUse)
	}
	doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t1.1", 1, "echo", map[string]string{"text": "x"})))
	if st := x.Plugin().Stats("acme"); st.Created != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHostMemoryCapEvictsIdle(t *testing.T) {
	probe := newEnv(t, Config{})
	px := probe.executor(t, conformance.PluginExecutor, nil)
	doneIn(t)(px.Start(context.Background(), toolCall("acme", "r", 1, "echo", map[string]string{"text": "x"})))
	one := probe.h.MemoryInUse()
	if one <= 0 {
		t.Fatalf("one instance uses %d bytes", one)
	}
	// Room for one instance and a half: a second tenant's instance can only
	// exist once the first tenant's idle one is evicted.
	e := newEnv(t, Config{MaxInstanceMemory: one + one/2})
	x := e.executor(t, conformance.PluginExecutor, nil)
	doneIn(t)(x.Start(context.Background(), toolCall("acme", "r", 1, "echo", map[string]string{"text": "x"})))
	doneIn(t)(x.Start(context.Background(), toolCall("globex", "r", 1, "echo", map[string]string{"text": "x"})))
	if a := x.Plugin().Stats("acme"); a.Evicted != 1 || a.Idle != 0 {
		t.Fatalf("acme's idle instance was not evicted for globex: %+v", a)
	}
	if e.h.MemoryInUse() > one+one/2 {
		t.Fatalf("memory in use %d is over the cap %d", e.h.MemoryInUse(), one+one/2)
	}
	// With the only instance busy, a new one cannot be made: the call waits
	// for room instead of passing the cap, and is counted as a wait for an
	// instance; once the busy instance is back (idle), it is evicted for
	// the waiting call.
	pl, _ := x.Plugin().pool("globex")
	held, err := pl.acquire(context.Background(), "start")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := x.Start(context.Background(), toolCall("initech", "r", 1, "echo", map[string]string{"text": "x"}))
		done <- err
	}()
	waitFor(t, "initech's call to wait for room", time.Minute, func() bool { return x.Plugin().Stats("initech").Waiting == 1 })
	pl.release(context.Background(), held, true)
	if err := <-done; err != nil {
		t.Fatalf("the call that waited for room: %v", err)
	}
	if st := x.Plugin().Stats("initech"); st.Waited != 1 || st.Created != 1 {
		t.Fatalf("initech %+v: want one instance, made after one wait", st)
	}
	if g := x.Plugin().Stats("globex"); g.Evicted != 1 {
		t.Fatalf("globex's idle instance was not evicted for initech: %+v", g)
	}
	if w := x.Plugin().InstanceWaits(); w.Waits != 1 {
		t.Fatalf("instance waits %+v; want 1", w)
	}
}

// TestPoolHammer runs concurrent calls of several tenants through small
// pools that grow past pool_size and shrink back once burstLinger has
// passed, under -race in make test.
func TestPoolHammer(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) { s.Limits.PoolSize, s.Limits.MaxInstances = 1, 2 })
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tenant := fmt.Sprintf("t%d", w%3)
			for i := 0; i < 10; i++ {
				text := fmt.Sprintf("%d-%d", w, i)
				r, err := x.Start(context.Background(), toolCall(tenant, "r.t1."+text, 1, "echo", map[string]string{"text": text}))
				if err != nil || r.State != abi.StateDone || toolContent(t, r) != text {
					errs <- fmt.Errorf("worker %d call %d: %+v %v", w, i, r, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Once burstLinger has passed with no call, each pool is back to
	// pool_size.
	waitFor(t, "each pool's idle sweep to be armed", time.Minute, func() bool { return e.clock.Pending() == 3 })
	e.clock.Advance(burstLinger)
	waitFor(t, "the sweeps to end", time.Minute, func() bool { return e.clock.Running() == 0 })
	for _, tenant := range []string{"t0", "t1", "t2"} {
		if st := x.Plugin().Stats(tenant); st.Idle != 1 || st.InUse != 0 || st.Created != st.Idle+st.Trimmed+st.Evicted+st.Failed {
			t.Errorf("%s: %+v (pool size 1, max instances 2): want one idle, and every other instance made closed", tenant, st)
		}
	}
}

// TestLoadCloseDoesNotLeak loads, calls and closes a plugin many times and
// checks that goroutines, the heap and the host's memory count come back.
func TestLoadCloseDoesNotLeak(t *testing.T) {
	path := pluginPath(t, conformance.PluginExecutor)
	cycle := func() {
		e := newEnv(t, Config{})
		p, err := e.h.Load(context.Background(), PluginSpec{Name: "x", Path: path, Role: abi.RoleExecutor})
		if err != nil {
			t.Fatal(err)
		}
		x, _ := p.Executor()
		doneIn(t)(x.Start(context.Background(), toolCall("acme", "r", 1, "echo", map[string]string{"text": "x"})))
		_, _ = x.Start(context.Background(), toolCall("acme", "r", 1, "trap", nil)) // unknown tool: failed reply
		if err := e.h.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := e.h.MemoryInUse(); n != 0 {
			t.Fatalf("memory in use after Close: %d", n)
		}
	}
	measure := func() (int, uint64) {
		goruntime.GC()
		goruntime.GC()
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		return goruntime.NumGoroutine(), ms.HeapInuse
	}
	for i := 0; i < 2; i++ { // warm up caches and pools of the runtime
		cycle()
	}
	g0, h0 := measure()
	const n = 12
	for i := 0; i < n; i++ {
		cycle()
	}
	var g1 int
	var h1 uint64
	waitFor(t, "goroutines to settle", time.Minute, func() bool {
		g1, h1 = measure()
		return g1 <= g0+2
	})
	// One leaked instance is tens of MiB of linear memory; n cycles that
	// leaked would add far more than this bound.
	if h1 > h0+64<<20 {
		t.Fatalf("heap in use grew from %d to %d over %d load/close cycles", h0, h1, n)
	}
	t.Logf("goroutines %d -> %d, heap in use %d -> %d MiB over %d cycles", g0, g1, h0>>20, h1>>20, n)
}

// callWave takes n instances of pl at once, as n calls in flight
// together would, and gives them all back.
func callWave(t *testing.T, pl *pool, n int) {
	t.Helper()
	ctx := context.Background()
	var held []*instance
	for range n {
		in, err := pl.acquire(ctx, "start")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, in)
	}
	for _, in := range held {
		pl.release(ctx, in, true)
	}
}

// The instances a wave of calls made past PoolSize stay idle after it for
// burstLinger, so that the next wave (the Runs the next group commit
// wakes) takes them instead of making its own; once none has been used
// for burstLinger, the sweep closes them, the oldest first, and keeps
// PoolSize until IdleTimeout.
func TestABurstsInstancesServeTheNextWave(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) {
		s.Limits.PoolSize, s.Limits.MaxInstances, s.Limits.IdleTimeout = 1, 4, time.Minute
	})
	pl, err := x.Plugin().pool("acme")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	wave := func() { callWave(t, pl, 4) }
	wave()
	if st := x.Plugin().Stats("acme"); st.Created != 4 || st.Idle != 4 || st.Trimmed != 0 {
		t.Fatalf("after a wave of 4 calls: %+v; want all 4 kept idle, none closed", st)
	}
	e.clock.Advance(burstLinger / 2)
	wave()
	if st := x.Plugin().Stats("acme"); st.Created != 4 || st.Idle != 4 {
		t.Fatalf("a second wave within burstLinger: %+v; want the first wave's 4 instances reused, none made", st)
	}
	waitFor(t, "the idle sweep to be armed", time.Minute, func() bool { return e.clock.Pending() == 1 })
	e.clock.Advance(burstLinger - time.Millisecond)
	// The sweep armed for the first wave may have run, and armed another.
	waitFor(t, "no sweep running, one armed", time.Minute, func() bool { return e.clock.Running() == 0 && e.clock.Pending() == 1 })
	if st := x.Plugin().Stats("acme"); st.Idle != 4 {
		t.Fatalf("closed before burstLinger passed unused: %+v", st)
	}
	e.clock.Advance(time.Millisecond)
	waitFor(t, "the instances beyond pool_size to be closed", time.Minute, func() bool {
		st := x.Plugin().Stats("acme")
		return st.Idle == 1 && st.Trimmed == 3 && e.clock.Running() == 0
	})
	doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.0", 1, "echo", map[string]string{"text": "x"})))
	if st := x.Plugin().Stats("acme"); st.Created != 4 || st.Idle != 1 || st.Evicted != 0 {
		t.Fatalf("a call after: %+v; want the pool_size instance reused", st)
	}
	waitFor(t, "the idle sweep to be armed", time.Minute, func() bool { return e.clock.Pending() == 1 })
	e.clock.Advance(time.Minute)
	waitFor(t, "the last idle instance to be evicted after idle_timeout", time.Minute, func() bool {
		st := x.Plugin().Stats("acme")
		return st.Idle == 0 && st.Evicted == 1 && st.Trimmed == 3
	})
}

// The host-wide eviction orders the idle instances of every pool by their
// last use, outside the pools' locks, while calls take and give back
// those instances: it must order them by what it read under each pool's
// lock, not by the instances' fields, which a release writes. Under -race
// (make test) this fails when the eviction reads a field a release
// writes.
func TestEvictionOrdersWhatItReadUnderThePoolsLocks(t *testing.T) {
	e := newEnv(t, Config{})
	const warm = 12
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) { s.Limits.PoolSize, s.Limits.MaxInstances = warm, warm })
	ctx := context.Background()
	var pools []*pool
	for _, tenant := range []string{"acme", "globex"} {
		pl, err := x.Plugin().pool(tenant)
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, pl)
		callWave(t, pl, warm)
	}
	// A call at a time on each pool, taking its newest idle instance and
	// giving it back, while the host evicts the least recently used of
	// all, one a round.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var cycles atomic.Int64
	for _, pl := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				in, err := pl.acquire(ctx, "start")
				if err != nil {
					t.Error(err)
					return
				}
				pl.release(ctx, in, true)
				cycles.Add(1)
			}
		}()
	}
	waitFor(t, "the calls to run", time.Minute, func() bool { return cycles.Load() >= 100 })
	for range warm + warm/2 {
		e.h.evictIdleFor(ctx, e.h.budget.limit-e.h.budget.used.Load()+1)
	}
	close(stop)
	wg.Wait()
	if st, g := x.Plugin().Stats("acme"), x.Plugin().Stats("globex"); st.Evicted+g.Evicted == 0 {
		t.Fatalf("nothing evicted: acme %+v, globex %+v", st, g)
	}
}

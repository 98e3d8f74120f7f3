package runtime_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// hangingRenewals is a store whose RenewNode, once hang is set, does not
// answer until the test lets it go (release), whatever its context says:
// a network partitioned from the database, a stalled disk. A renewal let
// go answers as the inner store does. It counts the Commit calls, which a
// node that no longer trusts its lease must not make.
type hangingRenewals struct {
	runtime.Store
	hang     atomic.Bool
	release  chan struct{}
	renewals atomic.Int64 // RenewNode calls, hung or not
	hung     atomic.Int64 // RenewNode calls hanging now
	answered atomic.Int64 // hung RenewNode calls that have answered since
	commits  atomic.Int64
}

func (s *hangingRenewals) RenewNode(ctx context.Context, nodeID string, expiresMS int64) error {
	s.renewals.Add(1)
	if s.hang.Load() {
		s.hung.Add(1)
		<-s.release
		s.hung.Add(-1)
		defer s.answered.Add(1)
	}
	return s.Store.RenewNode(ctx, nodeID, expiresMS)
}

func (s *hangingRenewals) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	s.commits.Add(1)
	return s.Store.Commit(ctx, c)
}

// eachStoreWithHangingRenewals is eachStore over a hangingRenewals store.
// Its hung renewals are let go when the test ends.
func eachStoreWithHangingRenewals(t *testing.T, f func(t *testing.T, e *conformance.RuntimeEnv, hs *hangingRenewals)) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			var hs *hangingRenewals
			inner := h.NewStore
			h.NewStore = func(t *testing.T, clock runtime.Clock) runtime.Store {
				hs = &hangingRenewals{Store: inner(t, clock), release: make(chan struct{})}
				return hs
			}
			e := conformance.NewRuntimeEnv(t, h, nil)
			t.Cleanup(func() { hs.letGo() })
			f(t, e, hs)
		})
	}
}

// letGo lets every hung renewal answer, and no later one hang.
func (s *hangingRenewals) letGo() {
	s.hang.Store(false)
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

// stepWhileRenewalHangs moves the fake clock to target in steps, each once
// no clock callback is running but the renewals that hang (which never
// return by themselves).
func stepWhileRenewalHangs(t *testing.T, c *conformance.FakeClock, hs *hangingRenewals, target time.Time, step time.Duration) {
	t.Helper()
	for c.Now().Before(target) {
		conformance.Eventually(t, "the clock's callbacks to return", func() bool { return c.Running() <= int(hs.hung.Load()) })
		next := c.Now().Add(step)
		if next.After(target) {
			next = target
		}
		c.Set(next)
	}
	conformance.Eventually(t, "the clock's callbacks to return", func() bool { return c.Running() <= int(hs.hung.Load()) })
}

// executorCalls counts every call the runtime made of the model and the
// tools: start, poll, attach and cancel.
func executorCalls(e *conformance.RuntimeEnv) int {
	n := 0
	for _, x := range []string{abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel} {
		n += e.Model.Calls(x) + e.Tools.Calls(x)
	}
	return n
}

func leaseLost(rt *runtime.Runtime) bool {
	select {
	case <-rt.LeaseLost():
		return true
	default:
		return false
	}
}

// The lease trust window is enforced on the node's own (monotonic)
// clock: once LeaseTTL minus a fifth of it has passed since the start of
// the last good renewal, the node gives its lease up even though the
// renewal it began has not answered (a network partitioned from the
// store, a stalled disk): it reports not ready, cancels its calls in
// flight, starts no call and makes no commit from then on. It used to
// check the window only when a renewal returned an error, so a renewal
// that hung let it go on past the lease's end at the store, where another
// node takes its sessions over and starts the same effects.
func TestTheLeaseTrustWindowIsEnforcedOnTheMonotonicClock(t *testing.T) {
	eachStoreWithHangingRenewals(t, func(t *testing.T, e *conformance.RuntimeEnv, hs *hangingRenewals) {
		start := e.Clock.Now() // node-a registered now; LeaseTTL is 1 min in the suite: trusted until 48 s
		hs.hang.Store(true)
		runID := runtime.NewRunID(e.Clock.Now())
		go func() {
			_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
		}()
		conformance.Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })

		// The renewal due at 20 s hangs; inside the window the node trusts
		// its lease all the same.
		stepWhileRenewalHangs(t, e.Clock, hs, start.Add(47*time.Second), time.Second)
		if n := hs.hung.Load(); n != 1 {
			t.Fatalf("%d renewals hang at 47 s, want the one begun at 20 s", n)
		}
		if leaseLost(e.Runtime) || !e.Runtime.Ready() {
			t.Fatal("the lease was given up inside its trust window (47 s of a 60 s lease)")
		}

		commits, calls := hs.commits.Load(), executorCalls(e)
		e.Clock.Set(start.Add(48 * time.Second))
		conformance.Eventually(t, "the lease to be given up at the end of its trust window, its renewal still hanging", func() bool { return leaseLost(e.Runtime) })
		if hs.hung.Load() != 1 || hs.answered.Load() != 0 {
			t.Fatalf("the renewal answered (hung %d, answered %d): the test lost its point", hs.hung.Load(), hs.answered.Load())
		}
		if e.Runtime.Ready() {
			t.Fatal("Ready after the lease was lost")
		}
		// The block call, which ignores everything but its context, was
		// cancelled, and its effect stays executing on record, for the
		// node that takes the session over.
		conformance.Eventually(t, "the block call to be cancelled", e.Runtime.Idle)
		run, err := e.Store.LoadRun(context.Background(), "acme", runID)
		if err != nil {
			t.Fatal(err)
		}
		if eff := run.Effect(runID + ".t1.0"); eff == nil || eff.State != loop.EffectExecuting {
			t.Fatalf("effect %+v, want it executing on record", eff)
		}

		// From here on it starts nothing and commits nothing: not a Run
		// submitted to it, not its timers (polls, recovery, the
		// watchdog), for hours of its clock.
		run2, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s2", Input: `call:echo({"text":"x"})|answer:$results`})
		if err == nil {
			conformance.Eventually(t, "the driver of s2 to give up", e.Runtime.Idle)
		}
		stepWhileRenewalHangs(t, e.Clock, hs, e.Clock.Now().Add(3*time.Hour), time.Minute)
		conformance.Eventually(t, "the runtime to be idle", e.Runtime.Idle)
		if n := hs.commits.Load() - commits; n != 0 {
			t.Fatalf("%d commits were attempted after the trust window ended", n)
		}
		if n := executorCalls(e) - calls; n != 0 {
			t.Fatalf("%d executor calls were made after the trust window ended", n)
		}
		if err == nil {
			got, lerr := e.Store.LoadRun(context.Background(), "acme", run2.ID)
			if lerr != nil {
				t.Fatal(lerr)
			}
			if got.Seq != 1 || got.Status != loop.StatusPending {
				t.Fatalf("the Run submitted after the window moved on: %s at seq %d", got.Status, got.Seq)
			}
		}
		if n := hs.renewals.Load(); n != 1 {
			t.Fatalf("%d renewals were begun, want only the one that hangs", n)
		}
	})
}

// A renewal that hung past the trust window and then answers that it
// renewed the lease (the partition heals) does not revive it: the node
// gave it up at the window's end, its calls are cancelled and it may
// already have been replaced, so it stays lost and no renewal follows.
func TestARenewalThatAnswersAfterTheTrustWindowDoesNotReviveTheLease(t *testing.T) {
	eachStoreWithHangingRenewals(t, func(t *testing.T, e *conformance.RuntimeEnv, hs *hangingRenewals) {
		start := e.Clock.Now()
		hs.hang.Store(true)
		stepWhileRenewalHangs(t, e.Clock, hs, start.Add(48*time.Second), time.Second)
		conformance.Eventually(t, "the lease to be given up at the end of its trust window", func() bool { return leaseLost(e.Runtime) })

		// The store still holds the lease (it runs until 60 s): the
		// renewal let go now succeeds there.
		hs.letGo()
		conformance.Eventually(t, "the hung renewal to answer", func() bool { return hs.answered.Load() == 1 })
		conformance.Eventually(t, "the clock's callbacks to return", func() bool { return e.Clock.Running() == 0 })
		stepClock(t, e.Clock, e.Clock.Now().Add(5*time.Minute), 5*time.Second)
		if e.Runtime.Ready() {
			t.Fatal("Ready again after a late renewal")
		}
		if n := hs.renewals.Load(); n != 1 {
			t.Fatalf("%d renewals were begun, want none after the lease was given up", n)
		}
		if n := e.Runtime.Stats().LeaseRenewals; n != 0 {
			t.Fatalf("%d renewals counted as good, want the late one ignored", n)
		}
	})
}

// On the real clock too the node gives its lease up at the end of the
// trust window while its renewal hangs, and not before: the window is
// timed by the runtime's Clock (SystemClock's timers run on Go's
// monotonic clock), not by the renewal.
func TestTheLeaseTrustWindowEndsOnTheRealClockWhileARenewalHangs(t *testing.T) {
	clock := runtime.SystemClock{}
	mem := conformance.NewMemStore(clock, conformance.KVLimits{})
	t.Cleanup(func() { _ = mem.Close() })
	hs := &hangingRenewals{Store: mem, release: make(chan struct{})}
	hs.hang.Store(true)
	t.Cleanup(hs.letGo)
	const ttl = 1500 * time.Millisecond
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	rt, err := runtime.New(runtime.Options{Store: hs, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		NodeID: "node-real", LeaseTTL: ttl, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now() // before the registration, which starts the window
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	conformance.Eventually(t, "the lease to be given up while its renewal hangs", func() bool { return leaseLost(rt) })
	if took, window := time.Since(began), ttl-ttl/5; took < window {
		t.Fatalf("the lease was given up %s after the registration, inside its %s trust window", took, window)
	}
	if n := hs.answered.Load(); n != 0 {
		t.Fatalf("%d hung renewals answered: the lease was to be given up with none answering", n)
	}
}

// hangingCommits is a store whose Commit, once hang is set, does not
// answer until its context ends: a commit sent over a network that was
// cut off from the database.
type hangingCommits struct {
	*hangingRenewals
	hangCommits atomic.Bool
	began       atomic.Int64 // hung commits begun
	ended       atomic.Int64 // hung commits that returned
}

func (s *hangingCommits) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	if !s.hangCommits.Load() {
		return s.hangingRenewals.Commit(ctx, c)
	}
	s.began.Add(1)
	defer s.ended.Add(1)
	<-ctx.Done()
	return runtime.CommitResult{}, ctx.Err()
}

// A node that gives its lease up ends the commits it has under way: they
// ran detached from its life, bounded only by CommitTimeout (30 s by
// default), so a node cut off from the database held them, and its
// drain, that long after it had stopped trusting its lease, although
// what they would write is recovery's to find either way.
func TestALostLeaseEndsTheCommitsUnderWay(t *testing.T) {
	clock := runtime.SystemClock{}
	mem := conformance.NewMemStore(clock, conformance.KVLimits{})
	t.Cleanup(func() { _ = mem.Close() })
	hs := &hangingCommits{hangingRenewals: &hangingRenewals{Store: mem, release: make(chan struct{})}}
	t.Cleanup(hs.letGo)
	const ttl = 3 * time.Second
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	rt, err := runtime.New(runtime.Options{Store: hs, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		NodeID: "node-commits", LeaseTTL: ttl, CommitTimeout: time.Hour, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	// The commits hang first, and the renewals only once a commit is
	// under way: the trust window then runs from the last good renewal,
	// however long the machine took to get the Run's first commit going.
	hs.hangCommits.Store(true)
	if _, _, err := rt.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:hello"}); err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "the Run's first commit to hang", func() bool { return hs.began.Load() >= 1 })
	hs.hang.Store(true)
	conformance.Eventually(t, "the lease to be given up", func() bool { return leaseLost(rt) })
	conformance.Eventually(t, "the commits under way to end with the lease (CommitTimeout is an hour)", func() bool {
		return hs.ended.Load() == hs.began.Load()
	})
	conformance.Eventually(t, "the runtime to be idle", rt.Idle)
}

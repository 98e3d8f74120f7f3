package runtime_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The runtime holds state for the sessions with recent work, not for every
// session it ever drove (a platform's sessions are unbounded): the watchdog
// drops a session it finds idle in two scans in a row.
func TestIdleSessionsAreForgottenByTheWatchdog(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	for i := range 20 {
		if res := e.Execute(fmt.Sprintf("s%d", i), `answer:done`); res.Run.Status != loop.StatusCompleted {
			t.Fatalf("run %d: %s %s", i, res.Kind, res.Run.Status)
		}
	}
	waiting := e.Execute("asks", `ask:Which city?|answer:ok`)
	if waiting.Kind != runtime.ResultWaiting {
		t.Fatalf("want a wait for input, got %s", waiting.Kind)
	}
	conformance.Eventually(t, "the drivers to finish", func() bool { return e.Runtime.Idle() })
	ctx := context.Background()
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 21 {
		t.Fatalf("%d sessions held after one scan, want 21: a session is forgotten only when found idle twice", n)
	}
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 1 {
		t.Fatalf("%d sessions held after two scans, want 1 (the one whose Run waits)", n)
	}
	// A forgotten session is driven again as before, under the same claim.
	if res := e.Execute("s3", `answer:again`); res.Run.Status != loop.StatusCompleted {
		t.Fatalf("a Run of a forgotten session: %s %s", res.Kind, res.Run.Status)
	}
	if _, err := e.Runtime.ProvideInput(ctx, "acme", waiting.Run.ID, "Paris"); err != nil {
		t.Fatal(err)
	}
	e.UntilTerminal(e.Runtime, waiting.Run.ID, 100*time.Millisecond)
	conformance.Eventually(t, "the drivers to finish", func() bool { return e.Runtime.Idle() })
	e.Runtime.WatchdogScan(ctx)
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 0 {
		t.Fatalf("%d sessions held once every Run ended and two scans passed, want 0", n)
	}
	if n := e.Runtime.Stats().Boundaries; n != 0 {
		t.Fatalf("%d ownership boundaries: a session's claim was lost on the way", n)
	}
	if n := e.Runtime.Recovery().WatchdogReports; n != 0 {
		t.Fatalf("the watchdog reported %d Runs", n)
	}
}

// ownershipCalls is a Store that counts the session claims and the reads
// of a session's active Runs the runtime makes.
type ownershipCalls struct {
	runtime.Store
	claims, activeReads atomic.Int64
}

func (s *ownershipCalls) ClaimSession(ctx context.Context, tenant, session, node string, nowMS int64) (uint64, error) {
	s.claims.Add(1)
	return s.Store.ClaimSession(ctx, tenant, session, node, nowMS)
}

func (s *ownershipCalls) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	s.activeReads.Add(1)
	return s.Store.ActiveRuns(ctx, tenant, session)
}

// A submission into a new session claims it in the creation's transaction
// (CreateRun.Claimant): the session's driver neither claims it again nor
// reads its active Runs before it starts the Run. Stop releases such a
// claim like any other, so another node takes the session at once.
func TestASubmissionClaimsItsNewSession(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	store := &ownershipCalls{Store: conformance.NewMemStore(clock, conformance.KVLimits{})}
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 2}}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Halt)
	for i := range 3 {
		res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: "ask:Which city?|answer:ok"})
		if err != nil || res.Kind != runtime.ResultWaiting || res.Waiting.Input == nil {
			t.Fatalf("run %d: %v, %s; want a wait for input", i, err, res.Kind)
		}
	}
	conformance.Eventually(t, "the drivers to finish", rt.Idle)
	if c, a := store.claims.Load(), store.activeReads.Load(); c != 0 || a != 0 {
		t.Fatalf("the drivers of 3 new sessions claimed %d times and read active Runs %d times; want 0 and 0", c, a)
	}
	if err := rt.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.RegisterNode(ctx, "node-b", clock.Now().Add(time.Minute).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if e, err := store.Store.ClaimSession(ctx, "acme", "s1", "node-b", clock.Now().UnixMilli()); err != nil || e != 2 {
		t.Fatalf("node-b claiming s1 after the submitting node stopped: epoch %d, %v; want 2", e, err)
	}
}

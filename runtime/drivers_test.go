package runtime_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// claimOrder is a Store that records the order in which sessions are first
// claimed, and holds the claim of one session until release is closed. Its
// creations claim no session (CreateRun.Claimant is dropped): each
// session's driver claims it.
type claimOrder struct {
	runtime.Store
	hold    string
	held    chan struct{} // closed when the held claim arrives
	release chan struct{}

	mu    sync.Mutex
	order []string
}

func (s *claimOrder) ClaimSession(ctx context.Context, tenant, session, node string, nowMS int64) (uint64, error) {
	s.mu.Lock()
	if !slices.Contains(s.order, session) {
		s.order = append(s.order, session)
	}
	s.mu.Unlock()
	if session == s.hold {
		close(s.held)
		select {
		case <-s.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return s.Store.ClaimSession(ctx, tenant, session, node, nowMS)
}

func (s *claimOrder) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	c.Claimant = ""
	return s.Store.CreateRun(ctx, c)
}

func (s *claimOrder) claimed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// Sessions kicked while every driver slot is taken get a slot in the order
// they were kicked, not in the order the Go scheduler happens to run their
// driver goroutines: the deterministic mode of TestMetamorphic depends on
// it (with one slot, which of two sessions recovery hands to drivers is
// driven first decided when a Run's settlement was committed).
func TestDriverSlotsAreHandedOutInKickOrder(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	store := &claimOrder{Store: conformance.NewMemStore(clock, conformance.KVLimits{}),
		hold: "s00", held: make(chan struct{}), release: make(chan struct{})}
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 2}}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		MaxDrivers: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Halt)
	conformance.Eventually(t, "the first recovery pass", rt.Ready)

	var want []string
	for i := range 33 {
		session := fmt.Sprintf("s%02d", i)
		want = append(want, session)
		if _, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: session, RunID: "r-" + session, Input: "answer:hi"}); err != nil {
			t.Fatalf("submit into %s: %v", session, err)
		}
		if i == 0 {
			// s00's driver has the one slot, and waits in its claim.
			conformance.Eventually(t, "the claim of s00", func() bool {
				select {
				case <-store.held:
					return true
				default:
					return false
				}
			})
		}
	}
	close(store.release)
	conformance.Eventually(t, "every Run to complete", func() bool {
		for _, s := range want {
			run, err := store.LoadRun(ctx, "acme", "r-"+s)
			if err != nil || run.Status != loop.StatusCompleted {
				return false
			}
		}
		return true
	})
	if got := store.claimed(); !slices.Equal(got, want) {
		t.Fatalf("sessions driven in the order %v, want the order they were kicked in, %v", got, want)
	}
}

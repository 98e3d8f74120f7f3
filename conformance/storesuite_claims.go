package conformance

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here hold ClaimSessions to the port's promise that
// a batch refused with ErrNodeExpired writes nothing.

// testClaimSessionsRefusedForAnExpiredNodeWritesNothing: a node whose
// lease ran out claims a batch of sessions in every state a claim meets
// (one it owns, one a dead node owns, one a live node owns, one never
// claimed with a Run, one with no record at all). The batch is refused
// with ErrNodeExpired, and every session is as it was: the same owner at
// the same epoch, and the next live claimant takes each at the epoch it
// would have before the batch.
func testClaimSessionsRefusedForAnExpiredNodeWritesNothing(t *testing.T, h *harness) {
	h.register("x", time.Second)
	h.register("c", time.Second)
	h.register("b", time.Minute)
	h.claim("t", "mine", "x")
	h.create("t", "mine", "m1", "")
	h.claim("t", "orphan", "c")
	h.create("t", "orphan", "o1", "")
	h.create("t", "free", "f1", "")
	h.claim("t", "theirs", "b")
	h.create("t", "theirs", "b1", "")
	h.clock.Advance(2 * time.Second) // x and c are dead
	before := h.active("", "", 0)

	batch := []runtime.SessionRef{{Tenant: "t", Session: "fresh"}, {Tenant: "t", Session: "theirs"},
		{Tenant: "t", Session: "orphan"}, {Tenant: "t", Session: "free"}, {Tenant: "t", Session: "mine"}}
	got, err := h.s.ClaimSessions(h.ctx, "x", h.nowMS(), batch)
	h.wantErr(err, runtime.ErrNodeExpired, "ClaimSessions by a node whose lease ran out")
	if got != nil {
		t.Fatalf("a refused ClaimSessions answered claims %+v", got)
	}
	if after := h.active("", "", 0); !slices.Equal(after, before) {
		t.Fatalf("the refused batch changed the sessions' owners: %v, was %v", after, before)
	}
	h.register("a", time.Minute)
	for _, want := range []struct {
		session string
		epoch   uint64
	}{{"fresh", 1}, {"orphan", 2}, {"free", 1}, {"mine", 2}} {
		if e := h.claim("t", want.session, "a"); e != want.epoch {
			t.Fatalf("a live node's claim of %s after the refused batch: epoch %d, want %d", want.session, e, want.epoch)
		}
	}
	var owned *runtime.SessionOwnedError
	if _, err := h.s.ClaimSession(h.ctx, "t", "theirs", "a", h.nowMS()); !errors.As(err, &owned) || owned.Owner != "b" || owned.Epoch != 1 {
		t.Fatalf("a claim of the session b owns after the refused batch: %v; want owned by b at epoch 1", err)
	}
	h.checkIndexes("t", "mine", "orphan", "free", "theirs")
}

// testClaimSessionsRacingTheNodesDeathClaimsAllOrNothing: a node's batch
// claim races the end of its lease (the clock moves past it and a renewal
// finds it so). Whichever comes first, the batch is one decision: it
// claims every session, or it is refused with ErrNodeExpired and claims
// none. A store that judges the lease again at each session of the batch
// can refuse midway; then the claims made before must not stay.
func testClaimSessionsRacingTheNodesDeathClaimsAllOrNothing(t *testing.T, h *harness) {
	const (
		rounds   = 4
		sessions = 60
	)
	h.register("a", time.Hour)
	for round := range rounds {
		node := fmt.Sprintf("n%d", round)
		h.register(node, time.Second)
		batch := make([]runtime.SessionRef, sessions)
		for i := range batch {
			batch[i] = runtime.SessionRef{Tenant: "t", Session: fmt.Sprintf("r%d-s%02d", round, i)}
		}
		var (
			wg       sync.WaitGroup
			claimErr error
			renewErr error
			start    = make(chan struct{})
			nowMS    = h.nowMS()
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, claimErr = h.s.ClaimSessions(h.ctx, node, nowMS, batch)
		}()
		go func() {
			defer wg.Done()
			<-start
			h.clock.Advance(2 * time.Second)
			renewErr = h.s.RenewNode(h.ctx, node, h.nowMS()+1000)
		}()
		close(start)
		wg.Wait()
		h.wantErr(renewErr, runtime.ErrNodeExpired, "the renewal after the lease ran out")
		if claimErr != nil && !errors.Is(claimErr, runtime.ErrNodeExpired) {
			t.Fatalf("round %d: ClaimSessions: %v", round, claimErr)
		}
		// a's claim of each session says whether the batch claimed it:
		// epoch 2 after the dead node's claim, 1 if it is a first claim.
		want := uint64(2)
		if claimErr != nil {
			want = 1
		}
		var odd []string
		for _, ref := range batch {
			if e := h.claim(ref.Tenant, ref.Session, "a"); e != want {
				odd = append(odd, ref.Session)
			}
		}
		switch {
		case len(odd) > 0 && claimErr != nil:
			t.Fatalf("round %d: ClaimSessions was refused (%v), yet it kept its claims of %v", round, claimErr, odd)
		case len(odd) > 0:
			t.Fatalf("round %d: ClaimSessions succeeded, yet did not claim %v", round, odd)
		}
	}
}

package conformance

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here hold a store to its promises about who owns
// a session: node leases and their renewal, claims and takeovers, the
// epochs that fence an old owner's commits, and orphaned sessions.
// storesuite_claims.go holds the further cases of ClaimSessions.

func testFencing(t *testing.T, h *harness) {
	h.register("node-a", 10*time.Second)
	ea := h.claim("t", "s", "node-a")
	if ea == 0 {
		t.Fatal("the first claim of a session must raise its epoch above 0")
	}
	r := h.create("t", "s", "r", "")
	_, err := h.s.Commit(h.ctx, h.step(r, ea+1, "", started()))
	h.wantErr(err, runtime.ErrFenced, "commit with an epoch from the future")
	_, err = h.s.Commit(h.ctx, h.step(r, 0, "", started()))
	h.wantErr(err, runtime.ErrFenced, "commit with epoch 0 on a claimed session")
	r = h.commit(r, ea, "", started())

	// node-a stalls past its lease; node-b takes the session over.
	h.clock.Advance(11 * time.Second)
	h.register("node-b", 10*time.Second)
	eb := h.claim("t", "s", "node-b")
	if eb != ea+1 {
		t.Fatalf("takeover epoch = %d, want %d", eb, ea+1)
	}
	_, err = h.s.Commit(h.ctx, h.step(r, ea, "late-a", planned(r)))
	h.wantErr(err, runtime.ErrFenced, "commit from node-a's old epoch after the takeover")
	if got := h.load("t", "r"); got.Seq != r.Seq {
		t.Fatalf("a fenced commit wrote: Seq %d, want %d", got.Seq, r.Seq)
	}
	// The fenced command was not recorded: the new owner may use its ID.
	r = h.commit(r, eb, "late-a", planned(r))
	// Fencing is per session: another session of the tenant has its own epoch.
	o := h.create("t", "other", "o", "")
	h.commit(o, 0, "", started())
	h.checkIndexes("t", "s", "other")
}

func testClaimSessions(t *testing.T, h *harness) {
	h.register("node-a", 10*time.Second)
	h.register("node-b", 10*time.Second)
	// free: never claimed, two active Runs and one ended before them.
	done := h.toCompleted(h.toExecuting(h.create("t", "free", "f0", ""), 0), 0)
	f1 := h.toExecuting(h.create("t", "free", "f1", ""), 0)
	f2 := h.create("t", "free", "f2", "")
	// mine: node-a owns it already. theirs: node-b, alive, owns it.
	// dead: node-c owned it and its lease ran out.
	ea := h.claim("t", "mine", "node-a")
	m1 := h.create("t", "mine", "m1", "")
	eb := h.claim("t", "theirs", "node-b")
	h.create("t", "theirs", "x1", "")
	h.register("node-c", time.Second)
	ec := h.claim("u", "dead", "node-c")
	d1 := h.create("u", "dead", "d1", "")
	h.clock.Advance(2 * time.Second)

	batch := []runtime.SessionRef{{Tenant: "t", Session: "theirs"}, {Tenant: "t", Session: "free"}, {Tenant: "u", Session: "dead"},
		{Tenant: "t", Session: "mine"}, {Tenant: "t", Session: "empty"}}
	got, err := h.s.ClaimSessions(h.ctx, "node-a", h.nowMS(), batch)
	if err != nil {
		t.Fatalf("ClaimSessions: %v", err)
	}
	if len(got) != len(batch) {
		t.Fatalf("ClaimSessions answered %d claims for %d sessions", len(got), len(batch))
	}
	ids := func(runs []loop.Run) []string {
		var out []string
		for _, r := range runs {
			out = append(out, r.ID)
		}
		return out
	}
	var owned *runtime.SessionOwnedError
	if !errors.As(got[0].Err, &owned) || !errors.Is(got[0].Err, runtime.ErrSessionOwned) || owned.Owner != "node-b" || owned.Epoch != eb || got[0].Active != nil || got[0].HeadOrdinal != 0 {
		t.Fatalf("a session a live node owns: %+v; want a SessionOwnedError naming node-b at epoch %d, and no Runs", got[0], eb)
	}
	want := []struct {
		epoch uint64
		runs  []loop.Run
		head  int64 // the ordinal of the first of runs
	}{{}, {1, []loop.Run{f1, f2}, 2}, {ec + 1, []loop.Run{d1}, 1}, {ea, []loop.Run{m1}, 1}, {1, nil, 0}}
	for i := 1; i < len(batch); i++ {
		c := got[i]
		if c.Err != nil || c.Epoch != want[i].epoch {
			t.Fatalf("claim of %s: epoch %d, %v; want epoch %d", batch[i].Session, c.Epoch, c.Err, want[i].epoch)
		}
		if c.HeadOrdinal != want[i].head {
			t.Fatalf("claim of %s: head ordinal %d, want %d", batch[i].Session, c.HeadOrdinal, want[i].head)
		}
		if !slices.Equal(ids(c.Active), ids(want[i].runs)) {
			t.Fatalf("claim of %s read Runs %v, want the active ones %v (not %s, which ended)", batch[i].Session, ids(c.Active), ids(want[i].runs), done.ID)
		}
		for j, r := range c.Active {
			if !reflect.DeepEqual(r, want[i].runs[j]) {
				t.Fatalf("claim of %s read Run %s as %+v, want %+v", batch[i].Session, r.ID, r, want[i].runs[j])
			}
		}
	}
	// The claims are those ClaimSession would have made: node-a now holds
	// each at the epoch given, with no further write.
	for i := 1; i < len(batch); i++ {
		if e := h.claim(batch[i].Tenant, batch[i].Session, "node-a"); e != want[i].epoch {
			t.Fatalf("ClaimSession of %s after the batch: epoch %d, want %d", batch[i].Session, e, want[i].epoch)
		}
	}
	if _, err := h.s.Commit(h.ctx, h.step(h.load("u", "d1"), ec, "", started())); !errors.Is(err, runtime.ErrFenced) {
		t.Fatalf("a commit under the dead owner's epoch after the batch claim: %v, want ErrFenced", err)
	}
	h.commit(d1, ec+1, "", started())

	// A node whose lease ran out claims nothing at all.
	h.register("node-d", time.Second)
	h.clock.Advance(2 * time.Second)
	_, err = h.s.ClaimSessions(h.ctx, "node-d", h.nowMS(), []runtime.SessionRef{{Tenant: "t", Session: "fresh"}})
	h.wantErr(err, runtime.ErrNodeExpired, "ClaimSessions by an expired node")
	h.register("node-e", 10*time.Second)
	if e := h.claim("t", "fresh", "node-e"); e != 1 {
		t.Fatalf("the expired node's batch wrote: the next claim of its session has epoch %d, want 1", e)
	}

	// Malformed batches are refused whole.
	_, err = h.s.ClaimSessions(h.ctx, "node-a", h.nowMS(), []runtime.SessionRef{{Tenant: "t", Session: "a"}, {Tenant: "t", Session: "a"}})
	h.wantErr(err, runtime.ErrInvalidRequest, "a batch naming a session twice")
	_, err = h.s.ClaimSessions(h.ctx, "node-a", h.nowMS(), []runtime.SessionRef{{Tenant: "t", Session: "a/b"}})
	h.wantErr(err, runtime.ErrInvalidRequest, "a batch with a bad session ID")
	big := make([]runtime.SessionRef, runtime.MaxClaimBatch+1)
	for i := range big {
		big[i] = runtime.SessionRef{Tenant: "t", Session: fmt.Sprintf("b%d", i)}
	}
	_, err = h.s.ClaimSessions(h.ctx, "node-a", h.nowMS(), big)
	h.wantErr(err, runtime.ErrInvalidRequest, "a batch over MaxClaimBatch")
	if got, err := h.s.ClaimSessions(h.ctx, "node-a", h.nowMS(), big[:runtime.MaxClaimBatch]); err != nil || len(got) != runtime.MaxClaimBatch {
		t.Fatalf("a batch of MaxClaimBatch sessions: %d claims, %v", len(got), err)
	}
	h.checkIndexes("t", "free", "mine", "theirs", "empty")
	h.checkIndexes("u", "dead")
}

func testTakeover(t *testing.T, h *harness) {
	_, err := h.s.ClaimSession(h.ctx, "t", "s", "ghost", h.nowMS())
	h.wantErr(err, runtime.ErrNodeExpired, "claim by a node that never registered")
	h.register("a", 10*time.Second)
	e1 := h.claim("t", "s", "a")
	if again := h.claim("t", "s", "a"); again != e1 {
		t.Fatalf("the owner's second claim changed the epoch %d → %d", e1, again)
	}
	h.register("b", 10*time.Second)
	_, err = h.s.ClaimSession(h.ctx, "t", "s", "b", h.nowMS())
	h.wantErr(err, runtime.ErrSessionOwned, "claim of a session a live node owns")
	var owned *runtime.SessionOwnedError
	if !errors.As(err, &owned) || owned.Tenant != "t" || owned.Session != "s" || owned.Owner != "a" || owned.Epoch != e1 {
		t.Fatalf("claim of a session a live node owns: %v; want a *runtime.SessionOwnedError naming t/s, owner a, epoch %d", err, e1)
	}

	// a renews and outlives its first lease.
	h.clock.Advance(8 * time.Second)
	if err := h.s.RenewNode(h.ctx, "a", h.nowMS()+10_000); err != nil {
		t.Fatalf("RenewNode a: %v", err)
	}
	h.clock.Advance(8 * time.Second) // past b's lease and a's first one
	_, err = h.s.ClaimSession(h.ctx, "t", "s", "b", h.nowMS())
	h.wantErr(err, runtime.ErrNodeExpired, "claim by b, whose lease expired")
	err = h.s.RenewNode(h.ctx, "b", h.nowMS()+10_000)
	h.wantErr(err, runtime.ErrNodeExpired, "renewal of b's expired lease")
	err = h.s.RegisterNode(h.ctx, "b", h.nowMS()+10_000)
	h.wantErr(err, runtime.ErrNodeExpired, "registering b's dead incarnation again")

	// a stalls; c takes the session over with a higher epoch.
	h.clock.Advance(3 * time.Second)
	h.register("c", 10*time.Second)
	e2 := h.claim("t", "s", "c")
	if e2 != e1+1 {
		t.Fatalf("takeover epoch = %d, want %d", e2, e1+1)
	}
	err = h.s.RenewNode(h.ctx, "a", h.nowMS()+10_000)
	h.wantErr(err, runtime.ErrNodeExpired, "renewal by a after its lease ran out")
	_, err = h.s.ClaimSession(h.ctx, "t", "s", "a", h.nowMS())
	h.wantErr(err, runtime.ErrNodeExpired, "claim by the expired a")

	// Release lets another live node claim at once.
	if err := h.s.ReleaseSession(h.ctx, "t", "s", "a"); err != nil {
		t.Fatal(err)
	}
	h.register("d", 10*time.Second)
	_, err = h.s.ClaimSession(h.ctx, "t", "s", "d", h.nowMS())
	h.wantErr(err, runtime.ErrSessionOwned, "claim after a release by a non-owner")
	if err := h.s.ReleaseSession(h.ctx, "t", "s", "c"); err != nil {
		t.Fatal(err)
	}
	if e3 := h.claim("t", "s", "d"); e3 != e2+1 {
		t.Fatalf("claim after release: epoch %d, want %d", e3, e2+1)
	}
}

// testRegisterAgain pins down RegisterNode on a live incarnation: it
// renews, so a shorter expiry leaves the lease as it was and a longer one
// extends it; once the lease ran out, it is ErrNodeExpired.
func testRegisterAgain(t *testing.T, h *harness) {
	owned := func(other, when string) {
		t.Helper()
		h.register(other, time.Second)
		_, err := h.s.ClaimSession(h.ctx, "t", "s", other, h.nowMS())
		h.wantErr(err, runtime.ErrSessionOwned, "claim of n's session "+when)
		if got, err := h.s.OrphanedSessions(h.ctx, h.nowMS()); err != nil || len(got) != 0 {
			t.Fatalf("orphans %s = %+v, %v; want none: n is alive", when, got, err)
		}
	}
	h.register("n", 10*time.Second) // lease until t0+10s
	h.claim("t", "s", "n")
	h.create("t", "s", "r", "")
	// A second registration with a shorter lease (t0+1s) keeps t0+10s.
	h.register("n", time.Second)
	h.clock.Advance(5 * time.Second)
	owned("other1", "at t0+5s, after a registration that asked for t0+1s")
	// A longer one (t0+25s) extends it past the first lease.
	h.register("n", 20*time.Second)
	h.clock.Advance(8 * time.Second)
	owned("other2", "at t0+13s, after a registration that asked for t0+25s")
	if err := h.s.RenewNode(h.ctx, "n", h.nowMS()+time.Second.Milliseconds()); err != nil {
		t.Fatalf("RenewNode of the live n: %v", err)
	}
	// Its lease runs out at t0+25s: n is dead, and stays dead.
	h.clock.Advance(13 * time.Second)
	err := h.s.RegisterNode(h.ctx, "n", h.nowMS()+time.Hour.Milliseconds())
	h.wantErr(err, runtime.ErrNodeExpired, "registering n again after its lease ran out")
	err = h.s.RenewNode(h.ctx, "n", h.nowMS()+time.Hour.Milliseconds())
	h.wantErr(err, runtime.ErrNodeExpired, "renewing n after the refused registration")
	if got, err := h.s.OrphanedSessions(h.ctx, h.nowMS()); err != nil || len(got) != 1 || got[0].Owner != "n" {
		t.Fatalf("orphans after n died = %+v, %v; want t/s owned by n", got, err)
	}
}

func testOrphans(t *testing.T, h *harness) {
	orphans := func() []string {
		t.Helper()
		got, err := h.s.OrphanedSessions(h.ctx, h.nowMS())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range got {
			out = append(out, fmt.Sprintf("%s/%s:%s@%d", o.Tenant, o.Session, o.Owner, o.Epoch))
		}
		return out
	}
	h.register("a", 10*time.Second)
	// A session with a live Run and no owner is an orphan (acknowledged,
	// never started).
	h.create("t", "unowned", "r0", "")
	if got := fmt.Sprint(orphans()); got != "[t/unowned:@0]" {
		t.Fatalf("orphans = %s", got)
	}
	e := h.claim("t", "owned", "a")
	r := h.create("t", "owned", "r1", "")
	r = h.toExecuting(r, e)
	h.claim("t", "unowned", "a")
	h.claim("t2", "idle", "a") // owned, but no Run: never an orphan
	if got := orphans(); len(got) != 0 {
		t.Fatalf("orphans with a live owner = %v", got)
	}
	h.clock.Advance(11 * time.Second)
	if got := fmt.Sprint(orphans()); got != "[t/owned:a@1 t/unowned:a@1]" {
		t.Fatalf("orphans after a died = %s", got)
	}
	h.register("b", 10*time.Second)
	eb := h.claim("t", "owned", "b")
	exec, err := h.s.ExecutingEffects(h.ctx, "t", "owned")
	if err != nil || len(exec) != 1 || exec[0].Epoch != e {
		t.Fatalf("executing effects of the orphan = %+v, %v", exec, err)
	}
	r = h.toCompleted(r, eb)
	// Its only Run ended: no longer an orphan whoever owns it.
	h.clock.Advance(11 * time.Second)
	if got := fmt.Sprint(orphans()); got != "[t/unowned:a@1]" {
		t.Fatalf("orphans after the owned session ended = %s", got)
	}
	h.checkIndexes("t", "owned", "unowned")
}

// testCreationClaims: a creation with a Claimant claims the session for it
// when no one owns it, as ClaimSession would (epoch 1 for a new session;
// the same epoch when the claimant holds it already), and claims nothing
// when another live incarnation owns it, when the claimant's lease ran
// out or it is unknown, or when the creation writes no Run. The claim
// fences like any other: after a takeover, the claimant's commit at its
// epoch is refused.
func testCreationClaims(t *testing.T, h *harness) {
	h.register("node-a", 10*time.Second)
	h.register("node-b", 10*time.Second)
	create := func(session, id, claimant, cmd string) runtime.CreateResult {
		t.Helper()
		req := h.createReq("t", session, id, cmd)
		req.Claimant = claimant
		res, err := h.s.CreateRun(h.ctx, req)
		if err != nil {
			t.Fatalf("CreateRun %s in %s by %q: %v", id, session, claimant, err)
		}
		return res
	}
	if res := create("s", "r1", "node-a", "k1"); res.Epoch != 1 || res.Ordinal != 1 {
		t.Fatalf("the first Run of a new session: epoch %d, ordinal %d; want 1, 1", res.Epoch, res.Ordinal)
	}
	if e := h.claim("t", "s", "node-a"); e != 1 {
		t.Fatalf("node-a claiming the session its creation claimed: epoch %d, want 1", e)
	}
	if res := create("s", "r2", "node-a", ""); res.Epoch != 1 || res.Ordinal != 2 {
		t.Fatalf("a second Run by the owner: epoch %d, ordinal %d; want 1, 2", res.Epoch, res.Ordinal)
	}
	if res := create("s", "r3", "node-b", ""); res.Epoch != 0 || res.Ordinal != 3 {
		t.Fatalf("a Run by another live node: epoch %d, ordinal %d; want 0, 3", res.Epoch, res.Ordinal)
	}
	if res := create("plain", "p1", "", ""); res.Epoch != 0 {
		t.Fatalf("a creation without a claimant: epoch %d", res.Epoch)
	}
	if res := create("other", "o1", "node-b", "k1"); !res.Duplicate || res.Epoch != 0 {
		t.Fatalf("a repeated command: %+v; want a duplicate and no claim", res)
	}
	used := h.createReq("t", "other", "r1", "")
	used.Claimant = "node-b"
	_, err := h.s.CreateRun(h.ctx, used)
	h.wantErr(err, runtime.ErrRunExists, "a used run ID")
	if res := create("ghost", "g1", "node-x", ""); res.Epoch != 0 {
		t.Fatalf("an unknown claimant: epoch %d", res.Epoch)
	}
	if got, want := h.active("", "", 10), []string{"t/ghost:@0", "t/plain:@0", "t/s:node-a@1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("active sessions: %v, want %v", got, want)
	}

	// node-a stalls past its lease: its creations claim nothing, and its
	// session passes to node-c, which fences node-a's commits at the
	// epoch its creation claimed.
	h.clock.Advance(11 * time.Second)
	if res := create("late", "l1", "node-a", ""); res.Epoch != 0 {
		t.Fatalf("a claimant whose lease ran out: epoch %d", res.Epoch)
	}
	h.register("node-c", 10*time.Second)
	if e := h.claim("t", "late", "node-c"); e != 1 {
		t.Fatalf("node-c claiming the session node-a's late creation left: epoch %d, want 1", e)
	}
	if e := h.claim("t", "s", "node-c"); e != 2 {
		t.Fatalf("takeover by node-c: epoch %d, want 2", e)
	}
	_, err = h.s.Commit(h.ctx, h.step(h.load("t", "r1"), 1, "", started()))
	h.wantErr(err, runtime.ErrFenced, "node-a's commit at the epoch its creation claimed, after the takeover")
	h.checkIndexes("t", "s", "plain", "other", "ghost", "late")
}

// StepsFirstRuns implements runtime.FirstStepper: StepFirstRuns says.
func (s *MemStore) StepsFirstRuns() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stepsFirst
}

// testFirstStep: a creation that carries its first step (CreateRun.
// FirstStep) writes it with the Run exactly when the port allows, in a
// store that steps: the session's first Run, claimed by the creation at
// the step's epoch. The stepped Run reads back as the step left it, with
// the step's events after its first and its dispatched effect among the
// session's executing ones. Anywhere else (a session's second Run, a
// session another node owns, another epoch, no claimant or none with a
// live lease, a store that never steps), the Run is written alone, as without the step; a
// repeated creation returns the Run as it stands and writes nothing; and
// a malformed step is refused with nothing written.
func testFirstStep(t *testing.T, h *harness) {
	steps := false
	if fs, ok := h.s.(runtime.FirstStepper); ok {
		steps = fs.StepsFirstRuns()
	}
	h.register("node-a", 10*time.Second)
	h.register("node-b", 10*time.Second)
	// withStep is the creation of run id in session by claimant, with the
	// first step the driver would commit under epoch.
	withStep := func(session, id, claimant, cmd string, epoch uint64) runtime.CreateRun {
		t.Helper()
		req := h.createReq("t", session, id, cmd)
		req.Claimant = claimant
		c := h.step(req.Run, epoch, "", started(), planned(req.Run))
		m := loop.ModelEffectID(id, 1)
		next := h.step(c.Run, epoch, "", dispatched(m, 1, epoch))
		req.FirstStep = &runtime.FirstStep{Events: append(c.Events, next.Events...), Run: next.Run, Epoch: epoch}
		return req
	}
	create := func(req runtime.CreateRun) runtime.CreateResult {
		t.Helper()
		res, err := h.s.CreateRun(h.ctx, req)
		if err != nil {
			t.Fatalf("CreateRun %s in %s: %v", req.Run.ID, req.Run.Session, err)
		}
		return res
	}
	// wantAlone checks that run id was written without its step.
	wantAlone := func(res runtime.CreateResult, id, why string) {
		t.Helper()
		if res.Stepped || res.Run.Seq != 1 {
			t.Fatalf("%s: Stepped %v, Seq %d; want the Run alone, at Seq 1", why, res.Stepped, res.Run.Seq)
		}
		if r := h.load("t", id); r.Seq != 1 || r.Status != loop.StatusPending {
			t.Fatalf("%s: the stored Run is at Seq %d, %s; want 1, pending", why, r.Seq, r.Status)
		}
		if evs := h.events("t", id, 0, 0); len(evs) != 1 {
			t.Fatalf("%s: %d events stored, want run_created alone", why, len(evs))
		}
	}

	req := withStep("s", "r1", "node-a", "k1", 1)
	res := create(req)
	if res.Epoch != 1 || res.Ordinal != 1 {
		t.Fatalf("the first Run of a new session: epoch %d, ordinal %d; want 1, 1", res.Epoch, res.Ordinal)
	}
	if !steps {
		wantAlone(res, "r1", "a store that never steps")
	} else {
		if !res.Stepped || !sameJSON(res.Run, req.FirstStep.Run) {
			t.Fatalf("the first Run of a new session, claimed by its creation: Stepped %v, Seq %d; want the step's snapshot, Seq %d",
				res.Stepped, res.Run.Seq, req.FirstStep.Run.Seq)
		}
		if !sameJSON(h.load("t", "r1"), req.FirstStep.Run) {
			t.Fatal("the stepped Run does not load as the step left it")
		}
		evs := h.events("t", "r1", 0, 0)
		if len(evs) != 1+len(req.FirstStep.Events) || evs[0].Type != loop.EventRunCreated {
			t.Fatalf("the stepped Run's log: %v; want run_created then the step's %v", eventTypes(evs), eventTypes(req.FirstStep.Events))
		}
		for i, ev := range req.FirstStep.Events {
			if !sameJSON(evs[i+1], ev) {
				t.Fatalf("event %d of the stepped Run's log is not the step's", ev.Seq)
			}
		}
		recs, err := h.s.ExecutingEffects(h.ctx, "t", "s")
		if err != nil || len(recs) != 1 || recs[0].EffectID != loop.ModelEffectID("r1", 1) || recs[0].Epoch != 1 {
			t.Fatalf("the session's executing effects after the step: %+v, %v; want r1's model call at epoch 1", recs, err)
		}
		h.wantStored("t", h.held("t", "r1", "k1"), "after a stepped creation")
		// The step is the Run's next commit: the driver goes on from it.
		h.commit(req.FirstStep.Run, 1, "", answered(loop.ModelEffectID("r1", 1), 1, "4"))
	}
	// A repeated creation returns the Run as it stands, and writes nothing.
	now := h.load("t", "r1")
	if again := create(req); !again.Duplicate || again.Stepped || again.Run.Seq != now.Seq || h.load("t", "r1").Seq != now.Seq {
		t.Fatalf("the creation repeated: duplicate %v, stepped %v, Seq %d; want a duplicate of the Run as it stands (Seq %d), not stepped",
			again.Duplicate, again.Stepped, again.Run.Seq, now.Seq)
	}
	wantAlone(create(withStep("s", "r2", "node-a", "", 1)), "r2", "the session's second Run")
	wantAlone(create(withStep("b", "b1", "node-b", "", 2)), "b1", "a step made under an epoch the claim does not take")
	h.claim("t", "owned", "node-b")
	wantAlone(create(withStep("owned", "o1", "node-a", "", 1)), "o1", "a session another node owns")
	wantAlone(create(withStep("ghost", "g1", "node-x", "", 1)), "g1", "a claimant with no live lease")

	bad := withStep("bad", "x1", "node-a", "", 1)
	bad.FirstStep.Events[0].Seq = 7
	_, err := h.s.CreateRun(h.ctx, bad)
	h.wantErr(err, runtime.ErrInvalidRequest, "a first step whose events do not follow run_created")
	if _, err := h.s.LoadRun(h.ctx, "t", "x1"); !errors.Is(err, runtime.ErrRunNotFound) {
		t.Fatalf("a refused creation wrote its Run: %v", err)
	}
	wantAlone(create(withStep("plain", "p1", "", "", 1)), "p1", "a creation without a claimant")
}

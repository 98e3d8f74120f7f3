package conformance

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here hold a store to its promises about a Run's
// life: creation, loading, commits under compare-and-set, the command
// IDs that make a retry a duplicate, and the event log.

func testCreateLoad(t *testing.T, h *harness) {
	res, err := h.s.CreateRun(h.ctx, h.createReq("t1", "s1", "r1", ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Ordinal != 1 || res.Duplicate || res.Run.Seq != 1 || res.Run.Status != loop.StatusPending {
		t.Fatalf("CreateRun = ordinal %d duplicate %v seq %d status %s", res.Ordinal, res.Duplicate, res.Run.Seq, res.Run.Status)
	}
	got := h.load("t1", "r1")
	if !sameJSON(got, res.Run) {
		t.Fatalf("LoadRun differs from the created snapshot:\n%+v\n%+v", got, res.Run)
	}
	evs := h.events("t1", "r1", 0, 0)
	if len(evs) != 1 || evs[0].Type != loop.EventRunCreated || evs[0].Seq != 1 || evs[0].Spec == nil || evs[0].Spec.ID != "r1" {
		t.Fatalf("events after create = %+v, want one run_created with Seq 1", evs)
	}
	// The caller owns what it got back: changing it does not reach the store.
	got.Transcript[0].Content = "changed"
	got.Status = loop.StatusFailed
	if again := h.load("t1", "r1"); again.Transcript[0].Content != "what is 2+2?" || again.Status != loop.StatusPending {
		t.Fatalf("a change to a returned snapshot reached the store: %+v", again)
	}
	_, err = h.s.LoadRun(h.ctx, "t1", "nope")
	h.wantErr(err, runtime.ErrRunNotFound, "LoadRun of a missing run")
	_, err = h.s.LoadRun(h.ctx, "t2", "r1")
	h.wantErr(err, runtime.ErrRunNotFound, "LoadRun of the run under another tenant")
	h.checkIndexes("t1", "s1")
}

func testInvalidIDs(t *testing.T, h *harness) {
	long := strings.Repeat("x", loop.MaxIDLen+1)
	for _, bad := range []string{"", "a/b", "a.b", "a b", long, "é"} {
		req := h.createReq("t", "s", "r", "")
		req.Run.ID, req.Event.Spec.ID = bad, bad
		_, err := h.s.CreateRun(h.ctx, req)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("CreateRun with run id %q", bad))
		req = h.createReq("t", "s", "r", "")
		req.Run.Tenant, req.Event.Spec.Tenant = bad, bad
		_, err = h.s.CreateRun(h.ctx, req)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("CreateRun with tenant %q", bad))
		req = h.createReq("t", "s", "r", "")
		req.Run.Session, req.Event.Spec.Session = bad, bad
		_, err = h.s.CreateRun(h.ctx, req)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("CreateRun with session %q", bad))
		_, err = h.s.LoadRun(h.ctx, bad, "r")
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("LoadRun with tenant %q", bad))
		_, err = h.s.Events(h.ctx, "t", bad, 0, 0)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("Events of run %q", bad))
		_, err = h.s.SessionRuns(h.ctx, "t", bad, 0, 0)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("SessionRuns of session %q", bad))
		_, err = h.s.ActiveRuns(h.ctx, bad, "s")
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("ActiveRuns of tenant %q", bad))
		_, err = h.s.RunsByStatus(h.ctx, bad, loop.StatusPending, "", 0)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("RunsByStatus of tenant %q", bad))
		_, err = h.s.RunsByStatusDesc(h.ctx, bad, loop.StatusPending, "", 0)
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("RunsByStatusDesc of tenant %q", bad))
		_, err = h.s.Commit(h.ctx, runtime.Commit{Tenant: "t", Session: "s", RunID: bad})
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("Commit to run %q", bad))
		_, err = h.s.KVGet(h.ctx, bad, "p", []byte("k"))
		h.wantErr(err, loop.ErrInvalidID, fmt.Sprintf("KVGet of tenant %q", bad))
	}
	// A 64-character ID is inside the grammar.
	max := strings.Repeat("y", loop.MaxIDLen)
	h.create(max, max, max, "")
	h.load(max, max)
	if runs, err := h.s.RunsByStatus(h.ctx, "t", loop.StatusPending, "", 0); err != nil || len(runs) != 0 {
		t.Fatalf("refused creations left runs behind: %v %v", runs, err)
	}
}

func testRunExists(t *testing.T, h *harness) {
	r := h.create("t", "s", "r1", "")
	_, err := h.s.CreateRun(h.ctx, h.createReq("t", "s", "r1", ""))
	h.wantErr(err, runtime.ErrRunExists, "second CreateRun of r1")
	_, err = h.s.CreateRun(h.ctx, h.createReq("t", "other", "r1", ""))
	h.wantErr(err, runtime.ErrRunExists, "CreateRun of r1 in another session of the tenant")
	// Still exists once terminal.
	r = h.toCompleted(h.toExecuting(r, 0), 0)
	_, err = h.s.CreateRun(h.ctx, h.createReq("t", "s", "r1", "fresh-command"))
	h.wantErr(err, runtime.ErrRunExists, "CreateRun of a completed run's ID")
	// The same ID in another tenant is another Run.
	h.create("t2", "s", "r1", "")
	if got := h.load("t", "r1"); got.Status != loop.StatusCompleted || got.Seq != r.Seq {
		t.Fatalf("refused creations changed run t/r1: %+v", got)
	}
	if runs, _ := h.s.SessionRuns(h.ctx, "t", "other", 0, 0); len(runs) != 0 {
		t.Fatalf("a refused creation placed a run in session other: %+v", runs)
	}
	h.checkIndexes("t", "s", "other")
}

func testCreateIdempotent(t *testing.T, h *harness) {
	first, err := h.s.CreateRun(h.ctx, h.createReq("t", "s", "r1", "submit-1"))
	if err != nil {
		t.Fatal(err)
	}
	// The acknowledgement was lost and the client retries, even with a
	// different payload: the first Run comes back and nothing is written.
	again, err := h.s.CreateRun(h.ctx, h.createReq("t", "s2", "r2", "submit-1"))
	if err != nil {
		t.Fatalf("retried CreateRun: %v", err)
	}
	if !again.Duplicate || again.Ordinal != first.Ordinal || !sameJSON(again.Run, first.Run) {
		t.Fatalf("retried CreateRun = %+v, want the first Run with Duplicate", again)
	}
	_, err = h.s.LoadRun(h.ctx, "t", "r2")
	h.wantErr(err, runtime.ErrRunNotFound, "the retried payload's run")
	if runs, _ := h.s.SessionRuns(h.ctx, "t", "s2", 0, 0); len(runs) != 0 {
		t.Fatalf("the retried CreateRun wrote to session s2: %+v", runs)
	}
	if evs := h.events("t", "r1", 0, 0); len(evs) != 1 {
		t.Fatalf("the retried CreateRun appended events: %+v", evs)
	}
	// After the Run moved on, a retry still gets it (as it is now).
	r := h.commit(first.Run, 0, "", started())
	again, err = h.s.CreateRun(h.ctx, h.createReq("t", "s", "r1", "submit-1"))
	if err != nil || !again.Duplicate || again.Run.Seq != r.Seq {
		t.Fatalf("retry after progress = %+v, %v", again, err)
	}
	// Command IDs are scoped to the tenant.
	other, err := h.s.CreateRun(h.ctx, h.createReq("u", "s", "r9", "submit-1"))
	if err != nil || other.Duplicate {
		t.Fatalf("the same command ID in another tenant: %+v, %v", other, err)
	}
	h.checkIndexes("t", "s", "s2")
}

func testVersionConflict(t *testing.T, h *harness) {
	r0 := h.create("t", "s", "r", "")
	r1 := h.commit(r0, 0, "", started())
	// A second writer decided on the older snapshot.
	stale := h.step(r0, 0, "", started())
	_, err := h.s.Commit(h.ctx, stale)
	h.wantErr(err, runtime.ErrVersionConflict, "commit expecting Seq 1 after Seq 2")
	ahead := h.step(r1, 0, "", planned(r1))
	ahead.ExpectedSeq, ahead.Events[0].Seq, ahead.Run.Seq = 5, 6, 6
	_, err = h.s.Commit(h.ctx, ahead)
	h.wantErr(err, runtime.ErrVersionConflict, "commit expecting a future Seq")
	if got := h.load("t", "r"); !sameJSON(got, r1) {
		t.Fatalf("conflicting commits changed the snapshot: %+v", got)
	}
	if evs := h.events("t", "r", 0, 0); len(evs) != 2 {
		t.Fatalf("conflicting commits appended events: %d events", len(evs))
	}
	// Reload and decide again: it goes through.
	h.commit(h.load("t", "r"), 0, "", planned(r1))
	_, err = h.s.Commit(h.ctx, h.step(r0, 0, "", started()))
	h.wantErr(err, runtime.ErrVersionConflict, "commit to a missing Seq")
	c := h.step(r1, 0, "", planned(r1))
	c.RunID, c.Run.ID = "missing", "missing"
	_, err = h.s.Commit(h.ctx, c)
	h.wantErr(err, runtime.ErrRunNotFound, "commit to a missing run")
	h.checkIndexes("t", "s")
}

func testAlsoCommandIDs(t *testing.T, h *harness) {
	r := h.toExecuting(h.create("t", "s", "r", ""), 0)
	eff := loop.ModelEffectID("r", 1)
	n := 0
	next := func(cmd string, also ...string) runtime.Commit {
		n++
		c := h.step(h.load("t", "r"), 0, cmd, pending(eff, 1, fmt.Sprintf("h%d", n)))
		c.AlsoCommandIDs = also
		return c
	}
	// One commit applies three commands: each is recorded, and counted in
	// the tenant's stored bytes.
	res, err := h.s.Commit(h.ctx, next("first", "second", "third"))
	if err != nil || res.Duplicate {
		t.Fatalf("commit with further command IDs: %+v, %v", res, err)
	}
	r = h.load("t", "r")
	h.wantStored("t", h.held("t", "r", "first", "second", "third"), "after a commit of three commands")
	for _, cmd := range []string{"first", "second", "third"} {
		res, err := h.s.Commit(h.ctx, next(cmd))
		if err != nil || !res.Duplicate || res.Seq != r.Seq {
			t.Fatalf("commit under %q after it was applied: %+v, %v; want a duplicate at Seq %d", cmd, res, err, r.Seq)
		}
	}
	// A commit that also applies a command applied before writes nothing.
	_, err = h.s.Commit(h.ctx, next("fourth", "fifth", "second"))
	h.wantErr(err, runtime.ErrVersionConflict, "a commit that also applies an applied command")
	if got := h.load("t", "r"); got.Seq != r.Seq {
		t.Fatalf("the refused commit wrote: Seq %d, want %d", got.Seq, r.Seq)
	}
	if res, err := h.s.Commit(h.ctx, next("fifth")); err != nil || res.Duplicate {
		t.Fatalf("the refused commit recorded its further command: %+v, %v", res, err)
	}
	// However many it carries: one applied before at the end of a long
	// list refuses the commit, and a long list is recorded whole.
	many := make([]string, 20)
	for i := range many {
		many[i] = fmt.Sprintf("many%d", i)
	}
	_, err = h.s.Commit(h.ctx, next("seventh", append(slices.Clone(many[:19]), "first")...))
	h.wantErr(err, runtime.ErrVersionConflict, "a commit whose twentieth further command was applied")
	if res, err := h.s.Commit(h.ctx, next("seventh", many...)); err != nil || res.Duplicate {
		t.Fatalf("a commit of twenty further commands: %+v, %v", res, err)
	}
	r = h.load("t", "r")
	for _, cmd := range many {
		if res, err := h.s.Commit(h.ctx, next(cmd)); err != nil || !res.Duplicate || res.Seq != r.Seq {
			t.Fatalf("commit under %q after a commit applied it with nineteen others: %+v, %v; want a duplicate at Seq %d", cmd, res, err, r.Seq)
		}
	}
	// Malformed lists are refused.
	for name, c := range map[string]runtime.Commit{
		"empty": next("sixth", ""), "twice": next("sixth", "x", "x"), "the command itself": next("sixth", "sixth"), "without a command ID": next("", "x"),
	} {
		_, err := h.s.Commit(h.ctx, c)
		h.wantErr(err, runtime.ErrInvalidRequest, "further command IDs "+name)
	}
	h.checkIndexes("t", "s")
}

func testCommitIdempotent(t *testing.T, h *harness) {
	r := h.create("t", "s", "r", "")
	r = h.toExecuting(r, 0)
	eff := loop.ModelEffectID("r", 1)
	cmd := loop.SettleCommandID(eff, 1)
	settle := h.step(r, 0, cmd, answered(eff, 1, "first answer"))
	res, err := h.s.Commit(h.ctx, settle)
	if err != nil || res.Duplicate || res.Seq != settle.Run.Seq {
		t.Fatalf("first settlement: %+v, %v", res, err)
	}
	// The acknowledgement was lost: the same commit again.
	res, err = h.s.Commit(h.ctx, settle)
	if err != nil || !res.Duplicate || res.Seq != settle.Run.Seq {
		t.Fatalf("retried settlement = %+v, %v; want the first result with Duplicate", res, err)
	}
	// Another process settles the same attempt with another outcome, from the
	// snapshot it had: the first settlement wins, nothing is written.
	other := h.step(r, 0, cmd, answered(eff, 1, "second answer"))
	res, err = h.s.Commit(h.ctx, other)
	if err != nil || !res.Duplicate || res.Seq != settle.Run.Seq {
		t.Fatalf("second settlement = %+v, %v; want the first result with Duplicate", res, err)
	}
	// Even a payload that would be refused (bad epoch, malformed) is
	// answered from the first result: the lookup comes first.
	odd := other
	odd.Epoch = 99
	odd.Events = nil
	res, err = h.s.Commit(h.ctx, odd)
	if err != nil || !res.Duplicate || res.Seq != settle.Run.Seq {
		t.Fatalf("retry with a different payload = %+v, %v; want the first result", res, err)
	}
	got := h.load("t", "r")
	if !sameJSON(got, settle.Run) || got.Transcript[len(got.Transcript)-1].Content != "first answer" {
		t.Fatalf("snapshot after retries = %+v", got)
	}
	// The Run moves on; a late retry still gets the first result.
	r = h.commit(got, 0, "complete", completed())
	res, err = h.s.Commit(h.ctx, settle)
	if err != nil || !res.Duplicate || res.Seq != settle.Run.Seq {
		t.Fatalf("late retry = %+v, %v", res, err)
	}
	if evs := h.events("t", "r", 0, 0); int64(len(evs)) != r.Seq {
		t.Fatalf("%d events for Seq %d: a duplicate wrote", len(evs), r.Seq)
	}
	h.checkIndexes("t", "s")
}

func testCommandScope(t *testing.T, h *harness) {
	a := h.create("t", "s", "a", "")
	b := h.create("t", "s", "b", "")
	h.commit(a, 0, "start", started())
	// The same command ID on another Run is another command.
	h.commit(b, 0, "start", started())
	if got := h.load("t", "b"); got.Status != loop.StatusRunning {
		t.Fatalf("run b = %s, want running", got.Status)
	}
}

func testMalformedCommit(t *testing.T, h *harness) {
	r := h.create("t", "s", "r", "")
	cases := map[string]func(c *runtime.Commit){
		"no events":                    func(c *runtime.Commit) { c.Events = nil },
		"events not numbered from Seq": func(c *runtime.Commit) { c.Events[0].Seq = 7 },
		"snapshot Seq not Seq+len":     func(c *runtime.Commit) { c.Run.Seq = 5 },
		"snapshot of another run":      func(c *runtime.Commit) { c.Run.ID = "x" },
		"session not the run's":        func(c *runtime.Commit) { c.Session, c.Run.Session = "s2", "s2" },
	}
	for name, mutate := range cases {
		c := h.step(r, 0, "", started())
		mutate(&c)
		_, err := h.s.Commit(h.ctx, c)
		h.wantErr(err, runtime.ErrInvalidRequest, "commit with "+name)
	}
	if got := h.load("t", "r"); got.Seq != 1 {
		t.Fatalf("malformed commits wrote: Seq %d", got.Seq)
	}
	req := h.createReq("t", "s", "r2", "")
	req.Run.Seq = 3
	_, err := h.s.CreateRun(h.ctx, req)
	h.wantErr(err, runtime.ErrInvalidRequest, "CreateRun of a snapshot with Seq 3")
	req = h.createReq("t", "s", "r2", "")
	req.Event.Type = loop.EventRunStarted
	_, err = h.s.CreateRun(h.ctx, req)
	h.wantErr(err, runtime.ErrInvalidRequest, "CreateRun whose event is not run_created")
	h.checkIndexes("t", "s")
}

func testEvents(t *testing.T, h *harness) {
	r := h.create("t", "s", "r", "")
	r = h.toExecuting(r, 0)
	for i := range 5 {
		r = h.commit(r, 0, "", pending(loop.ModelEffectID("r", 1), 1, fmt.Sprintf("h%d", i)))
	}
	all := h.events("t", "r", 0, 0)
	if int64(len(all)) != r.Seq {
		t.Fatalf("%d events, want %d", len(all), r.Seq)
	}
	wantTypes := []loop.EventType{loop.EventRunCreated, loop.EventRunStarted, loop.EventModelStepPlanned, loop.EventEffectDispatched}
	for i, ev := range all {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has Seq %d", i, ev.Seq)
		}
		if i < len(wantTypes) && ev.Type != wantTypes[i] {
			t.Fatalf("event %d is %s, want %s", i+1, ev.Type, wantTypes[i])
		}
		if i >= len(wantTypes) && ev.Handle != fmt.Sprintf("h%d", i-len(wantTypes)) {
			t.Fatalf("event %d has handle %q", i+1, ev.Handle)
		}
	}
	if string(all[2].Request) != `{"model":"test"}` {
		t.Fatalf("the model request did not survive the log: %s", all[2].Request)
	}
	// Replaying the log rebuilds the snapshot.
	var replay loop.Run
	for _, ev := range all {
		var err error
		if replay, err = loop.Apply(replay, ev); err != nil {
			t.Fatalf("replay of event %d: %v", ev.Seq, err)
		}
	}
	if !sameJSON(replay, h.load("t", "r")) {
		t.Fatal("replaying the event log does not give the stored snapshot")
	}
	part := h.events("t", "r", 3, 2)
	if len(part) != 2 || part[0].Seq != 3 || part[1].Seq != 4 {
		t.Fatalf("Events(from 3, limit 2) = %v", part)
	}
	if tail := h.events("t", "r", r.Seq, 10); len(tail) != 1 || tail[0].Seq != r.Seq {
		t.Fatalf("Events(from last) = %v", tail)
	}
	if none := h.events("t", "r", r.Seq+1, 0); len(none) != 0 {
		t.Fatalf("Events past the end = %v", none)
	}
	_, err := h.s.Events(h.ctx, "t", "missing", 0, 0)
	h.wantErr(err, runtime.ErrRunNotFound, "Events of a missing run")
}

// testSessionIdle: a commit that ends a Run says whether it left its
// session with no live Run (CommitResult.SessionIdle): not while another
// Run of the session is live (whatever the other sessions and tenants
// hold), not for a commit that does not end its Run, not for a
// duplicate; yes for the end of the last one, and again when a Run
// created in the session later ends.
func testSessionIdle(t *testing.T, h *harness) {
	commit := func(c runtime.Commit) runtime.CommitResult {
		t.Helper()
		res, err := h.s.Commit(h.ctx, c)
		if err != nil {
			t.Fatalf("commit %v to run %s: %v", eventTypes(c.Events), c.RunID, err)
		}
		return res
	}
	// end answers r's model step and, in a commit of its own under cmd,
	// completes it; it returns that commit and its result.
	end := func(r loop.Run, cmd string) (runtime.Commit, runtime.CommitResult) {
		t.Helper()
		answer := h.step(r, 0, "", answered(loop.ModelEffectID(r.ID, r.Step), 1, "4"))
		if res := commit(answer); res.SessionIdle {
			t.Fatalf("a commit that does not end run %s says its session is idle", r.ID)
		}
		c := h.step(answer.Run, 0, cmd, completed())
		return c, commit(c)
	}
	r1 := h.toExecuting(h.create("t", "s", "r1", ""), 0)
	r2 := h.toExecuting(h.create("t", "s", "r2", ""), 0)
	h.create("t", "other", "o1", "")
	h.create("u", "s", "u1", "")
	if _, res := end(r1, "end-r1"); res.SessionIdle {
		t.Fatal("the end of r1 says the session is idle; r2 is live in it")
	}
	last, res := end(r2, "end-r2")
	if !res.SessionIdle {
		t.Fatal("the end of r2, the session's last live Run, does not say the session is idle")
	}
	if res := commit(last); !res.Duplicate || res.SessionIdle {
		t.Fatalf("the end of r2 committed again: %+v; want a duplicate that says nothing of the session", res)
	}
	r3 := h.toExecuting(h.create("t", "s", "r3", ""), 0)
	if _, res := end(r3, "end-r3"); !res.SessionIdle {
		t.Fatal("the end of r3, created in the idle session and its only live Run, does not say the session is idle")
	}
}

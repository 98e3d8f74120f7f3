package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here hold a store to what Prune deletes and keeps,
// and to TenantStoredBytes, which counts what each tenant holds through
// commits and prunes.

func testPrune(t *testing.T, h *harness) {
	// old: completed at t0+1s with command IDs; recent: completed later;
	// live: still running.
	h.clock.Advance(time.Second)
	old := h.create("t", "s", "old", "create-old")
	old = h.commit(old, 0, "start-old", started())
	old = h.commit(old, 0, "", planned(old), dispatched("old.m1", 1, 0))
	oldSettle := h.step(old, 0, loop.SettleCommandID("old.m1", 1), answered("old.m1", 1, "4"))
	if _, err := h.s.Commit(h.ctx, oldSettle); err != nil {
		t.Fatal(err)
	}
	old = h.commit(oldSettle.Run, 0, "", completed())
	cutoff := h.nowMS() + 1
	h.clock.Advance(time.Minute)
	recent := h.toCompleted(h.toExecuting(h.create("t", "s", "recent", ""), 0), 0)
	live := h.toExecuting(h.create("t2", "s", "live", ""), 0)

	st, err := h.s.Prune(h.ctx, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	// old has 6 events and 3 command IDs (its creation, start and settlement).
	if st != (runtime.PruneStats{Runs: 1, Events: int(old.Seq), Commands: 3}) {
		t.Fatalf("Prune = %+v, want {Runs:1 Events:%d Commands:3}", st, old.Seq)
	}
	if got := h.load("t", "old"); !sameJSON(got, old) {
		t.Fatal("Prune changed the snapshot of a pruned run")
	}
	if evs := h.events("t", "old", 0, 0); len(evs) != 0 {
		t.Fatalf("events of the pruned run = %d", len(evs))
	}
	if evs := h.events("t", "recent", 0, 0); int64(len(evs)) != recent.Seq {
		t.Fatalf("events of a recent run = %d, want %d", len(evs), recent.Seq)
	}
	if evs := h.events("t2", "live", 0, 0); int64(len(evs)) != live.Seq {
		t.Fatalf("events of a live run = %d, want %d", len(evs), live.Seq)
	}
	// The pruned command IDs are gone: a retry is decided afresh, and a
	// terminal Run refuses it as a conflict instead of a duplicate.
	_, err = h.s.Commit(h.ctx, oldSettle)
	h.wantErr(err, runtime.ErrVersionConflict, "retry of a pruned command")
	// The Run ID is still used, even through its pruned creation command.
	_, err = h.s.CreateRun(h.ctx, h.createReq("t", "s", "old", "create-old"))
	h.wantErr(err, runtime.ErrRunExists, "re-creating a pruned run")
	if again, err := h.s.Prune(h.ctx, cutoff); err != nil || again != (runtime.PruneStats{}) {
		t.Fatalf("second Prune = %+v, %v; want nothing", again, err)
	}
	// A later cutoff takes recent too, across tenants; live is never pruned.
	st, err = h.s.Prune(h.ctx, h.nowMS()+time.Hour.Milliseconds())
	if err != nil || st.Runs != 1 || st.Events != int(recent.Seq) {
		t.Fatalf("Prune of recent = %+v, %v", st, err)
	}
	if evs := h.events("t2", "live", 0, 0); int64(len(evs)) != live.Seq {
		t.Fatal("Prune touched a live run")
	}
	h.checkIndexes("t", "s")
	h.checkIndexes("t2", "s")
}

func testStoredBytes(t *testing.T, h *harness) {
	// Tenant a is asked about before it has a Run (a store that keeps a
	// running figure then keeps it from the first write on); tenant b
	// only after it has Runs (the figure is then read from what is there).
	h.wantStored("a", 0, "a tenant with no Runs")
	_, err := h.s.TenantStoredBytes(h.ctx, "not a tenant!")
	h.wantErr(err, loop.ErrInvalidID, "TenantStoredBytes of an invalid tenant ID")
	h.clock.Advance(time.Second)
	b1 := h.toExecuting(h.create("b", "s", "b1", "create-b1"), 0)

	first := h.create("a", "s", "r1", "create-r1")
	h.wantStored("a", h.held("a", "r1", "create-r1"), "after CreateRun")
	r1 := h.commit(first, 0, "start-r1", started(), planned(first))
	want := h.held("a", "r1", "create-r1", "start-r1")
	h.wantStored("a", want, "after a Commit with a command ID")
	r1 = h.commit(r1, 0, "", dispatched(loop.ModelEffectID("r1", 1), 1, 0))
	want = h.held("a", "r1", "create-r1", "start-r1")
	h.wantStored("a", want, "after a Commit without one")

	// What writes nothing counts nothing: a repeated creation, a repeated
	// command, a stale commit, a malformed one.
	if res, err := h.s.CreateRun(h.ctx, h.createReq("a", "s", "r1", "create-r1")); err != nil || !res.Duplicate {
		t.Fatalf("repeated CreateRun = %+v, %v; want a duplicate", res, err)
	}
	if _, err := h.s.CreateRun(h.ctx, h.createReq("a", "s", "r1", "")); !errors.Is(err, runtime.ErrRunExists) {
		t.Fatalf("CreateRun of a used run ID: %v, want ErrRunExists", err)
	}
	retry := h.step(h.load("a", "r1"), 0, "start-r1", pending(loop.ModelEffectID("r1", 1), 1, "h"))
	if res, err := h.s.Commit(h.ctx, retry); err != nil || !res.Duplicate {
		t.Fatalf("repeated command = %+v, %v; want a duplicate", res, err)
	}
	_, err = h.s.Commit(h.ctx, h.step(first, 0, "", started()))
	h.wantErr(err, runtime.ErrVersionConflict, "a stale commit")
	bad := h.step(r1, 0, "", pending(loop.ModelEffectID("r1", 1), 1, "h"))
	bad.Run.Seq++
	_, err = h.s.Commit(h.ctx, bad)
	h.wantErr(err, runtime.ErrInvalidRequest, "a malformed commit")
	h.wantStored("a", want, "after commits that wrote nothing")

	// A second Run of a, to the end; a tenant whose ID a is a prefix of
	// stays apart, and so does b.
	r2 := h.toCompleted(h.toExecuting(h.create("a", "s2", "r2", ""), 0), 0)
	want += h.held("a", "r2")
	h.wantStored("a", want, "with a second Run")
	h.toExecuting(h.create("ab", "s", "x", "create-x"), 0)
	h.wantStored("ab", h.held("ab", "x", "create-x"), "tenant ab")
	h.wantStored("b", h.held("b", "b1", "create-b1"), "tenant b, first asked after its Runs were written")
	h.wantStored("a", want, "tenant a, after writes of tenants ab and b")

	// Prune deletes the logs and command IDs of a's ended Runs: what is
	// left is their snapshots. b1 is still running and keeps its log.
	r1 = h.toCompleted(r1, 0)
	before := h.stored("a")
	h.clock.Advance(time.Minute)
	if _, err := h.s.Prune(h.ctx, h.nowMS()); err != nil {
		t.Fatal(err)
	}
	want = int64(len(runcodec.Append(nil, &r1)) + len(runcodec.Append(nil, &r2)))
	if evs := h.events("a", "r1", 0, 0); len(evs) != 0 {
		t.Fatalf("Prune left %d events of r1", len(evs))
	}
	h.wantStored("a", want, "after Prune")
	if want >= before {
		t.Fatalf("Prune left a at %d bytes, from %d", want, before)
	}
	h.wantStored("b", h.held("b", "b1", "create-b1"), "tenant b, after a Prune that spared it")
	_ = b1
}

package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// StoreConfig is how StoreSuite wants a store under test configured.
type StoreConfig struct {
	// Clock is the store's clock: what RenewNode reads to tell an expired
	// lease. The suite moves it.
	Clock *FakeClock
	// KV are the plugin KV limits the suite tests against.
	KV KVLimits
}

// The KV limits StoreSuite configures, small enough to reach in a test.
const (
	suiteKVMaxKey   = 16
	suiteKVMaxValue = 64
	suiteKVQuota    = 200
)

// StoreSuite holds a runtime.Store implementation to the port's contract.
// newStore must return a new, empty store configured with cfg (its clock
// and its KV limits); the suite closes it. Every subtest gets its own
// store and its own FakeClock, and is named after what it proves.
//
// Both conformance.MemStore and badgerstore.Store run it, so the fake
// cannot drift from the real store.
func StoreSuite(t *testing.T, newStore func(t *testing.T, cfg StoreConfig) runtime.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"create then load returns the snapshot and its first event", testCreateLoad},
		{"IDs outside the grammar are refused", testInvalidIDs},
		{"a used run ID is refused with ErrRunExists", testRunExists},
		{"CreateRun with a repeated command ID returns the first Run and writes nothing", testCreateIdempotent},
		{"a commit that expects a stale Seq is a version conflict and writes nothing", testVersionConflict},
		{"a commit from an old epoch is fenced after a takeover", testFencing},
		{"a commit records the further command IDs it applies, and is refused if one was applied", testAlsoCommandIDs},
		{"ClaimSessions claims a batch as ClaimSession would each, and reads each claimed session's active Runs", testClaimSessions},
		{"ClaimSessions refused for an expired node writes nothing", testClaimSessionsRefusedForAnExpiredNodeWritesNothing},
		{"ClaimSessions racing the end of its node's lease claims all of the batch or none", testClaimSessionsRacingTheNodesDeathClaimsAllOrNothing},
		{"a retried commit whose ack was lost returns the first result and writes nothing", testCommitIdempotent},
		{"command IDs of commits are scoped to their Run", testCommandScope},
		{"malformed commits are refused", testMalformedCommit},
		{"the event log comes back in order from a position with a limit", testEvents},
		{"indexes follow the snapshots through status changes", testIndexes},
		{"session runs come back in creation order with paging", testSessionOrder},
		{"the completed Runs before a Run are the last ones of its session, oldest first", testCompletedRunsBefore},
		{"lease expiry lets another incarnation take a session over", testTakeover},
		{"registering a live node again extends its lease and never shortens it", testRegisterAgain},
		{"orphaned sessions are those with live Runs and a dead or missing owner", testOrphans},
		{"an active session is listed with its owner, and with none before a claim", testActiveSessionsOwner},
		{"a session whose Runs are all terminal is not an active session", testActiveSessionsTerminal},
		{"active sessions page in (tenant, session) order, each exactly once", testActiveSessionsPaging},
		{"active sessions are listed across tenants", testActiveSessionsTenants},
		{"plugin KV enforces its limits and quota", testKV},
		{"tenants sessions and plugins whose IDs are prefixes of each other stay apart", testIsolation},
		{"prune removes old terminal logs and command IDs and keeps snapshots", testPrune},
		{"stored bytes count each Run's snapshot, log and command IDs, per tenant, through commits and prune", testStoredBytes},
		{"JSON escapes are not stored six times over", testJSONEscapesAreNotStoredSixTimesOver},
		{"close is safe twice and later calls give ErrClosed", testClose},
		{"concurrent committers see exactly the CAS winners", testHammer},
		{"concurrent creators get distinct session ordinals", testConcurrentCreate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewFakeClock(time.Time{})
			cfg := StoreConfig{Clock: clock, KV: KVLimits{MaxKeyBytes: suiteKVMaxKey, MaxValueBytes: suiteKVMaxValue, QuotaBytes: suiteKVQuota}}
			s := newStore(t, cfg)
			t.Cleanup(func() { _ = s.Close() })
			tc.fn(t, &harness{t: t, s: s, clock: clock, ctx: context.Background()})
		})
	}
}

// harness carries the store under test and helpers that build realistic
// snapshots with loop.Apply.
type harness struct {
	t     *testing.T
	s     runtime.Store
	clock *FakeClock
	ctx   context.Context
}

func (h *harness) nowMS() int64 { return h.clock.Now().UnixMilli() }

func testSpec(tenant, session, id string) loop.Spec {
	return loop.Spec{Tenant: tenant, Session: session, ID: id, Input: "what is 2+2?",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{{Name: "calc", Policy: loop.DefaultToolPolicy(false)}}}
}

// create makes a Run through CreateRun and returns its snapshot.
func (h *harness) create(tenant, session, id, cmd string) loop.Run {
	h.t.Helper()
	res, err := h.s.CreateRun(h.ctx, h.createReq(tenant, session, id, cmd))
	if err != nil {
		h.t.Fatalf("CreateRun %s/%s/%s: %v", tenant, session, id, err)
	}
	if res.Duplicate {
		h.t.Fatalf("CreateRun %s/%s/%s: Duplicate on a first creation", tenant, session, id)
	}
	return res.Run
}

func (h *harness) createReq(tenant, session, id, cmd string) runtime.CreateRun {
	h.t.Helper()
	ev := loop.RunCreated(testSpec(tenant, session, id), h.nowMS())
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		h.t.Fatalf("apply run_created: %v", err)
	}
	ev.Seq = 1
	return runtime.CreateRun{Run: r, Event: ev, CommandID: cmd}
}

// step applies evs to r and returns the Commit that records them.
func (h *harness) step(r loop.Run, epoch uint64, cmd string, evs ...loop.Event) runtime.Commit {
	h.t.Helper()
	c := runtime.Commit{Tenant: r.Tenant, Session: r.Session, RunID: r.ID, CommandID: cmd, ExpectedSeq: r.Seq, Epoch: epoch}
	for _, ev := range evs {
		if ev.At == 0 {
			ev.At = h.nowMS()
		}
		next, err := loop.Apply(r, ev)
		if err != nil {
			h.t.Fatalf("apply %s to run %s: %v", ev.Type, r.ID, err)
		}
		ev.Seq = next.Seq
		c.Events = append(c.Events, ev)
		r = next
	}
	c.Run = r
	return c
}

// commit applies evs to r, commits them and returns the new snapshot.
func (h *harness) commit(r loop.Run, epoch uint64, cmd string, evs ...loop.Event) loop.Run {
	h.t.Helper()
	c := h.step(r, epoch, cmd, evs...)
	res, err := h.s.Commit(h.ctx, c)
	if err != nil {
		h.t.Fatalf("commit %v to run %s: %v", eventTypes(c.Events), r.ID, err)
	}
	if res.Duplicate || res.Seq != c.Run.Seq {
		h.t.Fatalf("commit to run %s: got %+v, want Seq %d not duplicate", r.ID, res, c.Run.Seq)
	}
	return c.Run
}

func eventTypes(evs []loop.Event) []loop.EventType {
	var out []loop.EventType
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func started() loop.Event { return loop.Event{Type: loop.EventRunStarted} }

func planned(r loop.Run) loop.Event {
	return loop.Event{Type: loop.EventModelStepPlanned, Step: r.Step + 1, Request: json.RawMessage(`{"model":"test"}`)}
}

func dispatched(effectID string, attempt int, epoch uint64) loop.Event {
	return loop.Event{Type: loop.EventEffectDispatched, EffectID: effectID, Attempt: attempt, Epoch: epoch}
}

func pending(effectID string, attempt int, handle string) loop.Event {
	return loop.Event{Type: loop.EventEffectPending, EffectID: effectID, Attempt: attempt, Handle: handle}
}

func answered(effectID string, attempt int, text string) loop.Event {
	return loop.Settled(effectID, attempt, loop.Outcome{State: loop.OutcomeDone,
		Model: &abi.ModelOutcome{Message: abi.Message{Content: text}}}, 0)
}

func completed() loop.Event { return loop.Event{Type: loop.EventRunCompleted} }

// toExecuting drives a fresh Run to an executing model effect: RunCreated →
// RunStarted → ModelStepPlanned → EffectDispatched.
func (h *harness) toExecuting(r loop.Run, epoch uint64) loop.Run {
	h.t.Helper()
	r = h.commit(r, epoch, "", started(), planned(r))
	return h.commit(r, epoch, "", dispatched(loop.ModelEffectID(r.ID, r.Step), 1, epoch))
}

// toCompleted settles the executing model effect with a final answer and
// completes the Run.
func (h *harness) toCompleted(r loop.Run, epoch uint64) loop.Run {
	h.t.Helper()
	r = h.commit(r, epoch, "", answered(loop.ModelEffectID(r.ID, r.Step), 1, "4"))
	return h.commit(r, epoch, "", completed())
}

func (h *harness) load(tenant, id string) loop.Run {
	h.t.Helper()
	r, err := h.s.LoadRun(h.ctx, tenant, id)
	if err != nil {
		h.t.Fatalf("LoadRun %s/%s: %v", tenant, id, err)
	}
	return r
}

func (h *harness) events(tenant, id string, from int64, limit int) []loop.Event {
	h.t.Helper()
	evs, err := h.s.Events(h.ctx, tenant, id, from, limit)
	if err != nil {
		h.t.Fatalf("Events %s/%s from %d: %v", tenant, id, from, err)
	}
	return evs
}

// held is what a Run holds in the store as TenantStoredBytes counts it,
// read back through the port: its snapshot in the stores' binary form
// (internal/runcodec), its events' JSON as the stores write it
// (runcodec.MarshalJSON), and the command IDs cmds, which the caller
// knows are recorded for it.
func (h *harness) held(tenant, id string, cmds ...string) int64 {
	h.t.Helper()
	r := h.load(tenant, id)
	n := len(runcodec.Append(nil, &r))
	for _, ev := range h.events(tenant, id, 0, 0) {
		n += len(mustJSON(h.t, ev))
	}
	for _, c := range cmds {
		n += len(c)
	}
	return int64(n)
}

// stored is TenantStoredBytes of tenant.
func (h *harness) stored(tenant string) int64 {
	h.t.Helper()
	n, err := h.s.TenantStoredBytes(h.ctx, tenant)
	if err != nil {
		h.t.Fatalf("TenantStoredBytes %s: %v", tenant, err)
	}
	return n
}

// wantStored fails unless TenantStoredBytes of tenant is want.
func (h *harness) wantStored(tenant string, want int64, when string) {
	h.t.Helper()
	if got := h.stored(tenant); got != want {
		h.t.Fatalf("%s: TenantStoredBytes(%s) = %d, want %d (off by %d)", when, tenant, got, want, got-want)
	}
}

// mustJSON is v's JSON as the stores write it.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := runcodec.MarshalJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (h *harness) checkIndexes(tenant string, sessions ...string) {
	h.t.Helper()
	if err := CheckIndexes(h.ctx, h.s, tenant, sessions); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) wantErr(err, target error, what string) {
	h.t.Helper()
	if !errors.Is(err, target) {
		h.t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

func (h *harness) register(node string, ttl time.Duration) {
	h.t.Helper()
	if err := h.s.RegisterNode(h.ctx, node, h.nowMS()+ttl.Milliseconds()); err != nil {
		h.t.Fatalf("RegisterNode %s: %v", node, err)
	}
}

func (h *harness) claim(tenant, session, node string) uint64 {
	h.t.Helper()
	e, err := h.s.ClaimSession(h.ctx, tenant, session, node, h.nowMS())
	if err != nil {
		h.t.Fatalf("ClaimSession %s/%s by %s: %v", tenant, session, node, err)
	}
	return e
}

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
	// Malformed lists are refused.
	for name, c := range map[string]runtime.Commit{
		"empty": next("sixth", ""), "twice": next("sixth", "x", "x"), "the command itself": next("sixth", "sixth"), "without a command ID": next("", "x"),
	} {
		_, err := h.s.Commit(h.ctx, c)
		h.wantErr(err, runtime.ErrInvalidRequest, "further command IDs "+name)
	}
	h.checkIndexes("t", "s")
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
	if !errors.As(got[0].Err, &owned) || !errors.Is(got[0].Err, runtime.ErrSessionOwned) || owned.Owner != "node-b" || owned.Epoch != eb || got[0].Active != nil {
		t.Fatalf("a session a live node owns: %+v; want a SessionOwnedError naming node-b at epoch %d, and no Runs", got[0], eb)
	}
	want := []struct {
		epoch uint64
		runs  []loop.Run
	}{{}, {1, []loop.Run{f1, f2}}, {ec + 1, []loop.Run{d1}}, {ea, []loop.Run{m1}}, {1, nil}}
	for i := 1; i < len(batch); i++ {
		c := got[i]
		if c.Err != nil || c.Epoch != want[i].epoch {
			t.Fatalf("claim of %s: epoch %d, %v; want epoch %d", batch[i].Session, c.Epoch, c.Err, want[i].epoch)
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

func testIndexes(t *testing.T, h *harness) {
	ids := func(st loop.Status) []string {
		t.Helper()
		got, err := h.s.RunsByStatus(h.ctx, "t", st, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	a := h.create("t", "s", "a", "")
	b := h.create("t", "s", "b", "")
	c := h.create("t", "s", "c", "")
	if got := fmt.Sprint(ids(loop.StatusPending)); got != "[a b c]" {
		t.Fatalf("pending = %s", got)
	}
	a = h.toExecuting(a, 0)
	exec, err := h.s.ExecutingEffects(h.ctx, "t", "s")
	if err != nil || len(exec) != 1 || exec[0].EffectID != "a.m1" || exec[0].Attempt != 1 || exec[0].RunID != "a" ||
		exec[0].Tenant != "t" || exec[0].Session != "s" || exec[0].Handle != "" {
		t.Fatalf("executing effects = %+v, %v", exec, err)
	}
	a = h.commit(a, 0, "", pending("a.m1", 1, "job-7"))
	exec, _ = h.s.ExecutingEffects(h.ctx, "t", "s")
	if len(exec) != 1 || exec[0].Handle != "job-7" {
		t.Fatalf("executing effects after pending = %+v", exec)
	}
	h.checkIndexes("t", "s")
	// A model answer that asks for a tool call: the model effect settles, a
	// tool effect becomes ready, then executing.
	a = h.commit(a, 0, "", loop.Settled("a.m1", 1, loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{
		Message: abi.Message{ToolCalls: []abi.ToolCall{{Name: "calc", Arguments: json.RawMessage(`{"x":2}`)}}}}}, 0))
	if exec, _ = h.s.ExecutingEffects(h.ctx, "t", "s"); len(exec) != 0 {
		t.Fatalf("executing effects after settlement = %+v", exec)
	}
	a = h.commit(a, 0, "", dispatched("a.t1.0", 1, 0))
	exec, _ = h.s.ExecutingEffects(h.ctx, "t", "s")
	if len(exec) != 1 || exec[0].EffectID != "a.t1.0" {
		t.Fatalf("executing effects after tool dispatch = %+v", exec)
	}
	h.checkIndexes("t", "s")
	b = h.commit(b, 0, "", started())
	if got := fmt.Sprint(ids(loop.StatusRunning)); got != "[a b]" {
		t.Fatalf("running = %s", got)
	}
	if got := fmt.Sprint(ids(loop.StatusPending)); got != "[c]" {
		t.Fatalf("pending = %s", got)
	}
	// b completes: it leaves the active index and the running status.
	b = h.commit(b, 0, "", planned(b))
	b = h.toCompleted(h.commit(b, 0, "", dispatched("b.m1", 1, 0)), 0)
	active, err := h.s.ActiveRuns(h.ctx, "t", "s")
	if err != nil || len(active) != 2 || active[0].ID != "a" || active[1].ID != "c" {
		t.Fatalf("active runs = %v, %v; want [a c]", runIDs(active), err)
	}
	if !sameJSON(active[0], a) {
		t.Fatal("ActiveRuns returned a snapshot that is not the stored one")
	}
	if got := fmt.Sprint(ids(loop.StatusCompleted)); got != "[b]" {
		t.Fatalf("completed = %s", got)
	}
	// c is cancelled before it starts.
	c = h.commit(c, 0, "", loop.Event{Type: loop.EventCancelRequested, Reason: "user"}, loop.Event{Type: loop.EventRunCancelled})
	if c.Status != loop.StatusCancelled {
		t.Fatalf("c = %s", c.Status)
	}
	// a's tool settles; the model answers; a completes.
	a = h.commit(a, 0, "", loop.Settled("a.t1.0", 1, loop.Outcome{State: loop.OutcomeDone, Tool: &abi.ToolOutcome{Content: "4"}}, 0))
	a = h.commit(a, 0, "", planned(a), dispatched("a.m2", 1, 0))
	a = h.commit(a, 0, "", answered("a.m2", 1, "4"), completed())
	if active, _ = h.s.ActiveRuns(h.ctx, "t", "s"); len(active) != 0 {
		t.Fatalf("active runs after all ended = %v", runIDs(active))
	}
	for _, st := range []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting} {
		if got := ids(st); len(got) != 0 {
			t.Fatalf("%s = %v after all ended", st, got)
		}
	}
	if got := fmt.Sprint(ids(loop.StatusCompleted)); got != "[a b]" {
		t.Fatalf("completed = %s", got)
	}
	// Paging through a status.
	for _, id := range []string{"d", "e", "f", "g"} {
		h.create("t", "s2", id, "")
	}
	page, _ := h.s.RunsByStatus(h.ctx, "t", loop.StatusPending, "", 2)
	next, _ := h.s.RunsByStatus(h.ctx, "t", loop.StatusPending, "e", 10)
	if fmt.Sprint(page) != "[d e]" || fmt.Sprint(next) != "[f g]" {
		t.Fatalf("paging pending: %v then %v", page, next)
	}
	h.checkIndexes("t", "s", "s2")
}

func runIDs(runs []loop.Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.ID)
	}
	return out
}

func testSessionOrder(t *testing.T, h *harness) {
	// IDs whose lexical order is not their creation order.
	order := []string{"zeta", "alpha", "m", "b10", "b9"}
	for i, id := range order {
		res, err := h.s.CreateRun(h.ctx, h.createReq("t", "s", id, ""))
		if err != nil || res.Ordinal != int64(i+1) {
			t.Fatalf("CreateRun %s: ordinal %d, %v; want %d", id, res.Ordinal, err, i+1)
		}
	}
	all, err := h.s.SessionRuns(h.ctx, "t", "s", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, sr := range all {
		if sr.Ordinal != int64(i+1) {
			t.Fatalf("run %s has ordinal %d at position %d", sr.Run.ID, sr.Ordinal, i+1)
		}
		got = append(got, sr.Run.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(order) {
		t.Fatalf("session order = %v, want %v", got, order)
	}
	page, _ := h.s.SessionRuns(h.ctx, "t", "s", 2, 2)
	if len(page) != 2 || page[0].Run.ID != "m" || page[1].Run.ID != "b10" || page[0].Ordinal != 3 {
		t.Fatalf("SessionRuns(after 2, limit 2) = %+v", page)
	}
	if empty, err := h.s.SessionRuns(h.ctx, "t", "nobody", 0, 0); err != nil || len(empty) != 0 {
		t.Fatalf("SessionRuns of an empty session = %v, %v", empty, err)
	}
	active, _ := h.s.ActiveRuns(h.ctx, "t", "s")
	if fmt.Sprint(runIDs(active)) != fmt.Sprint(order) {
		t.Fatalf("active runs = %v, want session order %v", runIDs(active), order)
	}
}

func testCompletedRunsBefore(t *testing.T, h *harness) {
	// The session, in order: c1 completed, x cancelled, c2 and c3
	// completed, the Run "now" in progress, c4 completed after it. Another
	// session's completed Run sits between them in time.
	done := func(session, id string) { h.toCompleted(h.toExecuting(h.create("t", session, id, ""), 0), 0) }
	done("s", "c1")
	h.commit(h.create("t", "s", "x", ""), 0, "", loop.Event{Type: loop.EventCancelRequested, Reason: "user"}, loop.Event{Type: loop.EventRunCancelled})
	done("other", "o1")
	done("s", "c2")
	done("s", "c3")
	h.toExecuting(h.create("t", "s", "now", ""), 0)
	done("s", "c4")

	ids := func(runID string, limit int) string {
		t.Helper()
		runs, err := h.s.CompletedRunsBefore(h.ctx, "t", "s", runID, limit)
		if err != nil {
			t.Fatalf("CompletedRunsBefore(%s, %d): %v", runID, limit, err)
		}
		for _, r := range runs {
			if r.Status != loop.StatusCompleted || r.Session != "s" || len(r.Transcript) == 0 {
				t.Errorf("CompletedRunsBefore(%s, %d) returned run %s %s of session %s with %d transcript messages", runID, limit, r.ID, r.Status, r.Session, len(r.Transcript))
			}
		}
		return fmt.Sprint(runIDs(runs))
	}
	for _, tc := range []struct {
		run   string
		limit int
		want  string
	}{
		{"now", 0, "[c1 c2 c3]"},
		{"now", 2, "[c2 c3]"},
		{"now", 1, "[c3]"},
		{"now", 10, "[c1 c2 c3]"},
		{"c4", 0, "[c1 c2 c3]"}, // "now" is not completed
		{"c2", 5, "[c1]"},       // x was cancelled
		{"c1", 0, "[]"},
		{"x", 0, "[c1]"},
	} {
		if got := ids(tc.run, tc.limit); got != tc.want {
			t.Errorf("CompletedRunsBefore(%s, limit %d) = %s, want %s", tc.run, tc.limit, got, tc.want)
		}
	}
	for _, tc := range []struct{ session, run string }{{"s", "missing"}, {"other", "now"}, {"nobody", "c1"}} {
		if _, err := h.s.CompletedRunsBefore(h.ctx, "t", tc.session, tc.run, 0); !errors.Is(err, runtime.ErrRunNotFound) {
			t.Errorf("CompletedRunsBefore of run %s in session %s: %v, want ErrRunNotFound", tc.run, tc.session, err)
		}
	}
	for _, bad := range []string{"", "a b", strings.Repeat("x", 300)} {
		if _, err := h.s.CompletedRunsBefore(h.ctx, "t", "s", bad, 0); !errors.Is(err, loop.ErrInvalidID) {
			t.Errorf("CompletedRunsBefore of run ID %q: %v, want loop.ErrInvalidID", bad, err)
		}
	}
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

// active lists ActiveSessions(afterTenant, afterSession, limit) as
// "tenant/session:owner@epoch" strings.
func (h *harness) active(afterTenant, afterSession string, limit int) []string {
	h.t.Helper()
	got, err := h.s.ActiveSessions(h.ctx, afterTenant, afterSession, limit)
	if err != nil {
		h.t.Fatalf("ActiveSessions after %q/%q limit %d: %v", afterTenant, afterSession, limit, err)
	}
	out := []string{}
	for _, o := range got {
		out = append(out, fmt.Sprintf("%s/%s:%s@%d", o.Tenant, o.Session, o.Owner, o.Epoch))
	}
	return out
}

func testActiveSessionsOwner(t *testing.T, h *harness) {
	if got := h.active("", "", 0); len(got) != 0 {
		t.Fatalf("active sessions of an empty store = %v", got)
	}
	// Written, never claimed: listed with no owner, at epoch 0.
	h.create("t", "s", "r", "")
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:@0]" {
		t.Fatalf("active sessions before a claim = %s", got)
	}
	h.register("a", 10*time.Second)
	h.claim("t", "s", "a")
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:a@1]" {
		t.Fatalf("active sessions after a claim = %s", got)
	}
	// Whether the owner lives is not judged: a dead owner is still listed.
	h.clock.Advance(11 * time.Second)
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:a@1]" {
		t.Fatalf("active sessions after the owner died = %s", got)
	}
	h.register("b", 10*time.Second)
	h.claim("t", "s", "b")
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:b@2]" {
		t.Fatalf("active sessions after a takeover = %s", got)
	}
	if err := h.s.ReleaseSession(h.ctx, "t", "s", "b"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:@2]" {
		t.Fatalf("active sessions after a release = %s", got)
	}
	// A session claimed but without a Run holds no work.
	h.claim("t", "idle", "b")
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/s:@2]" {
		t.Fatalf("active sessions with a claimed idle session = %s", got)
	}
}

func testActiveSessionsTerminal(t *testing.T, h *harness) {
	done := h.toCompleted(h.toExecuting(h.create("t", "done", "d1", ""), 0), 0)
	h.commit(h.create("t", "done", "d2", ""), 0, "", loop.Event{Type: loop.EventCancelRequested, Reason: "user"}, loop.Event{Type: loop.EventRunCancelled})
	mixed := h.create("t", "mixed", "m1", "")
	h.toCompleted(h.toExecuting(h.create("t", "mixed", "m2", ""), 0), 0)
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/mixed:@0]" {
		t.Fatalf("active sessions = %s; want only mixed (done=%s)", got, done.Status)
	}
	// The last live Run of mixed ends: nothing is active any more.
	h.toCompleted(h.toExecuting(mixed, 0), 0)
	if got := h.active("", "", 0); len(got) != 0 {
		t.Fatalf("active sessions after every Run ended = %v", got)
	}
	// A new Run makes the session active again.
	h.create("t", "done", "d3", "")
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t/done:@0]" {
		t.Fatalf("active sessions after a new Run = %s", got)
	}
}

func testActiveSessionsPaging(t *testing.T, h *harness) {
	// IDs whose lexical order is not their length order, prefixes of each
	// other, and mixed case: "B" < "a" < "a-" < "ab" < "b".
	tenants := []string{"b", "ab", "a", "a-", "B"}
	sessions := []string{"s9", "s10", "s", "S", "s-1", "z", "s1"}
	var all []runtime.SessionOwner
	n := 0
	for _, tn := range tenants {
		for i, sn := range sessions {
			if (len(tn)+i)%3 == 2 {
				continue // not every tenant has every session
			}
			n++
			h.create(tn, sn, fmt.Sprintf("r%d", n), "")
			all = append(all, runtime.SessionOwner{Tenant: tn, Session: sn})
		}
	}
	// A session whose only Run ended is skipped wherever it falls.
	h.toCompleted(h.toExecuting(h.create("a", "s0", "ended", ""), 0), 0)
	after := func(o runtime.SessionOwner, tenant, session string) bool {
		return o.Tenant > tenant || o.Tenant == tenant && o.Session > session
	}
	sort.Slice(all, func(i, j int) bool { return after(all[j], all[i].Tenant, all[i].Session) })
	var want []string
	for _, o := range all {
		want = append(want, o.Tenant+"/"+o.Session+":@0")
	}
	if got := h.active("", "", 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ActiveSessions = %v\nwant %v", got, want)
	}
	if got := h.active("", "", -1); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ActiveSessions with limit -1 = %v", got)
	}
	for _, limit := range []int{1, 2, 3, 7, len(want) - 1, len(want), len(want) + 1} {
		var got []string
		tenant, session := "", ""
		for pages := 0; ; pages++ {
			if pages > len(want) {
				t.Fatalf("limit %d: paging does not end: %v", limit, got)
			}
			page, err := h.s.ActiveSessions(h.ctx, tenant, session, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(page))
			}
			if len(page) == 0 {
				break
			}
			for _, o := range page {
				got = append(got, fmt.Sprintf("%s/%s:%s@%d", o.Tenant, o.Session, o.Owner, o.Epoch))
			}
			last := page[len(page)-1]
			tenant, session = last.Tenant, last.Session
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("paging with limit %d = %v\nwant %v", limit, got, want)
		}
	}
	// The cursor need not be an active session, nor an ID that exists.
	for _, c := range []struct{ tenant, session string }{
		{"a", ""}, {"a", "s0"}, {"a", "s10"}, {"a", "s1-"}, {"a-", "zz"}, {"aa", ""}, {"A", "x"}, {"c", ""}, {"", "x"}, {"b", "z"},
	} {
		rest := []string{}
		for i, o := range all {
			if after(o, c.tenant, c.session) {
				rest = append(rest, want[i])
			}
		}
		if got := h.active(c.tenant, c.session, 0); fmt.Sprint(got) != fmt.Sprint(rest) {
			t.Fatalf("ActiveSessions after %q/%q = %v\nwant %v", c.tenant, c.session, got, rest)
		}
		if got := h.active(c.tenant, c.session, 2); len(rest) > 2 && fmt.Sprint(got) != fmt.Sprint(rest[:2]) {
			t.Fatalf("ActiveSessions after %q/%q limit 2 = %v, want %v", c.tenant, c.session, got, rest[:2])
		}
	}
}

func testActiveSessionsTenants(t *testing.T, h *harness) {
	h.register("n", time.Hour)
	for i, tn := range []string{"t3", "t1", "t2"} {
		h.create(tn, "s", "r", "")
		if i != 1 {
			h.claim(tn, "s", "n")
		}
	}
	if got := fmt.Sprint(h.active("", "", 0)); got != "[t1/s:@0 t2/s:n@1 t3/s:n@1]" {
		t.Fatalf("active sessions across tenants = %s", got)
	}
	if got := fmt.Sprint(h.active("t1", "s", 0)); got != "[t2/s:n@1 t3/s:n@1]" {
		t.Fatalf("active sessions after t1/s = %s", got)
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

func testKV(t *testing.T, h *harness) {
	get := func(tenant, plugin, key string) string {
		t.Helper()
		v, err := h.s.KVGet(h.ctx, tenant, plugin, []byte(key))
		if err != nil {
			t.Fatalf("KVGet %s/%s/%s: %v", tenant, plugin, key, err)
		}
		if v == nil {
			return "<nil>"
		}
		return string(v)
	}
	set := func(key string, n int) error {
		return h.s.KVSet(h.ctx, "t", "p", []byte(key), []byte(strings.Repeat("v", n)))
	}
	if got := get("t", "p", "missing"); got != "<nil>" {
		t.Fatalf("missing key = %q", got)
	}
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if got := get("t", "p", "k"); got != "v1" {
		t.Fatalf("k = %q", got)
	}
	buf := []byte("v2")
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), buf); err != nil {
		t.Fatal(err)
	}
	buf[0] = 'X' // the store keeps its own copy
	if got := get("t", "p", "k"); got != "v2" {
		t.Fatalf("k after overwrite = %q", got)
	}
	// An empty value deletes.
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), nil); err != nil {
		t.Fatal(err)
	}
	if got := get("t", "p", "k"); got != "<nil>" {
		t.Fatalf("k after an empty set = %q", got)
	}
	h.wantErr(set("big", suiteKVMaxValue+1), runtime.ErrKVTooLarge, "value over the limit")
	h.wantErr(set(strings.Repeat("k", suiteKVMaxKey+1), 1), runtime.ErrKVTooLarge, "key over the limit")
	if err := set("edge", suiteKVMaxValue); err != nil {
		t.Fatalf("a value at the limit: %v", err)
	}
	// Quota: len(key)+len(value) summed over the plugin's keys.
	steps := []struct {
		key  string
		n    int
		want error
		used int
	}{
		{"k1", 60, nil, 68 + 62},
		{"k2", 64, nil, 130 + 66},
		{"k3", 2, nil, 200}, // exactly at the quota
		{"k4", 1, runtime.ErrKVQuota, 200},
		{"k1", 10, nil, 200 - 62 + 12}, // shrinking an entry frees quota
		{"k4", 1, nil, 150 + 3},
	}
	for _, st := range steps {
		err := set(st.key, st.n)
		if st.want == nil && err != nil {
			t.Fatalf("set %s (%d bytes) at %d used: %v", st.key, st.n, st.used, err)
		}
		if st.want != nil {
			h.wantErr(err, st.want, fmt.Sprintf("set %s (%d bytes) past the quota", st.key, st.n))
			if got := get("t", "p", st.key); got != "<nil>" {
				t.Fatalf("a refused write was stored: %s = %q", st.key, got)
			}
		}
	}
	// Deleting frees quota: 153 - 68 = 85, room for another 64-byte value.
	if err := h.s.KVDelete(h.ctx, "t", "p", []byte("edge")); err != nil {
		t.Fatal(err)
	}
	if err := h.s.KVDelete(h.ctx, "t", "p", []byte("never-set")); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := set("late", 64); err != nil {
		t.Fatalf("a write after a delete freed quota: %v", err)
	}
	h.wantErr(set("more", 64), runtime.ErrKVQuota, "a write past the quota again")
	// The quota is per (tenant, plugin).
	if err := h.s.KVSet(h.ctx, "t", "p2", []byte("late"), []byte(strings.Repeat("v", 64))); err != nil {
		t.Fatalf("another plugin's quota: %v", err)
	}
	if err := h.s.KVSet(h.ctx, "t2", "p", []byte("late"), []byte(strings.Repeat("v", 64))); err != nil {
		t.Fatalf("another tenant's quota: %v", err)
	}
	// Binary keys, and the empty key, are keys like any other.
	for _, k := range []string{"", "\x00", "a\x00b"} {
		if err := h.s.KVSet(h.ctx, "t", "p3", []byte(k), []byte("x"+k)); err != nil {
			t.Fatalf("KVSet %q: %v", k, err)
		}
	}
	for _, k := range []string{"", "\x00", "a\x00b"} {
		if got := get("t", "p3", k); got != "x"+k {
			t.Fatalf("KVGet %q = %q", k, got)
		}
	}
	err := h.s.KVSet(h.ctx, "t", "", []byte("k"), []byte("v"))
	h.wantErr(err, runtime.ErrInvalidRequest, "KVSet with an empty plugin name")

	// Many writers of one plugin at once (a pool of instances) all
	// succeed, and the usage stays exact: 32 writers overwrite and delete
	// their own keys 20 times, then exactly the rest of the quota fits.
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("c%02d", w)) // 3 bytes
			for i := 0; i < 20; i++ {
				val := []byte(strings.Repeat("v", 1+i%2))
				if i%5 == 4 {
					val = nil // a delete now and then
				}
				if err := h.s.KVSet(h.ctx, "t", "pc", key, val); err != nil {
					errs <- fmt.Errorf("writer %d, write %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent KV writers of one plugin: %v", err)
	}
	// Every key ends with write 19, a delete: the plugin holds nothing,
	// so 3 entries of 66 bytes and one of 2 fill the 200-byte quota
	// exactly, and one more is refused.
	for _, k := range []string{"f1", "f2", "f3"} {
		if err := h.s.KVSet(h.ctx, "t", "pc", []byte(k), []byte(strings.Repeat("v", suiteKVMaxValue))); err != nil {
			t.Fatalf("after concurrent writes that deleted everything, the whole quota must fit: %s: %v", k, err)
		}
	}
	if err := h.s.KVSet(h.ctx, "t", "pc", []byte("g"), []byte("v")); err != nil {
		t.Fatalf("the last 2 bytes of the quota: %v", err)
	}
	err = h.s.KVSet(h.ctx, "t", "pc", []byte("h"), []byte("v"))
	h.wantErr(err, runtime.ErrKVQuota, "2 bytes past the quota after concurrent writes")
}
func testIsolation(t *testing.T, h *harness) {
	// Tenants "a"/"ab", sessions "s"/"s1", runs "r"/"r1": each ID is a
	// prefix of the other, and "a"+"bs" == "ab"+"s".
	h.create("a", "s", "r", "")
	h.create("a", "s1", "r1", "")
	h.create("a", "bs", "x", "")
	h.create("ab", "s", "r", "")
	h.create("ab", "s", "r1", "")
	ra := h.toExecuting(h.load("a", "r"), 0)
	h.commit(h.load("ab", "r1"), 0, "", started())
	sessionIDs := func(tenant, session string) string {
		t.Helper()
		runs, err := h.s.SessionRuns(h.ctx, tenant, session, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sr := range runs {
			out = append(out, sr.Run.Tenant+"/"+sr.Run.ID)
		}
		return fmt.Sprint(out)
	}
	for _, c := range []struct{ tenant, session, want string }{
		{"a", "s", "[a/r]"}, {"a", "s1", "[a/r1]"}, {"a", "bs", "[a/x]"}, {"ab", "s", "[ab/r ab/r1]"}, {"ab", "s1", "[]"},
	} {
		if got := sessionIDs(c.tenant, c.session); got != c.want {
			t.Fatalf("SessionRuns %s/%s = %s, want %s", c.tenant, c.session, got, c.want)
		}
	}
	if evs := h.events("a", "r", 0, 0); int64(len(evs)) != ra.Seq {
		t.Fatalf("events of a/r = %d, want %d (mixed with r1 or ab/r?)", len(evs), ra.Seq)
	}
	if evs := h.events("ab", "r", 0, 0); len(evs) != 1 {
		t.Fatalf("events of ab/r = %d, want 1", len(evs))
	}
	if evs := h.events("ab", "r1", 0, 0); len(evs) != 2 {
		t.Fatalf("events of ab/r1 = %d, want 2", len(evs))
	}
	if p, _ := h.s.RunsByStatus(h.ctx, "a", loop.StatusPending, "", 0); fmt.Sprint(p) != "[r1 x]" {
		t.Fatalf("pending runs of a = %v", p)
	}
	if p, _ := h.s.RunsByStatus(h.ctx, "ab", loop.StatusPending, "", 0); fmt.Sprint(p) != "[r]" {
		t.Fatalf("pending runs of ab = %v", p)
	}
	if act, _ := h.s.ActiveRuns(h.ctx, "a", "s"); fmt.Sprint(runIDs(act)) != "[r]" {
		t.Fatalf("active runs of a/s = %v", runIDs(act))
	}
	if ex, _ := h.s.ExecutingEffects(h.ctx, "ab", "s"); len(ex) != 0 {
		t.Fatalf("executing effects of ab/s = %+v (a/s's leaked)", ex)
	}
	if ex, _ := h.s.ExecutingEffects(h.ctx, "a", "s1"); len(ex) != 0 {
		t.Fatalf("executing effects of a/s1 = %+v (a/s's leaked)", ex)
	}
	// Ownership is per (tenant, session).
	h.register("n", 10*time.Second)
	if e := h.claim("a", "s", "n"); e != 1 {
		t.Fatalf("epoch of a/s = %d", e)
	}
	if e := h.claim("ab", "s", "n"); e != 1 {
		t.Fatalf("epoch of ab/s = %d, want its own epoch", e)
	}
	// KV: tenant "a" plugin "bc" versus tenant "ab" plugin "c", and
	// plugin "p" key "1x" versus plugin "p1" key "x".
	kv := []struct{ tenant, plugin, key, val string }{
		{"a", "bc", "k", "a-bc"}, {"ab", "c", "k", "ab-c"}, {"a", "p", "1x", "p-1x"}, {"a", "p1", "x", "p1-x"},
	}
	for _, e := range kv {
		if err := h.s.KVSet(h.ctx, e.tenant, e.plugin, []byte(e.key), []byte(e.val)); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range kv {
		v, err := h.s.KVGet(h.ctx, e.tenant, e.plugin, []byte(e.key))
		if err != nil || string(v) != e.val {
			t.Fatalf("KVGet %s/%s/%s = %q, %v; want %q", e.tenant, e.plugin, e.key, v, err, e.val)
		}
	}
	if v, _ := h.s.KVGet(h.ctx, "ab", "bc", []byte("k")); v != nil {
		t.Fatalf("ab/bc/k = %q, want missing", v)
	}
	h.checkIndexes("a", "s", "s1", "bs")
	h.checkIndexes("ab", "s", "s1")
}

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

func testClose(t *testing.T, h *harness) {
	r := h.create("t", "s", "r", "")
	if err := h.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := h.s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	calls := map[string]error{}
	_, calls["CreateRun"] = h.s.CreateRun(h.ctx, h.createReq("t", "s", "r2", ""))
	_, calls["LoadRun"] = h.s.LoadRun(h.ctx, "t", "r")
	_, calls["Commit"] = h.s.Commit(h.ctx, h.step(r, 0, "", started()))
	_, calls["Events"] = h.s.Events(h.ctx, "t", "r", 0, 0)
	_, calls["SessionRuns"] = h.s.SessionRuns(h.ctx, "t", "s", 0, 0)
	_, calls["CompletedRunsBefore"] = h.s.CompletedRunsBefore(h.ctx, "t", "s", "r", 0)
	_, calls["ActiveRuns"] = h.s.ActiveRuns(h.ctx, "t", "s")
	_, calls["RunsByStatus"] = h.s.RunsByStatus(h.ctx, "t", loop.StatusPending, "", 0)
	_, calls["TenantStoredBytes"] = h.s.TenantStoredBytes(h.ctx, "t")
	calls["RegisterNode"] = h.s.RegisterNode(h.ctx, "n", h.nowMS()+1000)
	calls["RenewNode"] = h.s.RenewNode(h.ctx, "n", h.nowMS()+1000)
	_, calls["ClaimSession"] = h.s.ClaimSession(h.ctx, "t", "s", "n", h.nowMS())
	_, calls["ClaimSessions"] = h.s.ClaimSessions(h.ctx, "n", h.nowMS(), []runtime.SessionRef{{Tenant: "t", Session: "s"}})
	calls["ReleaseSession"] = h.s.ReleaseSession(h.ctx, "t", "s", "n")
	_, calls["OrphanedSessions"] = h.s.OrphanedSessions(h.ctx, h.nowMS())
	_, calls["ActiveSessions"] = h.s.ActiveSessions(h.ctx, "", "", 0)
	_, calls["ExecutingEffects"] = h.s.ExecutingEffects(h.ctx, "t", "s")
	var v []byte
	v, calls["KVGet"] = h.s.KVGet(h.ctx, "t", "p", []byte("k"))
	calls["KVSet"] = h.s.KVSet(h.ctx, "t", "p", []byte("k"), []byte("v"))
	calls["KVDelete"] = h.s.KVDelete(h.ctx, "t", "p", []byte("k"))
	_, calls["Prune"] = h.s.Prune(h.ctx, h.nowMS())
	for name, err := range calls {
		if !errors.Is(err, runtime.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if v != nil {
		t.Errorf("KVGet after Close returned a value")
	}
}

// testHammer runs committers in parallel: each drives its own Run, and all
// of them race on shared Runs with compare-and-set. Every commit appends an
// EffectPending with a handle unique to the committer and attempt, so the
// shared Runs' logs must hold exactly the winners' handles, in Seq order.
func testHammer(t *testing.T, h *harness) {
	const (
		workers = 8
		shared  = 2
		rounds  = 25
	)
	prep := func(id, session string) {
		h.toExecuting(h.create("t", session, id, ""), 0)
	}
	for i := range shared {
		prep(fmt.Sprintf("shared%d", i), "hot")
	}
	for w := range workers {
		prep(fmt.Sprintf("own%d", w), fmt.Sprintf("w%d", w))
	}
	type win struct {
		run    string
		seq    int64
		handle string
	}
	var (
		mu   sync.Mutex
		wins []win
	)
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	// The tenant's stored bytes are first asked for while the committers
	// race (a store that keeps a running figure seeds it then), and must
	// come out exact once they stop.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 5 {
			if _, err := h.s.TenantStoredBytes(h.ctx, "t"); err != nil {
				errs <- fmt.Errorf("TenantStoredBytes while committers race: %w", err)
				return
			}
		}
		errs <- nil
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- hammerWorker(h, w, shared, rounds, func(run string, seq int64, handle string) {
				mu.Lock()
				wins = append(wins, win{run, seq, handle})
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]map[int64]string{}
	for _, w := range wins {
		if want[w.run] == nil {
			want[w.run] = map[int64]string{}
		}
		if prev, dup := want[w.run][w.seq]; dup {
			t.Fatalf("two commits won Seq %d of %s: %s and %s", w.seq, w.run, prev, w.handle)
		}
		want[w.run][w.seq] = w.handle
	}
	for run, bySeq := range want {
		r := h.load("t", run)
		evs := h.events("t", run, 0, 0)
		if int64(len(evs)) != r.Seq || r.Seq != 4+int64(len(bySeq)) {
			t.Fatalf("%s: %d events, Seq %d, %d winners: lost or phantom commits", run, len(evs), r.Seq, len(bySeq))
		}
		for _, ev := range evs[4:] {
			if ev.Handle != bySeq[ev.Seq] {
				t.Fatalf("%s Seq %d holds handle %q, the winner was %q", run, ev.Seq, ev.Handle, bySeq[ev.Seq])
			}
		}
		if exec := runtime.ExecutingRecords(r); len(exec) != 1 || exec[0].Handle != evs[len(evs)-1].Handle {
			t.Fatalf("%s: snapshot handle %+v, last event %q", run, exec, evs[len(evs)-1].Handle)
		}
	}
	for w := range workers {
		if got := len(want[fmt.Sprintf("own%d", w)]); got != rounds {
			t.Fatalf("own%d has %d commits, want %d", w, got, rounds)
		}
	}
	var stored int64
	for run, bySeq := range want {
		var cmds []string
		for _, handle := range bySeq {
			cmds = append(cmds, "cmd-"+handle)
		}
		stored += h.held("t", run, cmds...)
	}
	h.wantStored("t", stored, "after the committers stopped")
	sessions := []string{"hot"}
	for w := range workers {
		sessions = append(sessions, fmt.Sprintf("w%d", w))
	}
	h.checkIndexes("t", sessions...)
}

// hammerWorker commits rounds times to its own Run and rounds times to the
// shared Runs, retrying a lost compare-and-set after reloading. It does not
// call t.Fatal: it runs off the test goroutine.
func hammerWorker(h *harness, w, shared, rounds int, won func(run string, seq int64, handle string)) error {
	commitOnce := func(run, handle string) (bool, error) {
		r, err := h.s.LoadRun(h.ctx, "t", run)
		if err != nil {
			return false, err
		}
		ev := pending(loop.ModelEffectID(run, 1), 1, handle)
		next, err := loop.Apply(r, ev)
		if err != nil {
			return false, fmt.Errorf("apply to %s: %w", run, err)
		}
		ev.Seq = next.Seq
		c := runtime.Commit{Tenant: "t", Session: r.Session, RunID: run, CommandID: "cmd-" + handle,
			ExpectedSeq: r.Seq, Events: []loop.Event{ev}, Run: next}
		res, err := h.s.Commit(h.ctx, c)
		switch {
		case errors.Is(err, runtime.ErrVersionConflict):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("commit %s to %s: %w", handle, run, err)
		case res.Duplicate || res.Seq != next.Seq:
			return false, fmt.Errorf("commit %s to %s: %+v, want Seq %d", handle, run, res, next.Seq)
		}
		won(run, next.Seq, handle)
		return true, nil
	}
	for i := range rounds {
		for _, run := range []string{fmt.Sprintf("own%d", w), fmt.Sprintf("shared%d", i%shared)} {
			handle := fmt.Sprintf("w%d-%d", w, i)
			for {
				ok, err := commitOnce(run, handle)
				if err != nil {
					return err
				}
				if ok {
					break
				}
			}
		}
	}
	return nil
}

func testConcurrentCreate(t *testing.T, h *harness) {
	const n = 16
	ordinals := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.s.CreateRun(h.ctx, h.createReq("t", "s", fmt.Sprintf("r%02d", i), ""))
			ordinals[i], errs[i] = res.Ordinal, err
		}()
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("CreateRun r%02d: %v", i, errs[i])
		}
		if seen[ordinals[i]] || ordinals[i] < 1 || ordinals[i] > n {
			t.Fatalf("ordinal %d given twice or out of 1..%d: %v", ordinals[i], n, ordinals)
		}
		seen[ordinals[i]] = true
	}
	h.checkIndexes("t", "s")
}

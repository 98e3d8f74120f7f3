package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
		{"a creation claims an unowned session for its claimant, as ClaimSession would", testCreationClaims},
		{"a creation writes its first step only with its session's first Run, under the claim it takes", testFirstStep},
		{"a commit records the further command IDs it applies, and is refused if one was applied", testAlsoCommandIDs},
		{"a commit says when it ended its session's last live Run", testSessionIdle},
		{"ClaimSessions claims a batch as ClaimSession would each, and reads each claimed session's active Runs", testClaimSessions},
		{"ClaimSessions refused for an expired node writes nothing", testClaimSessionsRefusedForAnExpiredNodeWritesNothing},
		{"ClaimSessions racing the end of its node's lease claims all of the batch or none", testClaimSessionsRacingTheNodesDeathClaimsAllOrNothing},
		{"a retried commit whose ack was lost returns the first result and writes nothing", testCommitIdempotent},
		{"command IDs of commits are scoped to their Run", testCommandScope},
		{"malformed commits are refused", testMalformedCommit},
		{"the event log comes back in order from a position with a limit", testEvents},
		{"indexes follow the snapshots through status changes", testIndexes},
		{"Runs by status come back newest first, paged backwards, per status and tenant", testRunsByStatusDesc},
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

func runIDs(runs []loop.Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.ID)
	}
	return out
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

// The StoreSuite cases live by topic in storesuite_runs.go,
// storesuite_ownership.go and storesuite_claims.go, storesuite_indexes.go,
// storesuite_kv.go, storesuite_prune.go, storesuite_escapes.go and
// storesuite_hammer.go. The two below cut across every part of the port
// (keys of all kinds, every method after Close), so they stay here.

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
	if p, _ := h.s.RunsByStatusDesc(h.ctx, "a", loop.StatusPending, "", 0); fmt.Sprint(p) != "[x r1]" {
		t.Fatalf("pending runs of a, descending = %v", p)
	}
	if p, _ := h.s.RunsByStatusDesc(h.ctx, "ab", loop.StatusPending, "", 0); fmt.Sprint(p) != "[r]" {
		t.Fatalf("pending runs of ab, descending = %v", p)
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
	_, calls["RunsByStatusDesc"] = h.s.RunsByStatusDesc(h.ctx, "t", loop.StatusPending, "", 0)
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

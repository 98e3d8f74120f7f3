package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here hold a store's indexes to the snapshots:
// Runs by status, a session's Runs in creation order, ActiveRuns,
// CompletedRunsBefore, ExecutingEffects and ActiveSessions with paging.

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

func testRunsByStatusDesc(t *testing.T, h *harness) {
	desc := func(tenant string, st loop.Status, before string, limit int) string {
		t.Helper()
		got, err := h.s.RunsByStatusDesc(h.ctx, tenant, st, before, limit)
		if err != nil {
			t.Fatalf("RunsByStatusDesc(%s, %s, before %q, limit %d): %v", tenant, st, before, limit, err)
		}
		return fmt.Sprint(got)
	}
	if got := desc("t", loop.StatusPending, "", 0); got != "[]" {
		t.Fatalf("pending runs of an empty store, descending = %s", got)
	}
	// Created out of ID order: the order is the IDs', not the creation's.
	for _, id := range []string{"c", "a", "e", "b", "d", "f"} {
		h.create("t", "s", id, "")
	}
	// Tenants whose IDs are prefixes of "t" and of each other, and one
	// sorting just after it, each with a Run whose ID is among t's.
	h.create("tt", "s", "c2", "")
	h.create("u", "s", "b2", "")
	// b and e start: they leave pending for running.
	h.commit(h.load("t", "b"), 0, "", started())
	h.commit(h.load("t", "e"), 0, "", started())
	for _, c := range []struct {
		status loop.Status
		before string
		limit  int
		want   string
	}{
		{loop.StatusPending, "", 0, "[f d c a]"},
		{loop.StatusPending, "", -1, "[f d c a]"},
		{loop.StatusRunning, "", 0, "[e b]"},
		{loop.StatusCompleted, "", 0, "[]"},
		// Pages: before is the last ID of the page before, and need be
		// neither a Run of that status nor one that exists.
		{loop.StatusPending, "", 2, "[f d]"},
		{loop.StatusPending, "d", 2, "[c a]"},
		{loop.StatusPending, "a", 2, "[]"},
		{loop.StatusPending, "e", 0, "[d c a]"},
		{loop.StatusPending, "cz", 1, "[c]"},
		{loop.StatusPending, "c-", 0, "[c a]"}, // c is a prefix of c-: it sorts before
		{loop.StatusPending, "c", 0, "[a]"},
		{loop.StatusPending, "A", 0, "[]"},
		{loop.StatusPending, "zz", 3, "[f d c]"},
		{loop.StatusRunning, "e", 5, "[b]"},
	} {
		if got := desc("t", c.status, c.before, c.limit); got != c.want {
			t.Errorf("RunsByStatusDesc(t, %s, before %q, limit %d) = %s, want %s", c.status, c.before, c.limit, got, c.want)
		}
	}
	// Paging to the end with each limit gives each Run once, newest first.
	for _, limit := range []int{1, 2, 3, 4, 5} {
		var got []string
		before := ""
		for pages := 0; ; pages++ {
			if pages > 4 {
				t.Fatalf("limit %d: paging does not end: %v", limit, got)
			}
			page, err := h.s.RunsByStatusDesc(h.ctx, "t", loop.StatusPending, before, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(page))
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			before = page[len(page)-1]
		}
		if fmt.Sprint(got) != "[f d c a]" {
			t.Errorf("paging pending with limit %d = %v, want [f d c a]", limit, got)
		}
	}
	// Each tenant sees its own Runs only.
	for _, c := range []struct{ tenant, want string }{{"tt", "[c2]"}, {"u", "[b2]"}, {"T", "[]"}, {"ts", "[]"}} {
		if got := desc(c.tenant, loop.StatusPending, "", 0); got != c.want {
			t.Errorf("pending runs of tenant %s, descending = %s, want %s", c.tenant, got, c.want)
		}
	}
	if got := desc("tt", loop.StatusPending, "c3", 0); got != "[c2]" {
		t.Errorf("pending runs of tenant tt before c3 = %s, want [c2]", got)
	}
	h.checkIndexes("t", "s")
	h.checkIndexes("tt", "s")
	h.checkIndexes("u", "s")
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

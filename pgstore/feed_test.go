package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// recorder is a subscriber that keeps what it is given.
type recorder struct {
	mu  sync.Mutex
	got []runtime.Change
}

func (r *recorder) add(c runtime.Change) {
	r.mu.Lock()
	r.got = append(r.got, c)
	r.mu.Unlock()
}

func (r *recorder) all() []runtime.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]runtime.Change(nil), r.got...)
}

// has reports whether a change of run at Seq seq (or a Rescan, for run
// "") has arrived.
func (r *recorder) has(run string, seq int64) bool {
	for _, c := range r.all() {
		if (run == "" && c.Rescan) || (run != "" && c.RunID == run && c.Seq == seq) {
			return true
		}
	}
	return false
}

func TestAChangeReachesTheOtherInstancesNotItsOwn(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	a, b := open(t, dsn, schema, nil), open(t, dsn, schema, nil)
	other := open(t, dsn, freshSchema(t, dsn), nil) // another schema: another store
	var ra, rb, ro recorder
	defer a.SubscribeChanges(ra.add)()
	defer b.SubscribeChanges(rb.add)()
	defer other.SubscribeChanges(ro.add)()

	ctx := context.Background()
	if err := b.RegisterNode(ctx, "node-b", time.Now().Add(time.Minute).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	epoch, err := b.ClaimSession(ctx, "t", "s", "node-b", time.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(t, b, "t", "s", "r1", 1)
	c := step(t, r, epoch, "", loop.Event{Type: loop.EventRunStarted})
	if _, err := b.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a to hear of b's commit", 10*time.Second, func() bool { return ra.has("r1", 2) })
	for _, ch := range ra.all() {
		if ch.RunID == "r1" && ch.Seq == 2 && (ch.Tenant != "t" || ch.Session != "s" || ch.Owner != "node-b" || ch.Rescan) {
			t.Fatalf("a heard %+v; want t/s/r1 at Seq 2 owned by node-b", ch)
		}
	}
	// Now a commits: b hears that, after its own notification (one channel,
	// in commit order), which it must have dropped.
	r2 := newRun(t, a, "t", "s2", "r2", 1)
	eventually(t, "b to hear of a's creation", 10*time.Second, func() bool { return rb.has("r2", 1) })
	for _, ch := range rb.all() {
		if ch.RunID != "r2" {
			t.Fatalf("b heard %+v: its own change, or another's", ch)
		}
	}
	if got := ra.all(); len(got) > 0 && got[len(got)-1].RunID == "r2" {
		t.Fatalf("a heard its own creation of r2: %+v", got)
	}
	_ = r2
	if got := ro.all(); len(got) != 0 {
		t.Fatalf("a store on another schema heard %+v", got)
	}
}

// TestTheFeedReconnectsAfterARestartAndSaysRescan restarts the server
// under two Stores: the listener reconnects, delivers a Rescan, and later
// changes arrive again.
func TestTheFeedReconnectsAfterARestartAndSaysRescan(t *testing.T) {
	conformance.SkipInShort(t, "starting a PostgreSQL server")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	dsn := srv.DSN("postgres")
	a, b := open(t, dsn, "agenthost", nil), open(t, dsn, "agenthost", nil)
	var ra recorder
	defer a.SubscribeChanges(ra.add)()
	newRun(t, b, "t", "s", "before", 1)
	eventually(t, "a to hear of a creation before the restart", 10*time.Second, func() bool { return ra.has("before", 1) })

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Rescan after the restart", 30*time.Second, func() bool { return ra.has("", 0) })
	// b's pooled connections died with the server: its first calls may
	// fail (ErrStoreUnavailable), then it reconnects.
	eventually(t, "b to create a Run after the restart", 30*time.Second, func() bool {
		_, err := b.CreateRun(ctx, createReq(t, "t", "s", "after"))
		return err == nil
	})
	eventually(t, "a to hear of a creation after the restart", 10*time.Second, func() bool { return ra.has("after", 1) })
}

func createReq(t testing.TB, tenant, session, id string) runtime.CreateRun {
	spec := loop.Spec{Tenant: tenant, Session: session, ID: id, Input: "hello", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	ev.Seq = 1
	return runtime.CreateRun{Run: r, Event: ev}
}

// TestManyChangesArriveCoalesced commits many times to many Runs through
// one Store: the other hears the last Seq of every Run (payloads split
// under the NOTIFY limit), and nothing newer than was committed.
func TestManyChangesArriveCoalesced(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	a, b := open(t, dsn, schema, nil), open(t, dsn, schema, nil)
	var ra recorder
	defer a.SubscribeChanges(ra.add)()
	ctx := context.Background()
	const runs = 300
	last := map[string]int64{}
	for i := range runs {
		id := fmt.Sprintf("run-with-a-longish-id-%04d", i)
		r := newRun(t, b, "tenant-with-a-longish-id", "s", id, 1)
		c := step(t, r, 0, "", loop.Event{Type: loop.EventRunStarted})
		if _, err := b.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		last[id] = c.Run.Seq
	}
	eventually(t, "a to hear the last commit of every Run", 20*time.Second, func() bool {
		seen := map[string]int64{}
		for _, c := range ra.all() {
			if c.Seq > last[c.RunID] {
				t.Fatalf("a heard Seq %d of %s, past its last commit", c.Seq, c.RunID)
			}
			seen[c.RunID] = max(seen[c.RunID], c.Seq)
		}
		for id, seq := range last {
			if seen[id] != seq {
				return false
			}
		}
		return true
	})
}

func TestNoticesStayUnderTheLimitAndRoundTrip(t *testing.T) {
	var in []runtime.Change
	for i := range 500 {
		in = append(in, runtime.Change{Tenant: strings.Repeat("t", 64), Session: strings.Repeat("s", 64),
			RunID: fmt.Sprintf("%064d", i), Seq: int64(i), Owner: strings.Repeat("n\"é", 40)})
	}
	payloads := encodeNotices("origin", "agenthost", true, in)
	var out []runtime.Change
	for i, p := range payloads {
		if len(p) >= 8000 {
			t.Fatalf("payload %d is %d bytes", i, len(p))
		}
		n, changes, ok := decodeNotice(p)
		if !ok || n.Origin != "origin" || n.Schema != "agenthost" {
			t.Fatalf("payload %d does not decode: %s", i, p)
		}
		if i == 0 != n.Rescan {
			t.Fatalf("payload %d: rescan %v", i, n.Rescan)
		}
		out = append(out, changes...)
	}
	if len(payloads) < 3 || fmt.Sprint(out) != fmt.Sprint(in) {
		t.Fatalf("%d payloads; the changes do not round-trip", len(payloads))
	}
}

// TestASlowSubscriberGetsARescanAndBlocksNothing fills a subscriber's
// queue while it is stuck: the queue is bounded, its changes are replaced
// by a Rescan, and the store's commits go on meanwhile.
func TestASlowSubscriberGetsARescanAndBlocksNothing(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	s := open(t, dsn, freshSchema(t, dsn), nil)
	stuck, entered := make(chan struct{}), make(chan struct{})
	var rec recorder
	first := true
	defer s.SubscribeChanges(func(c runtime.Change) {
		if first {
			first = false
			close(entered)
			<-stuck
		}
		rec.add(c)
	})()
	s.feed.deliver(runtime.Change{Tenant: "t", Session: "s", RunID: "r", Seq: 1})
	<-entered
	for i := 1; i < maxSubQueue+10; i++ {
		s.feed.deliver(runtime.Change{Tenant: "t", Session: "s", RunID: "r", Seq: int64(i + 1)})
	}
	newRun(t, s, "t", "s", "still-commits", 1)
	close(stuck)
	eventually(t, "the subscriber to catch up", 10*time.Second, func() bool {
		got := rec.all()
		return len(got) > 0 && got[len(got)-1].Seq == maxSubQueue+10
	})
	got := rec.all()
	if len(got) > 20 || !got[1].Rescan {
		t.Fatalf("the stuck subscriber got %d changes (%+v …); want its first, a Rescan, then the rest", len(got), got[:2])
	}
}

// rawListener LISTENs on the change feed's channel on a connection of its
// own: it hears every notice and announces nothing, so the instances do
// not count it as an audience.
type rawListener struct {
	mu      sync.Mutex
	notices []notice
}

func listenRaw(t *testing.T, dsn string) *rawListener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		t.Fatal(err)
	}
	l := &rawListener{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			if got, _, ok := decodeNotice(n.Payload); ok {
				l.mu.Lock()
				l.notices = append(l.notices, got)
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return l
}

// heard reports whether a notice from origin that matches ok came.
func (l *rawListener) heard(origin string, ok func(notice) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.notices {
		if n.Origin == origin && ok(n) {
			return true
		}
	}
	return false
}

// carriesChange reports whether a notice has a change of run.
func carriesChange(run string) func(notice) bool {
	return func(n notice) bool {
		_, changes, _ := decodeNotice(mustJSON(n))
		for _, c := range changes {
			if c.RunID == run {
				return true
			}
		}
		return false
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pastGrace moves an instance's join back past joinGrace, as if it had
// listened that long.
func pastGrace(s *Store) {
	s.feed.mu.Lock()
	s.feed.joinedAt = s.feed.joinedAt.Add(-joinGrace)
	s.feed.mu.Unlock()
}

// dropped reports whether the notifier has taken every change queued and
// dropped some for want of an audience.
func (f *feed) dropped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending) == 0 && f.skipped
}

// An instance alone on its schema sends no change notices, which only
// its own listener would hear: past its join grace, with no other
// instance heard, it drops them. A newcomer's Hello gives it an audience:
// it answers Here, saying that it dropped changes, and the changes it
// commits after reach the newcomer.
func TestAnInstanceAloneSendsNoChangesUntilANewcomerSaysHello(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	raw := listenRaw(t, dsn)
	a := open(t, dsn, schema, nil)
	eventually(t, "a's Hello", 10*time.Second, func() bool { return raw.heard(a.feed.origin, func(n notice) bool { return n.Hello }) })
	pastGrace(a)
	newRun(t, a, "t", "s1", "r1", 1)
	eventually(t, "a to drop r1's change, alone", 10*time.Second, a.feed.dropped)

	b := open(t, dsn, schema, nil)
	var rb recorder
	defer b.SubscribeChanges(rb.add)()
	eventually(t, "a to answer b's Hello, saying it dropped changes", 10*time.Second, func() bool {
		return raw.heard(a.feed.origin, func(n notice) bool { return n.Here && n.Skipped })
	})
	newRun(t, a, "t", "s2", "r2", 1)
	eventually(t, "b to hear of r2", 10*time.Second, func() bool { return rb.has("r2", 1) })
	eventually(t, "the raw listener to hear of r2", 10*time.Second, func() bool { return raw.heard(a.feed.origin, carriesChange("r2")) })
	// One channel, in commit order: had a sent r1's change, it would have
	// come before r2's.
	if raw.heard(a.feed.origin, carriesChange("r1")) {
		t.Fatal("a sent r1's change, made while it was alone")
	}
}

// A newcomer that hears a Here saying its sender dropped changes reads
// everything again (a Rescan to its subscribers): what it missed is what
// the sender dropped between the newcomer's LISTEN and its Hello. A Here
// that dropped nothing, or one heard long after joining, asks for nothing.
func TestANewcomerRescansWhenAnswerSaysChangesWereDropped(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	b := open(t, dsn, freshSchema(t, dsn), nil)
	var rb recorder
	defer b.SubscribeChanges(rb.add)()
	here := func(skipped bool) string {
		return mustJSON(notice{Origin: "other", Schema: b.feed.schema, Here: true, Skipped: skipped})
	}
	b.feed.handle(here(false))
	b.feed.handle(here(true))
	eventually(t, "a Rescan", 10*time.Second, func() bool { return rb.has("", 0) })
	if got := rb.all(); len(got) != 1 {
		t.Fatalf("b's subscriber got %+v; want one Rescan", got)
	}
	b.feed.mu.Lock()
	b.feed.joinedAt = b.feed.joinedAt.Add(-peerTTL)
	b.feed.mu.Unlock()
	b.feed.handle(here(true))
	b.feed.handle(mustJSON(notice{Origin: "other", Schema: b.feed.schema, Changes: []json.RawMessage{json.RawMessage(`["t","s","r9",3,"n"]`)}}))
	eventually(t, "r9's change", 10*time.Second, func() bool { return rb.has("r9", 3) })
	if got := rb.all(); len(got) != 2 {
		t.Fatalf("b's subscriber got %+v; want the Rescan and r9's change", got)
	}
}

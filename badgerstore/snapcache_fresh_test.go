package badgerstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// grown is r with a tool message of n bytes more in its transcript, as a
// step's tool results make a snapshot grow. It shares nothing with r's
// transcript.
func grown(r loop.Run, n int) loop.Run {
	r.Transcript = append(append([]abi.Message(nil), r.Transcript...),
		abi.Message{Role: abi.MessageTool, ToolCallID: "call_1_1", Content: strings.Repeat("x", n)})
	return r
}

// bigSnapAt is snapAt's Run grown by n bytes.
func bigSnapAt(id string, seq int64, n int) []byte {
	r := grown(loop.Run{Spec: loop.Spec{Tenant: "t", Session: "s", ID: id}, Seq: seq}, n)
	return runcodec.Append(nil, &r)
}

// checkSnapCache fails the test unless the cache's byte count is what its
// entries hold, and within its bound.
func checkSnapCache(t *testing.T, c *snapCache, after string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	sum := 0
	for _, e := range c.m {
		sum += len(e.snap)
	}
	if c.bytes != sum {
		t.Fatalf("after %s: the cache counts %d bytes and holds %d in %d entries", after, c.bytes, sum, len(c.m))
	}
	if sum > max(c.max, 0) {
		t.Fatalf("after %s: the cache holds %d bytes, over its bound of %d", after, sum, c.max)
	}
}

// A commit whose snapshot is past the cache's bound is not cached, and the
// Run's older entry goes: LoadRun answered the older version for good,
// and the next outcome, applied to it, was refused as an unknown effect.
func TestASnapshotLargerThanTheCacheDropsTheOlderEntry(t *testing.T) {
	small := snapAt("r", 1)
	c := newSnapCache(len(small) + 64)
	c.put("t", "r", 1, small)
	if r, ok, err := c.load("t", "r"); !ok || err != nil || r.Seq != 1 {
		t.Fatalf("the first put: %d, %v, %v", r.Seq, ok, err)
	}
	c.put("t", "r", 2, bigSnapAt("r", 2, c.max))
	if r, ok, err := c.load("t", "r"); ok || err != nil {
		t.Fatalf("after a put past the bound the cache answers Seq %d (%v); want no entry", r.Seq, err)
	}
	checkSnapCache(t, c, "a put past the bound")
	// The same through the store: the commit of a snapshot past the bound
	// leaves LoadRun to read Badger.
	ctx := context.Background()
	s := openT(t, t.TempDir(), Options{SnapshotCacheBytes: 4096})
	r := createRunT(t, s, "r")
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != 1 {
		t.Fatalf("load: %d, %v", got.Seq, err)
	}
	if _, ok, _ := s.snaps.load("t", "r"); !ok {
		t.Fatal("the created Run is not cached: the test proves nothing")
	}
	start := loop.Event{Type: loop.EventRunStarted, Seq: 2, At: 2}
	next, err := loop.Apply(r, start)
	if err != nil {
		t.Fatal(err)
	}
	next = grown(next, 8192)
	if _, err := s.Commit(ctx, runtime.Commit{Tenant: "t", Session: "s", RunID: "r", CommandID: "c", ExpectedSeq: 1, Events: []loop.Event{start}, Run: next}); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadRun(ctx, "t", "r")
	if err != nil || got.Seq != 2 || !reflect.DeepEqual(got, next) {
		t.Fatalf("a load after a commit past the cache's bound: Seq %d, %v; want the committed Seq 2", got.Seq, err)
	}
}

// The byte count is the sum of what the entries hold after every put,
// replacement, eviction and drop: a put that replaced an entry subtracted
// its size but left it in the map, where an eviction could subtract it
// again, and the count drifted below what the cache held, unbounded.
func TestTheCacheByteCountDriftsBelowWhatItHoldsNoMore(t *testing.T) {
	one := len(snapAt("a", 1))
	// Two entries, then one replaced by a snapshot that needs room: the
	// eviction that makes the room picks either entry, the replaced one
	// too, so the sequence is tried until both have surely been picked.
	big := bigSnapAt("a", 2, 2*one)
	if max := 4 * one; len(big) > max || one+len(big) <= max {
		t.Fatalf("a replacement of %d bytes in a cache of %d holding two of %d: the test proves nothing", len(big), max, one)
	}
	for trial := range 200 {
		c := newSnapCache(4 * one)
		c.put("t", "a", 1, snapAt("a", 1))
		c.put("t", "b", 1, snapAt("b", 1))
		checkSnapCache(t, c, "two puts")
		c.put("t", "a", 2, big)
		checkSnapCache(t, c, fmt.Sprintf("trial %d: a replacement that evicts", trial))
		if r, ok, err := c.load("t", "a"); !ok || err != nil || r.Seq != 2 {
			t.Fatalf("trial %d: the replaced entry answers Seq %d (%v, %v); want 2", trial, r.Seq, ok, err)
		}
	}
	// And random interleavings of the store's uses of the cache: commits
	// (begin, the write, a put or a drop, end), and reads that began
	// earlier putting what they found. After each step the count is what
	// the entries hold, within the bound, and no entry is older than what
	// was committed.
	type read struct {
		rd  snapRead
		id  string
		seq int64
	}
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 33))
		c := newSnapCache(4 * one)
		committed := map[string]int64{}
		var reads []read
		for step := range 2000 {
			id := fmt.Sprintf("r%d", rng.IntN(6))
			var what string
			switch op := rng.IntN(10); {
			case op < 4:
				c.begin("t", id)
				committed[id]++
				if rng.IntN(8) == 0 {
					c.drop("t", id) // a write that failed, or may have
				} else {
					c.put("t", id, committed[id], bigSnapAt(id, committed[id], rng.IntN(4*one)))
				}
				c.end("t", id)
				what = "commit"
			case op < 7:
				reads = append(reads, read{c.beginRead(), id, committed[id]})
				what = "read"
			case len(reads) > 0:
				i := rng.IntN(len(reads))
				r := reads[i]
				reads = append(reads[:i], reads[i+1:]...)
				id = r.id
				c.putRead(r.rd, "t", r.id, r.seq, bigSnapAt(r.id, r.seq, rng.IntN(2*one)))
				c.endRead(r.rd)
				what = fmt.Sprintf("putRead of Seq %d", r.seq)
			}
			checkSnapCache(t, c, fmt.Sprintf("seed %d, step %d (%s of %s)", seed, step, what, id))
			if r, ok, err := c.load("t", id); err != nil || (ok && r.Seq != committed[id]) {
				t.Fatalf("seed %d, step %d (%s): %s answers Seq %d (%v), committed %d", seed, step, what, id, r.Seq, err, committed[id])
			}
		}
	}
}

// The Run CreateRun returns shares no bytes with the cache: changing it
// changes nothing a later load returns. The port says the store keeps no
// reference to what it hands out.
func TestACreatedRunSharesNothingWithTheCache(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), Options{})
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "r", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Metadata: []byte(`{"k":"v"}`)}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	want := r.Clone()
	res, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	res.Run.Metadata[2] = 'X'
	got, err := s.LoadRun(ctx, "t", "r")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("a load after the created Run was changed: %s, %v; want %s", got.Metadata, err, want.Metadata)
	}
}

// oneRunCache opens a store whose cache holds r's snapshot as created or
// as started, and never two Runs' like it: creating a Run evicts every
// other Run's entry.
func oneRunCache(t *testing.T, clock runtime.Clock, id string) *Store {
	t.Helper()
	spec := loop.Spec{Tenant: "t", Session: "s", ID: id, Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	created, err := loop.Apply(loop.Run{}, loop.RunCreated(spec, 1))
	if err != nil {
		t.Fatal(err)
	}
	started, err := loop.Apply(created, loop.Event{Type: loop.EventRunStarted, Seq: 2, At: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := len(encodeSnapshot(&created)), len(encodeSnapshot(&started))
	bound := max(a, b) + 8
	if 2*min(a, b) <= bound {
		t.Fatalf("snapshots of %d and %d bytes: two fit in %d", a, b, bound)
	}
	return openT(t, t.TempDir(), Options{Clock: clock, SnapshotCacheBytes: bound})
}

// holdOnce is a beforePutRead hook that holds the first putRead until
// release is closed, once read is closed; the others go on.
func holdOnce() (hook func(), read, release chan struct{}) {
	read, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func() { once.Do(func() { close(read); <-release }) }, read, release
}

// A load reads Badger, then caches what it read. A commit that completes
// between the two, and whose entry is then evicted, must not leave the
// load's older version cached: the load began before the commit changed
// the Run, so it puts nothing.
func TestALoadNeverCachesAnOlderVersionThanACommitInItsGap(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := oneRunCache(t, clock, "r")
	r := createRunT(t, s, "r")
	if _, ok, _ := s.snaps.load("t", "r"); !ok {
		t.Fatal("the created Run is not cached: the test proves nothing")
	}
	createRunT(t, s, "other1") // evicts r
	if _, ok, _ := s.snaps.load("t", "r"); ok {
		t.Fatal("r is still cached: the test proves nothing")
	}
	hook, read, release := holdOnce()
	s.snaps.beforePutRead = hook
	loaded := make(chan loop.Run, 1)
	go func() {
		got, err := s.LoadRun(ctx, "t", "r")
		if err != nil {
			t.Error(err)
		}
		loaded <- got
	}()
	<-read // the load has read Seq 1 from Badger
	next := commitStartT(t, s, r, 0)
	if _, ok, _ := s.snaps.load("t", "r"); !ok {
		t.Fatal("the commit's snapshot is not cached: the test proves nothing")
	}
	createRunT(t, s, "other2") // evicts the commit's entry
	close(release)
	if got := <-loaded; got.Seq != 1 {
		t.Fatalf("the load read Seq %d; the test wants it to have read Seq 1", got.Seq)
	}
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != next.Seq {
		t.Fatalf("a load after the commit: Seq %d, %v; want %d", got.Seq, err, next.Seq)
	}
}

// createRunIn creates Run id, pending, in tenant t and session.
func createRunIn(t *testing.T, s *Store, session, id string) {
	t.Helper()
	spec := loop.Spec{Tenant: "t", Session: session, ID: id, Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRun(context.Background(), runtime.CreateRun{Run: r, Event: ev}); err != nil {
		t.Fatal(err)
	}
}

// commitStartT commits r's start under epoch.
func commitStartT(t *testing.T, s *Store, r loop.Run, epoch uint64) loop.Run {
	t.Helper()
	start := loop.Event{Type: loop.EventRunStarted, Seq: r.Seq + 1, At: 2}
	next, err := loop.Apply(r, start)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(context.Background(), runtime.Commit{Tenant: "t", Session: "s", RunID: r.ID, CommandID: "start", ExpectedSeq: r.Seq,
		Epoch: epoch, Events: []loop.Event{start}, Run: next}); err != nil {
		t.Fatal(err)
	}
	return next
}

// The same for a claim, which caches the active Runs it read.
func TestAClaimNeverCachesAnOlderVersionThanACommitInItsGap(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := oneRunCache(t, clock, "r")
	r := createRunT(t, s, "r")
	createRunIn(t, s, "s2", "other1") // evicts r
	if _, ok, _ := s.snaps.load("t", "r"); ok {
		t.Fatal("r is still cached: the test proves nothing")
	}
	now := clock.Now().UnixMilli()
	if err := s.RegisterNode(ctx, "n", now+60_000); err != nil {
		t.Fatal(err)
	}
	hook, read, release := holdOnce()
	s.snaps.beforePutRead = hook
	claimed := make(chan []runtime.SessionClaim, 1)
	go func() {
		claims, err := s.ClaimSessions(ctx, "n", now, []runtime.SessionRef{{Tenant: "t", Session: "s"}})
		if err != nil {
			t.Error(err)
		}
		claimed <- claims
	}()
	<-read // the claim is written, and has read the session's one Run, r, at Seq 1
	next := commitStartT(t, s, r, 1)
	if _, ok, _ := s.snaps.load("t", "r"); !ok {
		t.Fatal("the commit's snapshot is not cached: the test proves nothing")
	}
	createRunIn(t, s, "s2", "other2") // evicts the commit's entry
	close(release)
	claims := <-claimed
	if len(claims) != 1 || claims[0].Epoch != 1 || len(claims[0].Active) != 1 || claims[0].Active[0].ID != "r" || claims[0].Active[0].Seq != 1 {
		t.Fatalf("the claim: %+v; the test wants it to have read r at Seq 1", claims)
	}
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != next.Seq {
		t.Fatalf("a load after the commit: Seq %d, %v; want %d", got.Seq, err, next.Seq)
	}
}

// At the cache itself: a read puts nothing for a Run that a commit began,
// put, dropped or ended since the read began, whatever became of the
// commit's entry; other Runs it puts. The record of changes is kept only
// while reads are under way, and is bounded.
func TestAReadNeverCachesAVersionOlderThanACommitSinceItBegan(t *testing.T) {
	one := len(snapAt("r", 1))
	for name, change := range map[string]func(c *snapCache){
		"a commit evicted": func(c *snapCache) {
			c.begin("t", "r")
			c.put("t", "r", 2, snapAt("r", 2))
			c.end("t", "r")
			c.put("t", "x", 1, make([]byte, c.max)) // evicts every other entry
		},
		"a commit dropped": func(c *snapCache) {
			c.begin("t", "r")
			c.drop("t", "r")
			c.end("t", "r")
		},
		"a commit past the bound": func(c *snapCache) {
			c.begin("t", "r")
			c.put("t", "r", 2, bigSnapAt("r", 2, 4*one))
			c.end("t", "r")
		},
		"a commit under way": func(c *snapCache) {
			c.begin("t", "r")
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := newSnapCache(2*one + 8)
			rd := c.beginRead()
			change(c)
			c.putRead(rd, "t", "r", 1, snapAt("r", 1))
			if r, ok, _ := c.load("t", "r"); ok && r.Seq != 2 {
				t.Fatalf("the cache answers Seq %d, older than the commit", r.Seq)
			}
			c.putRead(rd, "t", "z", 1, snapAt("z", 1))
			c.endRead(rd)
			if _, ok, _ := c.load("t", "z"); !ok {
				t.Fatal("a Run no commit changed was not cached")
			}
			if len(c.changed) != 0 {
				t.Fatalf("%d changes still recorded with no read under way", len(c.changed))
			}
			checkSnapCache(t, c, name)
		})
	}
	// Past maxChanged Runs changed while a read is under way, the record
	// is cleared and that read puts nothing at all.
	c := newSnapCache(4 * one)
	rd := c.beginRead()
	for i := range maxChanged + 1 {
		c.drop("t", fmt.Sprintf("r%d", i))
	}
	if len(c.changed) > maxChanged {
		t.Fatalf("%d changes recorded, over the bound of %d", len(c.changed), maxChanged)
	}
	c.putRead(rd, "t", "r0", 1, snapAt("r0", 1))
	c.putRead(rd, "t", "z", 1, snapAt("z", 1))
	if _, ok, _ := c.load("t", "r0"); ok {
		t.Fatal("a Run changed during the read was cached after the record was cleared")
	}
	later := c.beginRead()
	c.putRead(later, "t", "z", 1, snapAt("z", 1))
	c.endRead(later)
	c.endRead(rd)
	if _, ok, _ := c.load("t", "z"); !ok {
		t.Fatal("a read that began after the record was cleared puts nothing")
	}
}

// End to end, through the runtime: a Run whose snapshot outgrows the
// cache's bound as its step's tool results come in still completes. The
// cache kept its older version, the tool's settlement was applied to it
// and refused as an unknown effect, and the Run stuck for ever.
func TestARunWhoseSnapshotOutgrowsTheCacheCompletes(t *testing.T) {
	text := strings.Repeat("x", 4096)
	script := `call:echo({"text":"` + text + `"}),echo({"text":"` + text + `"})|answer:done`
	run := func(t *testing.T, cacheBytes int) (loop.Run, *Store) {
		var s *Store
		e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s = openT(t, t.TempDir(), Options{Clock: clock, SnapshotCacheBytes: cacheBytes})
			return s
		}}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		created, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: script})
		if err != nil {
			t.Fatal(err)
		}
		return e.UntilTerminal(e.Runtime, created.ID, time.Second), s
	}
	// The Run's versions, from a run with the cache at its default: the
	// bound below holds its creation and not its end.
	done, s := run(t, 0)
	evs, err := s.Events(context.Background(), "acme", done.ID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cur loop.Run
	var sizes []int
	for _, ev := range evs {
		if cur, err = loop.Apply(cur, ev); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(encodeSnapshot(&cur)))
	}
	bound := sizes[0] + 256
	if sizes[len(sizes)-1] <= bound {
		t.Fatalf("the Run's snapshot grows from %d to %d bytes only: the test proves nothing", sizes[0], sizes[len(sizes)-1])
	}
	got, _ := run(t, bound)
	if got.Status != loop.StatusCompleted || got.Result != "done" {
		t.Fatalf("with a cache of %d bytes the Run ended %s (%q), failure %+v; want completed", bound, got.Status, got.Result, got.Failure)
	}
}

// Two commits of one Run under way at once (a group transaction holds
// r0's first, its second, and a stale third that is refused) return to
// their callers in any order. The older one's put, after the refused
// one's drop, used to cache the older version over the committed one:
// TestAGroupAnswersEachCommitByItsOwnChecks then read r0 at Seq 2, with
// Seq 3 in the store. An overlapped commit drops the entry instead.
func TestOverlappingCommitsOfARunNeverLeaveAnOlderVersionCached(t *testing.T) {
	c := newSnapCache(1 << 20)
	for _, begun := range [][]string{{"first", "second", "stale"}, {"second", "first", "stale"}} {
		for range begun {
			c.begin("t", "r")
		}
		// The answers return newest first, the refusal between.
		c.putCommitted("t", "r", 3, snapAt("r", 3))
		c.drop("t", "r")
		c.putCommitted("t", "r", 2, snapAt("r", 2))
		for range begun {
			c.end("t", "r")
		}
		if r, ok, err := c.load("t", "r"); ok && r.Seq != 3 {
			t.Fatalf("after overlapping commits the cache answers Seq %d (%v); want 3 or no entry", r.Seq, err)
		}
	}
	// A commit alone puts as before.
	c.begin("t", "r")
	c.putCommitted("t", "r", 4, snapAt("r", 4))
	c.end("t", "r")
	if r, ok, err := c.load("t", "r"); !ok || r.Seq != 4 {
		t.Fatalf("a commit alone: the cache answers Seq %d, %v, %v; want 4", r.Seq, ok, err)
	}
}

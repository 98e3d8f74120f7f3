package runtime_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// countingStore counts the log reads and the commits of each Run.
type countingStore struct {
	runtime.Store
	mu      sync.Mutex
	reads   map[string]int // Events calls, by Run
	commits map[string]int // Commit calls, by Run
}

func (c *countingStore) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	c.mu.Lock()
	c.reads[runID]++
	c.mu.Unlock()
	return c.Store.Events(ctx, tenant, runID, fromSeq, limit)
}

func (c *countingStore) Commit(ctx context.Context, cm runtime.Commit) (runtime.CommitResult, error) {
	c.mu.Lock()
	c.commits[cm.RunID]++
	c.mu.Unlock()
	return c.Store.Commit(ctx, cm)
}

// counts returns the reads and commits of a Run so far.
func (c *countingStore) counts(runID string) (reads, commits int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[runID], c.commits[runID]
}

func countingHarness(out **countingStore) conformance.RuntimeHarness {
	return conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		*out = &countingStore{Store: s, reads: map[string]int{}, commits: map[string]int{}}
		return *out
	}}
}

// follower collects what one Follow call streams.
type follower struct {
	mu    sync.Mutex
	seqs  []int64
	emits []string
	done  chan error
}

func follow(rt *runtime.Runtime, runID string, from int64) *follower {
	f := &follower{done: make(chan error, 1)}
	go func() {
		f.done <- rt.Follow(context.Background(), "acme", runID, from, func(it runtime.StreamItem) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if it.Event != nil {
				f.seqs = append(f.seqs, it.Event.Seq)
			} else {
				f.emits = append(f.emits, it.Emit.Message)
			}
			return nil
		})
	}()
	return f
}

func (f *follower) last() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seqs) == 0 {
		return 0
	}
	return f.seqs[len(f.seqs)-1]
}

// wait waits for the follower's Follow call to return, and fails unless
// it returned nil.
func (f *follower) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		close(f.done)
	case <-time.After(20 * time.Second):
		t.Fatal("Follow did not return after the Run's end")
	}
}

// wantWhole waits for the follower, and fails unless it streamed every
// event from from to the Run's last, in order, each once.
func (f *follower) wantWhole(t *testing.T, from int64, run loop.Run) {
	t.Helper()
	if _, open := <-f.done; open {
		t.Fatal("wantWhole before wait")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if int64(len(f.seqs)) != run.Seq-from+1 {
		t.Fatalf("follow from %d streamed %d events, want %d: %v", from, len(f.seqs), run.Seq-from+1, f.seqs)
	}
	for i, s := range f.seqs {
		if s != from+int64(i) {
			t.Fatalf("follow from %d: event %d has seq %d: %v", from, i, s, f.seqs)
		}
	}
}

// TestFollowersOfARunShareOneReadPerNotice: fifty followers of one Run
// cost the store one read of its log per commit notice, as one follower
// does, instead of one read per follower per notice.
func TestFollowersOfARunShareOneReadPerNotice(t *testing.T) {
	var store *countingStore
	e := conformance.NewRuntimeEnv(t, countingHarness(&store), nil)
	res := e.Execute("s1", `call:wire({"text":"w"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	const n = 50
	fs := make([]*follower, n)
	for i := range fs {
		fs[i] = follow(e.Runtime, res.Run.ID, 1)
	}
	conformance.Eventually(t, "every follower to stream the log so far", func() bool {
		for _, f := range fs {
			if f.last() != res.Run.Seq {
				return false
			}
		}
		return true
	})
	reads0, commits0 := store.counts(res.Run.ID)

	// The clock does not move: only the commits' notices wake the tail.
	if _, err := e.Runtime.Approve(context.Background(), "acme", res.Run.ID,
		[]abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		f.wait(t)
	}
	run, err := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		f.wantWhole(t, 1, run)
	}
	reads, commits := store.counts(res.Run.ID)
	reads, commits = reads-reads0, commits-commits0
	t.Logf("%d followers, %d commits: %d reads of the log", n, commits, reads)
	if commits == 0 {
		t.Fatal("the approval committed nothing")
	}
	// One read per notice, and one the first follower to join asked for
	// (it may come after the counts above were taken).
	if reads > commits+1 {
		t.Fatalf("%d followers, %d commits: %d reads of the log; want at most one per commit, not one per follower", n, commits, reads)
	}
	if st := e.Runtime.Hub().FollowStats(); st.Followers != 0 || st.Tails != 0 {
		t.Fatalf("after the end: %+v, want no follower and no tail left", st)
	}
}

// TestFollowersJoinTheTailWithoutAGapOrADuplicate starts followers from
// every point of a Run's log while it runs, before and after others
// joined the tail, and checks each streams every event from its start to
// the end once, in order.
func TestFollowersJoinTheTailWithoutAGapOrADuplicate(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", `call:slow({"text":"a"})|call:slow({"text":"b"})|call:slow({"text":"c"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	type started struct {
		from int64
		f    *follower
	}
	var all []started
	add := func(from int64) { all = append(all, started{from, follow(e.Runtime, res.Run.ID, from)}) }
	for from := int64(1); from <= res.Run.Seq+2; from++ {
		add(from)
	}
	// Move the Run on a step at a time, adding followers from the start,
	// the middle and the head of its log as it grows.
	for {
		run, err := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status.Terminal() {
			break
		}
		add(1)
		add(run.Seq / 2)
		add(run.Seq)
		add(run.Seq + 1)
		conformance.Eventually(t, "the runtime to be quiescent", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
		e.Clock.Advance(time.Second)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, time.Second)
	t.Logf("%d followers, the Run has %d events", len(all), run.Seq)
	for _, s := range all {
		s.f.wait(t)
		s.f.wantWhole(t, max(s.from, 1), run)
	}
}

// TestAFollowerThatFallsBehindReadsItsBacklog: a follower whose caller
// takes nothing while its Run commits more events than its queue holds
// falls behind the tail, then reads the rest from the store and streams
// every event once, in order.
func TestAFollowerThatFallsBehindReadsItsBacklog(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], func(tn *runtime.Tenant) { tn.Limits.MaxSteps = 100 })
	script := `call:wire({"text":"w"})|` + strings.Repeat(`call:echo({"text":"e"})|`, 80) + `answer:$results`
	res := e.Execute("s1", script)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	release := make(chan struct{})
	blocked := make(chan struct{})
	var seqs []int64
	done := make(chan error, 1)
	go func() {
		done <- e.Runtime.Follow(context.Background(), "acme", res.Run.ID, 1, func(it runtime.StreamItem) error {
			if it.Event == nil {
				return nil
			}
			if len(seqs) == 0 {
				close(blocked)
				<-release
			}
			seqs = append(seqs, it.Event.Seq)
			return nil
		})
	}()
	<-blocked // it read its backlog and joined the tail, and takes nothing more
	before := e.Runtime.Hub().FollowStats()
	if _, err := e.Runtime.Approve(context.Background(), "acme", res.Run.ID,
		[]abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, time.Second)
	if run.Seq-res.Run.Seq < 300 {
		t.Fatalf("the Run committed %d events after the approval; the test needs more than the follower's queue holds", run.Seq-res.Run.Seq)
	}
	t.Logf("%d events after the approval", run.Seq-res.Run.Seq)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if int64(len(seqs)) != run.Seq {
		t.Fatalf("streamed %d events, the Run has %d", len(seqs), run.Seq)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, s)
		}
	}
	if after := e.Runtime.Hub().FollowStats(); after.BacklogReads == before.BacklogReads {
		t.Fatalf("the follower never read a backlog after the approval (%+v): it did not fall behind, and the test shows nothing", after)
	}
}

// TestNewFollowerCapsTheFollowersOfATenant: past MaxPerTenant a tenant's
// new follower is refused and counted; another tenant's is not, and a
// closed follower frees its place.
func TestNewFollowerCapsTheFollowersOfATenant(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", "ask:Which?|answer:ok")
	limit := runtime.FollowOptions{MaxPerTenant: 2}
	var open []*runtime.Follower
	for range 2 {
		f, err := e.Runtime.NewFollower("acme", res.Run.ID, 1, limit)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
	}
	if _, err := e.Runtime.NewFollower("acme", res.Run.ID, 1, limit); !errors.Is(err, runtime.ErrTooManyFollowers) {
		t.Fatalf("a third follower of acme: %v, want ErrTooManyFollowers", err)
	}
	other, err := e.Runtime.NewFollower("globex", "run_of_globex", 1, limit)
	if err != nil {
		t.Fatalf("globex's follower: %v", err)
	}
	other.Close()
	open[0].Close()
	open[0].Close() // twice is harmless
	f, err := e.Runtime.NewFollower("acme", res.Run.ID, 1, limit)
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	f.Drop()
	open[1].Close()
	st := e.Runtime.Hub().FollowStats()
	if st.Refused != 1 || st.Dropped != 1 || st.Followers != 0 || st.Tails != 0 {
		t.Fatalf("stats %+v, want 1 refused, 1 dropped, nothing open", st)
	}
}

// endingStore makes a Run end at one chosen moment: between a read of its
// log that found nothing and the look at its snapshot that follows.
type endingStore struct {
	runtime.Store
	mu    sync.Mutex
	runID string
	empty bool   // the last read of runID's log found nothing
	hook  func() // run once, in that LoadRun, before it reads
}

func (s *endingStore) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	evs, err := s.Store.Events(ctx, tenant, runID, fromSeq, limit)
	s.mu.Lock()
	if runID == s.runID {
		s.empty = err == nil && len(evs) == 0
	}
	s.mu.Unlock()
	return evs, err
}

func (s *endingStore) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	s.mu.Lock()
	var hook func()
	if runID == s.runID && s.empty && s.hook != nil {
		hook, s.hook = s.hook, nil
	}
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s.Store.LoadRun(ctx, tenant, runID)
}

// TestAFollowerGetsTheEndOfARunThatEndsWhileItLooks: a follower that
// finds the log empty and then the Run terminal reads the log again
// before it ends: the Run may have ended in between, and its last events
// (the terminal one among them) are then in the log, not delivered. The
// stream used to end without them (seen in TestThreeNodesSurviveAKill: a
// stream "ended after event 10 without the Run's end").
func TestAFollowerGetsTheEndOfARunThatEndsWhileItLooks(t *testing.T) {
	var s *endingStore
	e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		m := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = m.Close() })
		s = &endingStore{Store: m}
		return s
	}}, nil)
	res := e.Execute("s1", `call:wire({"text":"w"})|answer:done`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	approved, ended := make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.runID = res.Run.ID
	s.hook = func() {
		if _, err := e.Runtime.Approve(context.Background(), "acme", res.Run.ID,
			[]abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
			t.Error(err)
		}
		close(approved)
		<-ended
	}
	s.mu.Unlock()
	// From past the last event: the follower's first read of the log
	// finds nothing, and the Run ends before it looks at the snapshot.
	f := follow(e.Runtime, res.Run.ID, res.Run.Seq+1)
	select {
	case <-approved:
	case <-time.After(20 * time.Second):
		t.Fatal("the follower never looked at the snapshot after an empty read")
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, time.Second)
	close(ended)
	f.wait(t)
	f.wantWhole(t, res.Run.Seq+1, run)
}

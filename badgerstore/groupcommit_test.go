package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The store suite again with every Run commit in a transaction of its
// own, the path a commit takes when its group cannot take it.
func TestStoreConformanceOneCommitATransaction(t *testing.T) {
	storeSuite(t, Options{MaxGroupCommits: 1})
}

// inOneGroup has the n writes that start(i) begins, each on a goroutine
// of its own, queue in order behind a leader held before it takes its
// group, then lets the leader go: they are committed in one group.
func inOneGroup(t *testing.T, s *Store, n int, start func(i int)) {
	t.Helper()
	free := make(chan struct{})
	defer close(free) // on a t.Fatal too
	first := true
	s.commits.beforeTake = func() {
		if first {
			first = false
			<-free
		}
	}
	for i := range n {
		start(i)
		// Wait until it has queued, so that the next one queues after it.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.commits.mu.Lock()
			got := len(s.commits.queue)
			s.commits.mu.Unlock()
			if got > i {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the commit queue holds %d writes after 10 s, want %d", got, i+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// startCommit is the commit of the event that starts Run r (Seq+1) under
// command cmd, checked against expectedSeq and epoch.
func startCommit(t *testing.T, r loop.Run, cmd string, expectedSeq int64, epoch uint64) runtime.Commit {
	t.Helper()
	return eventCommit(t, r, loop.EventRunStarted, cmd, expectedSeq, epoch)
}

// eventCommit is the commit of an event of type typ to Run r (Seq+1).
func eventCommit(t *testing.T, r loop.Run, typ loop.EventType, cmd string, expectedSeq int64, epoch uint64) runtime.Commit {
	t.Helper()
	ev := loop.Event{Type: typ, Seq: r.Seq + 1, At: r.Seq + 1}
	next, err := loop.Apply(r, ev)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.Commit{Tenant: r.Tenant, Session: r.Session, RunID: r.ID, CommandID: cmd, ExpectedSeq: expectedSeq, Epoch: epoch,
		Events: []loop.Event{ev}, Run: next}
}

type commitAnswer struct {
	res runtime.CommitResult
	err error
}

// sendCommit commits c on a goroutine of its own; the answer comes on the
// channel.
func sendCommit(s *Store, c runtime.Commit) <-chan commitAnswer {
	ch := make(chan commitAnswer, 1)
	go func() {
		res, err := s.Commit(context.Background(), c)
		ch <- commitAnswer{res, err}
	}()
	return ch
}

// wantStoredBytesRecounted checks the tenant's stored bytes, as the
// writes kept them, against a count from the keys by a fresh open.
func wantStoredBytesRecounted(t *testing.T, s *Store, dir string) {
	t.Helper()
	ctx := context.Background()
	kept, err := s.TenantStoredBytes(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	again := openT(t, dir, Options{})
	counted, err := again.TenantStoredBytes(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if kept != counted {
		t.Fatalf("the writes kept %d stored bytes for the tenant; its keys hold %d", kept, counted)
	}
}

// Commits that arrive while another is being written share one
// transaction, and so one sync, and each is written as if alone.
func TestConcurrentCommitsShareOneTransaction(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	const n = 8
	runs := make([]loop.Run, n)
	for i := range runs {
		runs[i] = createRunT(t, s, fmt.Sprintf("r%d", i))
	}
	groups0, commits0 := s.CommitGroups()
	answers := make([]<-chan commitAnswer, n)
	inOneGroup(t, s, n, func(i int) { answers[i] = sendCommit(s, startCommit(t, runs[i], "start", 1, 0)) })
	for i, ch := range answers {
		if a := <-ch; a.err != nil || a.res.Seq != 2 || a.res.Duplicate {
			t.Fatalf("commit to r%d: %+v, %v; want Seq 2", i, a.res, a.err)
		}
	}
	if groups, commits := s.CommitGroups(); groups-groups0 != 1 || commits-commits0 != n {
		t.Fatalf("%d group transactions wrote %d commits; want 1 for all %d", groups-groups0, commits-commits0, n)
	}
	for i := range runs {
		r, err := s.LoadRun(context.Background(), "t", fmt.Sprintf("r%d", i))
		if err != nil || r.Seq != 2 || r.Status != loop.StatusRunning {
			t.Fatalf("r%d after the group: Seq %d, %s, %v", i, r.Seq, r.Status, err)
		}
		evs, err := s.Events(context.Background(), "t", r.ID, 0, 0)
		if err != nil || len(evs) != 2 || evs[1].Type != loop.EventRunStarted {
			t.Fatalf("r%d's events after the group: %v, %v", i, evs, err)
		}
	}
	wantStoredBytesRecounted(t, s, dir)
}

// In one group, each commit gets the answer its own checks give against
// what the commits before it in the group wrote: a second commit to the
// same Run sees the first, a stale or fenced one is refused alone, a
// repeated command is a duplicate, and the others are written.
func TestAGroupAnswersEachCommitByItsOwnChecks(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	r0, r1, r2, r3, r4 := createRunT(t, s, "r0"), createRunT(t, s, "r1"), createRunT(t, s, "r2"), createRunT(t, s, "r3"), createRunT(t, s, "r4")
	done := startCommit(t, r3, "start", 1, 0)
	if _, err := s.Commit(ctx, done); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, startCommit(t, r1, "start", 1, 0)); err != nil {
		t.Fatal(err)
	}
	first := startCommit(t, r0, "start", 1, 0)
	second := eventCommit(t, first.Run, loop.EventCancelRequested, "cancel", 2, 0)
	cases := []struct {
		name    string
		c       runtime.Commit
		wantErr error
		wantSeq int64
		dup     bool
	}{
		{"r0's first", first, nil, 2, false},
		{"r0's second, on the first", second, nil, 3, false},
		{"r0's second again, stale", eventCommit(t, first.Run, loop.EventCancelRequested, "late", 2, 0), runtime.ErrVersionConflict, 0, false},
		{"r1 at a Seq it is past", startCommit(t, r1, "start-again", 1, 0), runtime.ErrVersionConflict, 0, false},
		{"r2 with another epoch", startCommit(t, r2, "start", 1, 7), runtime.ErrFenced, 0, false},
		{"r3's command again", done, nil, 2, true},
		{"r4's first", startCommit(t, r4, "start", 1, 0), nil, 2, false},
	}
	groups0, commits0 := s.CommitGroups()
	answers := make([]<-chan commitAnswer, len(cases))
	inOneGroup(t, s, len(cases), func(i int) { answers[i] = sendCommit(s, cases[i].c) })
	for i, tc := range cases {
		a := <-answers[i]
		switch {
		case tc.wantErr != nil && !errors.Is(a.err, tc.wantErr):
			t.Errorf("%s: %+v, %v; want %v", tc.name, a.res, a.err, tc.wantErr)
		case tc.wantErr == nil && (a.err != nil || a.res.Seq != tc.wantSeq || a.res.Duplicate != tc.dup):
			t.Errorf("%s: %+v, %v; want Seq %d, duplicate %v", tc.name, a.res, a.err, tc.wantSeq, tc.dup)
		}
	}
	if groups, commits := s.CommitGroups(); groups-groups0 != 1 || commits-commits0 != 3 {
		t.Fatalf("%d group transactions wrote %d commits; want 1 writing 3 (r0's two and r4's)", groups-groups0, commits-commits0)
	}
	for id, want := range map[string]int64{"r0": 3, "r1": 2, "r2": 1, "r3": 2, "r4": 2} {
		r, err := s.LoadRun(ctx, "t", id)
		if err != nil || r.Seq != want {
			t.Errorf("%s after the group: Seq %d, %v; want %d", id, r.Seq, err, want)
		}
		evs, err := s.Events(ctx, "t", id, 0, 0)
		if err != nil || int64(len(evs)) != want {
			t.Errorf("%s after the group: %d events, %v; want %d", id, len(evs), err, want)
		}
	}
	wantStoredBytesRecounted(t, s, dir)
}

// groupedKeyWrite is a commit for commitGroup that writes key k, and then
// returns fail (after writing, when wrote is set).
func groupedKeyWrite(k string, fail error, wrote bool) *groupedCommit {
	return &groupedCommit{tenant: "t", apply: func(txn *badger.Txn) (int64, bool, error) {
		if fail != nil && !wrote {
			return 0, false, fail
		}
		if err := txn.Set([]byte(k), []byte("v")); err != nil {
			return 0, true, err
		}
		return 0, true, fail
	}}
}

func keyExists(t *testing.T, s *Store, k string) bool {
	t.Helper()
	err := s.db.View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte(k))
		return err
	})
	if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// A commit that fails its checks is answered alone; one that fails after
// it has written spoils the group's transaction, which then writes
// nothing, and every commit of the group goes to a transaction of its own.
func TestAGroupWritesNothingOfACommitThatFailed(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	refused := errors.New("refused by its checks")
	group := []*groupedCommit{groupedKeyWrite("g1/a", nil, false), groupedKeyWrite("g1/x", refused, false), groupedKeyWrite("g1/b", nil, false)}
	s.commitGroup(group)
	if group[0].err != nil || !errors.Is(group[1].err, refused) || group[2].err != nil {
		t.Fatalf("answers %v, %v, %v; want nil, %v, nil", group[0].err, group[1].err, group[2].err, refused)
	}
	if !keyExists(t, s, "g1/a") || keyExists(t, s, "g1/x") || !keyExists(t, s, "g1/b") {
		t.Fatal("a group wrote a refused commit, or left out one that passed")
	}

	broken := errors.New("failed while writing")
	group = []*groupedCommit{groupedKeyWrite("g2/a", nil, false), groupedKeyWrite("g2/x", broken, true), groupedKeyWrite("g2/b", nil, false)}
	s.commitGroup(group)
	for i, c := range group {
		if !errors.Is(c.err, errCommitAlone) {
			t.Fatalf("commit %d of a spoiled group: %v; want errCommitAlone", i, c.err)
		}
	}
	for _, k := range []string{"g2/a", "g2/x", "g2/b"} {
		if keyExists(t, s, k) {
			t.Fatalf("a spoiled group wrote %s", k)
		}
	}
}

// A group whose transaction loses a conflict with a concurrent one runs
// again from the start, checks included, and is written once.
func TestAGroupThatLosesAConflictRunsAgain(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	runs := 0
	c := &groupedCommit{tenant: "t", apply: func(txn *badger.Txn) (int64, bool, error) {
		runs++
		item, err := txn.Get([]byte("k"))
		seen := ""
		switch {
		case err == nil:
			b, err := item.ValueCopy(nil)
			if err != nil {
				return 0, false, err
			}
			seen = string(b)
		case !errors.Is(err, badger.ErrKeyNotFound):
			return 0, false, err
		}
		if runs == 1 {
			// Another transaction writes what this one read.
			if err := s.db.Update(func(other *badger.Txn) error { return other.Set([]byte("k"), []byte("other")) }); err != nil {
				return 0, false, err
			}
		}
		return 0, true, txn.Set([]byte("k"), []byte(seen+"+group"))
	}}
	s.commitGroup([]*groupedCommit{c})
	if c.err != nil || runs != 2 {
		t.Fatalf("after a conflict: %v, %d runs; want nil and 2", c.err, runs)
	}
	var got string
	if err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("k"))
		if err != nil {
			return err
		}
		b, err := item.ValueCopy(nil)
		got = string(b)
		return err
	}); err != nil || got != "other+group" {
		t.Fatalf("k = %q, %v; want the group's write on the other's", got, err)
	}
}

// Creations share a group too, and each reads what the ones before it in
// the group wrote: Runs of one session get the next ordinals in turn, a
// repeated command names the first Run, and a Run that exists is refused.
func TestAGroupOfCreationsTakesOrdinalsInTurn(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	createRunT(t, s, "before")
	create := func(id, cmd string) runtime.CreateRun {
		spec := loop.Spec{Tenant: "t", Session: "s", ID: id, Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
		ev := loop.RunCreated(spec, 1)
		r, err := loop.Apply(loop.Run{}, ev)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.CreateRun{Run: r, Event: ev, CommandID: cmd}
	}
	cases := []struct {
		name    string
		c       runtime.CreateRun
		wantErr error
		ord     int64
		run     string
		dup     bool
	}{
		{"c1", create("c1", "k1"), nil, 2, "c1", false},
		{"c2", create("c2", ""), nil, 3, "c2", false},
		{"k1 again", create("c9", "k1"), nil, 2, "c1", true},
		{"an existing Run", create("before", ""), runtime.ErrRunExists, 0, "", false},
		{"c3", create("c3", "k3"), nil, 4, "c3", false},
	}
	type answer struct {
		res runtime.CreateResult
		err error
	}
	groups0, commits0 := s.CommitGroups()
	answers := make([]chan answer, len(cases))
	inOneGroup(t, s, len(cases), func(i int) {
		answers[i] = make(chan answer, 1)
		go func() {
			res, err := s.CreateRun(ctx, cases[i].c)
			answers[i] <- answer{res, err}
		}()
	})
	for i, tc := range cases {
		a := <-answers[i]
		switch {
		case tc.wantErr != nil && !errors.Is(a.err, tc.wantErr):
			t.Errorf("%s: %v; want %v", tc.name, a.err, tc.wantErr)
		case tc.wantErr == nil && (a.err != nil || a.res.Ordinal != tc.ord || a.res.Run.ID != tc.run || a.res.Duplicate != tc.dup):
			t.Errorf("%s: run %s, ordinal %d, duplicate %v, %v; want %s, %d, %v", tc.name, a.res.Run.ID, a.res.Ordinal, a.res.Duplicate, a.err, tc.run, tc.ord, tc.dup)
		}
	}
	if groups, commits := s.CommitGroups(); groups-groups0 != 1 || commits-commits0 != 3 {
		t.Fatalf("%d group transactions wrote %d creations; want 1 writing 3", groups-groups0, commits-commits0)
	}
	runs, err := s.SessionRuns(ctx, "t", "s", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, r := range runs {
		order = append(order, fmt.Sprintf("%s@%d", r.Run.ID, r.Ordinal))
	}
	if got := fmt.Sprint(order); got != "[before@1 c1@2 c2@3 c3@4]" {
		t.Fatalf("the session's Runs: %s", got)
	}
	wantStoredBytesRecounted(t, s, dir)
}

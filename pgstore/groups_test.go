package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func holdFirstGroup(t *testing.T, s *Store) *heldBatches {
	h := newHeldBatches(t)
	s.writeGroupHook = h.hook
	return h
}

// untilWritesQueued waits until n writes wait in s's queue.
func untilWritesQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	untilCount(t, "writes queued", n, func() int {
		s.writes.mu.Lock()
		defer s.writes.mu.Unlock()
		return len(s.writes.pending)
	})
}

// openGroupStore opens a Store with writeGroups transactions of writes
// under way at most; with 1, whatever arrives while one is held queues.
func openGroupStore(t *testing.T, dsn string, writeGroups int) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{DSN: dsn, Schema: freshSchema(t, dsn), Logger: quietLogger(), WriteGroups: writeGroups})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startCommit is the Commit that starts r, under command cmd.
func startCommit(t *testing.T, r loop.Run, cmd string) runtime.Commit {
	t.Helper()
	return step(t, r, 0, cmd, loop.Event{Type: loop.EventRunStarted})
}

func seqOf(t *testing.T, s *Store, id string) int64 {
	t.Helper()
	r, err := s.LoadRun(context.Background(), "t", id)
	if err != nil {
		t.Fatal(err)
	}
	return r.Seq
}

// outcome is what one write of a group came back with.
type outcome struct {
	seq       int64
	duplicate bool
	ordinal   int64
	err       error
}

// The commits and creations that queue while a transaction is under way
// share the next one, and each is judged as it would be alone: in one
// group, a commit goes ahead, a retried command is a duplicate with its
// first Seq, a stale Seq is a version conflict, a wrong epoch is fenced,
// a missing Run is not found, a creation takes its session's next
// ordinal, a creation of a used run ID is refused and leaves no session
// behind. What was refused wrote nothing.
func TestWritesThatQueueShareATransactionEachJudgedAsAlone(t *testing.T) {
	s := openGroupStore(t, pgserver.NewDatabase(t), 1)
	ctx := context.Background()
	r0 := newRun(t, s, "t", "s0", "r0", 1)
	r1 := newRun(t, s, "t", "s1", "r1", 1)
	r2 := newRun(t, s, "t", "s2", "r2", 1)
	r3 := newRun(t, s, "t", "s3", "r3", 1)
	r4 := newRun(t, s, "t", "s4", "r4", 1)
	first, err := s.Commit(ctx, startCommit(t, r1, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	stale := startCommit(t, r3, "stale") // built on r3 as it was
	r3at, err := s.Commit(ctx, startCommit(t, r3, "c3"))
	if err != nil {
		t.Fatal(err)
	}
	groups0, grouped0 := s.CommitGroups()
	h := holdFirstGroup(t, s)
	held := make(chan error, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, r0, "held")); held <- err }()
	<-h.entered

	fenced := startCommit(t, r4, "fenced")
	fenced.Epoch = 7
	missing := startCommit(t, r2, "missing")
	missing.RunID = "nope"
	writes := map[string]func() outcome{
		"retried command": func() outcome {
			res, err := s.Commit(ctx, startCommit(t, r1, "c1"))
			return outcome{seq: res.Seq, duplicate: res.Duplicate, err: err}
		},
		"commit": func() outcome {
			res, err := s.Commit(ctx, startCommit(t, r2, "c2"))
			return outcome{seq: res.Seq, duplicate: res.Duplicate, err: err}
		},
		"stale seq":   func() outcome { _, err := s.Commit(ctx, stale); return outcome{err: err} },
		"wrong epoch": func() outcome { _, err := s.Commit(ctx, fenced); return outcome{err: err} },
		"missing run": func() outcome { _, err := s.Commit(ctx, missing); return outcome{err: err} },
		"creation": func() outcome {
			res, err := s.CreateRun(ctx, createReq(t, "t", "s1", "r5"))
			return outcome{seq: res.Run.Seq, ordinal: res.Ordinal, err: err}
		},
		"creation of a used ID": func() outcome {
			_, err := s.CreateRun(ctx, createReq(t, "t", "s9", "r2"))
			return outcome{err: err}
		},
	}
	var (
		mu  sync.Mutex
		got = map[string]outcome{}
		wg  sync.WaitGroup
	)
	for name, write := range writes {
		wg.Go(func() {
			o := write()
			mu.Lock()
			got[name] = o
			mu.Unlock()
		})
	}
	untilWritesQueued(t, s, len(writes))
	h.release()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if sizes := h.batchSizes(); len(sizes) != 2 || sizes[0] != 1 || sizes[1] != len(writes) {
		t.Fatalf("groups of %v writes; want [1 %d]", sizes, len(writes))
	}
	if groups, grouped := s.CommitGroups(); groups-groups0 != 2 || grouped-grouped0 != int64(1+len(writes)) {
		t.Errorf("CommitGroups: %d transactions of %d writes; want 2 of %d", groups-groups0, grouped-grouped0, 1+len(writes))
	}

	check := func(name string, ok bool, want string) {
		t.Helper()
		if !ok {
			t.Errorf("%s: got %+v; want %s", name, got[name], want)
		}
	}
	o := got["retried command"]
	check("retried command", o.err == nil && o.duplicate && o.seq == first.Seq, fmt.Sprintf("a duplicate at Seq %d", first.Seq))
	o = got["commit"]
	check("commit", o.err == nil && !o.duplicate && o.seq == r2.Seq+1, fmt.Sprintf("written at Seq %d", r2.Seq+1))
	check("stale seq", errors.Is(got["stale seq"].err, runtime.ErrVersionConflict), "ErrVersionConflict")
	check("wrong epoch", errors.Is(got["wrong epoch"].err, runtime.ErrFenced), "ErrFenced")
	check("missing run", errors.Is(got["missing run"].err, runtime.ErrRunNotFound), "ErrRunNotFound")
	o = got["creation"]
	check("creation", o.err == nil && o.ordinal == 2 && o.seq == 1, "the session's second Run at Seq 1")
	check("creation of a used ID", errors.Is(got["creation of a used ID"].err, runtime.ErrRunExists), "ErrRunExists")

	for id, want := range map[string]int64{"r0": r0.Seq + 1, "r1": first.Seq, "r2": r2.Seq + 1, "r3": r3at.Seq, "r4": r4.Seq, "r5": 1} {
		if seq := seqOf(t, s, id); seq != want {
			t.Errorf("run %s at Seq %d; want %d", id, seq, want)
		}
	}
	var sessions int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM sessions WHERE tenant = 't' AND session = 's9'`).Scan(&sessions); err != nil || sessions != 0 {
		t.Errorf("%d rows of the refused creation's session (%v); want none", sessions, err)
	}
}

// When PostgreSQL aborts a group's transaction, nothing of it is written
// and each write is written again alone, so that the error is its own
// write's: here one commit waits for a session another transaction
// holds until lock_timeout ends the wait; the commits grouped with it
// are written, it alone fails, and writes nothing.
func TestAnAbortedGroupIsWrittenAgainAloneAndTheErrorIsOneWrites(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	conn := connect(t, dsn)
	if _, err := conn.Exec(context.Background(), `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET lock_timeout = %L', current_database(), '1s'); END $$`); err != nil {
		t.Fatal(err)
	}
	s := openGroupStore(t, dsn, 1)
	ctx := context.Background()
	r0 := newRun(t, s, "t", "s0", "r0", 1)
	runs := []loop.Run{newRun(t, s, "t", "s1", "r1", 1), newRun(t, s, "t", "s2", "r2", 1), newRun(t, s, "t", "s3", "r3", 1)}
	lock := holdSessionLock(t, dsn, s.opts.Schema, "t", "s2")
	h := holdFirstGroup(t, s)
	held := make(chan error, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, r0, "held")); held <- err }()
	<-h.entered
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() { _, errs[i] = s.Commit(ctx, startCommit(t, r, "c")) })
	}
	untilWritesQueued(t, s, len(runs))
	h.release()
	wg.Wait()
	lock.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if sizes := h.batchSizes(); len(sizes) < 2 || sizes[1] != len(runs) {
		t.Fatalf("groups of %v writes; want the second of %d", sizes, len(runs))
	}
	for i, r := range runs {
		seq := seqOf(t, s, r.ID)
		if r.Session == "s2" {
			if !errors.Is(errs[i], runtime.ErrStoreUnavailable) || sqlState(errs[i]) != "55P03" || seq != r.Seq {
				t.Errorf("the commit to %s, whose session was locked: %v, at Seq %d; want ErrStoreUnavailable for a lock timeout (55P03), Seq %d", r.ID, errs[i], seq, r.Seq)
			}
			continue
		}
		if errs[i] != nil || seq != r.Seq+1 {
			t.Errorf("the commit to %s: %v, at Seq %d; want written at Seq %d", r.ID, errs[i], seq, r.Seq+1)
		}
	}
}

// A caller whose context ends while its write is queued withdraws it:
// it gets the context's error and nothing is written.
func TestAWriteWithdrawnFromTheQueueIsNotWritten(t *testing.T) {
	s := openGroupStore(t, pgserver.NewDatabase(t), 1)
	ctx := context.Background()
	r0, r1 := newRun(t, s, "t", "s0", "r0", 1), newRun(t, s, "t", "s1", "r1", 1)
	h := holdFirstGroup(t, s)
	held := make(chan error, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, r0, "held")); held <- err }()
	<-h.entered
	wctx, cancel := context.WithCancel(ctx)
	withdrawn := make(chan error, 1)
	go func() { _, err := s.Commit(wctx, startCommit(t, r1, "c")); withdrawn <- err }()
	untilWritesQueued(t, s, 1)
	cancel()
	if err := <-withdrawn; !errors.Is(err, context.Canceled) || !errors.Is(err, runtime.ErrStoreUnavailable) {
		t.Fatalf("a withdrawn commit: %v; want context.Canceled as ErrStoreUnavailable", err)
	}
	untilWritesQueued(t, s, 0)
	h.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if seq := seqOf(t, s, "r1"); seq != r1.Seq {
		t.Fatalf("the withdrawn commit's Run at Seq %d; want %d", seq, r1.Seq)
	}
	if sizes := h.batchSizes(); len(sizes) != 1 {
		t.Fatalf("groups of %v writes; want the held one alone", sizes)
	}
}

// A group runs under a context of its own: a caller that gives up once
// its write was taken (a client gone, a runtime halting) returns at
// once, not knowing whether it was written, and takes no other write of
// the group down with it.
func TestACallerThatGivesUpTakesNoOneElsesWriteDown(t *testing.T) {
	s := openGroupStore(t, pgserver.NewDatabase(t), 1)
	ctx := context.Background()
	r0, r1, r2 := newRun(t, s, "t", "s0", "r0", 1), newRun(t, s, "t", "s1", "r1", 1), newRun(t, s, "t", "s2", "r2", 1)
	h := holdFirstGroup(t, s)
	held := make(chan error, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, r0, "held")); held <- err }()
	<-h.entered
	gctx, giveUp := context.WithCancel(ctx)
	gaveUp, other := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.Commit(gctx, startCommit(t, r1, "c")); gaveUp <- err }()
	untilWritesQueued(t, s, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, r2, "c")); other <- err }()
	untilWritesQueued(t, s, 2)
	h.mu.Lock()
	h.onLater = func(int) {
		giveUp()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Errorf("the caller that gave up: %v; want context.Canceled", err)
		}
	}
	h.mu.Unlock()
	h.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatalf("the other commit of the group: %v", err)
	}
	// Taken before its caller gave up, the write went ahead.
	for _, r := range []loop.Run{r1, r2} {
		if seq := seqOf(t, s, r.ID); seq != r.Seq+1 {
			t.Errorf("run %s at Seq %d; want %d", r.ID, seq, r.Seq+1)
		}
	}
}

// While a transaction of writes is under way, the writes that arrive
// wait for it, and another transaction starts only once groupBacklog of
// them wait, which it takes: below that, a transaction more at once
// costs the server more than it saves the writes' wait.
func TestAnotherTransactionStartsOnlyForABacklog(t *testing.T) {
	s := openGroupStore(t, pgserver.NewDatabase(t), 2)
	ctx := context.Background()
	runs := make([]loop.Run, 1+groupBacklog)
	for i := range runs {
		runs[i] = newRun(t, s, "t", fmt.Sprintf("s%d", i), fmt.Sprintf("r%d", i), 1)
	}
	h := holdFirstGroup(t, s)
	held := make(chan error, 1)
	go func() { _, err := s.Commit(ctx, startCommit(t, runs[0], "c")); held <- err }()
	<-h.entered

	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	commit := func(i int) { wg.Go(func() { _, errs[i] = s.Commit(ctx, startCommit(t, runs[i], "c")) }) }
	for i := 1; i < groupBacklog; i++ {
		commit(i)
	}
	untilWritesQueued(t, s, groupBacklog-1)
	s.writes.mu.Lock()
	writers := s.writes.writers
	s.writes.mu.Unlock()
	if writers != 1 || len(h.batchSizes()) != 1 {
		t.Fatalf("%d writers and transactions of %v writes with %d writes queued; want the held one alone",
			writers, h.batchSizes(), groupBacklog-1)
	}

	// The backlog's last write starts a second transaction, which writes
	// them all while the first is still held.
	commit(groupBacklog)
	untilCount(t, "transactions begun", 2, func() int { return len(h.batchSizes()) })
	wg.Wait()
	if sizes := h.batchSizes(); len(sizes) != 2 || sizes[1] != groupBacklog {
		t.Fatalf("transactions of %v writes; want [1 %d]", sizes, groupBacklog)
	}
	h.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	for i, r := range runs {
		if seq := seqOf(t, s, r.ID); (i > 0 && errs[i] != nil) || seq != r.Seq+1 {
			t.Errorf("the commit to %s: %v, at Seq %d; want written at Seq %d", r.ID, errs[i], seq, r.Seq+1)
		}
	}
}

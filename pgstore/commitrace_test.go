package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The tests here race a commit against another to the same Run: the
// holder of the session's lock writes the other commit in its own
// transaction while the commit waits for that lock, then commits. The
// commit must be judged on what the other wrote: its statement that
// reads the command IDs starts once the session's lock is held
// (pgstore/doc.go). A statement that took the session's lock itself
// would read them as of before it waited. Folded that way (tried on
// 2026-12-07, docs/BENCHMARKS.md, "One statement a commit, tried"), the
// first test got a version conflict and the second a unique violation
// on commands, until the statement compared its snapshot's Run with the
// one it locked.

// commitResult is what a Commit running in a goroutine returned.
type commitResult struct {
	res runtime.CommitResult
	err error
}

// newCommitRace opens a Store on a fresh schema with one Run, "t"/"r" in
// session "s", and returns them with a commitBehindAnother on them.
func newCommitRace(t *testing.T) (*Store, loop.Run, func(theirs, mine runtime.Commit) commitResult) {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	r := newRun(t, s, "t", "s", "r", 1)
	return s, r, func(theirs, mine runtime.Commit) commitResult {
		return commitBehindAnother(t, dsn, schema, s, theirs, mine)
	}
}

// commitBehindAnother sends mine while the holder of its session's lock
// writes theirs and commits, and returns mine's result.
func commitBehindAnother(t *testing.T, dsn, schema string, s *Store, theirs, mine runtime.Commit) commitResult {
	t.Helper()
	holder := holdSessionLock(t, dsn, schema, mine.Tenant, mine.Session)
	monitor := connect(t, dsn)
	done := make(chan commitResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := s.Commit(ctx, mine)
		done <- commitResult{res, err}
	}()
	eventually(t, "the commit to wait for the session's lock", time.Minute, func() bool { return holder.blocking(t, monitor) > 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := newCommitCall(theirs)
	if k.payloadErr != nil {
		t.Fatal(k.payloadErr)
	}
	if _, err := holder.conn.Exec(ctx, "SET LOCAL search_path = "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	rows, err := holder.conn.Query(ctx, k.write, k.args...)
	if err != nil {
		t.Fatal(err)
	}
	row, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	if err != nil || row[5] != true { // the statement's sixth column: whether it wrote
		t.Fatalf("the other commit, written by the lock's holder: %v, %v", row, err)
	}
	if _, err := holder.conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		return r
	case <-time.After(time.Minute):
		t.Fatal("the commit did not end within a minute of the lock's release")
		return commitResult{}
	}
}

// A retried command whose first attempt commits while the retry waits
// for the session's lock gets the first attempt's result: Duplicate, at
// the Seq the first attempt wrote.
func TestCommitRacingItsOwnRetryIsADuplicate(t *testing.T) {
	s, r, race := newCommitRace(t)
	c := step(t, r, 0, "cmd-1", loop.Event{Type: loop.EventRunStarted})

	got := race(c, c)
	if got.err != nil || !got.res.Duplicate || got.res.Seq != c.Run.Seq {
		t.Fatalf("the retry: %+v, %v; want a duplicate at Seq %d", got.res, got.err, c.Run.Seq)
	}
	wantStored(t, s, c.Run.Seq, 2)
}

// A commit that expects the Seq another commit writes while it waits for
// the lock, and carries that commit's command ID, is a duplicate of it:
// judged on the rows as they were before it waited, it would apply the
// command a second time.
func TestCommitExpectingTheSeqOfARacingCommitIsJudgedAfterIt(t *testing.T) {
	s, r, race := newCommitRace(t)
	theirs := step(t, r, 0, "cmd-1", loop.Event{Type: loop.EventRunStarted})
	mine := step(t, theirs.Run, 0, "cmd-1",
		loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{"model":"test"}`)})

	got := race(theirs, mine)
	if got.err != nil || !got.res.Duplicate || got.res.Seq != theirs.Run.Seq {
		t.Fatalf("the commit: %+v, %v; want a duplicate at Seq %d", got.res, got.err, theirs.Run.Seq)
	}
	wantStored(t, s, theirs.Run.Seq, 2)

	// A commit that raced another to its Run and lost goes ahead on the
	// next try as any commit does.
	next := step(t, theirs.Run, 0, "cmd-2",
		loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{"model":"test"}`)})
	if res, err := s.Commit(context.Background(), next); err != nil || res.Duplicate || res.Seq != next.Run.Seq {
		t.Fatalf("the next commit: %+v, %v", res, err)
	}
	wantStored(t, s, next.Run.Seq, 3)
}

// wantStored checks the Run "t"/"r" of s: its Seq and the events stored.
func wantStored(t *testing.T, s *Store, seq int64, events int) {
	t.Helper()
	ctx := context.Background()
	run, err := s.LoadRun(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, "t", "r", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if run.Seq != seq || len(evs) != events {
		t.Fatalf("the Run is at Seq %d with %d events; want Seq %d with %d", run.Seq, len(evs), seq, events)
	}
}

package badgerstore

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// Group commit of Run writes: CreateRun and Commit.
//
// Badger syncs its write-ahead log once per transaction, even when it
// writes many transactions in one batch (writeToLSM calls SyncWAL for
// each request), so N concurrent synced commits cost N syncs, one after
// the other, on Badger's single writer goroutine. A restart that recovers
// 10,000 Runs made 20,666 syncs, and spent 5.0 of its 9 s in them.
//
// So the Run writes (creations and commits; "commits" below) that
// arrive while one is being written queue on the store's commitQueue (a
// leaderQueue), and one writer at a time, the leader, applies the ones
// queued at its head in one Badger transaction, in order, each against
// what the ones before it wrote (the transaction reads its own writes),
// then commits it: one sync for the lot. A commit whose checks fail (a
// stale Seq, a fence, a duplicate command, a Run that exists) is
// answered alone and writes nothing; the others go on. Nothing becomes
// visible before it is durable: Badger shows a transaction to readers
// only after its write and its sync, as before. Then the first of the
// commits that queued meanwhile leads the next batch, so that no caller
// serves the others' commits for long (the KV writes of a plugin queue
// the same way, kv.go).

// DefaultMaxGroupCommits bounds the commits one transaction carries
// (Options.MaxGroupCommits); groupCommitBytes bounds what they write, well
// below Badger's transaction size limit (a tenth of the memtable);
// commitKeysBytes is about what a commit writes besides its snapshot and
// events: keys, the record's header, indexes, command IDs.
const (
	DefaultMaxGroupCommits = 256
	groupCommitBytes       = 4 << 20
	commitKeysBytes        = 512
)

// errCommitAlone tells a queued commit to run in a transaction of its own:
// the group's transaction could not take it (it failed after writing, so
// the transaction is spoiled for the others too, or the group lost its
// conflict retries). The commit's own transaction then gives the answer.
var errCommitAlone = errors.New("badgerstore: commit alone")

// groupedCommit is one Run write in the queue.
type groupedCommit struct {
	tenant string
	bytes  int // what it writes, about
	// apply runs the commit's checks (reads only) and then its writes in
	// txn; wrote is true once it has written anything, so that an error
	// after that spoils txn. delta is what it adds to the tenant's stored
	// bytes. It must set its results afresh on every call.
	apply func(txn *badger.Txn) (delta int64, wrote bool, err error)

	err error
}

// commitQueue is the store's queue of Run writes, with its counts.
type commitQueue struct {
	leaderQueue[*groupedCommit]
	// groups and grouped count the group transactions committed and the
	// commits they wrote (CommitGroups).
	groups, grouped atomic.Int64
}

func newCommitQueue(maxGroup int) *commitQueue {
	return &commitQueue{leaderQueue: leaderQueue[*groupedCommit]{maxItems: maxGroup, maxBytes: groupCommitBytes,
		size: func(c *groupedCommit) int { return c.bytes }}}
}

// CommitGroups returns how many group transactions have committed since
// Open, and how many Run writes (creations and commits) they carried:
// commits/groups is how many shared one sync, on average. (A write that
// its group could not take, and that ran alone, is in neither; nor is
// one whose checks failed, nor a duplicate.)
func (s *Store) CommitGroups() (groups, commits int64) {
	return s.commits.groups.Load(), s.commits.grouped.Load()
}

// writeRun commits a Run's creation or commit, apply, with the ones
// queued with it, and returns its answer: nil once it is durable, or the
// error of its checks or of the group's transaction. When the group could
// not take it, apply runs again in a transaction of its own (retried on
// conflicts with ctx), which gives the answer. bytes is about what it
// writes.
func (s *Store) writeRun(ctx context.Context, tenant string, bytes int, apply func(txn *badger.Txn) (delta int64, wrote bool, err error)) error {
	c := &groupedCommit{tenant: tenant, bytes: bytes, apply: apply}
	s.commits.submit(c, s.commitGroup)
	if !errors.Is(c.err, errCommitAlone) {
		return c.err
	}
	var delta int64
	return s.write(ctx, tenant, &delta, func(txn *badger.Txn) error {
		var err error
		delta, _, err = apply(txn)
		return err
	})
}

// commitGroup applies group in order in one transaction and commits it,
// running it again from the start when Badger reports a conflict with a
// concurrent transaction. It sets each commit's err.
func (s *Store) commitGroup(group []*groupedCommit) {
	s.totals.gate.RLock()
	defer s.totals.gate.RUnlock()
	deltas := make([]int64, len(group))
	inTxn := make([]bool, len(group))   // its checks passed: the group's fate is its own
	written := make([]bool, len(group)) // and it wrote (not a duplicate)
	for attempt := 1; ; attempt++ {
		txn := s.db.NewTransaction(true)
		spoiled := false
		for i, c := range group {
			d, w, err := c.apply(txn)
			if err != nil && w {
				spoiled = true
				break
			}
			deltas[i], inTxn[i], c.err = d, err == nil, err
			written[i] = w && err == nil
		}
		if spoiled {
			txn.Discard()
			for _, c := range group {
				c.err = errCommitAlone
			}
			return
		}
		err := txn.Commit()
		switch {
		case err == nil:
			n := int64(0)
			for i, c := range group {
				if written[i] {
					n++
				}
				if inTxn[i] && deltas[i] != 0 {
					s.totals.add(c.tenant, deltas[i])
				}
			}
			s.commits.groups.Add(1)
			s.commits.grouped.Add(n)
			return
		case errors.Is(err, badger.ErrConflict) && attempt < maxTxnRetries:
			continue
		}
		// An error of the write itself (the commits may have been
		// written: a lost reply), or conflicts past the retries, which
		// each commit's own transaction retries with its caller's
		// context. A commit whose checks failed keeps their answer.
		for i, c := range group {
			switch {
			case !inTxn[i]:
			case errors.Is(err, badger.ErrConflict):
				c.err = errCommitAlone
			default:
				c.err = err
			}
		}
		return
	}
}

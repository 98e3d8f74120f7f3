package pgstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Writes that queue share a transaction: group commit.
//
// A transaction costs the server what its statements cost and, on top, a
// round trip, a start, a commit record, a wait for the WAL to reach the
// disk and the wake-ups of the processes on both ends; on a busy server
// that is most of what a commit costs (docs/BENCHMARKS.md, "Commits that
// share a transaction"). So a write that finds no transaction of them
// under way goes at once, written by its caller under its own context:
// none waits for others to come. The ones that arrive while one is under
// way queue, and when a writer's transaction ends, it takes every one
// queued up to then (at most maxWriteGroup) into its next: each with the
// statements it sends alone, in one pipelined batch, one implicit
// transaction, one round trip. Another transaction starts, written by a
// writer goroutine of its own, only when groupBacklog writes wait, and
// at most Options.WriteGroups are under way at once. A group runs under
// a context of its own (groupContext), so that a caller that gives up
// takes no one else's write down with it.
//
// Each write of a group is judged as it would be alone: its statements
// lock its session's row, then its Run's, and read what the writes
// before it in the transaction wrote. A refused write writes nothing and
// takes nothing from the others. A group is written in (tenant, session,
// run) byte order, the order batch claims lock sessions in, so that two
// groups, or a group and a batch claim, cannot deadlock. When PostgreSQL
// aborts a group's transaction (an error that is one write's, a
// deadlock), nothing of it was written, and each of its writes is
// written again alone, so that an error is its own write's. When the
// connection fails, whether the transaction committed is not known, for
// any of them: each gets the error, as a write alone would.

// maxWriteGroup bounds the writes of one transaction.
const maxWriteGroup = 64

// groupBacklog is how many writes wait in the queue, while a transaction
// of them is under way, before another one starts. Below it, they wait for
// the one under way and share its writer's next: the larger a group, the
// less each of its writes costs the server, and a transaction more at once
// pays off only when one writer cannot keep up. On 2 cores, a new
// transaction for every write that queued (the rule before, up to
// WriteGroups) made groups of 2.6 writes at 16 clients, where this makes
// groups of 8 at half the server's CPU a Run and 1.1 to 1.3 times the
// Runs/s; at 64 and 256 clients, where the backlog starts more, it gave
// more Runs/s too (docs/BENCHMARKS.md, "A transaction more only for a
// backlog").
const groupBacklog = maxWriteGroup / 2

// groupWrite is what a group needs of a write (createCall, commitCall).
type groupWrite interface {
	// orderKey is where the write goes in its group.
	orderKey() (tenant, session, run string)
	// queue queues the write's statements.
	queue(b *pgx.Batch)
	// readResults reads their results, setting afresh what it read.
	readResults(br pgx.BatchResults) error
	// retryUnique says whether the write, alone, is tried again after a
	// unique violation (inTx).
	retryUnique() bool
}

// queuedWrite is one write in the queue.
type queuedWrite struct {
	ctx context.Context // its caller's
	w   groupWrite
	err error // how its transaction went, set before done is closed
	// done is closed by the writer goroutine that wrote it; nil for a
	// write its caller writes itself.
	done chan struct{}
}

// errWriteAlone is how a write went whose group's transaction PostgreSQL
// aborted: its caller writes it again, alone.
var errWriteAlone = errors.New("pgstore: write again alone")

// writeQueue is the queue of a Store's commits and creations. Its mu is a
// leaf.
type writeQueue struct {
	mu      sync.Mutex
	pending []*queuedWrite
	// writers counts the goroutines writing groups (writeGroups): at
	// most WriteGroups.
	writers int

	// groups and grouped count the transactions that committed a group
	// and the writes they carried (CommitGroups).
	groups, grouped atomic.Int64
}

// CommitGroups returns how many transactions have committed a group of
// Run creations and commits since Open, and how many writes they carried:
// writes/groups is how many shared a transaction, on average. (A group of
// one counts; a write written again alone after its group was aborted is
// in neither.) It is what agenthost_store_commit_groups_total and
// agenthost_store_grouped_commits_total report.
func (s *Store) CommitGroups() (groups, commits int64) {
	return s.writes.groups.Load(), s.writes.grouped.Load()
}

// writeQueued writes w and judges it from what it read. With no writer
// under way (and so nothing queued), the caller writes w itself. Else it
// queues w and, when groupBacklog writes wait and fewer than WriteGroups
// writers are under way, starts one; a writer writes what is queued, a
// group at a time, until nothing is, so that a queued write is always
// taken by the writer under way when it is done, if not by another. A
// caller whose ctx ends before a writer took its write withdraws it:
// nothing is written. A caller whose ctx ends once its write was taken
// returns at once, not knowing whether it was written, as after a lost
// reply; the group goes on under its own deadline (groupContext).
func writeQueued[R any, W interface {
	groupWrite
	decide() (R, error)
}](ctx context.Context, s *Store, w W) (R, error) {
	var zero R
	q := &queuedWrite{ctx: ctx, w: w}
	wq := &s.writes
	wq.mu.Lock()
	if wq.writers == 0 {
		// Nothing to share the transaction with: the caller writes it,
		// under its own ctx, as a write alone always was, with no
		// goroutine to hand it to and back.
		wq.writers++
		wq.mu.Unlock()
		err := s.writeInOne(ctx, []*queuedWrite{q})
		s.writerDone()
		if err != nil {
			return zero, err
		}
		return w.decide()
	}
	q.done = make(chan struct{})
	wq.pending = append(wq.pending, q)
	if wq.writers < s.opts.WriteGroups && len(wq.pending) >= groupBacklog {
		wq.writers++
		go s.writeGroups()
	}
	wq.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		select {
		case <-q.done: // written meanwhile: its result is known
		default:
			wq.withdraw(q)
			return zero, ctx.Err()
		}
	}
	err := q.err
	if errors.Is(err, errWriteAlone) {
		err = s.writeAlone(ctx, q)
	}
	if err != nil {
		return zero, err
	}
	return w.decide()
}

// withdraw takes q out of the queue if no writer has taken it yet.
func (wq *writeQueue) withdraw(q *queuedWrite) {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if i := slices.Index(wq.pending, q); i >= 0 {
		wq.pending = slices.Delete(wq.pending, i, i+1)
	}
}

// writerDone counts out a caller that wrote its own write, and starts a
// writer for the writes that queued meanwhile, if any.
func (s *Store) writerDone() {
	wq := &s.writes
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if len(wq.pending) == 0 {
		wq.writers--
		return
	}
	go s.writeGroups()
}

// take takes the next group from the queue, up to maxWriteGroup writes;
// with none queued, it counts the calling writer out and returns nil.
func (wq *writeQueue) take() []*queuedWrite {
	wq.mu.Lock()
	defer wq.mu.Unlock()
	if len(wq.pending) == 0 {
		wq.writers--
		return nil
	}
	n := min(len(wq.pending), maxWriteGroup)
	group := slices.Clone(wq.pending[:n])
	wq.pending = slices.Delete(wq.pending, 0, n)
	return group
}

// writeGroups is a writer: it writes the queue's groups until it is empty.
func (s *Store) writeGroups() {
	for {
		group := s.writes.take()
		if group == nil {
			return
		}
		s.writeGroup(group)
	}
}

// groupContext is the context a group is written under: its first
// write's values, no cancellation but the Store's closing, and the latest
// of its writes' deadlines, or, when one has none, the statement timeout
// from now (none when it is off). So a caller that gives up, or whose
// client went away, takes no one else's write down with it.
func (s *Store) groupContext(group []*queuedWrite) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range group {
		d, ok := q.ctx.Deadline()
		if !ok {
			if s.opts.StatementTimeout <= 0 {
				latest = time.Time{}
				break
			}
			d = time.Now().Add(s.opts.StatementTimeout)
		}
		if d.After(latest) {
			latest = d
		}
	}
	base := context.WithoutCancel(group[0].ctx)
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if latest.IsZero() {
		ctx, cancel = context.WithCancel(base)
	} else {
		ctx, cancel = context.WithDeadline(base, latest)
	}
	stop := context.AfterFunc(s.closing, cancel)
	return ctx, func() { stop(); cancel() }
}

// writeGroup writes a group in one transaction, under its own context,
// and tells each write how it went.
func (s *Store) writeGroup(group []*queuedWrite) {
	ctx, cancel := s.groupContext(group)
	defer cancel()
	err := s.writeInOne(ctx, group)
	for _, q := range group {
		q.err = err
		close(q.done)
	}
}

// writeInOne writes a group in one transaction: a write alone as inTx
// tries it; a larger group once, and errWriteAlone when PostgreSQL
// aborted it.
func (s *Store) writeInOne(ctx context.Context, group []*queuedWrite) error {
	if hook := s.writeGroupHook; hook != nil {
		hook(len(group))
	}
	var err error
	if len(group) == 1 {
		err = s.writeAlone(ctx, group[0])
	} else {
		slices.SortFunc(group, func(a, b *queuedWrite) int {
			at, as, ar := a.w.orderKey()
			bt, bs, br := b.w.orderKey()
			if c := strings.Compare(at, bt); c != 0 {
				return c
			}
			if c := strings.Compare(as, bs); c != 0 {
				return c
			}
			return strings.Compare(ar, br)
		})
		err = s.txOnce(ctx, func(ctx context.Context, conn *pgx.Conn) error {
			return sendGroup(ctx, conn, group)
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			err = errWriteAlone
		}
	}
	if err == nil {
		s.writes.groups.Add(1)
		s.writes.grouped.Add(int64(len(group)))
	}
	return err
}

// writeAlone writes q in a transaction of its own, tried again as inTx
// tries a transaction.
func (s *Store) writeAlone(ctx context.Context, q *queuedWrite) error {
	return s.inTx(ctx, q.w.retryUnique(), func(ctx context.Context, conn *pgx.Conn) error {
		return sendGroup(ctx, conn, []*queuedWrite{q})
	})
}

// sendGroup sends the statements of a group's writes in one pipelined
// batch, one implicit transaction, and reads their results.
func sendGroup(ctx context.Context, conn *pgx.Conn, group []*queuedWrite) error {
	b := &pgx.Batch{}
	for _, q := range group {
		q.w.queue(b)
	}
	br := conn.SendBatch(ctx, b)
	var err error
	for _, q := range group {
		if err = q.w.readResults(br); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

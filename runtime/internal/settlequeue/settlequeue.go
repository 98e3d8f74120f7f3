// Package settlequeue holds the settlements of effect attempts waiting
// for their commit, by Run, so that the advance committing one takes the
// others of the same Run along into its commit (docs/DESIGN.md §5.1,
// step 8).
package settlequeue

import (
	"sync"

	"github.com/agenthost/agenthost/loop"
)

// Queue is the one owner of the settlements waiting to be committed, by
// Run, so that the advance committing one takes the others of the same Run
// along into its commit. The tool calls of one step usually answer
// together: without it, each settlement is its own synced commit, and the
// last one closes the step; with it, the settlements that arrive while one
// is being committed go into one commit, with the step's close and the next
// plan and dispatch.
//
// The protocol: the runtime's commitSettlement queues its settlement (Add)
// before it takes the Run's lock; its advance takes it out (Remove) as
// soon as its own commit is durable, still holding the lock, and
// commitSettlement again when the advance returns (a no-op then, or the
// cleanup of an advance that did not commit). An advance, holding the Run's lock, folds its own
// settlement and takes the others queued (Take), which marks them taken;
// after its commit it marks them committed with the snapshot it committed
// (Done with that snapshot) or puts them back (Done with nil). The owner of
// a committed settlement finds it so when its own advance holds the lock
// (CommittedAs): the advance that committed it has also performed what
// its commit obliges and reported the Run, so the owner has nothing left
// to do but to learn that snapshot. Since every Take and every check
// holds the Run's lock, a settlement is in at most one commit.
//
// A Queue is safe for concurrent use.
type Queue struct {
	// mu guards byRun and the taken and committed marks of every Entry
	// queued. It is a leaf: nothing is called while it is held.
	mu    sync.Mutex
	byRun map[string][]*Entry
}

// Entry is one settlement waiting for its commit. Its exported fields are
// set before Add and never change.
type Entry struct {
	Event     loop.Event // EffectSettled
	CommandID string     // its command ID, loop.SettleCommandID
	Key       string     // its attempt's assignment key

	taken     bool      // an advance folds it into its batch now
	committed *loop.Run // the snapshot of the commit that took it along; nil until then
}

// New returns an empty Queue.
func New() *Queue { return &Queue{byRun: map[string][]*Entry{}} }

// Add queues s under its Run's key.
func (q *Queue) Add(rk string, s *Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.byRun[rk] = append(q.byRun[rk], s)
}

// Remove takes s out of the queue, committed or not.
func (q *Queue) Remove(rk string, s *Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	list := q.byRun[rk]
	for i, o := range list {
		if o == s {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(q.byRun, rk)
	} else {
		q.byRun[rk] = list
	}
}

// Take returns, in the order they were queued, the settlements of the Run
// other than self that no advance has taken or committed, and marks them
// taken. The caller holds the Run's lock.
func (q *Queue) Take(rk string, self *Entry) []*Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*Entry
	for _, s := range q.byRun[rk] {
		if s != self && !s.taken && s.committed == nil {
			s.taken = true
			out = append(out, s)
		}
	}
	return out
}

// Done ends the Take of ss: committed with the advance's commit, whose
// snapshot is committed (not changed after), or given back to their
// owners (committed nil).
func (q *Queue) Done(ss []*Entry, committed *loop.Run) {
	if len(ss) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range ss {
		s.taken = false
		s.committed = committed
	}
}

// CommittedAs returns the snapshot of the commit another advance took s
// along in, and whether there is one.
func (q *Queue) CommittedAs(s *Entry) (loop.Run, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.committed == nil {
		return loop.Run{}, false
	}
	return *s.committed, true
}

// Len returns how many settlements wait in the queue.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, l := range q.byRun {
		n += len(l)
	}
	return n
}

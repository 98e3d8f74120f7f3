package runtime

import (
	"sync"

	"github.com/agenthost/agenthost/loop"
)

// settleQueue is the one owner of the settlements waiting to be committed,
// by Run, so that the advance committing one takes the others of the same
// Run along into its commit. The tool calls of one step usually answer
// together: without it, each settlement is its own synced commit, and the
// last one closes the step; with it, the settlements that arrive while one
// is being committed go into one commit, with the step's close and the next
// plan and dispatch (docs/DESIGN.md §5.1, step 8).
//
// The protocol: commitSettlement queues its settlement (add) before it
// takes the Run's lock, and takes it out (remove) when its advance returns.
// An advance, holding the Run's lock, folds its own settlement and takes
// the others queued (take), which marks them taken; after its commit it
// marks them committed (done with ok) or puts them back (done without).
// The owner of a committed settlement finds it so when its own advance
// holds the lock (committed), and advances the Run without it, as after a
// duplicate commit. Since every take and every check holds the Run's lock,
// a settlement is in at most one commit.
type settleQueue struct {
	mu    sync.Mutex
	byRun map[string][]*queuedSettle
}

// queuedSettle is one settlement waiting for its commit.
type queuedSettle struct {
	ev  loop.Event // EffectSettled
	cmd string     // its command ID, loop.SettleCommandID
	key string     // its attempt's assignment key

	taken     bool // an advance folds it into its batch now
	committed bool // an advance committed it
}

func newSettleQueue() *settleQueue { return &settleQueue{byRun: map[string][]*queuedSettle{}} }

// add queues s under its Run's key.
func (q *settleQueue) add(rk string, s *queuedSettle) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.byRun[rk] = append(q.byRun[rk], s)
}

// remove takes s out of the queue, committed or not.
func (q *settleQueue) remove(rk string, s *queuedSettle) {
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

// take returns, in the order they were queued, the settlements of the Run
// other than self that no advance has taken or committed, and marks them
// taken. The caller holds the Run's lock.
func (q *settleQueue) take(rk string, self *queuedSettle) []*queuedSettle {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*queuedSettle
	for _, s := range q.byRun[rk] {
		if s != self && !s.taken && !s.committed {
			s.taken = true
			out = append(out, s)
		}
	}
	return out
}

// done ends the take of ss: committed with the advance's commit (ok), or
// given back to their owners.
func (q *settleQueue) done(ss []*queuedSettle, ok bool) {
	if len(ss) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range ss {
		s.taken = false
		s.committed = ok
	}
}

// isCommitted reports whether another advance committed s.
func (q *settleQueue) isCommitted(s *queuedSettle) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return s.committed
}

package httpapi

import (
	"context"
	"errors"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The run_waiting events of an event stream.
//
// A stream sends its Run's stored events; whether the Run waits for a
// person is not in any one of them but in the Run they make. So the
// stream folds the events it sends with loop.Apply, as the runtime did
// when it committed them, and after each one that makes the Run wait
// sends "event: run_waiting" (no id: it is not in the log, like
// progress) with what it waits for (RunWaitingJSON).
//
// The fold starts from where the stream does. A stream from the start
// folds from nothing, and so has a run_waiting after every event that
// made the Run wait. One that resumes after an event starts from the
// Run's snapshot, read when the stream opened: the events up to it are
// sent without a fold, and at the snapshot's event (at once when there
// are none) the stream sends run_waiting if the Run waits then; after it,
// it folds as from the start. A client that reconnects to a waiting Run
// hears what it waits for again.
//
// A parent Run does not wait while a child of one of its agent tools
// does: the child waits. Once the fold has caught up with the snapshot
// the stream opened with, it follows the children of the Run's executing
// agent-tool calls too, and their children, at most maxWatchedChildren
// Runs in all: each child's snapshot, then its new events, from the
// Run's Hub as any stream's (each counts against the tenant's stream
// limit, and a child the limit refuses is not followed). When a followed
// child begins to wait, the stream sends run_waiting for its own Run,
// whose waiting.children_waiting names the child. A child's events and
// progress are not sent on the parent's stream: its own stream has them.

// maxWatchedChildren bounds the child Runs one stream follows.
const maxWatchedChildren = maxChildReads

// foldedRun is a Run as a stream's fold has it.
type foldedRun struct {
	run loop.Run
	// waits counts the waits for a person the fold has seen begin: a
	// run_waiting is owed for each.
	waits int
}

// fold applies ev to the Run, and reports false when it cannot: an event
// out of order, or one the Loop refuses (which the stored log never
// holds).
func (f *foldedRun) fold(ev loop.Event) bool {
	if ev.Seq != f.run.Seq+1 {
		return false
	}
	next, err := loop.Apply(f.run, ev)
	if err != nil {
		return false
	}
	if next.Status == loop.StatusWaiting && f.run.Status != loop.StatusWaiting {
		f.waits++
	}
	f.run = next
	return true
}

// adopt makes a snapshot the fold's Run.
func (f *foldedRun) adopt(run loop.Run) {
	f.run, f.waits = run, 0
	if run.Status == loop.StatusWaiting {
		f.waits = 1
	}
}

// watchedChild is a child Run a stream follows.
type watchedChild struct {
	foldedRun
	f *runtime.Follower
}

// waitWatch is the fold of one stream: its Run's, and its followed
// children's. One goroutine, the stream's handler, uses it.
type waitWatch struct {
	s      *Server
	tenant string
	root   foldedRun
	// folding is false until the root's fold holds a Run: until the
	// event syncAt, whose snapshot is snap (0: never, the fold is lost).
	folding bool
	syncAt  int64
	snap    loop.Run
	// live is the seq from which the root's fold is caught up with the
	// snapshot the stream opened with: children are followed from then.
	live int64
	// children are the child Runs followed, by ID; gone are those not to
	// follow again (ended, or refused by the stream limit).
	children map[string]*watchedChild
	gone     map[string]bool
	// told are the waits a run_waiting was sent for: by Run, the count
	// of its waits then.
	told map[string]int
}

// newWaitWatch starts the fold of a stream of run (its snapshot when the
// stream opened) that resumes after event after.
func (s *Server) newWaitWatch(tenant string, run loop.Run, after int64) *waitWatch {
	w := &waitWatch{s: s, tenant: tenant, live: run.Seq,
		children: map[string]*watchedChild{}, gone: map[string]bool{}, told: map[string]int{}}
	switch {
	case after == 0:
		w.folding = true // from nothing: the first event is run_created
	case run.Seq == after:
		w.folding = true
		w.root.adopt(run)
	case run.Seq > after:
		w.syncAt, w.snap = run.Seq, run
	}
	return w
}

// start sends the run_waiting owed before any event: for a stream that
// resumes at the end of the log of a waiting Run.
func (w *waitWatch) start(ctx context.Context, sw *sseWriter) error {
	if !w.folding || w.root.run.Seq == 0 {
		return nil
	}
	w.reconcile(ctx)
	return w.tell(sw)
}

// rootEvent folds an event of the stream's Run, once it is sent, and
// sends the run_waiting it owes.
func (w *waitWatch) rootEvent(ctx context.Context, sw *sseWriter, ev loop.Event) error {
	switch {
	case !w.folding && w.syncAt > 0 && ev.Seq == w.syncAt:
		w.folding = true
		w.root.adopt(w.snap)
		w.snap = loop.Run{}
	case !w.folding:
		return nil
	case !w.root.fold(ev):
		w.s.log.Debug("event stream: the fold of the run stopped; it sends no more run_waiting",
			"tenant", w.tenant, "run", w.root.run.ID, "seq", ev.Seq)
		w.folding = false
		w.syncAt = 0
		w.closeChildren()
		return nil
	}
	w.reconcile(ctx)
	return w.tell(sw)
}

// pollChildren folds what the followed children have, and sends the
// run_waiting events it owes.
func (w *waitWatch) pollChildren(ctx context.Context, sw *sseWriter) error {
	if len(w.children) == 0 {
		return nil
	}
	ids := make([]string, 0, len(w.children))
	for id := range w.children {
		ids = append(ids, id)
	}
	for _, id := range ids {
		c, ok := w.children[id]
		if !ok {
			continue // no longer followed
		}
		items, done, err := c.f.Next(ctx)
		for _, it := range items {
			if it.Event == nil {
				continue
			}
			if !c.fold(*it.Event) {
				err = errors.New("the child's fold stopped")
				break
			}
			// After each event, as for the Run's own: a wait that begins
			// and ends within one batch is told too.
			w.reconcile(ctx)
			if terr := w.tell(sw); terr != nil {
				return terr
			}
		}
		if done || err != nil {
			// An ended child is not followed again; one whose stream
			// failed is, at the next event of the Run.
			c.f.Close()
			delete(w.children, id)
			if done {
				w.gone[id] = true
			}
		}
	}
	w.reconcile(ctx)
	return w.tell(sw)
}

// reconcile follows the children of executing agent-tool calls of the
// Run and of the children followed, up to maxWatchedChildren, and stops
// following the others.
func (w *waitWatch) reconcile(ctx context.Context) {
	if !w.folding || w.root.run.Seq < w.live {
		return
	}
	wanted := map[string]bool{}
	queue := []loop.Run{w.root.run}
	for len(queue) > 0 {
		run := queue[0]
		queue = queue[1:]
		for _, c := range agentChildren(run) {
			if w.gone[c.id] || wanted[c.id] {
				continue
			}
			if len(wanted) == maxWatchedChildren {
				break
			}
			wanted[c.id] = true
			child, ok := w.children[c.id]
			if !ok {
				if child = w.follow(ctx, c.id); child == nil {
					continue
				}
			}
			queue = append(queue, child.run)
		}
	}
	for id, c := range w.children {
		if !wanted[id] {
			c.f.Close()
			delete(w.children, id)
		}
	}
}

// follow starts following child Run id from its snapshot, or returns nil
// when it cannot now: not created yet (its parent's next event comes when
// it is), ended, or refused by the tenant's stream limit.
func (w *waitWatch) follow(ctx context.Context, id string) *watchedChild {
	run, err := w.s.cfg.Runtime.LoadRun(ctx, w.tenant, id)
	if err != nil {
		if !errors.Is(err, runtime.ErrRunNotFound) {
			w.s.log.Debug("event stream: a child run could not be read", "tenant", w.tenant, "run", id, "err", err)
		}
		return nil
	}
	if run.Status.Terminal() {
		w.gone[id] = true
		return nil
	}
	f, err := w.s.cfg.Runtime.NewFollower(w.tenant, id, run.Seq+1, runtime.FollowOptions{MaxPerTenant: w.s.maxStreamsPerTenant()})
	if err != nil {
		w.s.log.Debug("event stream: a child run is not followed", "tenant", w.tenant, "run", id, "err", err)
		w.gone[id] = true
		return nil
	}
	c := &watchedChild{f: f}
	c.adopt(run)
	w.children[id] = c
	return c
}

// tell sends a run_waiting when a wait began that none was sent for: the
// Run's own, or a followed child's.
func (w *waitWatch) tell(sw *sseWriter) error {
	if !w.folding {
		return nil
	}
	owed := false
	note := func(f *foldedRun) {
		if f.run.Status == loop.StatusWaiting && w.told[f.run.ID] < f.waits {
			owed = true
		}
		w.told[f.run.ID] = f.waits
	}
	note(&w.root)
	for _, c := range w.children {
		note(&c.foldedRun)
	}
	if !owed {
		return nil
	}
	budget := maxWatchedChildren
	data := RunWaitingJSON{Run: w.root.run.ID, Seq: w.root.run.Seq, Status: w.root.run.Status,
		Waiting: waitingView(w.root.run, w.followed, &budget)}
	return sw.sendJSON("run_waiting", data)
}

// followed is the childLoader of the followed children.
func (w *waitWatch) followed(id string) (loop.Run, bool) {
	c, ok := w.children[id]
	if !ok {
		return loop.Run{}, false
	}
	return c.run, true
}

// ready returns the channels that say a followed child has something new.
func (w *waitWatch) ready() []<-chan struct{} {
	out := make([]<-chan struct{}, 0, len(w.children))
	for _, c := range w.children {
		out = append(out, c.f.Ready())
	}
	return out
}

// closeChildren stops following the children.
func (w *waitWatch) closeChildren() {
	for id, c := range w.children {
		c.f.Close()
		delete(w.children, id)
	}
}

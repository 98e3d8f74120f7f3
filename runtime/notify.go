package runtime

import (
	"strings"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime/internal/attempts"
)

// waiter is a one-shot channel for the next result of a Run.
type waiter struct {
	session string
	ch      chan Result
}

// runWaiters are the waiters of one Run, and the newest snapshot of it
// this runtime committed while they waited (committed). A Run is reported
// (afterAdvance) after its advance lets go of the Run's lock, and other
// reports of a quiescent wait come after a commit too, so a report can
// hold a snapshot older than a later advance's commit: notifyQuiescent
// judges the newest one.
type runWaiters struct {
	list   []waiter
	newest loop.Run // Seq 0: none committed yet
}

// addWaiter registers a one-shot channel for the next result of a Run.
func (rt *Runtime) addWaiter(tenant, session, runID string) chan Result {
	w := waiter{session: session, ch: make(chan Result, 1)}
	rt.mu.Lock()
	k := runKey(tenant, runID)
	rw := rt.waiters[k]
	if rw == nil {
		rw = &runWaiters{}
		rt.waiters[k] = rw
	}
	rw.list = append(rw.list, w)
	rt.mu.Unlock()
	return w.ch
}

func (rt *Runtime) removeWaiter(tenant, runID string, w chan Result) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	k := runKey(tenant, runID)
	rw := rt.waiters[k]
	if rw == nil {
		return
	}
	for i, x := range rw.list {
		if x.ch == w {
			rw.list = append(rw.list[:i:i], rw.list[i+1:]...)
			break
		}
	}
	if len(rw.list) == 0 {
		delete(rt.waiters, k)
	}
}

// committed notes that this runtime committed run (its snapshot after the
// commit), for the Run's waiters, if it has any.
func (rt *Runtime) committed(run loop.Run) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rw := rt.waiters[runKey(run.Tenant, run.ID)]; rw != nil && run.Seq > rw.newest.Seq {
		rw.newest = run
	}
}

// notifyRun hands r to every waiter of a Run.
func (rt *Runtime) notifyRun(tenant, runID string, r Result) {
	rt.mu.Lock()
	k := runKey(tenant, runID)
	rw := rt.waiters[k]
	delete(rt.waiters, k)
	rt.mu.Unlock()
	if rw == nil {
		return
	}
	for _, w := range rw.list {
		w.ch <- r
	}
}

// notifySession hands r to the waiters of every Run of a session.
func (rt *Runtime) notifySession(tenant, session string, r Result) {
	rt.mu.Lock()
	var ws []waiter
	for k, rw := range rt.waiters {
		if !strings.HasPrefix(k, tenant+"/") {
			continue
		}
		keep := rw.list[:0:0]
		for _, w := range rw.list {
			if w.session == session {
				ws = append(ws, w)
			} else {
				keep = append(keep, w)
			}
		}
		if len(keep) == 0 {
			delete(rt.waiters, k)
		} else {
			rw.list = keep
		}
	}
	rt.mu.Unlock()
	for _, w := range ws {
		w.ch <- r
	}
}

// afterAdvance tells waiters what became of a Run after an advance: its
// end, or a quiescent wait once no synchronous call of it is running.
// After an end it kicks the session for the next queued Run, unless the
// advance's own commit said none is left (CommitResult.SessionIdle).
func (rt *Runtime) afterAdvance(req advanceReq, cur loop.Run, sessionIdle bool) {
	if cur.Seq == 0 {
		return
	}
	if cur.Status.Terminal() {
		rt.hastenParent(cur)
		rt.forgetRun(cur)
		rt.notifyRun(cur.Tenant, cur.ID, Result{Kind: ResultTerminal, Run: cur})
		if !sessionIdle {
			rt.kick(cur.Tenant, cur.Session) // the next queued Run may start
		}
		return
	}
	rt.notifyQuiescent(cur)
}

// notifyQuiescent reports a quiescent wait when nothing synchronous is in
// flight for the Run and nothing is left for it to do by itself. It
// judges the newest snapshot this runtime committed when that is newer
// than cur: an advance after cur's has moved the Run on (an answer that
// came back at once was committed while cur's report was on its way),
// and a Run that has ended is reported by the advance that ended it. The
// newest snapshot is read after the holds are counted: an answer's hold
// is given back once its commit is durable and noted (committed), so a
// Run found idle has its newest commit noted already.
func (rt *Runtime) notifyQuiescent(cur loop.Run) {
	if rt.attempts.BusyRun(attempts.RunPrefixOf(cur.Tenant, cur.Session, cur.ID)) > 0 {
		return
	}
	k := runKey(cur.Tenant, cur.ID)
	rt.mu.Lock()
	rw := rt.waiters[k]
	if rw != nil && rw.newest.Seq > cur.Seq {
		cur = rw.newest
	}
	rt.mu.Unlock()
	if rw == nil || cur.Status.Terminal() {
		return
	}
	for _, a := range loop.Decide(cur) {
		switch a.Type {
		case loop.ActionPlanModelStep, loop.ActionDispatch, loop.ActionComplete, loop.ActionFail, loop.ActionFinishCancelled:
			return // it is moving: another advance will follow
		}
	}
	rt.notifyRun(cur.Tenant, cur.ID, Result{Kind: ResultWaiting, Run: cur, Waiting: WaitingFor(cur)})
}

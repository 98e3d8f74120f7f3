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

// addWaiter registers a one-shot channel for the next result of a Run.
func (rt *Runtime) addWaiter(tenant, session, runID string) chan Result {
	w := waiter{session: session, ch: make(chan Result, 1)}
	rt.mu.Lock()
	k := runKey(tenant, runID)
	rt.waiters[k] = append(rt.waiters[k], w)
	rt.mu.Unlock()
	return w.ch
}

func (rt *Runtime) removeWaiter(tenant, runID string, w chan Result) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	k := runKey(tenant, runID)
	ws := rt.waiters[k]
	for i, x := range ws {
		if x.ch == w {
			rt.waiters[k] = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(rt.waiters[k]) == 0 {
		delete(rt.waiters, k)
	}
}

// notifyRun hands r to every waiter of a Run.
func (rt *Runtime) notifyRun(tenant, runID string, r Result) {
	rt.mu.Lock()
	k := runKey(tenant, runID)
	ws := rt.waiters[k]
	delete(rt.waiters, k)
	rt.mu.Unlock()
	for _, w := range ws {
		w.ch <- r
	}
}

// notifySession hands r to the waiters of every Run of a session.
func (rt *Runtime) notifySession(tenant, session string, r Result) {
	rt.mu.Lock()
	var ws []waiter
	for k, list := range rt.waiters {
		if !strings.HasPrefix(k, tenant+"/") {
			continue
		}
		keep := list[:0:0]
		for _, w := range list {
			if w.session == session {
				ws = append(ws, w)
			} else {
				keep = append(keep, w)
			}
		}
		if len(keep) == 0 {
			delete(rt.waiters, k)
		} else {
			rt.waiters[k] = keep
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
// flight for the Run.
func (rt *Runtime) notifyQuiescent(cur loop.Run) {
	if rt.attempts.BusyRun(attempts.RunPrefixOf(cur.Tenant, cur.Session, cur.ID)) > 0 {
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

package runtime

import (
	"context"
	"errors"
)

// Session ownership in this process: the sessions this node holds in
// memory (sessionState), their claims and fencing epochs (claim), the
// boundary where it gives one up, and the one driver goroutine per session
// (kick, driveSession). The Runtime's mu guards the session table; the
// store holds the claims (Store.ClaimSession) and fences every commit with
// the epoch. docs/DESIGN.md §5.3 walks through it.

type sessionState struct {
	tenant, session string
	epoch           uint64
	claimed         bool
	driving         bool
	dirty           bool
	idleScans       int // watchdog scans in a row that found no active Run
}

func sessionKey(tenant, session string) string { return tenant + "/" + session }
func runKey(tenant, run string) string         { return tenant + "/" + run }

// claim returns the epoch this node holds for a session, claiming it the
// first time.
func (rt *Runtime) claim(ctx context.Context, tenant, session string) (uint64, error) {
	rt.mu.Lock()
	s := rt.sessionLocked(tenant, session)
	if s.claimed {
		e := s.epoch
		rt.mu.Unlock()
		return e, nil
	}
	expired := rt.expired
	rt.mu.Unlock()
	if expired {
		return 0, ErrNodeExpired
	}
	epoch, err := rt.store.ClaimSession(ctx, tenant, session, rt.nodeID, rt.nowMS())
	if err != nil {
		return 0, err
	}
	rt.mu.Lock()
	s = rt.sessionLocked(tenant, session)
	s.epoch, s.claimed = epoch, true
	rt.mu.Unlock()
	rt.log.Debug("session claimed", "tenant", tenant, "session", session, "epoch", epoch)
	return epoch, nil
}

func (rt *Runtime) sessionLocked(tenant, session string) *sessionState {
	k := sessionKey(tenant, session)
	s, ok := rt.sessions[k]
	if !ok {
		s = &sessionState{tenant: tenant, session: session}
		rt.sessions[k] = s
	}
	return s
}

// boundary gives a session up: this node no longer owns it. Waiters of its
// Runs get a boundary result.
func (rt *Runtime) boundary(tenant, session string, cause error) {
	rt.stats.Boundaries.Add(1)
	rt.mu.Lock()
	delete(rt.sessions, sessionKey(tenant, session))
	rt.mu.Unlock()
	rt.attempts.forgetSettledIn(tenant + "/" + session + "/")
	rt.log.Warn("ownership boundary: this node stops driving the session", "tenant", tenant, "session", session, "err", cause)
	rt.notifySession(tenant, session, Result{Kind: ResultBoundary, Err: cause})
}

// kick makes sure the session is being driven: it starts a driver
// goroutine, or tells the running one to look again.
func (rt *Runtime) kick(tenant, session string) {
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return
	}
	s := rt.sessionLocked(tenant, session)
	if s.driving {
		s.dirty = true
		rt.mu.Unlock()
		return
	}
	s.driving = true
	rt.wg.Add(1)
	rt.active.Add(1)
	rt.mu.Unlock()
	go func() {
		defer rt.wg.Done()
		defer rt.active.Add(-1)
		select {
		case rt.drivers <- struct{}{}:
			defer func() { <-rt.drivers }()
		case <-rt.life.Done():
			rt.mu.Lock()
			s.driving = false
			rt.mu.Unlock()
			return
		}
		for {
			rt.driveSession(tenant, session)
			rt.mu.Lock()
			if !s.dirty || rt.stopped {
				s.driving = false
				rt.mu.Unlock()
				return
			}
			s.dirty = false
			rt.mu.Unlock()
		}
	}()
}

// driveSession advances the head Run of a session until it is terminal (then
// the next one starts) or quiescent. A store error on the way (the claim,
// the read of the session's Runs) is retried with a backoff on the Clock:
// a Run acknowledged into the session must not wait for the watchdog
// because one read failed.
func (rt *Runtime) driveSession(tenant, session string) {
	ctx := rt.life
	backoff := commitRetryMin
	retry := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		rt.log.Warn("session driver: "+what+" failed; retrying", "tenant", tenant, "session", session, "retry_in", backoff, "err", err)
		ok := rt.sleep(backoff)
		backoff = min(2*backoff, commitRetryMax)
		return ok
	}
	for ctx.Err() == nil {
		epoch, err := rt.claim(ctx, tenant, session)
		if errors.Is(err, ErrSessionOwned) || errors.Is(err, ErrNodeExpired) {
			rt.boundary(tenant, session, err)
			return
		}
		if err != nil {
			if retry("claiming the session", err) {
				continue
			}
			return
		}
		runs, err := rt.store.ActiveRuns(ctx, tenant, session)
		if err != nil {
			if retry("reading the session's active Runs", err) {
				continue
			}
			return
		}
		if len(runs) == 0 {
			return
		}
		for _, queued := range runs[1:] {
			rt.notifyRun(tenant, queued.ID, Result{Kind: ResultWaiting, Run: queued, Waiting: &Waiting{Queued: true}})
		}
		head, err := rt.advance(ctx, advanceReq{tenant: tenant, session: session, runID: runs[0].ID, epoch: epoch, mayStart: true})
		if errors.Is(err, errStoreFailed) && !rt.stopping() {
			if retry("advancing the head Run", err) {
				continue
			}
			return
		}
		if err != nil || !head.Status.Terminal() {
			return
		}
		backoff = commitRetryMin
	}
}

package runtime

import (
	"context"
	"errors"
	"sync"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime/internal/driverslots"
)

// Session ownership in this process: the sessions this node holds in
// memory (sessionTable), their claims and fencing epochs (claim), the
// boundary where it gives one up, and the one driver goroutine per session
// (kick, driveSession). The store holds the claims (Store.ClaimSession)
// and fences every commit with the epoch. docs/DESIGN.md §5.3 walks
// through it.

// sessionState is what this process holds about one session. Its
// table's mu guards its fields. Once takeAll has handed a state out, only
// driving and dirty change (passDone, under the table's mu), and the
// caller of takeAll reads the others without it.
type sessionState struct {
	tenant, session string
	epoch           uint64 // the fencing epoch of this node's claim
	claimed         bool   // epoch holds this node's claim
	driving         bool   // a driver goroutine is on it
	dirty           bool   // it was kicked while driven: drive it again
	idleScans       int    // watchdog scans in a row that found no active Run
	// recovered holds the active Runs recovery's claim read (their IDs,
	// head first), or the first Run of a session its creation claimed
	// (setCreatedClaim), until the session's driver takes them for its
	// first pass (takeRecovered); hasRecovered says they are there.
	recovered    []string
	hasRecovered bool
}

// sessionTable is the one owner of the sessions this process holds, by
// tenant/session, behind its own lock. The watchdog bounds it by recent
// work (forgetIdle).
type sessionTable struct {
	// mu guards m, the fields of every sessionState in it, and existing.
	// It is a leaf: nothing is called while it is held. When both are
	// taken, the Runtime's mu comes first (kick).
	mu sync.Mutex
	m  map[string]*sessionState
	// existing remembers sessions the store holds Runs of that this
	// process no longer holds, or never did (markExisting), so that a Run
	// submitted in one is not taken for its session's first (known).
	existing existingSessions
}

func newSessionTable() *sessionTable {
	return &sessionTable{m: map[string]*sessionState{}, existing: existingSessions{set: map[string]struct{}{}}}
}

// maxExistingSessions bounds existingSessions: past it, the oldest mark
// is forgotten, and a Run submitted in that session costs a builder call
// made ahead in vain (Runtime.firstStep), no more.
const maxExistingSessions = 1 << 14

// existingSessions is a bounded set of session keys, forgetting the
// oldest first. sessionTable's mu guards it.
type existingSessions struct {
	set   map[string]struct{}
	order []string // the keys in the order they were added, a ring once full
	next  int      // the oldest key's index in order, once it is full
}

func (e *existingSessions) add(k string) {
	if _, ok := e.set[k]; ok {
		return
	}
	if len(e.order) < maxExistingSessions {
		e.order = append(e.order, k)
	} else {
		delete(e.set, e.order[e.next])
		e.order[e.next] = k
		e.next = (e.next + 1) % maxExistingSessions
	}
	e.set[k] = struct{}{}
}

// markExisting records that the store holds Runs of a session: a Run's
// creation found it was not the session's first (its first step was not
// written), or this process forgets the session (forgetIdle, remove).
func (t *sessionTable) markExisting(tenant, session string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.existing.add(sessionKey(tenant, session))
}

func sessionKey(tenant, session string) string { return tenant + "/" + session }
func runKey(tenant, run string) string         { return tenant + "/" + run }

// getLocked returns the session's state, adding it when it is not held.
func (t *sessionTable) getLocked(tenant, session string) *sessionState {
	k := sessionKey(tenant, session)
	s, ok := t.m[k]
	if !ok {
		s = &sessionState{tenant: tenant, session: session}
		t.m[k] = s
	}
	return s
}

// claimed returns the epoch of this node's claim on a session, if it holds
// one.
func (t *sessionTable) claimed(tenant, session string) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[sessionKey(tenant, session)]; s != nil && s.claimed {
		return s.epoch, true
	}
	return 0, false
}

// known reports whether this process holds anything of the session, or
// knows the store holds Runs of it (markExisting): a session it does not
// know may be new to the store.
func (t *sessionTable) known(tenant, session string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := sessionKey(tenant, session)
	_, existing := t.existing.set[k]
	return existing || t.m[k] != nil
}

// driven reports whether a driver of this process is on the session, or
// will be (kicked while driven): whatever stops it now, a backoff after a
// store error or a wait for a slot, it looks at the session again.
func (t *sessionTable) driven(tenant, session string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[sessionKey(tenant, session)]
	return s != nil && (s.driving || s.dirty)
}

// setClaim records this node's claim on a session.
func (t *sessionTable) setClaim(tenant, session string, epoch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.getLocked(tenant, session)
	s.epoch, s.claimed = epoch, true
}

// setRecoveredClaim records the claim recovery made on a session, with
// the IDs of the active Runs that the claim's transaction read (head
// first), for the driver's first pass.
func (t *sessionTable) setRecoveredClaim(tenant, session string, epoch uint64, active []loop.Run) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.getLocked(tenant, session)
	s.epoch, s.claimed = epoch, true
	s.recovered, s.hasRecovered = make([]string, len(active)), true
	for i, r := range active {
		s.recovered[i] = r.ID
	}
}

// setCreatedClaim records the claim a Run's creation made or found on its
// session (CreateResult.Epoch). When the Run is the session's first
// (first), it is the session's one active Run as of the creation's
// commit, and the driver's first pass takes it as the head without
// reading the session's active Runs (takeRecovered); a Run created in the
// session since then kicks the session again, and that pass reads them.
func (t *sessionTable) setCreatedClaim(tenant, session string, epoch uint64, first bool, runID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.getLocked(tenant, session)
	s.epoch, s.claimed = epoch, true
	if first {
		s.recovered, s.hasRecovered = []string{runID}, true
	}
}

// takeRecovered hands a driver, once, the active Runs recovery's claim
// read; ok is false when there are none to take.
func (t *sessionTable) takeRecovered(tenant, session string) (ids []string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[sessionKey(tenant, session)]
	if s == nil || !s.hasRecovered {
		return nil, false
	}
	ids, ok = s.recovered, true
	s.recovered, s.hasRecovered = nil, false
	return ids, ok
}

// dropClaim forgets a cached claim (recovery found the session owned by a
// dead incarnation, possibly an earlier claim of this node's: it must be
// claimed again, for a new epoch).
func (t *sessionTable) dropClaim(tenant, session string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[sessionKey(tenant, session)]; s != nil {
		s.claimed = false
		s.recovered, s.hasRecovered = nil, false
	}
}

// remove forgets a session, but that it exists (markExisting).
func (t *sessionTable) remove(tenant, session string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := sessionKey(tenant, session)
	delete(t.m, k)
	t.existing.add(k)
}

// takeAll empties the table and returns what it held.
func (t *sessionTable) takeAll() map[string]*sessionState {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.m
	t.m = map[string]*sessionState{}
	return all
}

// startDriving marks a session as driven; false (and the session marked
// dirty, to be driven again) when a driver is on it already.
func (t *sessionTable) startDriving(tenant, session string) (*sessionState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.getLocked(tenant, session)
	if s.driving {
		s.dirty = true
		return s, false
	}
	s.driving = true
	return s, true
}

// passDone ends a driver's pass over s: it reports whether to drive again
// (the session was kicked meanwhile, and the runtime is not stopping), or
// marks the session as no longer driven.
func (t *sessionTable) passDone(s *sessionState, stopping bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !s.dirty || stopping {
		s.driving = false
		return false
	}
	s.dirty = false
	return true
}

// forgetIdle counts, for every session held, the watchdog scans in a row
// that found it without an active Run (active holds those with one), and
// forgets it at the second if no driver is on it.
func (t *sessionTable) forgetIdle(active map[string]SessionOwner) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, s := range t.m {
		if _, ok := active[k]; ok || s.driving || s.dirty {
			s.idleScans = 0
			continue
		}
		if s.idleScans++; s.idleScans >= 2 {
			delete(t.m, k)
			t.existing.add(k)
		}
	}
}

func (t *sessionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// claim returns the epoch this node holds for a session, claiming it the
// first time.
func (rt *Runtime) claim(ctx context.Context, tenant, session string) (uint64, error) {
	if epoch, ok := rt.sessions.claimed(tenant, session); ok {
		return epoch, nil
	}
	rt.mu.Lock()
	expired := rt.expired
	rt.mu.Unlock()
	if expired {
		return 0, ErrNodeExpired
	}
	epoch, err := rt.store.ClaimSession(ctx, tenant, session, rt.nodeID, rt.nowMS())
	if err != nil {
		return 0, err
	}
	rt.sessions.setClaim(tenant, session, epoch)
	rt.log.Debug("session claimed", "tenant", tenant, "session", session, "epoch", epoch)
	return epoch, nil
}

// boundary gives a session up: this node no longer owns it. Waiters of its
// Runs get a boundary result.
func (rt *Runtime) boundary(tenant, session string, cause error) {
	rt.stats.Boundaries.Add(1)
	_, held := rt.sessions.claimed(tenant, session)
	rt.sessions.remove(tenant, session)
	rt.owned.ForgetSession(sessionKey(tenant, session))
	rt.attempts.ForgetSettledIn(tenant + "/" + session + "/")
	if held || !errors.Is(cause, ErrSessionOwned) {
		rt.log.Warn("ownership boundary: this node stops driving the session", "tenant", tenant, "session", session, "err", cause)
	} else {
		// A session this node never held, driven by another live node
		// (a Run submitted here for it): not news.
		rt.log.Debug("session driven by another node", "tenant", tenant, "session", session, "err", cause)
	}
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
	s, start := rt.sessions.startDriving(tenant, session)
	if !start {
		rt.mu.Unlock()
		return
	}
	rt.wg.Add(1)
	rt.active.Add(1)
	// A drive returns the next one queued for its slot (or nil, and the
	// slot is free), taken before its own count as active work ends: a
	// queued drive leaves the queue while the goroutine that will run it is
	// still counted, so the runtime never looks idle in between (a
	// quiescent check, the metamorphic test's, saw a Run of a queued
	// session stuck at that instant).
	var drive driverslots.Drive = func() driverslots.Drive {
		defer rt.wg.Done()
		defer rt.active.Add(-1)
		if rt.life.Err() != nil {
			rt.sessions.passDone(s, true)
			return rt.drivers.Next()
		}
		for {
			rt.driveSession(tenant, session)
			if !rt.sessions.passDone(s, rt.stopping()) {
				return rt.drivers.Next()
			}
		}
	}
	// The drive gets its slot, or its place in the queue for one, here,
	// in kick order, not when a goroutine happens to run.
	if !rt.drivers.TakeOrQueue(drive) {
		rt.mu.Unlock()
		return
	}
	rt.mu.Unlock()
	go func() {
		for d := drive; d != nil; {
			d = d()
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
		// New work waits while too many commits are under way
		// (runtime/internal/backlog); it holds no Run's lock here.
		if !rt.commits.Wait(ctx) {
			return
		}
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
		// The head Run: from the Runs recovery's claim read, on the first
		// pass after a takeover of a session with one active Run (the
		// advance reloads the Run itself); otherwise from the store.
		var headRun loop.Run // its ID alone, when recovery read it
		if ids, ok := rt.sessions.takeRecovered(tenant, session); ok && len(ids) <= 1 {
			if len(ids) == 0 {
				return
			}
			headRun.ID = ids[0]
		} else {
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
			headRun = runs[0]
		}
		head, err := rt.advance(ctx, driveHead(tenant, session, headRun, epoch))
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

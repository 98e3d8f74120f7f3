package runtime

import (
	"context"
	"sync"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime/internal/attempts"
)

// watchdog is the safety net under the session drivers: every
// WatchdogInterval it reads the store's index of sessions with an active
// Run (Store.ActiveSessions), and for each one this node owns on record it
// looks at the head Run. A Run that nothing will move on (stuck: nothing
// in flight, nothing awaited, no timer) in two scans in a row at the same
// version is reported and its session kicked, so the report is also a
// repair. Because it reads the store, not the sessions this process holds
// in memory, it finds a Run written into a session this node owns whoever
// wrote it: another node's submission, or one whose driver failed to
// start. (A session whose owner is dead, or that has none, is recovery's.)
//
// On a store shared with other nodes (a ChangeFeed), a Run found stuck at
// the first sighting is driven at once, quietly: another node wrote to it
// and the notice that should have woken this node was lost (the feed is a
// hint). The report, an error, is kept for a Run still stuck at the next
// scan, which a wake-up did not move.
//
// It also bounds the sessions the runtime holds in memory: one held with
// no active Run in two scans in a row, and no driver on it, is forgotten.
// Its claim stays in the store, so a later claim by this node reads it
// back with the same epoch.
type watchdog struct {
	// mu guards suspects; it is a leaf.
	mu sync.Mutex
	// suspects are the head Runs seen stuck once, by tenant/run, with the
	// Seq at which they were seen.
	suspects map[string]int64
}

// watchdogPage is how many sessions one ActiveSessions read returns.
const watchdogPage = 500

func (rt *Runtime) armWatchdog() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return
	}
	rt.watchdogTimer = rt.clock.AfterFunc(rt.opts.WatchdogInterval, func() {
		rt.goTracked(func() {
			rt.WatchdogScan(rt.life)
			rt.armWatchdog()
		})
	})
}

// WatchdogScan runs one scan of the watchdog and returns the number of
// Runs it reported stuck (and drove again). A store error ends the scan
// early; the next one starts afresh.
func (rt *Runtime) WatchdogScan(ctx context.Context) int {
	owned, err := rt.ownedActiveSessions(ctx)
	if err != nil {
		if ctx.Err() == nil {
			rt.log.Warn("watchdog: reading the sessions with an active Run failed; the next scan tries again", "err", err)
		}
		return 0
	}
	rt.sessions.forgetIdle(owned)
	shared := rt.isShared()
	reported := 0
	seen := map[string]bool{}
	for _, o := range owned {
		if rt.runningHere(o.Tenant, o.Session) {
			continue // not stuck, without a read
		}
		runs, err := rt.store.ActiveRuns(ctx, o.Tenant, o.Session)
		if err != nil || len(runs) == 0 {
			continue
		}
		head := runs[0]
		rk := runKey(head.Tenant, head.ID)
		seen[rk] = true
		if !rt.stuck(head) {
			rt.dog.forget(rk)
			continue
		}
		if !rt.dog.suspect(rk, head.Seq) {
			if shared {
				// Another node may have written to the Run (a Run
				// submitted, an input) and its change notice been lost:
				// wake it now. Still stuck at the next scan, it is
				// reported.
				rt.recStats.WatchdogWakes.Add(1)
				rt.log.Info("watchdog: drove a run nothing was moving, whose change notice from another node was lost",
					"tenant", head.Tenant, "session", head.Session, "run", head.ID, "seq", head.Seq)
				rt.kick(head.Tenant, head.Session)
			}
			continue
		}
		reported++
		rt.recStats.WatchdogReports.Add(1)
		rt.opts.Observer.WatchdogReport(head.Tenant)
		rt.log.Error("watchdog: run is stuck: not terminal, nothing in flight, nothing awaited, no timer; driving it again",
			"tenant", head.Tenant, "session", head.Session, "run", head.ID, "status", head.Status, "seq", head.Seq)
		rt.kick(head.Tenant, head.Session)
	}
	rt.dog.keepOnly(seen)
	return reported
}

// runningHere reports whether a Run of the session, as this node last
// committed or read it (rt.owned), has an executing effect whose attempt
// this process calls or watches: that Run is under way, and so it is the
// session's head (a queued Run has no effect), and stuck would find it
// not stuck on the store's snapshot too, which differs from this node's
// only by a guest's input, never by an effect's state. The watchdog then
// reads nothing for the session: a node with thousands of Runs waiting on
// their jobs does not read them all back at every scan.
func (rt *Runtime) runningHere(tenant, session string) bool {
	for _, key := range rt.owned.ExecutingAttempts(sessionKey(tenant, session)) {
		if rt.attempts.Handled(key) {
			return true
		}
	}
	return false
}

// ownedActiveSessions reads, page by page, the sessions with an active Run
// that this node owns on record.
func (rt *Runtime) ownedActiveSessions(ctx context.Context) (map[string]SessionOwner, error) {
	owned := map[string]SessionOwner{}
	var afterTenant, afterSession string
	for {
		page, err := rt.store.ActiveSessions(ctx, afterTenant, afterSession, watchdogPage)
		if err != nil {
			return nil, err
		}
		for _, o := range page {
			if o.Owner == rt.nodeID {
				owned[sessionKey(o.Tenant, o.Session)] = o
			}
		}
		if len(page) < watchdogPage {
			return owned, nil
		}
		last := page[len(page)-1]
		afterTenant, afterSession = last.Tenant, last.Session
	}
}

// suspect records that a Run was seen stuck at seq and reports whether it
// was seen stuck at the same seq by the scan before.
func (w *watchdog) suspect(rk string, seq int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, seen := w.suspects[rk]
	w.suspects[rk] = seq
	return seen && prev == seq
}

func (w *watchdog) forget(rk string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.suspects, rk)
}

// keepOnly drops the suspects the last scan did not see.
func (w *watchdog) keepOnly(seen map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.suspects {
		if !seen[k] {
			delete(w.suspects, k)
		}
	}
}

// stuck reports whether nothing will move a head Run on: no driver on
// its session (a driver backing off after a store error tries again), no
// effect this process calls, watches or settles, no person awaited, no
// effect timer, and no advance running or holding its lock.
func (rt *Runtime) stuck(run loop.Run) bool {
	if run.Status.Terminal() || rt.sessions.driven(run.Tenant, run.Session) {
		return false
	}
	rk := runKey(run.Tenant, run.ID)
	rt.mu.Lock()
	_, locked := rt.runLocks[rk]
	rt.mu.Unlock()
	if locked || rt.attempts.BusyRun(attempts.RunPrefixOf(run.Tenant, run.Session, run.ID)) > 0 {
		return false
	}
	for _, e := range run.Executing() {
		if rt.attempts.Handled(assignment(run, e.ID, e.Attempt)) {
			return false
		}
	}
	for _, a := range loop.Decide(run) {
		switch a.Type {
		case loop.ActionAwaitApproval, loop.ActionAwaitInput:
			return false
		case loop.ActionWakeAt:
			if a.EffectID != "" { // a backoff or an effect timeout; the deadline alone does not count
				return false
			}
		}
	}
	return true
}

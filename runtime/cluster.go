package runtime

import (
	"context"
	"math/rand/v2"
)

// Several nodes on one store (docs/DESIGN.md §5, "Several nodes"). Any node
// takes any API call for any tenant:
//
//   - a Run submitted on a node that does not own its session is created
//     there (CreateRun needs no epoch); that node's driver meets the owner
//     at its claim and steps aside, and the owner drives the Run;
//   - an input (approval, input, cancel) for such a session is committed
//     there alone, under the owner's epoch (guestInput), and the owner
//     acts on it;
//   - a Follow stream on any node reads the store.
//
// What wakes the owner, and the streams on other nodes, is the store's
// ChangeFeed when it has one (onChange). It is a latency hint: a change
// that is lost is found by the watchdog, which reads the store, and
// Follow's fallback re-reads the log on the Clock, so everything still
// completes without it, only slower.

// joinFeed subscribes to the store's ChangeFeed, if it has one. Stop and
// Halt end the subscription.
func (rt *Runtime) joinFeed() {
	feed, ok := rt.store.(ChangeFeed)
	if !ok {
		return
	}
	cancel := feed.SubscribeChanges(rt.onChange)
	rt.mu.Lock()
	if rt.stopped {
		// Stopped while subscribing: markStopped found no leaveFeed to
		// call, so the subscription ends here.
		rt.mu.Unlock()
		cancel()
		return
	}
	rt.shared, rt.leaveFeed = true, cancel
	rt.mu.Unlock()
}

// isShared reports whether the store is shared with other nodes through a
// ChangeFeed. Only then does a node commit an input for a session another
// live node owns: on a store without a feed, nothing would wake the owner
// but its watchdog, so the input is refused with ErrSessionOwned instead.
func (rt *Runtime) isShared() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.shared
}

// onChange acts on another node's commit: the Run's followers on this node
// read its log again, and, when this node owns the session on record, its
// driver looks at it. After a gap in the feed it looks again at every
// session this node owns (repairScan).
func (rt *Runtime) onChange(c Change) {
	if c.Rescan {
		rt.goTracked(func() { rt.repairScan(rt.life) })
		return
	}
	rt.hub.Publish(Notice{Tenant: c.Tenant, RunID: c.RunID, Seq: c.Seq})
	if c.Owner == rt.nodeID {
		rt.kick(c.Tenant, c.Session)
	}
}

// repairScan drives every session this node owns on record whose head Run
// nothing moves: what another node wrote while the feed was down. Unlike
// WatchdogScan it acts at the first sighting and reports nothing, since
// such a Run is expected after a gap in the feed. It returns how many
// sessions it kicked.
func (rt *Runtime) repairScan(ctx context.Context) int {
	owned, err := rt.ownedActiveSessions(ctx)
	if err != nil {
		if ctx.Err() == nil {
			rt.log.Warn("repair scan after a gap in the change feed failed; the watchdog will find what it missed", "err", err)
		}
		return 0
	}
	kicked := 0
	for _, o := range owned {
		runs, err := rt.store.ActiveRuns(ctx, o.Tenant, o.Session)
		if err != nil || len(runs) == 0 || !rt.stuck(runs[0]) {
			continue
		}
		kicked++
		rt.kick(o.Tenant, o.Session)
	}
	if kicked > 0 {
		rt.log.Info("change feed: drove the sessions other nodes wrote to while it was down", "sessions", kicked)
	}
	return kicked
}

// spreadClaims shuffles the orphaned sessions a recovery pass is about to
// claim when other nodes share the store, so that nodes starting together
// do not all queue on the same session rows in the same order. (On a store
// of one process, the order stays the store's, which keeps recovery
// deterministic for the tests that replay it.)
func (rt *Runtime) spreadClaims(orphans []SessionOwner) {
	if rt.isShared() {
		rand.Shuffle(len(orphans), func(i, j int) { orphans[i], orphans[j] = orphans[j], orphans[i] })
	}
}

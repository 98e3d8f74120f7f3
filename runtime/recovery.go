package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/recovery"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// RecoveryStats is a snapshot of recovery's counters, taken by Recovery:
// its passes, the sessions it took over, its decisions by kind, and the
// Runs the watchdog reported stuck.
type RecoveryStats struct {
	Passes          int64 // recovery passes run
	SessionsTaken   int64 // orphaned sessions taken over
	Reattach        int64
	Settle          int64
	Retry           int64
	Fail            int64
	FailRun         int64
	Defer           int64
	WatchdogReports int64 // Runs found stuck
	// WatchdogWakes counts the head Runs the watchdog drove at the first
	// sighting, on a store shared with other nodes: Runs another node
	// wrote to whose change notice was lost (cluster.go).
	WatchdogWakes int64
}

// Decided is how many decisions recovery made that ended its doubt about
// an attempt: every decision but Defer.
func (s RecoveryStats) Decided() int64 { return s.Reattach + s.Settle + s.Retry + s.Fail + s.FailRun }

// recoveryCounters are the live counters behind RecoveryStats.
type recoveryCounters struct {
	Passes, SessionsTaken, WatchdogReports        atomic.Int64
	WatchdogWakes                                 atomic.Int64
	Reattach, Settle, Retry, Fail, FailRun, Defer atomic.Int64
}

func (s *recoveryCounters) count(d recovery.Decision) {
	switch d {
	case recovery.Reattach:
		s.Reattach.Add(1)
	case recovery.Settle:
		s.Settle.Add(1)
	case recovery.Retry:
		s.Retry.Add(1)
	case recovery.Fail:
		s.Fail.Add(1)
	case recovery.FailRun:
		s.FailRun.Add(1)
	case recovery.Defer:
		s.Defer.Add(1)
	}
}

// Ready reports whether recovery's first pass is done: every session whose
// owner was dead at start-up has been taken over and handed to a driver.
// It is false again once the node's lease is lost (LeaseLost).
func (rt *Runtime) Ready() bool {
	select {
	case <-rt.lost:
		return false
	default:
		return rt.ready.Load()
	}
}

// Recovery returns a snapshot of recovery's counters.
func (rt *Runtime) Recovery() RecoveryStats {
	c := &rt.recStats
	return RecoveryStats{
		Passes: c.Passes.Load(), SessionsTaken: c.SessionsTaken.Load(),
		Reattach: c.Reattach.Load(), Settle: c.Settle.Load(), Retry: c.Retry.Load(),
		Fail: c.Fail.Load(), FailRun: c.FailRun.Load(), Defer: c.Defer.Load(),
		WatchdogReports: c.WatchdogReports.Load(), WatchdogWakes: c.WatchdogWakes.Load(),
	}
}

// startRecovery runs the first pass at once and then one every
// RecoveryInterval, and the watchdog every WatchdogInterval.
func (rt *Runtime) startRecovery() {
	rt.goTracked(func() {
		if _, err := rt.RecoverNow(rt.life); err != nil && rt.life.Err() == nil {
			rt.log.Error("recovery pass failed; it runs again on the next interval", "err", err)
		} else {
			rt.ready.Store(true)
		}
		rt.armRecovery()
	})
	rt.armWatchdog()
}

func (rt *Runtime) armRecovery() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return
	}
	rt.recoveryTimer = rt.clock.AfterFunc(rt.opts.RecoveryInterval, func() {
		rt.goTracked(func() {
			if _, err := rt.RecoverNow(rt.life); err != nil && rt.life.Err() == nil {
				rt.log.Error("recovery pass failed", "err", err)
			} else {
				rt.ready.Store(true)
			}
			rt.armRecovery()
		})
	})
}

// RecoverNow runs one recovery pass: it takes over every session whose
// owner incarnation is dead and hands it to a driver, which re-drives its
// Runs and sends its executing effects through attach. It returns the
// number of sessions taken over. Its error is the scan's (or ctx's): a
// claim the store fails is logged, and the session handed to its driver
// all the same, which claims it again.
func (rt *Runtime) RecoverNow(ctx context.Context) (sessions int, err error) {
	rt.recStats.Passes.Add(1)
	began := rt.clock.Now()
	orphans, err := rt.store.OrphanedSessions(ctx, rt.nowMS())
	if err != nil {
		return 0, fmt.Errorf("runtime: recovery scan: %w", err)
	}
	if len(orphans) > 0 {
		// A pass that finds nothing to take over (most of them, every
		// RecoveryInterval) leaves no trace.
		var span trace.Span
		ctx, span = startRecoverySpan(ctx, began, len(orphans))
		defer func() {
			if span.IsRecording() {
				span.SetAttributes(attrRecovered.Int(sessions))
			}
			EndSpan(span, err)
		}()
	}
	rt.spreadClaims(orphans)
	refs := make([]SessionOwner, 0, len(orphans))
	for _, o := range orphans {
		if _, ok := rt.opts.Tenants.Tenant(o.Tenant); !ok {
			rt.log.Warn("recovery: session of an unknown tenant left alone; configure the tenant to recover it",
				"tenant", o.Tenant, "session", o.Session)
			continue
		}
		// A session this node had claimed under an earlier epoch must be
		// claimed again: forget the cached claim.
		if o.Owner != rt.nodeID {
			rt.sessions.dropClaim(o.Tenant, o.Session)
			rt.owned.ForgetSession(sessionKey(o.Tenant, o.Session))
		}
		refs = append(refs, o)
	}
	// One transaction, and one synced write, claims a batch of sessions
	// (Store.ClaimSessions); a few batches go at once, so that the store
	// can group their syncs too (docs/DESIGN.md §10).
	var (
		taken atomic.Int64
		// mu guards unsure, which the claim workers append to; it is a
		// leaf.
		mu     sync.Mutex
		unsure []SessionOwner // claims the store failed: they may be written
		wg     sync.WaitGroup
		work   = make(chan []SessionOwner)
	)
	batches := (len(refs) + recoveryClaimBatch - 1) / recoveryClaimBatch
	for w := 0; w < min(batches, recoveryClaimWorkers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				n, err := rt.takeOver(ctx, batch)
				taken.Add(int64(n))
				if err != nil {
					if ctx.Err() == nil {
						rt.log.Warn("recovery: claiming a batch of sessions failed; their drivers claim them again",
							"sessions", len(batch), "first_tenant", batch[0].Tenant, "first_session", batch[0].Session, "err", err)
					}
					mu.Lock()
					unsure = append(unsure, batch...)
					mu.Unlock()
				}
			}
		}()
	}
	for len(refs) > 0 {
		n := min(len(refs), recoveryClaimBatch)
		work <- refs[:n:n]
		refs = refs[n:]
	}
	close(work)
	wg.Wait()
	// Drive them only once every claim is made: drivers started among the
	// claims compete with them for the store and the CPU, and made a pass
	// over 10,000 sessions six times slower (docs/BENCHMARKS.md).
	// A claim the store failed may have been written (a lost reply): its
	// session is driven too, and the driver claims it again (the same
	// epoch, if it was written), retrying a store error, or meets its
	// owner at a boundary. Otherwise a session this node owns on record
	// would wait for the watchdog.
	isUnsure := make(map[SessionRef]bool, len(unsure))
	for _, o := range unsure {
		isUnsure[SessionRef{Tenant: o.Tenant, Session: o.Session}] = true
	}
	for _, o := range orphans {
		if _, mine := rt.sessions.claimed(o.Tenant, o.Session); mine || isUnsure[SessionRef{Tenant: o.Tenant, Session: o.Session}] {
			rt.kick(o.Tenant, o.Session)
		}
	}
	return int(taken.Load()), ctx.Err()
}

// recoveryClaimBatch is how many sessions one ClaimSessions call of a
// recovery pass takes; recoveryClaimWorkers bounds the calls in flight.
const (
	recoveryClaimBatch   = 256
	recoveryClaimWorkers = 4
)

// takeOver claims a batch of orphaned sessions in one store call and
// records each claim, with the head Run the claim read, for the session's
// driver; RecoverNow then hands them to drivers. It returns how many it
// took; a session another live incarnation took first is not counted.
func (rt *Runtime) takeOver(ctx context.Context, orphans []SessionOwner) (int, error) {
	batch := make([]SessionRef, len(orphans))
	for i, o := range orphans {
		batch[i] = SessionRef{Tenant: o.Tenant, Session: o.Session}
	}
	rt.mu.Lock()
	expired := rt.expired
	rt.mu.Unlock()
	if expired {
		return 0, ErrNodeExpired
	}
	claims, err := rt.store.ClaimSessions(ctx, rt.nodeID, rt.nowMS(), batch)
	if err != nil {
		return 0, fmt.Errorf("runtime: recovery: take over %d sessions: %w", len(batch), err)
	}
	if len(claims) != len(batch) {
		return 0, fmt.Errorf("runtime: recovery: the store answered %d claims for %d sessions", len(claims), len(batch))
	}
	n := 0
	for i, c := range claims {
		ref := batch[i]
		if c.Err != nil {
			if !errors.Is(c.Err, ErrSessionOwned) {
				rt.log.Warn("recovery: the store refused a claim", "tenant", ref.Tenant, "session", ref.Session, "err", c.Err)
			}
			continue // another live incarnation took it first
		}
		rt.sessions.setRecoveredClaim(ref.Tenant, ref.Session, c.Epoch, c.Active)
		if len(c.Active) > 0 {
			rt.historyKnownAt(ref.Tenant, ref.Session, c.Active[0].ID, c.HeadOrdinal)
		}
		rt.recStats.SessionsTaken.Add(1)
		rt.log.Info("recovery: session taken over", "tenant", ref.Tenant, "session", ref.Session,
			"dead_owner", orphans[i].Owner, "epoch", c.Epoch)
		n++
	}
	return n, nil
}

// recoverEffect asks the executor of an orphaned attempt to attach, plans
// with recovery.Plan and carries the command out. The caller holds the
// attempt as being called (beginCall or takeWatched).
func (rt *Runtime) recoverEffect(t *Tenant, run loop.Run, e loop.Effect, key string, slot *callSlot) {
	exec := rt.executorFor(t, &run, &e)
	ctx, cancel := rt.callCtx(exec)
	defer cancel()
	st := recovery.AttachState{Kind: recovery.AttachUnavailable}
	taken, gone := routeTo(exec, e)
	if taken != nil {
		rt.logTakeover(run, e, key, *taken)
		e.Plugin = taken
	}
	if exec == nil {
		st.Reason = fmt.Sprintf("no executor for %s %q", e.Kind, e.Tool)
	} else if gone != nil {
		st = recovery.AttachState{Kind: recovery.AttachVersionGone, Reason: gone.Error()}
	} else if call, err := rt.effectCall(ctx, run, e, nil); err != nil {
		st.Reason = err.Error()
	} else {
		rt.stats.ExecutorCalls.Add(1)
		// Its wait for a plugin instance shows in the Run's JSON, as a
		// start's or a poll's does; the debug log times the whole attach,
		// that wait included, so that one that does not end can be found.
		ctx = WithCapacityWaitReport(ctx, rt.instanceWaits.report(key, rt.clock))
		began := rt.clock.Now()
		rt.log.Debug("recovery: attaching", "assignment_key", key, "kind", e.Kind, "tool", e.Tool)
		sctx, span := startEffectSpan(ctx, &run, &e, abi.ExportAttach, exec, &call)
		reply, err := exec.Attach(sctx, call)
		endEffectSpan(span, &e, reply, err)
		rt.log.Debug("recovery: attach answered", "assignment_key", key, "took", rt.clock.Now().Sub(began),
			"state", reply.State, "err", err)
		slot.free()
		switch {
		case err != nil && rt.life.Err() != nil:
			rt.abandon(key)
			return
		case err != nil:
			st.Reason = err.Error()
		default:
			st = attachState(e.Kind, reply)
		}
	}
	slot.free()
	rt.actOnAttach(run, e, key, st, slot)
}

// logTakeover logs that the plugin version taken takes over an attempt
// another version holds (VersionRouter); the effect_pending or
// effect_settled event that follows names it.
func (rt *Runtime) logTakeover(run loop.Run, e loop.Effect, key string, taken loop.PluginRef) {
	rt.log.Info("plugin version takes over an attempt: the version that started it is gone, and this one declares it can take its attempts over (attaches_from)",
		"assignment_key", key, "plugin", taken.Name, "version", taken.Version, "sha256", taken.SHA256,
		"started_by_version", e.Plugin.Version, "started_by_sha256", e.Plugin.SHA256, "tenant", run.Tenant, "run", run.ID)
}

// takenOver returns the plugin version e names when it is not the one the
// stored run's attempt holds (a takeover, which the event records), or nil.
func takenOver(run *loop.Run, e loop.Effect) *loop.PluginRef {
	stored := run.Effect(e.ID)
	if e.Plugin == nil || stored == nil || stored.Plugin == nil || stored.Plugin.SHA256 == e.Plugin.SHA256 {
		return nil
	}
	return e.Plugin
}

// actOnAttach plans what to do about an attempt whose state an attach (or
// a failed call) found, with recovery.Plan, and carries the command out.
// The caller holds the attempt as being called.
func (rt *Runtime) actOnAttach(run loop.Run, e loop.Effect, key string, st recovery.AttachState, slot *callSlot) {
	deferrals, firstMS := rt.attempts.Deferral(key)
	if e.DeferredSince != 0 && (firstMS == 0 || e.DeferredSince < firstMS) {
		// An earlier incarnation deferred it first: max_defer counts from
		// then, not from this process's start.
		firstMS = e.DeferredSince
		deferrals = max(deferrals, 1)
	}
	p := recovery.Policy{Missing: policyOf(run, e), MaxDeferMS: rt.opts.MaxDefer.Milliseconds(),
		DeferBackoffMS: rt.opts.PollMin.Milliseconds(), MaxDeferBackoffMS: rt.opts.PollMax.Milliseconds()}
	now := rt.nowMS()
	cmd := recovery.Plan(recovery.Record{Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID,
		Kind: e.Kind, Attempt: e.Attempt, RateLimited: e.RateLimited, Handle: e.Handle, Deferrals: deferrals, FirstDeferredMS: firstMS}, st, p, now)
	rt.recStats.count(cmd.Decision)
	rt.opts.Observer.RecoveryDecision(string(cmd.Decision))
	rt.log.Info("recovery decision", "assignment_key", key, "decision", cmd.Decision, "command_id", cmd.CommandID, "reason", cmd.Reason)
	switch cmd.Decision {
	case recovery.Reattach:
		rt.attempts.ClearDeferral(key)
		rt.recordPending(run, e, key, abi.EffectReply{State: abi.StatePending, Handle: cmd.Handle, PollAfterMS: cmd.PollAfterMS}, slot)
	case recovery.Defer:
		rt.attempts.DeferAttach(key, now)
		if e.DeferredSince == 0 {
			rt.recordDeferral(run, e, key)
		}
		if !rt.backToWatcher(key) {
			return
		}
		ok := rt.watcher.Schedule(watcher.Item{Key: "attach/" + key, Kind: watcher.Attach, At: time.UnixMilli(cmd.RetryAtMS),
			Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID, Attempt: e.Attempt})
		if !ok {
			rt.attempts.Forget(key)
		}
		rt.notifyQuiescent(run) // it waits on the watcher now
	default:
		rt.attempts.ClearDeferral(key)
		rt.commitSettlement(run, e, key, *cmd.Settlement.Outcome, slot)
	}
}

// recordDeferral commits when an attempt was first deferred
// (EffectDeferred), so that max_defer counts from then across restarts.
// It is best effort: if the commit fails, this process still counts from
// its own first deferral, and the next deferral tries again.
func (rt *Runtime) recordDeferral(run loop.Run, e loop.Effect, key string) {
	ctx, cancel := rt.commitCtx()
	defer cancel()
	if _, err := rt.advance(ctx, deferralStart(run, e, key)); err != nil && rt.life.Err() == nil {
		rt.log.Warn("recovery: the start of a deferral was not recorded; max_defer counts from this process's first deferral", "assignment_key", key, "err", err)
	}
}

// attachState maps an attach reply to recovery's terms.
func attachState(kind abi.EffectKind, r abi.EffectReply) recovery.AttachState {
	switch r.State {
	case abi.StatePending:
		return recovery.AttachState{Kind: recovery.AttachPending, Handle: r.Handle, PollAfterMS: r.PollAfterMS}
	case abi.StateDone:
		o := doneOutcome(kind, r.Outcome)
		if o.State == loop.OutcomeFailed {
			return recovery.AttachState{Kind: recovery.AttachFailed, Outcome: o}
		}
		return recovery.AttachState{Kind: recovery.AttachDone, Outcome: o}
	case abi.StateFailed:
		return recovery.AttachState{Kind: recovery.AttachFailed, Outcome: failedReplyOutcome(r.Error)}
	}
	return recovery.AttachState{Kind: recovery.AttachUnknown}
}

// policyOf is the missing-effect policy of an effect of run.
func policyOf(run loop.Run, e loop.Effect) loop.Policy {
	if e.Kind == abi.KindModel {
		return run.ModelPolicy
	}
	t, _ := run.ToolSpec(e.Tool)
	return t.Policy
}

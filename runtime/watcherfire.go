package runtime

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/recovery"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// Firing the Watcher's due items: a batch carried out by a bounded number
// of workers (onWatcherFire), each a Run's wake-up, a poll of a pending
// attempt, or a deferred recovery attach (runWatchItem).

// onWatcherFire carries out a batch of due items with a bounded number of
// goroutines, not one per item. The workers take the items in turn from
// the batch itself: no goroutine hands them out, so a Stop that refuses
// the rest of the workers leaves none waiting (the items not carried out
// are polls, attaches and wake-ups, which recovery and the next process's
// drivers redo).
func (rt *Runtime) onWatcherFire(batch []watcher.Item) {
	var next atomic.Int64
	work := func() {
		for {
			i := next.Add(1) - 1
			if i >= int64(len(batch)) || rt.life.Err() != nil {
				return
			}
			rt.runWatchItem(batch[i])
		}
	}
	for i := range min(len(batch), rt.opts.MaxConcurrentCalls) {
		if !rt.goTracked(work) {
			return
		}
		if hook := rt.watcherFireHook.Load(); i == 0 && hook != nil {
			(*hook)()
		}
	}
}

// takeWatched turns a due poll or attach item into a running call: it
// reloads the Run and, when the attempt is still executing and this
// process still watches it, holds it as being called. Otherwise it
// forgets the attempt (or records it settled, when it was settled
// meanwhile) and reports false.
func (rt *Runtime) takeWatched(it watcher.Item) (*Tenant, loop.Run, loop.Effect, string, bool) {
	key := loop.AssignmentKey{Tenant: it.Tenant, Session: it.Session, EffectID: it.EffectID, Attempt: it.Attempt}.String()
	t, ok := rt.opts.Tenants.Tenant(it.Tenant)
	run, err := rt.store.LoadRun(rt.life, it.Tenant, it.RunID)
	if !ok || errors.Is(err, ErrRunNotFound) {
		rt.attempts.Forget(key)
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	if err != nil {
		// The store failed: the item falls due again after a backoff,
		// still watched. Forgetting it would leave the attempt executing
		// on record with nobody polling it.
		if rt.life.Err() == nil {
			retry := it
			retry.At = rt.clock.Now().Add(max(it.Interval, rt.opts.PollMin))
			rt.log.Warn("watcher: reading the Run failed; trying again", "assignment_key", key, "retry_at", retry.At, "err", err)
			if !rt.watcher.Schedule(retry) {
				rt.attempts.Forget(key)
			}
		}
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	e := run.Effect(it.EffectID)
	if e == nil || e.State != loop.EffectExecuting || e.Attempt != it.Attempt {
		rt.attempts.MarkSettled(key) // settled meanwhile
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	if !rt.attempts.TakeWatched(key) {
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	return t, run, *e, key, true
}

func (rt *Runtime) runWatchItem(it watcher.Item) {
	switch it.Kind {
	case watcher.Wake:
		ctx, cancel := rt.commitCtx()
		defer cancel()
		_, err := rt.advance(ctx, timerFired(it.Tenant, it.Session, it.RunID))
		if err != nil && rt.life.Err() == nil && !errors.Is(err, ErrRunNotFound) {
			rt.log.Warn("timer delivery failed", "run", it.RunID, "err", err)
		}
		rt.kick(it.Tenant, it.Session)
	case watcher.Attach:
		if t, run, e, key, ok := rt.takeWatched(it); ok {
			rt.recoverEffect(t, run, e, key, nil)
		}
	case watcher.Budget:
		t, run, e, key, ok := rt.takeWatched(it)
		if !ok {
			rt.forgetBudgetWait(it.Tenant, key)
			return
		}
		rt.callExecutor(t, run, e, nil, abi.ExportStart, nil)
	case watcher.Poll:
		t, run, e, key, ok := rt.takeWatched(it)
		if !ok {
			return
		}
		exec := rt.executorFor(t, &run, &e)
		if exec == nil {
			rt.abandon(key)
			return
		}
		taken, gone := routeTo(exec, e)
		if gone != nil {
			// The version that started it was unloaded (its drain ran
			// out): as at a restart, the missing-effect policy decides.
			rt.actOnAttach(run, e, key, recovery.AttachState{Kind: recovery.AttachVersionGone, Reason: gone.Error()}, nil)
			return
		}
		if taken != nil {
			rt.logTakeover(run, e, key, *taken)
			e.Plugin = taken
		}
		ctx, cancel := rt.callCtx(exec)
		defer cancel()
		ef := e
		ef.Handle = it.Handle
		call, err := rt.effectCall(ctx, run, ef, nil)
		var reply abi.EffectReply
		if err == nil {
			rt.stats.ExecutorCalls.Add(1)
			sctx, span := startEffectSpan(ctx, &run, &ef, abi.ExportPoll, exec, &call)
			reply, err = exec.Poll(sctx, call)
			endEffectSpan(span, &ef, reply, err)
		}
		if err == nil && reply.State == abi.StatePending && reply.Handle == it.Handle {
			// Still pending, same handle: nothing to record; back off.
			if !rt.backToWatcher(key) {
				return
			}
			interval := watcher.NextPollInterval(it.Interval, rt.opts.PollMin, rt.opts.PollMax)
			if reply.PollAfterMS > 0 {
				interval = time.Duration(reply.PollAfterMS) * time.Millisecond
			}
			if !rt.schedulePoll(run, ef, key, it.Handle, interval) {
				rt.attempts.Forget(key)
			}
			rt.notifyQuiescent(run)
			return
		}
		rt.onReply(run, ef, key, abi.ExportPoll, reply, err, nil)
	}
}

// schedulePoll registers the next poll of a watched attempt; false when
// the watcher is stopped.
func (rt *Runtime) schedulePoll(run loop.Run, e loop.Effect, key, handle string, interval time.Duration) bool {
	return rt.watcher.Schedule(watcher.Item{
		Key: "poll/" + key, Kind: watcher.Poll, At: rt.clock.Now().Add(interval),
		Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID, Attempt: e.Attempt,
		Handle: handle, Interval: interval,
	})
}

// backToWatcher hands a called attempt back to the watcher and gives up
// the hold of the call, which concluded with nothing to commit (a poll
// still pending, a deferred attach). It reports false when there is
// nothing to watch: other work settles the attempt (a cancel), or the
// bookkeeping refused.
func (rt *Runtime) backToWatcher(key string) bool {
	watched, err := rt.attempts.Watch(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return false
	}
	rt.check(rt.attempts.Release(key))
	return watched
}

package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// perform carries out what a committed advance obliges, once it is durable
// (write-ahead dispatch): executor calls for the dispatched effects,
// cancels, Watcher wake-ups, and the adoption of any executing effect this
// process is not handling yet.
func (rt *Runtime) perform(t *Tenant, run loop.Run, epoch uint64, fx sideEffects) {
	fresh := map[string]bool{}
	for _, d := range fx.dispatched {
		// reserveDispatches marked these as being called before the commit.
		key := assignment(run, d.effect.ID, d.effect.Attempt)
		fresh[d.effect.ID] = true
		e, req := d.effect, d.request
		rt.launch(run, key, func() { rt.callStart(t, run, e, req, abi.ExportStart) })
	}
	cancelling := map[string]bool{}
	for _, a := range fx.cancels {
		cancelling[a.EffectID] = true
		key := assignment(run, a.EffectID, a.Attempt)
		if rt.beginCancel(run, key) {
			e := *run.Effect(a.EffectID)
			rt.launch(run, key, func() { rt.callCancel(t, run, e) })
		}
	}
	for _, e := range run.Executing() {
		if fresh[e.ID] || cancelling[e.ID] {
			continue
		}
		// Executing, but this process is neither calling nor polling it:
		// an effect of an earlier incarnation (attach), or of this one whose
		// settlement was lost on the way (call again: executors treat
		// (effect, attempt) as an idempotency key).
		key := assignment(run, e.ID, e.Attempt)
		if !rt.beginCall(run, key) {
			continue
		}
		e := e
		switch {
		case e.Epoch != epoch:
			rt.launch(run, key, func() { rt.recoverEffect(t, run, e, key) })
		case e.Handle != "":
			rt.launch(run, key, func() { rt.callStart(t, run, e, nil, abi.ExportPoll) })
		default:
			rt.launch(run, key, func() { rt.callStart(t, run, e, nil, abi.ExportStart) })
		}
	}
	for _, a := range fx.wakes {
		rt.watcher.Schedule(watchItem{
			Key: "wake/" + run.Tenant + "/" + run.ID + "/" + strconv.FormatInt(a.At, 10), Kind: watchWake,
			At: time.UnixMilli(a.At), Tenant: run.Tenant, Session: run.Session, RunID: run.ID,
		})
	}
}

func assignment(run loop.Run, effectID string, attempt int) string {
	return loop.AssignmentKey{Tenant: run.Tenant, Session: run.Session, EffectID: effectID, Attempt: attempt}.String()
}

// beginCall marks an attempt as being called; false when it is already
// being called or polled.
func (rt *Runtime) beginCall(run loop.Run, key string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return false
	}
	tr := rt.tracked.getOrAdd(key)
	if tr.calling || tr.polling || tr.cancelling || tr.done {
		return false
	}
	tr.calling = true
	rt.busy[runKey(run.Tenant, run.ID)]++
	return true
}

// reserveDispatches marks the attempts a commit is about to dispatch as
// being called, before the commit, so that no other advance that reads the
// commit can mistake them for orphans and call them a second time. It
// reports false (and reserves nothing) if the runtime is stopping.
func (rt *Runtime) reserveDispatches(run loop.Run, fx sideEffects) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return false
	}
	for _, d := range fx.dispatched {
		rt.tracked.put(assignment(run, d.effect.ID, d.effect.Attempt), &tracking{calling: true})
		rt.busy[runKey(run.Tenant, run.ID)]++
	}
	return true
}

// unreserveDispatches undoes reserveDispatches when the commit did not
// happen.
func (rt *Runtime) unreserveDispatches(run loop.Run, fx sideEffects) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, d := range fx.dispatched {
		rt.tracked.delete(assignment(run, d.effect.ID, d.effect.Attempt))
		rk := runKey(run.Tenant, run.ID)
		if rt.busy[rk]--; rt.busy[rk] <= 0 {
			delete(rt.busy, rk)
		}
	}
}

// beginCancel marks an attempt as being cancelled (once). A poll
// registration is dropped: the cancel reply settles the attempt.
func (rt *Runtime) beginCancel(run loop.Run, key string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return false
	}
	tr := rt.tracked.getOrAdd(key)
	if tr.cancelling || tr.done {
		return false
	}
	tr.cancelling = true
	if tr.polling {
		tr.polling = false
		rt.watcher.Cancel("poll/" + key)
		rt.watcher.Cancel("attach/" + key)
		delete(rt.deferred, key)
	}
	rt.busy[runKey(run.Tenant, run.ID)]++
	return true
}

// launch runs a call as tracked work; if the runtime is stopping it undoes
// the busy count the caller took.
func (rt *Runtime) launch(run loop.Run, key string, f func()) {
	if !rt.goTracked(f) {
		rt.mu.Lock()
		rt.busy[runKey(run.Tenant, run.ID)]--
		rt.mu.Unlock()
	}
}

// settled marks an attempt as settled for good (its settlement committed,
// or found committed before).
func (rt *Runtime) settled(key string) {
	rt.mu.Lock()
	rt.tracked.put(key, &tracking{done: true})
	rt.mu.Unlock()
}

// untrack forgets what this process was doing about an attempt that is
// still executing on record, so that a later advance adopts it again.
func (rt *Runtime) untrack(key string) {
	rt.mu.Lock()
	rt.tracked.delete(key)
	rt.mu.Unlock()
}

// forgetRun drops the tombstones of a Run that has ended.
func (rt *Runtime) forgetRun(run loop.Run) {
	prefix := run.Tenant + "/" + run.Session + "/" + run.ID + "."
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.tracked.deleteRun(prefix)
}

// effectCall builds the input of an executor call.
func (rt *Runtime) effectCall(ctx context.Context, run loop.Run, e loop.Effect, request json.RawMessage) (EffectCall, error) {
	in := abi.EffectInput{ABI: abi.Version, Handle: e.Handle, Effect: abi.Effect{
		ID: e.ID, AssignmentKey: assignment(run, e.ID, e.Attempt), Attempt: e.Attempt, Kind: e.Kind,
		DeadlineMS: run.Limits.DeadlineMS,
	}}
	if e.Kind == abi.KindTool {
		in.Effect.Tool = e.Tool
		args := e.Arguments
		if len(args) == 0 {
			args = json.RawMessage(`{}`)
		}
		raw, err := json.Marshal(abi.ToolRequest{Arguments: args})
		if err != nil {
			return EffectCall{}, err
		}
		in.Effect.Request = raw
	} else {
		if request == nil {
			evs, err := rt.store.Events(ctx, run.Tenant, run.ID, e.RequestSeq, 1)
			if err != nil {
				return EffectCall{}, fmt.Errorf("runtime: read the request of %s: %w", e.ID, err)
			}
			if len(evs) == 0 || evs[0].Type != loop.EventModelStepPlanned {
				return EffectCall{}, fmt.Errorf("runtime: the request of %s (event %d) is gone", e.ID, e.RequestSeq)
			}
			request = evs[0].Request
		}
		in.Effect.Request = request
	}
	return EffectCall{Tenant: run.Tenant, Session: run.Session, RunID: run.ID, Input: in}, nil
}

// callStart calls start, poll or attach for an effect attempt and acts on
// the reply.
func (rt *Runtime) callStart(t *Tenant, run loop.Run, e loop.Effect, request json.RawMessage, export string) {
	key := assignment(run, e.ID, e.Attempt)
	ctx, cancel := rt.callCtx()
	defer cancel()
	exec := t.executorFor(e.Kind, e.Tool)
	if exec == nil {
		rt.settle(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, fmt.Sprintf("no executor for %s %s", e.Kind, e.Tool), true))
		return
	}
	call, err := rt.effectCall(ctx, run, e, request)
	if err != nil {
		rt.settle(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, err.Error(), true))
		return
	}
	rt.stats.ExecutorCalls.Add(1)
	var reply abi.EffectReply
	switch export {
	case abi.ExportPoll:
		reply, err = exec.Poll(ctx, call)
	case abi.ExportAttach:
		reply, err = exec.Attach(ctx, call)
	default:
		reply, err = exec.Start(ctx, call)
	}
	rt.onReply(run, e, key, export, reply, err)
}

// onReply turns an executor reply into a settlement, a pending record and
// a poll, or nothing (when the runtime is stopping, recovery owns it).
func (rt *Runtime) onReply(run loop.Run, e loop.Effect, key, export string, reply abi.EffectReply, err error) {
	if err != nil {
		if rt.life.Err() != nil {
			rt.abandon(run, key) // stopping: the record stays for recovery
			return
		}
		if !errors.As(err, new(*PluginError)) {
			rt.stats.UnavailableErrors.Add(1)
		}
		rt.settle(run, e, key, loop.Outcome{State: loop.OutcomeFailed, Error: failureOf(err)})
		return
	}
	switch reply.State {
	case abi.StateDone:
		rt.settle(run, e, key, doneOutcome(e.Kind, reply.Outcome))
	case abi.StateFailed:
		msg, retriable := "the executor reported failure", false
		if reply.Error != nil {
			msg, retriable = reply.Error.Message, reply.Error.Retriable
		}
		rt.settle(run, e, key, failedOutcome(abi.ClassPluginFailed, msg, retriable))
	case abi.StateUnknown:
		rt.settle(run, e, key, failedOutcome(abi.ClassLost, export+": the executor holds no record of this attempt", true))
	case abi.StatePending:
		rt.pending(run, e, key, reply)
	default:
		rt.settle(run, e, key, failedOutcome(abi.ClassPluginProtocol, fmt.Sprintf("%s answered state %q", export, reply.State), false))
	}
}

func failedOutcome(class abi.ErrorClass, msg string, retriable bool) loop.Outcome {
	return loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: class, Message: msg, Retriable: retriable}}
}

// doneOutcome decodes the outcome payload of a done reply; a payload that
// does not decode is a protocol failure of the plugin.
func doneOutcome(kind abi.EffectKind, raw json.RawMessage) loop.Outcome {
	if kind == abi.KindModel {
		var m abi.ModelOutcome
		if err := json.Unmarshal(raw, &m); err != nil {
			return failedOutcome(abi.ClassPluginProtocol, "model outcome: "+err.Error(), false)
		}
		return loop.Outcome{State: loop.OutcomeDone, Model: &m}
	}
	var o abi.ToolOutcome
	if err := json.Unmarshal(raw, &o); err != nil {
		return failedOutcome(abi.ClassPluginProtocol, "tool outcome: "+err.Error(), false)
	}
	return loop.Outcome{State: loop.OutcomeDone, Tool: &o}
}

// settle commits the outcome of an attempt under its one settlement
// command ID, in a context detached from any caller.
func (rt *Runtime) settle(run loop.Run, e loop.Effect, key string, o loop.Outcome) {
	ev := loop.Settled(e.ID, e.Attempt, o, 0)
	ctx, cancel := rt.commitCtx()
	defer cancel()
	cmd := loop.SettleCommandID(e.ID, e.Attempt)
	_, err := rt.advance(ctx, advanceReq{
		tenant: run.Tenant, session: run.Session, runID: run.ID, pre: &ev, release: key,
		commandID: func(loop.Run) string { return cmd },
	})
	if err != nil {
		rt.untrack(key)
		if rt.life.Err() == nil {
			rt.log.Error("settlement not committed; the effect stays executing until it is settled again", "assignment_key", key, "err", err)
		}
		return
	}
	rt.settled(key)
}

// pending records the handle of a pending attempt and registers a poll.
func (rt *Runtime) pending(run loop.Run, e loop.Effect, key string, reply abi.EffectReply) {
	ev := loop.Event{Type: loop.EventEffectPending, EffectID: e.ID, Attempt: e.Attempt, Handle: reply.Handle}
	ctx, cancel := rt.commitCtx()
	defer cancel()
	rt.mu.Lock()
	if tr := rt.tracked.get(key); tr != nil {
		// From here on the Watcher owns the attempt; the commit below ends
		// the synchronous call.
		tr.calling, tr.polling = false, true
	}
	rt.mu.Unlock()
	// The poll is registered before the commit, so that by the time anyone
	// learns of the pending record, the Watcher holds it.
	interval := rt.opts.PollMin
	if reply.PollAfterMS > 0 {
		interval = time.Duration(reply.PollAfterMS) * time.Millisecond
	}
	rt.schedulePoll(run, e, key, reply.Handle, interval)
	cmd := "pending/" + key + "/" + reply.Handle
	_, err := rt.advance(ctx, advanceReq{
		tenant: run.Tenant, session: run.Session, runID: run.ID, pre: &ev, release: key,
		commandID: func(loop.Run) string { return cmd },
	})
	if err != nil {
		rt.watcher.Cancel("poll/" + key)
		rt.untrack(key)
		if rt.life.Err() == nil {
			rt.log.Error("pending record not committed", "assignment_key", key, "err", err)
		}
	}
}

func (rt *Runtime) schedulePoll(run loop.Run, e loop.Effect, key, handle string, interval time.Duration) {
	ok := rt.watcher.Schedule(watchItem{
		Key: "poll/" + key, Kind: watchPoll, At: rt.clock.Now().Add(interval),
		Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID, Attempt: e.Attempt,
		Handle: handle, Interval: interval,
	})
	if !ok {
		rt.untrack(key)
	}
}

// abandon forgets an attempt this process will not finish; its record
// stays executing for recovery.
func (rt *Runtime) abandon(run loop.Run, key string) {
	rt.untrack(key)
	rt.mu.Lock()
	rk := runKey(run.Tenant, run.ID)
	rt.busy[rk]--
	if rt.busy[rk] <= 0 {
		delete(rt.busy, rk)
	}
	rt.mu.Unlock()
}

// callCancel asks the executor to stop an attempt and settles it with the
// reply: done settles with its outcome, anything else as cancelled.
func (rt *Runtime) callCancel(t *Tenant, run loop.Run, e loop.Effect) {
	key := assignment(run, e.ID, e.Attempt)
	ctx, cancel := rt.callCtx()
	defer cancel()
	o := loop.Outcome{State: loop.OutcomeCancelled}
	if exec := t.executorFor(e.Kind, e.Tool); exec != nil {
		if call, err := rt.effectCall(ctx, run, e, nil); err == nil {
			rt.stats.ExecutorCalls.Add(1)
			reply, err := exec.Cancel(ctx, call)
			switch {
			case err != nil && rt.life.Err() != nil:
				rt.abandon(run, key)
				return
			case err != nil:
				o.Error = &loop.Failure{Class: abi.ClassCancelled, Message: "cancel failed: " + err.Error()}
			case reply.State == abi.StateDone:
				o = doneOutcome(e.Kind, reply.Outcome)
			}
		}
	}
	rt.settle(run, e, key, o)
}

// onWatcherFire carries out a batch of due items with a bounded number of
// goroutines, not one per item.
func (rt *Runtime) onWatcherFire(batch []watchItem) {
	next := make(chan watchItem)
	workers := min(len(batch), cap(rt.slots))
	for i := 0; i < workers; i++ {
		if !rt.goTracked(func() {
			for it := range next {
				rt.runWatchItem(it)
			}
		}) {
			return
		}
	}
	rt.goTracked(func() {
		defer close(next)
		for _, it := range batch {
			select {
			case next <- it:
			case <-rt.life.Done():
				return
			}
		}
	})
}

// takeWatched turns a due poll or attach item into a running call: it
// reloads the Run and, when the attempt is still executing and this
// process still watches it, marks it as being called. Otherwise it
// forgets the attempt (or tombstones it, when it was settled meanwhile)
// and reports false.
func (rt *Runtime) takeWatched(it watchItem) (*Tenant, loop.Run, loop.Effect, string, bool) {
	key := loop.AssignmentKey{Tenant: it.Tenant, Session: it.Session, EffectID: it.EffectID, Attempt: it.Attempt}.String()
	t, ok := rt.opts.Tenants.Tenant(it.Tenant)
	run, err := rt.store.LoadRun(rt.life, it.Tenant, it.RunID)
	if !ok || err != nil {
		rt.untrack(key)
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	e := run.Effect(it.EffectID)
	if e == nil || e.State != loop.EffectExecuting || e.Attempt != it.Attempt {
		rt.forgetDeferral(key)
		rt.settled(key) // settled meanwhile
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	tr := rt.tracked.get(key)
	if tr == nil || !tr.polling || tr.cancelling {
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	tr.polling, tr.calling = false, true
	rt.busy[runKey(run.Tenant, run.ID)]++
	return t, run, *e, key, true
}

func (rt *Runtime) runWatchItem(it watchItem) {
	switch it.Kind {
	case watchWake:
		ctx, cancel := rt.commitCtx()
		defer cancel()
		ev := loop.Event{Type: loop.EventTimerFired}
		_, err := rt.advance(ctx, advanceReq{tenant: it.Tenant, session: it.Session, runID: it.RunID, pre: &ev,
			commandID: func(r loop.Run) string { return fmt.Sprintf("timer/%s@%d", r.ID, r.Seq) }})
		if err != nil && rt.life.Err() == nil && !errors.Is(err, ErrRunNotFound) {
			rt.log.Warn("timer delivery failed", "run", it.RunID, "err", err)
		}
		rt.kick(it.Tenant, it.Session)
	case watchAttach:
		if t, run, e, key, ok := rt.takeWatched(it); ok {
			rt.recoverEffect(t, run, e, key)
		}
	case watchPoll:
		t, run, e, key, ok := rt.takeWatched(it)
		if !ok {
			return
		}
		if t.executorFor(e.Kind, e.Tool) == nil {
			rt.untrack(key)
			rt.releaseBusy(run)
			return
		}
		rt.mu.Lock()
		tr := rt.tracked.get(key)
		rt.mu.Unlock()
		ctx, cancel := rt.callCtx()
		defer cancel()
		ef := e
		ef.Handle = it.Handle
		call, err := rt.effectCall(ctx, run, ef, nil)
		var reply abi.EffectReply
		if err == nil {
			rt.stats.ExecutorCalls.Add(1)
			reply, err = t.executorFor(ef.Kind, ef.Tool).Poll(ctx, call)
		}
		if err == nil && reply.State == abi.StatePending && reply.Handle == it.Handle {
			// Still pending, same handle: nothing to record; back off.
			rt.mu.Lock()
			tr.calling, tr.polling = false, true
			rt.busy[runKey(run.Tenant, run.ID)]--
			rt.mu.Unlock()
			interval := nextPollInterval(it.Interval, rt.opts.PollMin, rt.opts.PollMax)
			if reply.PollAfterMS > 0 {
				interval = time.Duration(reply.PollAfterMS) * time.Millisecond
			}
			rt.schedulePoll(run, ef, key, it.Handle, interval)
			rt.notifyQuiescent(run)
			return
		}
		rt.onReply(run, ef, key, abi.ExportPoll, reply, err)
	}
}

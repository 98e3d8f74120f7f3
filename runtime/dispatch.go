package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/recovery"
)

// perform carries out what a committed advance obliges, once it is durable
// (write-ahead dispatch): executor calls for the dispatched effects,
// cancels, watcher wake-ups, and the adoption of any executing effect this
// process is not handling yet.
func (rt *Runtime) perform(t *Tenant, run loop.Run, epoch uint64, fx sideEffects) {
	fresh := map[string]bool{}
	for _, d := range fx.dispatched {
		// reserveDispatches reserved these before the commit.
		key := assignment(run, d.effect.ID, d.effect.Attempt)
		fresh[d.effect.ID] = true
		e, req := d.effect, d.request
		rt.launch(key, func(slot *callSlot) { rt.callExecutor(t, run, e, req, abi.ExportStart, slot) })
	}
	cancelling := map[string]bool{}
	for _, a := range fx.cancels {
		cancelling[a.EffectID] = true
		key := assignment(run, a.EffectID, a.Attempt)
		watched, ok := rt.attempts.beginCancel(key)
		if !ok {
			continue
		}
		if watched { // the cancel reply settles it: no poll, no attach
			rt.watcher.Cancel("poll/" + key)
			rt.watcher.Cancel("attach/" + key)
		}
		e := *run.Effect(a.EffectID)
		rt.launch(key, func(slot *callSlot) { rt.callCancel(t, run, e, slot) })
	}
	for _, e := range run.Executing() {
		if fresh[e.ID] || cancelling[e.ID] {
			continue
		}
		// Executing, but this process is neither calling nor watching it:
		// an effect of an earlier incarnation (attach), or of this one
		// whose call was abandoned (call again: executors treat (effect,
		// attempt) as an idempotency key).
		key := assignment(run, e.ID, e.Attempt)
		if !rt.attempts.beginCall(key) {
			continue
		}
		e := e
		switch {
		case e.Epoch != epoch:
			rt.launch(key, func(slot *callSlot) { rt.recoverEffect(t, run, e, key, slot) })
		case e.Handle != "":
			rt.launch(key, func(slot *callSlot) { rt.callExecutor(t, run, e, nil, abi.ExportPoll, slot) })
		default:
			rt.launch(key, func(slot *callSlot) { rt.callExecutor(t, run, e, nil, abi.ExportStart, slot) })
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

// reserveDispatches reserves the attempts a commit is about to dispatch
// (attempts.reserve). A runtime that is stopping still reserves them: the
// commit may carry an outcome that must not be lost, and the dispatches it
// folds in are then left to recovery (launch abandons them).
func (rt *Runtime) reserveDispatches(run loop.Run, fx sideEffects) error {
	for i, d := range fx.dispatched {
		if err := rt.check(rt.attempts.reserve(assignment(run, d.effect.ID, d.effect.Attempt))); err != nil {
			rt.unreserveDispatches(run, sideEffects{dispatched: fx.dispatched[:i]})
			return err
		}
	}
	return nil
}

// unreserveDispatches undoes reserveDispatches when the commit did not
// happen.
func (rt *Runtime) unreserveDispatches(run loop.Run, fx sideEffects) {
	for _, d := range fx.dispatched {
		rt.check(rt.attempts.unreserve(assignment(run, d.effect.ID, d.effect.Attempt)))
	}
}

// launch runs a call on an attempt the caller holds as tracked work; if
// the runtime is stopping, the call is abandoned: the record stays
// executing for recovery.
//
// The executor calls in flight are bounded (Options.MaxCallsInFlight):
// launch waits for a free call slot before it starts the goroutine, so
// the caller (an advance, holding its Run's lock, on a driver's slot or an
// executor call's goroutine) waits too, and a restart that finds 50,000
// effects in flight starts the calls as slots free up instead of 50,000
// goroutines queueing in the plugins' pools. The call gives its slot
// back as soon as the executor answers (callSlot.free), before it commits
// the answer: a goroutine holding a slot never waits for a Run's lock, so
// a launcher waiting for a slot under its Run's lock cannot deadlock with
// it.
func (rt *Runtime) launch(key string, f func(slot *callSlot)) {
	select {
	case rt.calls <- struct{}{}:
	case <-rt.life.Done():
		rt.abandon(key)
		return
	}
	slot := &callSlot{calls: rt.calls}
	if !rt.goTracked(func() {
		defer slot.free()
		f(slot)
	}) {
		slot.free()
		rt.abandon(key)
	}
}

// callSlot is one launched call's slot among Options.MaxCallsInFlight.
type callSlot struct {
	once  sync.Once
	calls chan struct{}
}

// free gives the slot back, once; a nil slot (a call the Watcher's
// bounded workers make) has none.
func (s *callSlot) free() {
	if s != nil {
		s.once.Do(func() { <-s.calls })
	}
}

// abandon gives up the caller's hold on an attempt without an answer.
func (rt *Runtime) abandon(key string) { rt.check(rt.attempts.abandon(key)) }

// backToWatcher hands a called attempt back to the watcher and gives up
// the hold of the call, which concluded with nothing to commit (a poll
// still pending, a deferred attach). It reports false when there is
// nothing to watch: other work settles the attempt (a cancel), or the
// bookkeeping refused.
func (rt *Runtime) backToWatcher(key string) bool {
	watched, err := rt.attempts.watch(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return false
	}
	rt.check(rt.attempts.release(key))
	return watched
}

// check logs a bookkeeping error (which panics first under the invariants
// build tag) and returns it.
func (rt *Runtime) check(err error) error {
	if err != nil {
		rt.log.Error("runtime bookkeeping error; please report it", "err", err)
	}
	return err
}

// forgetRun drops the bookkeeping of a Run that has ended.
func (rt *Runtime) forgetRun(run loop.Run) {
	rt.attempts.forgetRun(runPrefixOf(run.Tenant, run.Session, run.ID))
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

// callExecutor calls the executor's start, poll or attach export (export)
// for an effect attempt the caller holds, and acts on the reply.
func (rt *Runtime) callExecutor(t *Tenant, run loop.Run, e loop.Effect, request json.RawMessage, export string, slot *callSlot) {
	key := assignment(run, e.ID, e.Attempt)
	exec := t.executorFor(e.Kind, e.Tool)
	ctx, cancel := rt.callCtx(exec)
	defer cancel()
	if exec == nil {
		slot.free()
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, "no executor is configured for "+effectTarget(e), true),
			fmt.Errorf("runtime: the tenant has no executor for %s %q", e.Kind, e.Tool))
		return
	}
	call, err := rt.effectCall(ctx, run, e, request)
	if err != nil {
		slot.free()
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, "the request for "+effectSubject(e)+" could not be prepared", true), err)
		return
	}
	if rt.halted.Load() {
		// The runtime gave its lease up (or was halted) after this call
		// was let through: it starts, polls and attaches nothing more.
		// The record stays executing, for recovery.
		slot.free()
		rt.abandon(key)
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
	slot.free()
	rt.onReply(run, e, key, export, reply, err)
}

// onReply turns an executor reply into a settlement, a pending record and
// a poll, or nothing (when the runtime is stopping, recovery owns it).
func (rt *Runtime) onReply(run loop.Run, e loop.Effect, key, export string, reply abi.EffectReply, err error) {
	if err != nil {
		if rt.life.Err() != nil {
			rt.abandon(key) // stopping: the record stays for recovery
			return
		}
		if !errors.As(err, new(*PluginError)) {
			// The executor could not be reached, or did not answer within
			// CallTimeout: whether the work began is unknown. The attempt
			// is handled as recovery handles an attach that finds the
			// executor unavailable: attach is asked again, with a backoff,
			// until max_defer has passed, and then the missing-effect
			// policy applies. Failing it at once would let a retry run
			// work that may already be running.
			rt.stats.UnavailableErrors.Add(1)
			rt.actOnAttach(run, e, key, recovery.AttachState{Kind: recovery.AttachUnavailable, Reason: export + ": " + err.Error()})
			return
		}
		rt.settleFailed(run, e, key, loop.Outcome{State: loop.OutcomeFailed, Error: callFailure(effectSubject(e), err)}, err)
		return
	}
	switch reply.State {
	case abi.StateDone:
		o, err := decodeOutcome(e.Kind, reply.Outcome)
		if err != nil {
			rt.settleFailed(run, e, key, o, fmt.Errorf("%s: %w", export, err))
			return
		}
		rt.commitSettlement(run, e, key, o)
	case abi.StateFailed:
		msg, retriable := "the executor reported failure", false
		if reply.Error != nil {
			msg, retriable = reply.Error.Message, reply.Error.Retriable
		}
		o := failedOutcome(abi.ClassPluginFailed, msg, retriable)
		if o.Error.Message != msg {
			// Cut to MaxPluginMessageBytes: the log keeps it whole.
			rt.logEffectFailure(run, key, o.Error, fmt.Errorf("%s: the executor replied failed: %s", export, msg))
		}
		rt.commitSettlement(run, e, key, o)
	case abi.StateUnknown:
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassLost, effectSubject(e)+" holds no record of the attempt", true),
			fmt.Errorf("%s answered unknown", export))
	case abi.StatePending:
		rt.recordPending(run, e, key, reply)
	default:
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassPluginProtocol, "the reply of "+effectSubject(e)+" broke the plugin ABI", false),
			fmt.Errorf("%s answered state %q", export, reply.State))
	}
}

// settleFailed commits a failed outcome of an attempt the caller holds,
// as commitSettlement does, once the server's log has the detail behind
// it (logEffectFailure).
func (rt *Runtime) settleFailed(run loop.Run, e loop.Effect, key string, o loop.Outcome, detail error) {
	if o.Error != nil {
		rt.logEffectFailure(run, key, o.Error, detail)
	}
	rt.commitSettlement(run, e, key, o)
}

// failedOutcome is a failed outcome of class with msg, which is cut to
// MaxPluginMessageBytes: a plugin's own words may be long.
func failedOutcome(class abi.ErrorClass, msg string, retriable bool) loop.Outcome {
	return loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: class, Message: pluginText(msg), Retriable: retriable}}
}

// doneOutcome decodes the outcome payload of a done reply; a payload that
// does not decode is a protocol failure of the plugin (decodeOutcome).
func doneOutcome(kind abi.EffectKind, raw json.RawMessage) loop.Outcome {
	o, _ := decodeOutcome(kind, raw)
	return o
}

// decodeOutcome decodes the outcome payload of a done reply. A payload
// that does not decode gives a failed outcome of class plugin_protocol,
// in the runtime's words, and the decoder's error for the log.
func decodeOutcome(kind abi.EffectKind, raw json.RawMessage) (loop.Outcome, error) {
	if kind == abi.KindModel {
		var m abi.ModelOutcome
		if err := json.Unmarshal(raw, &m); err != nil {
			return failedOutcome(abi.ClassPluginProtocol, "the outcome of the model executor does not decode", false), fmt.Errorf("model outcome: %w", err)
		}
		return loop.Outcome{State: loop.OutcomeDone, Model: &m}, nil
	}
	var o abi.ToolOutcome
	if err := json.Unmarshal(raw, &o); err != nil {
		return failedOutcome(abi.ClassPluginProtocol, "the outcome of the tool's executor does not decode", false), fmt.Errorf("tool outcome: %w", err)
	}
	return loop.Outcome{State: loop.OutcomeDone, Tool: &o}, nil
}

// commitSettlement commits the outcome of an attempt the caller holds,
// under its one settlement command ID, in a context detached from any
// caller, and retries the commit until it is durable (commitOutcome). The
// attempt stays held meanwhile: no advance adopts it and calls it again.
func (rt *Runtime) commitSettlement(run loop.Run, e loop.Effect, key string, o loop.Outcome) {
	ok, err := rt.attempts.settling(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return
	}
	if !ok { // settled already, through another call or a cancel
		rt.stats.DroppedOutcomes.Add(1)
		rt.check(rt.attempts.settledDurably(key, false))
		return
	}
	ev := loop.Settled(e.ID, e.Attempt, o, 0)
	cmd := loop.SettleCommandID(e.ID, e.Attempt)
	// Queued, so that an advance of the Run that commits another
	// settlement meanwhile takes this one along (settleQueue).
	qs := &queuedSettle{ev: ev, cmd: cmd, key: key}
	rk := runKey(run.Tenant, run.ID)
	rt.settles.add(rk, qs)
	defer rt.settles.remove(rk, qs)
	rt.commitOutcome(key, "settlement", advanceReq{
		tenant: run.Tenant, session: run.Session, runID: run.ID, pre: &ev, outcomeOf: key, queued: qs,
		commandID: func(loop.Run) string { return cmd },
		onDurable: func(cur loop.Run) { rt.check(rt.attempts.settledDurably(key, cur.Status.Terminal())) },
	})
}

// recordPending records the handle of a pending attempt the caller holds,
// and hands the attempt to the watcher for its polls.
func (rt *Runtime) recordPending(run loop.Run, e loop.Effect, key string, reply abi.EffectReply) {
	ev := loop.Event{Type: loop.EventEffectPending, EffectID: e.ID, Attempt: e.Attempt, Handle: reply.Handle}
	// The attempt is watched, and its poll registered, before the commit,
	// so that by the time anyone learns of the pending record the watcher
	// holds it. The call's hold stays until the record is durable.
	watched, err := rt.attempts.watch(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return
	}
	if !watched { // a cancel runs on it, and its reply settles it
		rt.check(rt.attempts.release(key))
		return
	}
	interval := rt.opts.PollMin
	if reply.PollAfterMS > 0 {
		interval = time.Duration(reply.PollAfterMS) * time.Millisecond
	}
	polled := rt.schedulePoll(run, e, key, reply.Handle, interval)
	cmd := "pending/" + key + "/" + reply.Handle
	committed := rt.commitOutcome(key, "pending record", advanceReq{
		tenant: run.Tenant, session: run.Session, runID: run.ID, pre: &ev, outcomeOf: key,
		commandID: func(loop.Run) string { return cmd },
		onDurable: func(loop.Run) { rt.check(rt.attempts.release(key)) },
	})
	if !committed {
		rt.watcher.Cancel("poll/" + key)
	}
	if !polled || !committed {
		rt.attempts.forget(key) // the runtime is stopping: recovery attaches
	}
}

// commitOutcome runs the advance that commits news of an attempt (a
// settlement, a pending record) the caller holds, and retries it, with
// the same command ID and a backoff on the Clock, for as long as the
// store fails: the store applies a command ID once, so a commit whose
// acknowledgement was lost is answered as a duplicate. It never calls the
// executor again. It gives up, abandoning the caller's hold (the record
// stays executing, for recovery), when the session has another owner, the
// Run is gone, or the runtime's life ends. It reports whether the news is
// durable (req.onDurable ran).
//
// The Loop refusing the news as an unknown effect means the Run it was
// applied to does not know an effect this runtime dispatched from a
// committed snapshot: that snapshot was older than the committed one (a
// store that answered a stale version), so the advance, which loads the
// Run afresh, is tried again, up to unknownEffectReloads times, before
// the effect is taken to be truly unknown.
func (rt *Runtime) commitOutcome(key, what string, req advanceReq) bool {
	backoff := commitRetryMin
	reloads := 0
	for {
		ctx, cancel := rt.commitCtx()
		cur, err := rt.advance(ctx, req)
		cancel()
		if err == nil {
			if reloads > 0 {
				rt.log.Warn(what+" committed once the Run was loaded again: a load had answered a version that did not know the effect",
					"assignment_key", key, "reloads", reloads)
			}
			return true
		}
		unknown := errors.Is(err, loop.ErrUnknownEffect)
		retry := errors.Is(err, errStoreFailed) || (unknown && reloads < unknownEffectReloads)
		if !retry || rt.life.Err() != nil || rt.halted.Load() {
			switch {
			case rt.life.Err() != nil || errors.Is(err, ErrFenced) || errors.Is(err, ErrSessionOwned) || errors.Is(err, ErrNodeExpired):
			case unknown:
				rt.log.Error(what+" refused as an unknown effect, by every load of the Run; the effect stays executing for recovery",
					"assignment_key", key, "reloads", reloads, "run_seq", cur.Seq, "err", err)
			default:
				rt.log.Error(what+" not committed; the effect stays executing for recovery", "assignment_key", key, "err", err)
			}
			rt.abandon(key)
			return false
		}
		if unknown {
			reloads++
			rt.log.Warn(what+" refused as an unknown effect by the Run as loaded, which may be an older version than the committed one; loading it again",
				"assignment_key", key, "run_seq", cur.Seq, "reload", reloads, "of", unknownEffectReloads, "retry_in", backoff, "err", err)
		} else {
			rt.log.Warn(what+" not committed; retrying under the same command ID", "assignment_key", key, "retry_in", backoff, "err", err)
		}
		if !rt.sleep(backoff) {
			rt.abandon(key)
			return false
		}
		backoff = min(2*backoff, commitRetryMax)
	}
}

// The backoff between retries of a commit that the store failed.
const (
	commitRetryMin = 50 * time.Millisecond
	commitRetryMax = 5 * time.Second
)

// unknownEffectReloads bounds the loads of a Run, after the first, that
// may refuse an outcome as an unknown effect before commitOutcome takes
// the effect to be truly unknown.
const unknownEffectReloads = 3

// sleep waits d on the runtime's Clock; false when the runtime's life
// ended first.
func (rt *Runtime) sleep(d time.Duration) bool {
	done := make(chan struct{})
	tm := rt.clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return true
	case <-rt.life.Done():
		tm.Stop()
		return false
	}
}

// schedulePoll registers the next poll of a watched attempt; false when
// the watcher is stopped.
func (rt *Runtime) schedulePoll(run loop.Run, e loop.Effect, key, handle string, interval time.Duration) bool {
	return rt.watcher.Schedule(watchItem{
		Key: "poll/" + key, Kind: watchPoll, At: rt.clock.Now().Add(interval),
		Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID, Attempt: e.Attempt,
		Handle: handle, Interval: interval,
	})
}

// callCancel asks the executor to stop an attempt and settles it with the
// reply: done settles with its outcome, anything else as cancelled.
func (rt *Runtime) callCancel(t *Tenant, run loop.Run, e loop.Effect, slot *callSlot) {
	key := assignment(run, e.ID, e.Attempt)
	exec := t.executorFor(e.Kind, e.Tool)
	ctx, cancel := rt.callCtx(exec)
	defer cancel()
	o := loop.Outcome{State: loop.OutcomeCancelled}
	if exec != nil {
		if call, err := rt.effectCall(ctx, run, e, nil); err == nil {
			rt.stats.ExecutorCalls.Add(1)
			reply, err := exec.Cancel(ctx, call)
			slot.free()
			switch {
			case err != nil && rt.life.Err() != nil:
				rt.abandon(key)
				return
			case err != nil:
				o.Error = &loop.Failure{Class: abi.ClassCancelled, Message: "the call was cancelled; " + effectSubject(e) + " did not confirm the cancel"}
				rt.logEffectFailure(run, key, o.Error, fmt.Errorf("cancel: %w", err))
			case reply.State == abi.StateDone:
				var derr error
				if o, derr = decodeOutcome(e.Kind, reply.Outcome); derr != nil {
					rt.logEffectFailure(run, key, o.Error, fmt.Errorf("cancel: %w", derr))
				}
			}
		}
	}
	slot.free()
	rt.commitSettlement(run, e, key, o)
}

// onWatcherFire carries out a batch of due items with a bounded number of
// goroutines, not one per item. The workers take the items in turn from
// the batch itself: no goroutine hands them out, so a Stop that refuses
// the rest of the workers leaves none waiting (the items not carried out
// are polls, attaches and wake-ups, which recovery and the next process's
// drivers redo).
func (rt *Runtime) onWatcherFire(batch []watchItem) {
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
	for i := range min(len(batch), cap(rt.slots)) {
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
func (rt *Runtime) takeWatched(it watchItem) (*Tenant, loop.Run, loop.Effect, string, bool) {
	key := loop.AssignmentKey{Tenant: it.Tenant, Session: it.Session, EffectID: it.EffectID, Attempt: it.Attempt}.String()
	t, ok := rt.opts.Tenants.Tenant(it.Tenant)
	run, err := rt.store.LoadRun(rt.life, it.Tenant, it.RunID)
	if !ok || errors.Is(err, ErrRunNotFound) {
		rt.attempts.forget(key)
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
				rt.attempts.forget(key)
			}
		}
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	e := run.Effect(it.EffectID)
	if e == nil || e.State != loop.EffectExecuting || e.Attempt != it.Attempt {
		rt.attempts.markSettled(key) // settled meanwhile
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
	if !rt.attempts.takeWatched(key) {
		return nil, loop.Run{}, loop.Effect{}, key, false
	}
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
			rt.recoverEffect(t, run, e, key, nil)
		}
	case watchPoll:
		t, run, e, key, ok := rt.takeWatched(it)
		if !ok {
			return
		}
		exec := t.executorFor(e.Kind, e.Tool)
		if exec == nil {
			rt.abandon(key)
			return
		}
		ctx, cancel := rt.callCtx(exec)
		defer cancel()
		ef := e
		ef.Handle = it.Handle
		call, err := rt.effectCall(ctx, run, ef, nil)
		var reply abi.EffectReply
		if err == nil {
			rt.stats.ExecutorCalls.Add(1)
			reply, err = exec.Poll(ctx, call)
		}
		if err == nil && reply.State == abi.StatePending && reply.Handle == it.Handle {
			// Still pending, same handle: nothing to record; back off.
			if !rt.backToWatcher(key) {
				return
			}
			interval := nextPollInterval(it.Interval, rt.opts.PollMin, rt.opts.PollMax)
			if reply.PollAfterMS > 0 {
				interval = time.Duration(reply.PollAfterMS) * time.Millisecond
			}
			if !rt.schedulePoll(run, ef, key, it.Handle, interval) {
				rt.attempts.forget(key)
			}
			rt.notifyQuiescent(run)
			return
		}
		rt.onReply(run, ef, key, abi.ExportPoll, reply, err)
	}
}

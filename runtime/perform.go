package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/agenthost/agenthost/internal/budget"
	"strconv"
	"sync"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime/internal/attempts"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// Performing calls: what a committed advance obliges (perform), the
// executor calls it launches, bounded by Options.MaxCallsInFlight
// (launch), and the attempt bookkeeping around them.

// perform carries out what a committed advance obliges, once it is durable
// (write-ahead dispatch): executor calls for the dispatched effects,
// cancels, watcher wake-ups, and the adoption of any executing effect this
// process is not handling yet.
//
// from is the call slot of the executor call whose answer the advance
// committed, when one did (nil otherwise): its goroutine runs the first
// of these calls once it is done (launch), instead of starting another.
func (rt *Runtime) perform(t *Tenant, run loop.Run, epoch uint64, fx sideEffects, from *callSlot) {
	fresh := map[string]bool{}
	for _, d := range fx.dispatched {
		// reserveDispatches reserved these before the commit.
		key := assignment(run, d.effect.ID, d.effect.Attempt)
		fresh[d.effect.ID] = true
		e, req := d.effect, d.request
		rt.launch(from, key, func(slot *callSlot) { rt.callExecutor(t, run, e, req, abi.ExportStart, slot) })
	}
	cancelling := map[string]bool{}
	for _, a := range fx.cancels {
		cancelling[a.EffectID] = true
		key := assignment(run, a.EffectID, a.Attempt)
		watched, ok := rt.attempts.BeginCancel(key)
		if !ok {
			continue
		}
		if watched { // the cancel reply settles it: no poll, no attach
			rt.watcher.Cancel("poll/" + key)
			rt.watcher.Cancel("attach/" + key)
			rt.watcher.Cancel("budget/" + key)
			rt.forgetBudgetWait(run.Tenant, key)
		}
		e := *run.Effect(a.EffectID)
		rt.launch(from, key, func(slot *callSlot) { rt.callCancel(t, run, e, slot) })
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
		if !rt.attempts.BeginCall(key) {
			continue
		}
		e := e
		switch {
		case e.Epoch != epoch:
			rt.launch(from, key, func(slot *callSlot) { rt.recoverEffect(t, run, e, key, slot) })
		case e.Handle != "":
			rt.launch(from, key, func(slot *callSlot) { rt.callExecutor(t, run, e, nil, abi.ExportPoll, slot) })
		default:
			rt.launch(from, key, func(slot *callSlot) { rt.callExecutor(t, run, e, nil, abi.ExportStart, slot) })
		}
	}
	for _, a := range fx.wakes {
		rt.watcher.Schedule(watcher.Item{
			Key: "wake/" + run.Tenant + "/" + run.ID + "/" + strconv.FormatInt(a.At, 10), Kind: watcher.Wake,
			At: time.UnixMilli(a.At), Tenant: run.Tenant, Session: run.Session, RunID: run.ID,
		})
	}
}

func assignment(run loop.Run, effectID string, attempt int) string {
	return loop.AssignmentKey{Tenant: run.Tenant, Session: run.Session, EffectID: effectID, Attempt: attempt}.String()
}

// reserveDispatches reserves the attempts a commit is about to dispatch
// (attempts.Table.Reserve). A runtime that is stopping still reserves them: the
// commit may carry an outcome that must not be lost, and the dispatches it
// folds in are then left to recovery (launch abandons them).
func (rt *Runtime) reserveDispatches(run loop.Run, fx sideEffects) error {
	for i, d := range fx.dispatched {
		if err := rt.check(rt.attempts.Reserve(assignment(run, d.effect.ID, d.effect.Attempt))); err != nil {
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
		rt.check(rt.attempts.Unreserve(assignment(run, d.effect.ID, d.effect.Attempt)))
	}
}

// launch runs a call on an attempt the caller holds as tracked work; if
// the runtime is stopping, the call is abandoned: the record stays
// executing for recovery.
//
// A call launched from an executor call's goroutine (from, that call's
// slot) is handed to that goroutine, if it has none yet, to run once
// the call it is making is done (runCalls): a Run's next call goes on the
// goroutine that committed the answer obliging it, without waking
// another. The other calls each start a goroutine of their own.
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
// it. A call handed to a goroutine takes its slot there, once that
// goroutine holds no lock.
func (rt *Runtime) launch(from *callSlot, key string, f func(slot *callSlot)) {
	if from.handOver(key, f) {
		return
	}
	slot, ok := rt.takeSlot(key)
	if ok && !rt.goTracked(func() { rt.runCalls(slot, f) }) {
		slot.free()
		rt.abandon(key)
	}
}

// takeSlot waits for a free call slot for a call on the attempt keyed
// key; if the runtime's life ends first, it abandons the attempt, for
// recovery, and reports false.
func (rt *Runtime) takeSlot(key string) (*callSlot, bool) {
	select {
	case rt.calls <- struct{}{}:
		return &callSlot{calls: rt.calls}, true
	case <-rt.life.Done():
		rt.abandon(key)
		return nil, false
	}
}

// runCalls runs f on slot, then, in turn, each call handed to the slot
// it ran on (callSlot.handOver), each on a slot of its own: once a call
// slot is free, unless the runtime is stopping (as goTracked would
// refuse to start it); then the attempt is abandoned, for recovery.
func (rt *Runtime) runCalls(slot *callSlot, f func(slot *callSlot)) {
	for {
		f(slot)
		slot.free()
		if slot.next == nil {
			return
		}
		f = slot.next
		key := slot.nextKey
		var ok bool
		if slot, ok = rt.takeSlot(key); !ok {
			return
		}
		if !rt.mayStart() {
			slot.free()
			rt.abandon(key)
			return
		}
	}
}

// callSlot is one launched call's slot among Options.MaxCallsInFlight,
// and the call its goroutine makes next, if one was handed to it.
type callSlot struct {
	once  sync.Once
	calls chan struct{}
	// next, on an attempt keyed nextKey, is the call handed to the slot's
	// goroutine (handOver), which only that goroutine reads and writes.
	next    func(slot *callSlot)
	nextKey string
}

// free gives the slot back, once; a nil slot (a call the Watcher's
// bounded workers make) has none.
func (s *callSlot) free() {
	if s != nil {
		s.once.Do(func() { <-s.calls })
	}
}

// handOver gives f, a call on the attempt keyed key, to the slot's
// goroutine to make next, and reports whether it took it: a nil slot
// has no goroutine to take it, and a goroutine takes one.
func (s *callSlot) handOver(key string, f func(slot *callSlot)) bool {
	if s == nil || s.next != nil {
		return false
	}
	s.next, s.nextKey = f, key
	return true
}

// abandon gives up the caller's hold on an attempt without an answer.
func (rt *Runtime) abandon(key string) { rt.check(rt.attempts.Abandon(key)) }

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
	rt.attempts.ForgetRun(attempts.RunPrefixOf(run.Tenant, run.Session, run.ID))
	rt.owned.Forget(sessionKey(run.Tenant, run.Session), run.ID)
}

// effectCall builds the input of an executor call.
func (rt *Runtime) effectCall(ctx context.Context, run loop.Run, e loop.Effect, request json.RawMessage) (EffectCall, error) {
	in := abi.EffectInput{ABI: abi.Version, Handle: e.Handle, Effect: abi.Effect{
		ID: e.ID, AssignmentKey: assignment(run, e.ID, e.Attempt), Attempt: e.Attempt, Kind: e.Kind,
		// When the Run fails if it works on without waiting: an effect
		// executes only while the Run does not wait (loop.Run.Deadline).
		DeadlineMS: run.Deadline(),
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
	call := EffectCall{Tenant: run.Tenant, Session: run.Session, RunID: run.ID, Input: in, Plugin: e.Plugin}
	if e.DispatchedAt > 0 {
		call.DispatchedAt = time.UnixMilli(e.DispatchedAt)
	}
	return call, nil
}

// callExecutor calls the executor's start, poll or attach export (export)
// for an effect attempt the caller holds, and acts on the reply.
func (rt *Runtime) callExecutor(t *Tenant, run loop.Run, e loop.Effect, request json.RawMessage, export string, slot *callSlot) {
	key := assignment(run, e.ID, e.Attempt)
	exec := rt.executorFor(t, &run, &e)
	ctx, cancel := rt.callCtx(exec)
	defer cancel()
	if exec == nil {
		slot.free()
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, "no executor is configured for "+effectTarget(e), true),
			fmt.Errorf("runtime: the tenant has no executor for %s %q", e.Kind, e.Tool), slot)
		return
	}
	call, err := rt.effectCall(ctx, run, e, request)
	if err != nil {
		slot.free()
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassExecutorUnavailable, "the request for "+effectSubject(e)+" could not be prepared", true), err, slot)
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
	var spent *budget.Budget
	if export == abi.ExportStart && e.Kind == abi.KindModel {
		// A model call waits for its endpoint's budget in the Watcher,
		// giving its slot back; its timeout runs from its start.
		b, ok := rt.admitModelCall(ctx, t, run, e, key, slot)
		if !ok {
			return
		}
		if spent = b; b != nil {
			cancel()
			ctx, cancel = rt.callCtx(exec)
			defer cancel()
		}
	}
	rt.stats.ExecutorCalls.Add(1)
	ctx = WithCapacityWaitReport(ctx, rt.instanceWaits.report(key, rt.clock))
	ctx, span := startEffectSpan(ctx, &run, &e, export, exec, &call)
	var reply abi.EffectReply
	switch export {
	case abi.ExportPoll:
		reply, err = exec.Poll(ctx, call)
	case abi.ExportAttach:
		reply, err = exec.Attach(ctx, call)
	default:
		reply, err = exec.Start(ctx, call)
	}
	endEffectSpan(span, &e, reply, err)
	slot.free()
	rt.modelCallDone(spent, reply, err)
	rt.onReply(run, e, key, export, reply, err, slot)
}

// callCancel asks the executor to stop an attempt and settles it with the
// reply: done settles with its outcome, anything else as cancelled.
func (rt *Runtime) callCancel(t *Tenant, run loop.Run, e loop.Effect, slot *callSlot) {
	key := assignment(run, e.ID, e.Attempt)
	exec := rt.executorFor(t, &run, &e)
	ctx, cancel := rt.callCtx(exec)
	defer cancel()
	o := loop.Outcome{State: loop.OutcomeCancelled}
	if exec != nil {
		if call, err := rt.effectCall(ctx, run, e, nil); err == nil {
			rt.stats.ExecutorCalls.Add(1)
			sctx, span := startEffectSpan(ctx, &run, &e, abi.ExportCancel, exec, &call)
			reply, err := exec.Cancel(sctx, call)
			EndSpan(span, err)
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
	rt.commitSettlement(run, e, key, o, slot)
}

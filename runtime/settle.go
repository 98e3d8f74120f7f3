package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/recovery"
	"github.com/agenthost/agenthost/runtime/internal/settlequeue"
)

// Settling replies: an executor's reply turned into a settlement or a
// pending record (onReply), and the commit of that news under its one
// command ID, retried while the store fails (commitOutcome).

// onReply turns an executor reply into a settlement, a pending record and
// a poll, or nothing (when the runtime is stopping, recovery owns it).
// slot is the call's (nil for a watcher worker's): the first call the
// news obliges is handed to its goroutine (launch). settleFailed,
// commitSettlement, recordPending and actOnAttach pass it on alike.
func (rt *Runtime) onReply(run loop.Run, e loop.Effect, key, export string, reply abi.EffectReply, err error, slot *callSlot) {
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
			rt.actOnAttach(run, e, key, recovery.AttachState{Kind: recovery.AttachUnavailable, Reason: export + ": " + err.Error()}, slot)
			return
		}
		rt.settleFailed(run, e, key, loop.Outcome{State: loop.OutcomeFailed, Error: callFailure(effectSubject(e), err)}, err, slot)
		return
	}
	switch reply.State {
	case abi.StateDone:
		o, err := decodeOutcome(e.Kind, reply.Outcome)
		if err != nil {
			rt.settleFailed(run, e, key, o, fmt.Errorf("%s: %w", export, err), slot)
			return
		}
		rt.commitSettlement(run, e, key, o, slot)
	case abi.StateFailed:
		o := failedReplyOutcome(reply.Error)
		if reply.Error != nil && o.Error.Message != reply.Error.Message {
			// Cut to MaxPluginMessageBytes: the log keeps it whole.
			rt.logEffectFailure(run, key, o.Error, fmt.Errorf("%s: the executor replied failed: %s", export, reply.Error.Message))
		}
		rt.commitSettlement(run, e, key, o, slot)
	case abi.StateUnknown:
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassLost, effectSubject(e)+" holds no record of the attempt", true),
			fmt.Errorf("%s answered unknown", export), slot)
	case abi.StatePending:
		rt.recordPending(run, e, key, reply, slot)
	default:
		rt.settleFailed(run, e, key, failedOutcome(abi.ClassPluginProtocol, "the reply of "+effectSubject(e)+" broke the plugin ABI", false),
			fmt.Errorf("%s answered state %q", export, reply.State), slot)
	}
}

// settleFailed commits a failed outcome of an attempt the caller holds,
// as commitSettlement does, once the server's log has the detail behind
// it (logEffectFailure).
func (rt *Runtime) settleFailed(run loop.Run, e loop.Effect, key string, o loop.Outcome, detail error, slot *callSlot) {
	if o.Error != nil {
		rt.logEffectFailure(run, key, o.Error, detail)
	}
	rt.commitSettlement(run, e, key, o, slot)
}

// failedOutcome is a failed outcome of class with msg, which is cut to
// MaxPluginMessageBytes: a plugin's own words may be long.
func failedOutcome(class abi.ErrorClass, msg string, retriable bool) loop.Outcome {
	return loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: class, Message: pluginText(msg), Retriable: retriable}}
}

// failedReplyOutcome is the outcome of a failed reply with error re (nil
// when the reply had none): of the class the error names, when the host
// takes it from a plugin (abi.ReplyError.HostClass: rate_limited), else
// plugin_failed; retriable as the error says, and always when it is
// rate_limited; with the plugin's words cut to MaxPluginMessageBytes, and
// the wait it asked for when the failure is retriable.
func failedReplyOutcome(re *abi.ReplyError) loop.Outcome {
	if re == nil {
		return failedOutcome(abi.ClassPluginFailed, "the executor reported failure", false)
	}
	o := failedOutcome(re.HostClass(), re.Message, re.HostRetriable())
	if o.Error.Retriable {
		o.Error.RetryAfterMS = max(re.RetryAfterMS, 0)
	}
	return o
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
func (rt *Runtime) commitSettlement(run loop.Run, e loop.Effect, key string, o loop.Outcome, slot *callSlot) {
	ok, err := rt.attempts.Settling(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return
	}
	if !ok { // settled already, through another call or a cancel
		rt.stats.DroppedOutcomes.Add(1)
		rt.check(rt.attempts.SettledDurably(key, false))
		return
	}
	ev := loop.Settled(e.ID, e.Attempt, o, 0)
	ev.Plugin = takenOver(&run, e)
	cmd := loop.SettleCommandID(e.ID, e.Attempt)
	// Queued, so that an advance of the Run that commits another
	// settlement meanwhile takes this one along (settlequeue).
	qs := &settlequeue.Entry{Event: ev, CommandID: cmd, Key: key}
	rk := runKey(run.Tenant, run.ID)
	rt.settles.Add(rk, qs)
	defer rt.settles.Remove(rk, qs)
	req := settleOutcome(run, qs, func(cur loop.Run) {
		rt.check(rt.attempts.SettledDurably(key, cur.Status.Terminal()))
	})
	req.from = slot
	rt.commitOutcome(key, "settlement", req)
}

// recordPending records the handle of a pending attempt the caller holds,
// and hands the attempt to the watcher for its polls.
func (rt *Runtime) recordPending(run loop.Run, e loop.Effect, key string, reply abi.EffectReply, slot *callSlot) {
	// The attempt is watched, and its poll registered, before the commit,
	// so that by the time anyone learns of the pending record the watcher
	// holds it. The call's hold stays until the record is durable.
	watched, err := rt.attempts.Watch(key)
	if rt.check(err) != nil {
		rt.abandon(key)
		return
	}
	if !watched { // a cancel runs on it, and its reply settles it
		rt.check(rt.attempts.Release(key))
		return
	}
	interval := rt.opts.PollMin
	if reply.PollAfterMS > 0 {
		interval = time.Duration(reply.PollAfterMS) * time.Millisecond
	}
	polled := rt.schedulePoll(run, e, key, reply.Handle, interval)
	req := pendingHandle(run, e, key, reply.Handle, func(loop.Run) {
		rt.check(rt.attempts.Release(key))
	})
	req.from = slot
	committed := rt.commitOutcome(key, "pending record", req)
	if !committed {
		rt.watcher.Cancel("poll/" + key)
	}
	if !polled || !committed {
		rt.attempts.Forget(key) // the runtime is stopping: recovery attaches
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

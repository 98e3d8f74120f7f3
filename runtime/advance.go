package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	goruntime "runtime"
	"time"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime/internal/attempts"
	"github.com/agenthost/agenthost/runtime/internal/settlequeue"
)

// advanceReq asks for one advance of a Run: apply pre (if any), then fold
// every action that needs no outside answer into the same commit. Every
// advanceReq is made by one of the constructors below, which says what
// prompts it (its kind); what the advance may do with it follows from the
// kind (mayStart, fromExecutor, fromOutside).
type advanceReq struct {
	kind                   advanceKind
	tenant, session, runID string
	// epoch is the session epoch to fence with; 0 means claim it.
	epoch uint64
	// pre is the event that prompted the advance: a settlement, an
	// approval, an input, a timer. Its At is set when it is applied. The
	// advance drops it (nil) once it is on record, or stale, and goes on
	// as after a duplicate commit.
	pre *loop.Event
	// commandID derives the commit's command ID from the snapshot it
	// applies to; nil means "advance/<run>@<seq>".
	commandID func(loop.Run) string
	// outcomeOf names the assignment key of the attempt whose news (pre)
	// this advance commits, for the log of a dropped outcome.
	outcomeOf string
	// onDurable runs once pre is durable, or dropped as stale (the attempt
	// was settled before, the Run has ended), with the Run as it then
	// stands: before the Run's lock is released and its waiters are told.
	onDurable func(cur loop.Run)
	// queued is pre's entry in the settlement queue when pre is a
	// settlement: another advance of the Run may commit it with its own
	// (settlequeue), and this one then advances without it; and this one
	// takes the other settlements queued for the Run along.
	queued *settlequeue.Entry
	// input qualifies an input from outside (IfSeq); what names it.
	input inputOptions
	what  string
	// seen is the Run as the caller has just read it from the store (the
	// driver's read of the session's active Runs), which the advance's
	// first attempt takes instead of reading it again: a guess that its
	// commit checks, as a snapshot of rt.owned is (guessRun).
	seen *loop.Run
	// firstOfSession says the Run is its session's first, created with
	// this advance as its first step (firstStep): no Run precedes it, so
	// its builder's history is empty, and it is not read.
	firstOfSession bool
	// from is the slot of the executor call whose answer this advance
	// commits, on that call's goroutine: perform hands it a call to make
	// next (launch). nil when the advance is not on such a goroutine.
	from *callSlot
}

// advanceKind is what prompts an advance.
type advanceKind uint8

const (
	// advanceDrive: the session driver advances its head Run.
	advanceDrive advanceKind = iota + 1
	// advanceSettlement: the outcome of an attempt (EffectSettled).
	advanceSettlement
	// advancePending: the handle of a pending attempt (EffectPending).
	advancePending
	// advanceDeferral: the first deferral of an attempt's attach
	// (EffectDeferred).
	advanceDeferral
	// advanceTimer: a wake-up the Loop asked for (TimerFired).
	advanceTimer
	// advanceInput: an approval, an input or a cancel request from a
	// person or an API client.
	advanceInput
)

// driveHead is the session driver's advance of the session's head Run,
// under the epoch of its claim. It is the one advance that may start a
// pending Run: only the driver knows the Run is the session's head.
// head is the Run as the driver read it (its ID alone when the driver
// has only that).
func driveHead(tenant, session string, head loop.Run, epoch uint64) advanceReq {
	req := advanceReq{kind: advanceDrive, tenant: tenant, session: session, runID: head.ID, epoch: epoch}
	if head.Seq > 0 {
		req.seen = &head
	}
	return req
}

// createdHead is the first advance of a new session's first Run, made
// ahead of its creation under the claim the creation will take (epoch),
// to be written with it (Runtime.firstStep): the driver's advance of
// the session's head, with no Run before it.
func createdHead(run loop.Run, epoch uint64) advanceReq {
	return advanceReq{kind: advanceDrive, tenant: run.Tenant, session: run.Session, runID: run.ID, epoch: epoch, firstOfSession: true}
}

// settleOutcome commits the settlement queued as qs, of an attempt of run
// the caller holds, under its one settlement command ID; onDurable runs
// once it is durable or dropped as stale.
func settleOutcome(run loop.Run, qs *settlequeue.Entry, onDurable func(cur loop.Run)) advanceReq {
	ev, cmd := qs.Event, qs.CommandID
	return advanceReq{kind: advanceSettlement, tenant: run.Tenant, session: run.Session, runID: run.ID,
		pre: &ev, outcomeOf: qs.Key, queued: qs, onDurable: onDurable,
		commandID: func(loop.Run) string { return cmd }}
}

// pendingHandle commits the handle of a pending attempt (key) of run,
// under a command ID of the attempt and the handle; onDurable runs once
// it is durable or dropped as stale.
func pendingHandle(run loop.Run, e loop.Effect, key, handle string, onDurable func(cur loop.Run)) advanceReq {
	ev := loop.Event{Type: loop.EventEffectPending, EffectID: e.ID, Attempt: e.Attempt, Handle: handle, Plugin: takenOver(&run, e)}
	cmd := "pending/" + key + "/" + handle
	return advanceReq{kind: advancePending, tenant: run.Tenant, session: run.Session, runID: run.ID,
		pre: &ev, outcomeOf: key, onDurable: onDurable,
		commandID: func(loop.Run) string { return cmd }}
}

// deferralStart commits when recovery first deferred the attach of an
// attempt (key) of run.
func deferralStart(run loop.Run, e loop.Effect, key string) advanceReq {
	ev := loop.Event{Type: loop.EventEffectDeferred, EffectID: e.ID, Attempt: e.Attempt}
	cmd := "deferred/" + key
	return advanceReq{kind: advanceDeferral, tenant: run.Tenant, session: run.Session, runID: run.ID,
		pre: &ev, outcomeOf: key,
		commandID: func(loop.Run) string { return cmd }}
}

// timerFired delivers a wake-up the Loop asked for to a Run, under a
// command ID of the version it applies to.
func timerFired(tenant, session, runID string) advanceReq {
	ev := loop.Event{Type: loop.EventTimerFired}
	return advanceReq{kind: advanceTimer, tenant: tenant, session: session, runID: runID, pre: &ev,
		commandID: func(r loop.Run) string { return fmt.Sprintf("timer/%s@%d", r.ID, r.Seq) }}
}

// outsideInput applies ev, an approval, an input or a cancel request
// (what names it) from a person or an API client, to run, as qualified by
// o.
func outsideInput(run loop.Run, ev loop.Event, what string, o inputOptions) advanceReq {
	return advanceReq{kind: advanceInput, tenant: run.Tenant, session: run.Session, runID: run.ID,
		pre: &ev, input: o, what: what,
		commandID: func(r loop.Run) string { return fmt.Sprintf("%s/%s@%d", what, r.ID, r.Seq) }}
}

// mayStart reports whether the advance may start a pending Run: only the
// session driver's.
func (req advanceReq) mayStart() bool { return req.kind == advanceDrive }

// fromExecutor reports whether pre is news from an executor or the clock
// (a settlement, a pending record, a deferral, a timer) still to be
// applied: such news may come late or twice, and the Loop's refusal of it
// is dropped and logged. An event from a person or a client (approval,
// input, cancel) gets the refusal back.
func (req advanceReq) fromExecutor() bool {
	if req.pre == nil {
		return false
	}
	switch req.kind {
	case advanceSettlement, advancePending, advanceDeferral, advanceTimer:
		return true
	}
	return false
}

// fromOutside reports whether pre is an input from a person or an API
// client (an approval, an input, a cancel request) still to be applied,
// which any node may take for any session.
func (req advanceReq) fromOutside() bool { return req.pre != nil && req.kind == advanceInput }

// guestInput is the batch a node commits for an input to a Run whose
// session another live node owns: the input event alone, folded into the
// Run, and nothing that follows from it. The Loop never acts on an input
// in the same event that records it, so the owner, woken by the commit
// (ChangeFeed) or by its poll of the store, reads the input and does what
// it asks (plans, dispatches, cancels) under its own epoch, as if it had
// taken the input itself. The commit carries the owner's epoch, so the
// store refuses it if the session changed hands meanwhile.
func guestInput(run loop.Run, req advanceReq, nowMS int64) ([]loop.Event, loop.Run, error) {
	ev := *req.pre
	if ev.At == 0 {
		ev.At = nowMS
	}
	ev.Seq = run.Seq + 1
	next, err := loop.Apply(run, ev)
	if errors.Is(err, loop.ErrNoChange) {
		return nil, run, nil
	}
	if err != nil {
		return nil, run, err
	}
	return []loop.Event{ev}, next, nil
}

// sideEffects are what a commit obliges the runtime to do once it is
// durable.
type sideEffects struct {
	dispatched []dispatchedEffect
	cancels    []loop.Action
	wakes      []loop.Action
	// merged are the other settlements of the Run (from the settlement
	// queue) folded into the batch; the commit applies them under their
	// own command IDs (Commit.AlsoCommandIDs).
	merged []*settlequeue.Entry
}

type dispatchedEffect struct {
	effect  loop.Effect
	request json.RawMessage // the model request when it was built in this advance
}

// errStoreFailed marks an advance that failed because the store did (a
// load or a commit returned an error): the same advance may succeed when
// tried again.
var errStoreFailed = errors.New("runtime: the store failed")

// afterUncertainCommit follows an advance that failed because the store
// did: its commit may have been written (a lost reply) and may have ended
// the Run, which no later advance would then see (a driver looks only at
// active Runs). So the Run is read again, and if it has ended, its end is
// handled as after any advance: its bookkeeping goes, its waiters are
// told, the next queued Run may start. Otherwise its session is kicked,
// so that whatever the lost commit dispatched is performed. If the read
// fails too, the next advance or kick that reads the Run finds its end.
func (rt *Runtime) afterUncertainCommit(req advanceReq) {
	ctx, cancel := rt.commitCtx()
	defer cancel()
	run, err := rt.store.LoadRun(ctx, req.tenant, req.runID)
	switch {
	case err == nil && run.Status.Terminal():
		rt.afterAdvance(req, run, false)
	case err == nil:
		rt.kick(run.Tenant, run.Session)
	case req.session != "":
		rt.kick(req.tenant, req.session)
	}
}

// errAdvanceGaveUp means an advance met version conflicts too many times in a
// row; something else is committing to the Run in a tight loop.
var errAdvanceGaveUp = errors.New("runtime: too many version conflicts")

// guessRun is the snapshot an advance may start from without reading the
// Run from the store: the one the caller has just read (req.seen, taken
// once), or else the one this node last committed of the Run while it
// owns the session (rt.owned), with the epoch it committed it under (0
// for req.seen: the advance's own claim fences it). ok is false when the
// advance must read the Run: reload is set, the session is not known
// yet, or the advance takes an input from outside, which it must judge
// on the store's snapshot since it may refuse it without a commit.
//
// A guess is checked by the commit that follows it, which expects its Seq
// under the session's epoch: a stale one is refused (ErrVersionConflict,
// ErrFenced), the advance drops it and reads the Run. An advance that
// would return without a commit (nothing to write, a refusal) reads the
// Run and decides again, so that nothing is decided on an unchecked
// guess (docs/DESIGN.md §5.4).
func (rt *Runtime) guessRun(req *advanceReq, reload bool) (run loop.Run, epoch uint64, ok bool) {
	seen := req.seen
	req.seen = nil
	if reload || req.session == "" || req.fromOutside() {
		return loop.Run{}, 0, false
	}
	if seen != nil {
		run, epoch, ok = *seen, 0, true
	} else {
		run, epoch, ok = rt.owned.Snapshot(sessionKey(req.tenant, req.session), req.runID)
	}
	if hook := rt.guessHook.Load(); ok && hook != nil && !(*hook)(run) {
		return loop.Run{}, 0, false
	}
	return run, epoch, ok
}

// ownerCommitted records the snapshot this node has just committed, as
// the session's owner under epoch, for the Run's next advance
// (guessRun): only while it still holds that claim.
func (rt *Runtime) ownerCommitted(tenant, session string, next loop.Run, epoch uint64) {
	if held, ok := rt.sessions.claimed(tenant, session); ok && held == epoch {
		rt.owned.Committed(sessionKey(tenant, session), next, epoch)
	}
}

// ownerRead records the snapshot of a Run this node has just read from
// the store under its claim on the Run's session (epoch), as
// ownerCommitted records one it committed: the Run's next advance may
// start from it, not from a LoadRun. It is a guess like those
// (ownedruns): a commit from it is checked, and an advance that would
// end without one reads the Run again.
func (rt *Runtime) ownerRead(tenant, session string, run loop.Run, epoch uint64) {
	rt.ownerCommitted(tenant, session, run, epoch)
}

// ownerCreated records a Run this node has just created under the claim
// on its session the creation took or found (epoch), as ownerCommitted
// does a commit: the creation is the owner's commit of the Run, so its
// first advance starts from it, not from a LoadRun. The session's first
// Run (ordinal 1) has no Run before it, so its builder's history is
// empty, without a read (history). Both only while this node still holds
// that claim.
func (rt *Runtime) ownerCreated(tenant, session string, run loop.Run, epoch uint64, ordinal int64) {
	if held, ok := rt.sessions.claimed(tenant, session); !ok || held != epoch {
		return
	}
	rt.owned.Committed(sessionKey(tenant, session), run, epoch)
	rt.historyKnownAt(tenant, session, run.ID, ordinal)
}

// historyKnownAt records the builder's history of a Run at ordinal in
// its session when it is known without a read: the session's first Run
// (ordinal 1) has no Run before it, so its history is empty (history).
func (rt *Runtime) historyKnownAt(tenant, session, runID string, ordinal int64) {
	if ordinal == 1 {
		rt.owned.SetHistory(sessionKey(tenant, session), runID, []abi.Message{})
	}
}

// advance reads a Run (or takes a guess of it: guessRun), applies
// req.pre, folds the internal actions (start, plan, dispatch, finish)
// into one commit, and then performs what
// the commit obliges: executor calls for the dispatched effects, cancels,
// and Watcher wake-ups. It returns the authoritative snapshot after the
// commit.
//
// An outcome the Loop refuses as stale or repeated is dropped and logged;
// other refusals of pre (a bad approval, input the Run is not waiting for)
// are returned to the caller with nothing written.
func (rt *Runtime) advance(ctx context.Context, req advanceReq) (cur loop.Run, err error) {
	rk := runKey(req.tenant, req.runID)
	unlock := rt.lockRun(rk)
	tookAlong := false   // req's settlement was committed by another advance
	sessionIdle := false // this advance's commit left the session no live Run
	defer func() {
		if err == nil && req.onDurable != nil {
			req.onDurable(cur)
		}
		unlock()
		switch {
		case err == nil && tookAlong:
		case err == nil:
			if hook := rt.reportHook.Load(); hook != nil {
				req, cur, idle := req, cur, sessionIdle // only these escape
				(*hook)(cur, func() { rt.afterAdvance(req, cur, idle) })
				break
			}
			rt.afterAdvance(req, cur, sessionIdle)
		case errors.Is(err, errStoreFailed):
			rt.afterUncertainCommit(req)
		}
	}()
	tenant, ok := rt.opts.Tenants.Tenant(req.tenant)
	if !ok {
		return loop.Run{}, fmt.Errorf("runtime: unknown tenant %q", req.tenant)
	}
	if req.pre == nil && rt.stopping() {
		// Stop drains the work in progress: the news of effects, inputs
		// already taken. It starts nothing new (a driver's next Run).
		return loop.Run{}, fmt.Errorf("runtime: advance of %s: %w", req.runID, ErrClosed)
	}
	reload := false // read the Run from the store, not rt.owned
	for attempt := 0; ; attempt++ {
		if attempt >= 64 {
			return loop.Run{}, fmt.Errorf("%w: run %s", errAdvanceGaveUp, req.runID)
		}
		if req.queued != nil {
			if cur, ok := rt.settles.CommittedAs(req.queued); ok {
				// Another advance of the Run took this settlement along
				// into its commit, performed what that commit obliges and
				// reported the Run after it (afterAdvance): nothing is
				// left to do, nor to read. cur, that commit's snapshot, is
				// what onDurable learns; it may be older than the Run is
				// now, so it is not reported again.
				tookAlong = true
				return cur, nil
			}
		}
		run, guessEpoch, guessed := rt.guessRun(&req, reload)
		reload = false
		if !guessed {
			run, err = rt.store.LoadRun(ctx, req.tenant, req.runID)
			if errors.Is(err, ErrRunNotFound) {
				return loop.Run{}, err
			}
			if err != nil {
				return loop.Run{}, fmt.Errorf("%w: load %s: %w", errStoreFailed, req.runID, err)
			}
		}
		// reread drops a guessed snapshot and reads the Run from the
		// store on the next attempt: what the guess decided is not
		// checked by a commit of it.
		reread := func() {
			rt.owned.Drop(sessionKey(req.tenant, req.session), req.runID)
			reload = true
		}
		if req.session == "" {
			req.session = run.Session
		}
		// Checked at each load, under the Run's lock: the commit below
		// expects this seq, so the input applies to the version named.
		if err := req.input.check(run, req.what); err != nil {
			return run, err
		}
		if run.Status.Terminal() {
			if guessed { // a guess is never terminal; be sure all the same
				reread()
				continue
			}
			err := fmt.Errorf("%w: run %s is %s", loop.ErrTerminal, run.ID, run.Status)
			if req.pre != nil && !req.fromExecutor() {
				return run, err
			}
			if req.pre != nil {
				rt.dropOutcome(req, err)
			}
			return run, nil
		}
		epoch, guest := req.epoch, false
		if epoch == 0 {
			if epoch, err = rt.claim(ctx, req.tenant, req.session); err != nil {
				var owned *SessionOwnedError
				if errors.As(err, &owned) && req.fromOutside() && rt.isShared() {
					// Another live node drives the session: commit the
					// input alone, under its owner's epoch, and leave what
					// it asks for to the owner (guestInput), whom the
					// commit wakes through the store's ChangeFeed.
					epoch, guest = owned.Epoch, true
					err = nil
				}
			}
			if err != nil {
				if errors.Is(err, ErrSessionOwned) || errors.Is(err, ErrNodeExpired) {
					rt.boundary(req.tenant, req.session, err)
					return loop.Run{}, err
				}
				// The store failed: the claim may be written (a lost
				// reply), so the callers that retry, or kick the session,
				// must hear that trying again may succeed.
				return loop.Run{}, fmt.Errorf("%w: claim %s/%s: %w", errStoreFailed, req.tenant, req.session, err)
			}
		}
		if guessed && (guest || guessEpoch != 0 && guessEpoch != epoch) {
			// A snapshot committed under another epoch: the session may
			// have changed hands since.
			reread()
			continue
		}
		var (
			batch []loop.Event
			next  loop.Run
			fx    sideEffects
		)
		if guest {
			batch, next, err = guestInput(run, req, rt.nowMS())
		} else {
			if guessed && req.queued != nil && rt.attempts.BusyRun(attempts.RunPrefixOf(req.tenant, req.session, req.runID)) > 1 {
				// Other attempts of the Run are in flight: let those that
				// have answered queue their settlements, so that this
				// commit takes them along. A load used to give them that
				// time; a guess gives none, and the tool calls of a step
				// that answer at once would each commit on its own.
				goruntime.Gosched()
			}
			batch, next, fx, err = rt.foldActions(ctx, tenant, run, req, epoch)
		}
		var committed *loop.Run // next, once the commit is durable
		merged := fx.merged
		settleMerged := func() {
			rt.settles.Done(merged, committed)
			merged = nil
		}
		if err != nil && guessed {
			// Refused on a guess: judge it again on the store's snapshot.
			settleMerged()
			reread()
			continue
		}
		if err != nil {
			settleMerged()
			if req.fromExecutor() && (errors.Is(err, loop.ErrStaleAttempt) || errors.Is(err, loop.ErrAlreadySettled) || errors.Is(err, loop.ErrTerminal)) {
				// The news is stale (often: its own commit, applied before
				// a lost acknowledgement). Drop it, and advance the Run as
				// it stands, as after a duplicate commit: what that commit
				// dispatched must still be performed.
				rt.dropOutcome(req, err)
				req.pre, req.commandID = nil, nil
				continue
			}
			return run, err
		}
		if len(batch) == 0 && guessed {
			// Nothing to commit: no commit checks the guess, so decide
			// again on the store's snapshot.
			settleMerged()
			reread()
			continue
		}
		if len(batch) == 0 {
			if guest {
				return next, nil // the owner acts on the Run, never a guest
			}
			// The Run as the store holds it, read under this claim: the
			// Run's next advance may start from it, a guess like any
			// other (a settlement's, after recovery's or a duplicate's
			// advance that wrote nothing).
			rt.ownerRead(req.tenant, req.session, run, epoch)
			rt.perform(tenant, next, epoch, fx, req.from)
			return next, nil
		}
		cmd := fmt.Sprintf("advance/%s@%d", run.ID, run.Seq)
		if req.commandID != nil {
			cmd = req.commandID(run)
		}
		if rt.halted.Load() {
			settleMerged()
			return run, fmt.Errorf("runtime: advance of %s: halted: %w", run.ID, ErrClosed)
		}
		if err := rt.reserveDispatches(next, fx); err != nil {
			settleMerged()
			return run, err
		}
		var also []string
		for _, m := range merged {
			also = append(also, m.CommandID)
		}
		cctx, cancel := rt.commitCtx()
		cctx, span := startCommitSpan(cctx, &next, len(batch))
		began := rt.clock.Now()
		rt.commits.Begin()
		res, err := rt.store.Commit(cctx, Commit{
			Tenant: req.tenant, Session: req.session, RunID: req.runID, CommandID: cmd, AlsoCommandIDs: also,
			ExpectedSeq: run.Seq, Epoch: epoch, Events: batch, Run: next,
		})
		rt.commits.End()
		rt.opts.Observer.Committed(rt.clock.Now().Sub(began), err)
		EndSpan(span, err)
		cancel()
		if err != nil || res.Duplicate {
			rt.unreserveDispatches(next, fx)
			rt.owned.Drop(sessionKey(req.tenant, req.session), req.runID)
		} else {
			if !guest {
				rt.ownerCommitted(req.tenant, req.session, next, epoch)
			}
			durable := next
			committed = &durable
			if req.queued != nil {
				// Its own settlement is durable: out of the queue now,
				// under the Run's lock, not when commitSettlement returns
				// (after perform, whose calls may answer first), so that
				// no later advance of the Run takes it along and has it
				// refused as settled already.
				rt.settles.Remove(rk, req.queued)
			}
			rt.stats.MergedSettlements.Add(int64(len(merged)))
			// The merged settlements are durable with this commit: their
			// attempts are settled from now on, before perform starts what
			// the commit obliges. Their own advances, which wait for the
			// Run's lock, give their holds back later; until then a reply
			// that ends the Run must not find them still in flight.
			for _, m := range merged {
				rt.attempts.MarkSettled(m.Key)
			}
		}
		settleMerged()
		switch {
		case errors.Is(err, ErrVersionConflict):
			rt.stats.Conflicts.Add(1)
			continue
		case errors.Is(err, ErrFenced) && guest:
			// The session changed hands since its owner was read: read
			// it again, and claim it if its owner is gone.
			rt.stats.Conflicts.Add(1)
			continue
		case errors.Is(err, ErrFenced):
			rt.boundary(req.tenant, req.session, err)
			return loop.Run{}, err
		case errors.Is(err, ErrRunNotFound):
			return loop.Run{}, err
		case err != nil:
			return loop.Run{}, fmt.Errorf("%w: commit %s: %w", errStoreFailed, cmd, err)
		case res.Duplicate:
			// The command was applied before (a retry after a lost
			// acknowledgement, or another settler of the same attempt).
			// Its follow-ups are on record; decide again from there.
			rt.stats.DuplicateCommits.Add(1)
			if req.pre != nil && req.kind == advanceSettlement {
				rt.dropOutcome(req, fmt.Errorf("%w: command %s applied before", loop.ErrAlreadySettled, cmd))
			}
			req.pre, req.commandID = nil, nil
			continue
		}
		rt.stats.Commits.Add(1)
		rt.observeCommit(run, next, batch)
		rt.committed(next)
		rt.hub.Publish(Notice{Tenant: req.tenant, RunID: req.runID, Seq: next.Seq})
		rt.countTerminal(run, next)
		traceRunEnded(&run, &next)
		rt.logRunFailed(run, next)
		rt.logRateLimited(next, batch)
		if guest {
			rt.stats.GuestInputs.Add(1)
			return next, nil
		}
		sessionIdle = res.SessionIdle && next.Status.Terminal()
		rt.perform(tenant, next, epoch, fx, req.from)
		return next, nil
	}
}

// foldActions applies req.pre to run and folds the actions that need no
// outside answer (start, plan a model step, dispatch, finish) into one
// batch of events for one commit. Each event is stamped with the time it
// is applied at, so that those after a slow builder call carry the time
// after it.
func (rt *Runtime) foldActions(ctx context.Context, t *Tenant, run loop.Run, req advanceReq, epoch uint64) ([]loop.Event, loop.Run, sideEffects, error) {
	var (
		batch []loop.Event
		fx    sideEffects
		cur   = run
	)
	apply := func(ev loop.Event) error {
		if ev.At == 0 {
			ev.At = rt.nowMS()
		}
		ev.Seq = cur.Seq + 1
		next, err := loop.Apply(cur, ev)
		if err != nil {
			return err
		}
		batch, cur = append(batch, ev), next
		return nil
	}
	if req.pre != nil {
		if err := apply(*req.pre); err != nil && !errors.Is(err, loop.ErrNoChange) {
			return nil, run, fx, err
		}
		if req.queued != nil {
			// The other settlements of the Run waiting for their commit
			// go into this one. One the Loop refuses (stale, settled
			// before) goes back to its owner, who drops it.
			for _, s := range rt.settles.Take(runKey(req.tenant, req.runID), req.queued) {
				if err := apply(s.Event); err != nil {
					rt.settles.Done([]*settlequeue.Entry{s}, nil)
					continue
				}
				fx.merged = append(fx.merged, s)
			}
		}
	}
	requests := map[string]json.RawMessage{}
	for guard := 0; guard < 1000; guard++ {
		acts := loop.Decide(cur)
		fx.cancels, fx.wakes = nil, nil
		progressed := false
	actions:
		for _, a := range acts {
			var err error
			switch a.Type {
			case loop.ActionStart:
				if !req.mayStart() {
					continue
				}
				err = apply(loop.Event{Type: loop.EventRunStarted})
				progressed = true
			case loop.ActionPlanModelStep:
				var raw json.RawMessage
				raw, err = rt.build(ctx, t, cur, req.firstOfSession)
				if err != nil {
					f := planFailure(err)
					if !req.firstOfSession { // a first step that fails is never written (firstStep)
						rt.logPlanFailure(cur, a.Step, f, err)
					}
					err = apply(loop.Event{Type: loop.EventStepFailed, Failure: f})
				} else if err = apply(loop.Event{Type: loop.EventModelStepPlanned, Step: a.Step, Request: raw}); err == nil {
					requests[loop.ModelEffectID(cur.ID, a.Step)] = raw
				}
				progressed = true
			case loop.ActionDispatch:
				plugin := PluginOf(rt.executorFor(t, &cur, cur.Effect(a.EffectID)))
				if err = apply(loop.Event{Type: loop.EventEffectDispatched, EffectID: a.EffectID, Attempt: a.Attempt, Epoch: epoch, Plugin: plugin}); err == nil {
					fx.dispatched = append(fx.dispatched, dispatchedEffect{effect: *cur.Effect(a.EffectID), request: requests[a.EffectID]})
				}
				progressed = true
				continue
			case loop.ActionComplete:
				err = apply(loop.Event{Type: loop.EventRunCompleted, Result: a.Result})
				progressed = true
			case loop.ActionFail:
				err = apply(loop.Event{Type: loop.EventRunFailed, Failure: a.Failure})
				progressed = true
			case loop.ActionFinishCancelled:
				err = apply(loop.Event{Type: loop.EventRunCancelled, Failure: a.Failure})
				progressed = true
			case loop.ActionCancelEffect:
				fx.cancels = append(fx.cancels, a)
				continue
			case loop.ActionWakeAt:
				fx.wakes = append(fx.wakes, a)
				continue
			default: // AwaitApproval, AwaitInput: a person moves the Run on.
				continue
			}
			if err != nil {
				return nil, run, fx, fmt.Errorf("runtime: run %s: the loop refused its own decision %s: %w", cur.ID, a.Type, err)
			}
			break actions // the decision set changed: decide again
		}
		if !progressed {
			return batch, cur, fx, nil
		}
	}
	return nil, run, fx, fmt.Errorf("runtime: run %s: decisions did not settle", run.ID)
}

// build calls the builder of run's agent for the next model step of run.
func (rt *Runtime) build(ctx context.Context, t *Tenant, run loop.Run, firstOfSession bool) (json.RawMessage, error) {
	a := t.agentOf(&run)
	if a == nil {
		return nil, errAgentGone
	}
	if a.Builder == nil {
		return nil, errNoBuilder
	}
	history := []abi.Message{} // none before a session's first Run
	if !firstOfSession {
		var err error
		if history, err = rt.history(ctx, run); err != nil {
			return nil, fmt.Errorf("%w: %w", errHistoryUnread, err)
		}
	}
	in := abi.BuildInput{
		ABI:        abi.Version,
		Run:        abi.RunView{ID: run.ID, Tenant: run.Tenant, Session: run.Session, Step: run.Step + 1, Input: run.Input, Metadata: run.Metadata},
		History:    history,
		Transcript: run.Transcript,
		// The Run's own tools, as the Loop accepts calls of them: never
		// the agent's current set, which may have changed since the Run
		// was created.
		Tools: t.toolsOffered(run),
	}
	if p := run.Agent; p != nil {
		// The agent as the Run was created with it, never as it is now.
		in.Agent = &abi.AgentView{Name: p.Name, Version: p.Version, Instructions: p.Instructions, Settings: p.Settings,
			OutputSchema: p.OutputSchema}
	}
	cctx, cancel := rt.callCtxFrom(ctx, a.Builder)
	defer cancel()
	cctx, span := startStepSpan(cctx, &run)
	out, err := a.Builder.Build(cctx, t.ID, in)
	EndSpan(span, err)
	if err != nil {
		return nil, err
	}
	// The request is stored, in its ModelStepPlanned event and in the
	// snapshot, as the stores write JSON: without HTML escapes, which
	// would store each <, > or & of the transcript as six bytes.
	return runcodec.MarshalJSON(out.Request)
}

// history returns the transcripts of the session's completed Runs before
// run, oldest first, at most its agent's HistoryRuns of them.
func (rt *Runtime) history(ctx context.Context, run loop.Run) ([]abi.Message, error) {
	t, _ := rt.opts.Tenants.Tenant(run.Tenant)
	limit := DefaultHistoryRuns
	if t != nil {
		if a := t.agentOf(&run); a != nil && a.HistoryRuns > 0 {
			limit = a.HistoryRuns
		}
	}
	sk := sessionKey(run.Tenant, run.Session)
	if msgs, ok := rt.owned.History(sk, run.ID); ok {
		return msgs, nil
	}
	earlier, err := rt.store.CompletedRunsBefore(ctx, run.Tenant, run.Session, run.ID, limit)
	if err != nil {
		return nil, err
	}
	msgs := []abi.Message{}
	for _, r := range earlier {
		msgs = append(msgs, r.Transcript...)
	}
	// Read once per Run: the session's completed Runs before a live one
	// do not change while it runs (ownedruns.Cache.SetHistory).
	msgs = msgs[:len(msgs):len(msgs)]
	rt.owned.SetHistory(sk, run.ID, msgs)
	return msgs, nil
}

func (rt *Runtime) dropOutcome(req advanceReq, why error) {
	rt.stats.DroppedOutcomes.Add(1)
	key := req.outcomeOf
	if key == "" && req.pre != nil {
		key = loop.AssignmentKey{Tenant: req.tenant, Session: req.session, EffectID: req.pre.EffectID, Attempt: req.pre.Attempt}.String()
	}
	rt.log.Info("outcome dropped", "assignment_key", key, "reason", why)
}

// logRunFailed logs a Run that a commit ended as failed, with the agent
// it ran as and, when a model step's failure failed it, that effect and
// its endpoint. It is called once per commit, on the node that made it,
// and only a commit that moves the Run from a live status to failed logs:
// a Run ends once, and an advance that finds it ended (a recovery, a
// duplicate) commits nothing.
func (rt *Runtime) logRunFailed(before, after loop.Run) {
	if before.Status.Terminal() || after.Status != loop.StatusFailed {
		return
	}
	var class abi.ErrorClass
	msg := ""
	if f := after.Failure; f != nil {
		class, msg = f.Class, f.Message
	}
	args := []any{"tenant", after.Tenant, "session", after.Session, "run", after.ID, "agent", agentName(&after),
		"class", class, "message", msg, "step", after.Step}
	if e := failedModelEffect(&after); e != nil {
		args = append(args, "effect", e.ID, "attempt", e.Attempt, "endpoint", rt.endpointOf(&after, e))
	}
	rt.log.Warn("a Run failed", args...)
}

// failedModelEffect returns the model effect whose failure failed the Run:
// one of the effects of its last step that settled failed with the
// Run's failure class; nil when the failure came from elsewhere (a tool,
// a limit, the builder, a cancel).
func failedModelEffect(run *loop.Run) *loop.Effect {
	if run.Failure == nil {
		return nil
	}
	for i := len(run.Effects) - 1; i >= 0; i-- {
		e := &run.Effects[i]
		if e.Kind == abi.KindModel && e.Outcome != nil && e.Outcome.State == loop.OutcomeFailed &&
			e.Outcome.Error != nil && e.Outcome.Error.Class == run.Failure.Class {
			return e
		}
	}
	return nil
}

// endpointOf names the endpoint that carries out the Run's effect e (the
// executor plugin's ID, EndpointOf), or "" when it has none or is not
// known.
func (rt *Runtime) endpointOf(run *loop.Run, e *loop.Effect) string {
	t, ok := rt.opts.Tenants.Tenant(run.Tenant)
	if !ok || t == nil {
		return ""
	}
	ex := rt.executorFor(t, run, e)
	if ex == nil {
		return ""
	}
	return EndpointOf(ex)
}

// logRateLimited writes one line to the server's log for each attempt
// that a commit settled as rate_limited (batch holds the committed
// events): the tenant, the Run, the effect and attempt, the endpoint
// (EndpointOf its executor), the wait the provider asked for, and what the
// policy made of it (after, the Run the commit made): the time of the next
// attempt, or that it gave up.
func (rt *Runtime) logRateLimited(after loop.Run, batch []loop.Event) {
	for _, ev := range batch {
		if ev.Type != loop.EventEffectSettled || ev.Outcome == nil || ev.Outcome.State != loop.OutcomeFailed || !ev.Outcome.Error.RateLimited() {
			continue
		}
		args := []any{"tenant", after.Tenant, "session", after.Session, "run", after.ID, "effect", ev.EffectID, "attempt", ev.Attempt,
			"retry_after_ms", ev.Outcome.Error.RetryAfterMS}
		e := after.Effect(ev.EffectID)
		if e != nil {
			args = append(args, "endpoint", rt.endpointOf(&after, e))
		}
		if e != nil && e.State == loop.EffectBackoff && e.Attempt == ev.Attempt {
			rt.log.Info("the provider rate-limited an attempt; the next one waits", append(args,
				"rate_limited_attempts", e.RateLimited, "next_attempt_at", time.UnixMilli(e.NotBefore).UTC(),
				"wait_ms", e.NotBefore-ev.At)...)
			continue
		}
		rt.log.Warn("the provider rate-limited an attempt, and no other follows it", append(args,
			"run_status", after.Status, "message", ev.Outcome.Error.Message)...)
	}
}

func (rt *Runtime) countTerminal(before, after loop.Run) {
	if before.Status.Terminal() || !after.Status.Terminal() {
		return
	}
	switch after.Status {
	case loop.StatusCompleted:
		rt.stats.RunsCompleted.Add(1)
	case loop.StatusFailed:
		rt.stats.RunsFailed.Add(1)
	case loop.StatusCancelled:
		rt.stats.RunsCancelled.Add(1)
	}
}

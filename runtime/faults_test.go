package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The tests in this file are named after the holes a fault audit of the
// runtime reproduced; each one fails on the runtime before its fix.

// eachStore runs f once per store the runtime's own tests run over.
func eachStore(t *testing.T, mutate func(*runtime.Tenant), f func(t *testing.T, e *conformance.RuntimeEnv)) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) { f(t, conformance.NewRuntimeEnv(t, h, mutate)) })
	}
}

// effectLog returns the settlements of a Run's effect, in log order.
func settlementsOf(t *testing.T, store runtime.Store, runID, effectID string) []loop.Event {
	t.Helper()
	evs, err := store.Events(context.Background(), "acme", runID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []loop.Event
	for _, ev := range evs {
		if ev.Type == loop.EventEffectSettled && ev.EffectID == effectID {
			out = append(out, ev)
		}
	}
	return out
}

// Hole 1: a tool call answers while Stop drains. Its settlement closes the
// step, so the same commit dispatches the next model step; the runtime is
// stopping, and it used to drop the whole commit, settlement included, so
// that the next process settled the tool call as lost or ran it again.
// The outcome must be committed; the dispatch it folds in is left to
// recovery.
func TestStopCommitsAnOutcomeThatArrivesDuringTheDrain(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		runID := runtime.NewRunID(e.Clock.Now())
		go func() {
			_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
		}()
		conformance.Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stopped <- e.Runtime.Stop(ctx)
		}()
		conformance.Eventually(t, "Stop to begin", func() bool { return runtime.Stopping(e.Runtime) })
		e.Plugins.Release() // the tool answers during the drain
		if err := <-stopped; err != nil {
			t.Fatalf("Stop: %v", err)
		}
		settled := settlementsOf(t, e.Store, runID, runID+".t1.0")
		if len(settled) != 1 || settled[0].Outcome == nil || settled[0].Outcome.State != loop.OutcomeDone {
			run, _ := e.Store.LoadRun(context.Background(), "acme", runID)
			t.Fatalf("the tool call's outcome, which arrived during the drain, was not committed: settlements %+v, effects %+v", settled, run.Effects)
		}
		// The next incarnation finishes the Run from there, without
		// calling the tool again.
		b := e.Recover("node-b")
		run := e.UntilTerminal(b, runID, 100*time.Millisecond)
		if run.Status != loop.StatusCompleted || run.Result != "unblocked" {
			t.Fatalf("run %s, result %q", run.Status, run.Result)
		}
		if n := e.Tools.Calls(abi.ExportStart); n != 1 {
			t.Fatalf("the tool was started %d times", n)
		}
	})
}

// Hole 3: Stop landing while a watcher batch was being handed to its
// workers left the workers waiting for items that never came, and Stop
// waited for them forever, even past its context.
func TestStopReturnsWhenItLandsInAWatcherBatch(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		// Two pending effects fall due in one batch.
		res := e.Execute("s1", `call:slow({"text":"a"}),slow({"text":"b"})|answer:$results`)
		if res.Kind != runtime.ResultWaiting {
			t.Fatalf("result %s", res.Kind)
		}
		var once sync.Once
		stopped := make(chan error, 1)
		runtime.SetWatcherFireHook(e.Runtime, func() {
			once.Do(func() {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					stopped <- e.Runtime.Stop(ctx)
				}()
				conformance.Eventually(t, "Stop to begin", func() bool { return runtime.Stopping(e.Runtime) })
			})
		})
		t.Cleanup(func() { runtime.SetWatcherFireHook(e.Runtime, nil) })
		e.Clock.Advance(time.Second) // the polls fall due
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatalf("Stop returned %v; it drained nothing that could not finish", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Stop did not return: its watcher workers wait for a batch nobody hands out")
		}
	})
}

// Hole 5: Execute replayed with the same Run ID and idempotency key after
// the Run ended waited until its context ended. It must return the end at
// once.
func TestExecuteReplayedAfterTheRunEndedReturnsItsEnd(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		req := runtime.Request{Tenant: "acme", Session: "s1", RunID: "run_replayed", IdempotencyKey: "key-1", Input: "answer:once"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := e.Runtime.Execute(ctx, req)
		if err != nil || res.Kind != runtime.ResultTerminal {
			t.Fatalf("first execute: %v %s", err, res.Kind)
		}
		replay, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel2()
		again, err := e.Runtime.Execute(replay, req)
		if err != nil {
			t.Fatalf("the replayed Execute did not return the Run's end: %v", err)
		}
		if again.Kind != runtime.ResultTerminal || again.Run.ID != "run_replayed" || again.Run.Result != "once" {
			t.Fatalf("replay: %s %s %q", again.Kind, again.Run.ID, again.Run.Result)
		}
	})
}

// Hole 6: a reply that arrived after its Run had ended left a "done"
// tombstone in the tracking table for good, so memory grew with every
// cancel and every timeout.
func TestALateReplyLeavesNothingTrackedAfterTheRunEnded(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		runID := runtime.NewRunID(e.Clock.Now())
		go func() {
			_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
		}()
		conformance.Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
		if _, err := e.Runtime.Cancel(context.Background(), "acme", runID, "no longer needed"); err != nil {
			t.Fatal(err)
		}
		run := e.UntilTerminal(e.Runtime, runID, 100*time.Millisecond)
		if run.Status != loop.StatusCancelled {
			t.Fatalf("run %s", run.Status)
		}
		e.Plugins.Release() // the start call answers now, after the end
		conformance.Eventually(t, "the late reply to be dropped", func() bool { return e.Runtime.Stats().DroppedOutcomes >= 1 })
		conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
		if n := runtime.TrackedAttempts(e.Runtime); n != 0 {
			t.Fatalf("%d attempts are still tracked after the Run ended", n)
		}
	})
}

// withFaults is a harness whose store is h's wrapped in a FaultStore,
// which *fs points at once the env is built.
func withFaults(h conformance.RuntimeHarness, fs **conformance.FaultStore) conformance.RuntimeHarness {
	inner := h.NewStore
	h.NewStore = func(t *testing.T, clock runtime.Clock) runtime.Store {
		*fs = conformance.NewFaultStore(inner(t, clock), conformance.FaultOptions{})
		return *fs
	}
	return h
}

// eachStoreWithFaults is eachStore over a FaultStore.
func eachStoreWithFaults(t *testing.T, f func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore)) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			var fs *conformance.FaultStore
			e := conformance.NewRuntimeEnv(t, withFaults(h, &fs), nil)
			f(t, e, fs)
		})
	}
}

// failCommitOnce makes the first Commit whose command ID matches fail
// with kind, and no other.
func failCommitOnce(fs *conformance.FaultStore, kind conformance.FaultKind, match func(commandID string) bool) {
	var once sync.Once
	fs.FailWhen(func(_ string, args any) (conformance.FaultKind, bool) {
		c, ok := args.(runtime.Commit)
		hit := false
		if ok && match(c.CommandID) {
			once.Do(func() { hit = true })
		}
		return kind, hit
	})
}

// storedTerminal waits for a Run to be terminal on record, without asking
// the runtime (no Wait, which would kick its session), moving the fake
// clock in small steps whenever no clock callback is running, so that
// backoffs fall due. It fails the test after 10 s.
func storedTerminal(t *testing.T, e *conformance.RuntimeEnv, runID string) loop.Run {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		run, err := e.Store.LoadRun(context.Background(), "acme", runID)
		if err == nil && run.Status.Terminal() {
			return run
		}
		if e.Clock.Running() == 0 {
			e.Clock.Advance(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Millisecond) // a condition poll's cadence
	}
	run, _ := e.Store.LoadRun(context.Background(), "acme", runID)
	t.Fatalf("run %s is still %s on record; nothing drives it (effects %+v)", runID, run.Status, run.Effects)
	return loop.Run{}
}

// Hole 2: a settlement commit that failed once (a transient store error)
// let go of the attempt before the commit was durable, so the next
// advance found it executing with no handle and called start again: a
// plugin that cannot attach ran its work twice, and the Run waited for the
// watchdog meanwhile. The commit must be retried under the same command
// ID, and the effect never run again.
func TestAFailedSettlementCommitIsRetriedNeverStartedAgain(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		failCommitOnce(fs, conformance.FaultError, func(cmd string) bool {
			return strings.HasPrefix(cmd, "settle/") && strings.Contains(cmd, ".t1.0#")
		})
		run, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: `call:echo({"text":"x"})|answer:$results`})
		if err != nil {
			t.Fatal(err)
		}
		done := storedTerminal(t, e, run.ID)
		if done.Status != loop.StatusCompleted || done.Result != "x" {
			t.Fatalf("run %s, result %q", done.Status, done.Result)
		}
		key := loop.AssignmentKey{Tenant: "acme", Session: "s1", EffectID: run.ID + ".t1.0", Attempt: 1}.String()
		if n := e.Tools.CallsFor(abi.ExportStart, key); n != 1 {
			t.Fatalf("the tool call was started %d times; a failed settlement commit must be retried, not the effect", n)
		}
		if len(fs.Injected()) != 1 {
			t.Fatalf("injected %v, want the one failed settlement commit", fs.Injected())
		}
	})
}

// Hole 4, one node: the watchdog forgets a session idle for two scans;
// then a Run is submitted into it, and the driver's first claim fails on
// a transient store error. No driver, no watchdog and no recovery looked
// at the Run again. The driver retries, and the watchdog reads the store.
func TestARunSubmittedIntoAForgottenSessionIsDrivenWhenItsClaimFails(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		first := e.Execute("s1", "answer:one")
		if first.Kind != runtime.ResultTerminal {
			t.Fatalf("first run %s", first.Kind)
		}
		conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
		e.Runtime.WatchdogScan(context.Background())
		e.Runtime.WatchdogScan(context.Background())
		if n := runtime.SessionsHeld(e.Runtime); n != 0 {
			t.Fatalf("%d sessions held after two idle scans", n)
		}
		fs.FailNext("ClaimSession", conformance.FaultError, 1)
		run, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:two"})
		if err != nil {
			t.Fatal(err)
		}
		done := storedTerminal(t, e, run.ID)
		if done.Status != loop.StatusCompleted {
			t.Fatalf("run %s (%+v)", done.Status, done.Failure)
		}
	})
}

// Hole 4, two nodes: node-b submits into a session node-a owns but has
// forgotten (idle). node-b's driver meets ErrSessionOwned and stops there;
// node-a, which owns the Run, never looked at it. node-a's watchdog reads
// the store's index of active sessions, finds the Run in a session it
// owns, and drives it.
func TestARunSubmittedOnAnotherNodeIntoAnOwnedSessionIsDriven(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		a := e.Runtime
		first := e.Execute("s1", "answer:one")
		if first.Kind != runtime.ResultTerminal {
			t.Fatalf("first run %s", first.Kind)
		}
		conformance.Eventually(t, "node-a to be idle", func() bool { return a.Idle() && e.Clock.Running() == 0 })
		a.WatchdogScan(context.Background())
		a.WatchdogScan(context.Background())
		if n := runtime.SessionsHeld(a); n != 0 {
			t.Fatalf("node-a holds %d sessions after two idle scans", n)
		}
		b := e.NewRuntime("node-b")
		run, _, err := b.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:two"})
		if err != nil {
			t.Fatal(err)
		}
		conformance.Eventually(t, "node-b to give the owned session up", func() bool { return b.Stats().Boundaries >= 1 && b.Idle() })
		reported := a.WatchdogScan(context.Background()) + a.WatchdogScan(context.Background())
		if reported != 1 {
			t.Fatalf("node-a's watchdog reported %d Runs, want the one submitted on node-b", reported)
		}
		done := storedTerminal(t, e, run.ID)
		if done.Status != loop.StatusCompleted {
			t.Fatalf("run %s (%+v)", done.Status, done.Failure)
		}
	})
}

// Recovery's deferral of an unavailable executor survives a restart:
// max_defer counts from the first deferral of any incarnation (recorded
// as EffectDeferred), not from each new process's start, so a node that
// keeps restarting cannot defer an attempt for ever.
func TestADeferralSurvivesARestart(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
		e.Crash(e.Runtime)
		e.Gate.Closed.Store(true)
		b := e.Recover("node-b")
		conformance.Eventually(t, "node-b to defer the attach", func() bool { return b.Recovery().Defer >= 1 })
		conformance.Eventually(t, "the deferral to be on record", func() bool {
			run, err := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
			return err == nil && run.Effect(res.Run.ID+".t1.0").DeferredSince != 0
		})
		// node-b dies in turn; by the time node-c takes over, max_defer
		// (30 s in this suite) has long passed since the first deferral.
		e.Crash(b)
		c := e.Recover("node-c")
		run := e.UntilTerminal(c, res.Run.ID, time.Second)
		if c.Recovery().Defer != 0 || c.Recovery().Fail != 1 {
			t.Fatalf("node-c deferred %d times and failed %d; max_defer had passed since node-b's first deferral",
				c.Recovery().Defer, c.Recovery().Fail)
		}
		if !strings.HasPrefix(run.Result, "error (executor_unavailable)") {
			t.Fatalf("result %q", run.Result)
		}
	})
}

// lostStartReply passes the first start of a slow job through to the
// executor, which begins the work, and then loses the reply: the runtime
// sees the executor as unavailable (an unreachable executor, a call past
// CallTimeout), not knowing that the work began.
type lostStartReply struct {
	runtime.Executor
	lost atomic.Bool
}

func (l *lostStartReply) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	reply, err := l.Executor.Start(ctx, c)
	if err == nil && c.Input.Effect.Tool == "slow" && l.lost.CompareAndSwap(false, true) {
		return abi.EffectReply{}, fmt.Errorf("the reply was lost on the way: %w", runtime.ErrExecutorUnavailable)
	}
	return reply, err
}

// A start (or poll) that finds the executor unavailable is handled as
// recovery handles an attach that does: the attempt's fate is unknown, so
// attach is asked again until max_defer, and the work the executor began
// is attached to, not started a second time under a new attempt. (The live
// path used to fail the attempt at once as executor_unavailable, while
// recovery deferred: two answers to one situation.)
func TestAnUnavailableExecutorIsDeferredToAttachAsInRecovery(t *testing.T) {
	var wrap *lostStartReply
	eachStore(t, func(tn *runtime.Tenant) {
		for i := range tn.Tools {
			if tn.Tools[i].Spec.Name == "slow" {
				wrap = &lostStartReply{Executor: tn.Tools[i].Executor}
				tn.Tools[i].Executor = wrap
			}
		}
	}, func(t *testing.T, e *conformance.RuntimeEnv) {
		res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
		run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
		if run.Status != loop.StatusCompleted || run.Result != "slow:x" {
			t.Fatalf("run %s, result %q: the job that began was lost", run.Status, run.Result)
		}
		if !wrap.lost.Load() {
			t.Fatal("the start reply was never lost")
		}
		key := loop.AssignmentKey{Tenant: "acme", Session: "s1", EffectID: run.ID + ".t1.0", Attempt: 1}.String()
		if n := e.Tools.CallsFor(abi.ExportStart, key); n != 1 {
			t.Fatalf("the job was started %d times", n)
		}
		if n := e.Tools.CallsFor(abi.ExportAttach, key); n < 1 {
			t.Fatal("the runtime never asked the executor to attach")
		}
		if r := e.Runtime.Recovery(); r.Defer < 1 || r.Reattach != 1 {
			t.Fatalf("decisions: defer %d, reattach %d", r.Defer, r.Reattach)
		}
	})
}

// The store writes a settlement that also dispatches the next effects,
// and the acknowledgement is lost. The retried commit finds the outcome
// applied already (stale news), and must still perform what the commit
// dispatched: the tool call used to stay executing on record with no one
// calling it. (Found by the metamorphic test with store faults, seed 168.)
func TestALostAcknowledgementOfASettlementStillPerformsItsDispatches(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		failCommitOnce(fs, conformance.FaultLostReply, func(cmd string) bool {
			return strings.HasPrefix(cmd, "settle/") && strings.HasSuffix(cmd, ".m1#1")
		})
		run, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: `call:echo({"text":"x"})|answer:$results`})
		if err != nil {
			t.Fatal(err)
		}
		done := storedTerminal(t, e, run.ID)
		if done.Status != loop.StatusCompleted || done.Result != "x" {
			t.Fatalf("run %s, result %q", done.Status, done.Result)
		}
		if len(fs.Injected()) != 1 {
			t.Fatalf("injected %v, want the one lost acknowledgement", fs.Injected())
		}
	})
}

// waitInjected waits until fs has injected n faults in all.
func waitInjected(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore, n int) {
	t.Helper()
	conformance.Eventually(t, "the fault to be injected", func() bool {
		if e.Clock.Running() == 0 {
			e.Clock.Advance(50 * time.Millisecond)
		}
		return len(fs.Injected()) >= n
	})
}

// A poll falls due and the read of its Run fails: the poll is tried again
// later. (The attempt used to be forgotten, executing on record with no
// one polling it. Found by the metamorphic test with store faults.)
func TestAPollWhoseRunCannotBeReadIsTriedAgain(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
		if res.Kind != runtime.ResultWaiting {
			t.Fatalf("result %s", res.Kind)
		}
		conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
		fs.FailNext("LoadRun", conformance.FaultError, 1) // the poll's read of the Run
		waitInjected(t, e, fs, 1)
		if done := storedTerminal(t, e, res.Run.ID); done.Status != loop.StatusCompleted || done.Result != "slow:x" {
			t.Fatalf("run %s, result %q", done.Status, done.Result)
		}
	})
}

// The store writes a submission and loses the reply: Submit reports the
// failure, and the session is driven all the same, so the Run it wrote
// does not wait for the watchdog.
func TestASubmissionWrittenDespiteAnErrorIsDriven(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		fs.FailNext("CreateRun", conformance.FaultLostReply, 1)
		_, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: "run_lost_ack", Input: "answer:ok"})
		if err == nil {
			t.Fatal("Submit reported success for a reply the store lost")
		}
		if done := storedTerminal(t, e, "run_lost_ack"); done.Status != loop.StatusCompleted {
			t.Fatalf("run %s", done.Status)
		}
		// On a store that writes a creation's first step, the lost reply
		// was the first step's too: the model call it dispatched was made
		// all the same, once, and the driver did not make that commit
		// again.
		commits := int64(2) // plan and dispatch; settle and complete
		if fs.StepsFirstRuns() {
			commits = 1
		}
		conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() })
		if c, n := e.Runtime.Stats().Commits, e.Model.Calls(abi.ExportStart); c != commits || n != 1 {
			t.Fatalf("%d commits after the creation and %d model starts; want %d and 1", c, n, commits)
		}
	})
}

// An approval is written and its reply lost; the commit also dispatched
// the next model step. The caller is told of the failure, and the session
// is driven all the same, so that step is performed.
func TestAnInputWrittenDespiteAnErrorIsPerformed(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		res := e.Execute("s1", `call:wire({"text":"w"})|answer:$results`)
		if res.Kind != runtime.ResultWaiting || len(res.Waiting.Approvals) != 1 {
			t.Fatalf("result %s %+v", res.Kind, res.Waiting)
		}
		fs.FailWhen(func(method string, args any) (conformance.FaultKind, bool) {
			c, ok := args.(runtime.Commit)
			return conformance.FaultLostReply, ok && strings.HasPrefix(c.CommandID, "approve/")
		})
		_, err := e.Runtime.Approve(context.Background(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: res.Waiting.Approvals[0], Approved: true}})
		if err == nil {
			t.Fatal("Approve reported success for a reply the store lost")
		}
		fs.FailWhen(nil)
		if done := storedTerminal(t, e, res.Run.ID); done.Status != loop.StatusCompleted || done.Result != "w" {
			t.Fatalf("run %s, result %q", done.Status, done.Result)
		}
	})
}

// Recovery's claim of an orphaned session is written and its reply lost:
// the session is handed to its driver all the same, which claims it again
// and finishes the Run, and the node is ready. (It used to stay owned on
// record by a node that never drove it, and the node never became ready.)
func TestARecoveryClaimWrittenDespiteAnErrorIsDriven(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
		e.Crash(e.Runtime)
		fs.FailNext("ClaimSessions", conformance.FaultLostReply, 1)
		b := e.Recover("node-b")
		if done := storedTerminal(t, e, res.Run.ID); done.Status != loop.StatusCompleted || done.Result != "slow:x" {
			t.Fatalf("run %s, result %q", done.Status, done.Result)
		}
		if len(fs.Injected()) != 1 || !b.Ready() {
			t.Fatalf("injected %v, ready %v", fs.Injected(), b.Ready())
		}
	})
}

// slowBuilder moves the fake clock while it builds, as a slow builder
// call takes time.
type slowBuilder struct {
	runtime.Builder
	clock *conformance.FakeClock
	took  time.Duration
}

func (b *slowBuilder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	b.clock.Set(b.clock.Now().Add(b.took))
	return b.Builder.Build(ctx, tenant, in)
}

// The events of a batch are stamped when they are applied: those after a
// slow builder call carry the time after it, so the model effect's
// timeout and the deadline count from its dispatch, not from before the
// build. (Every event of a batch used to carry the time read before the
// builder was called.)
func TestEventsAfterASlowBuildCarryTheTimeAfterIt(t *testing.T) {
	var slow *slowBuilder
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e := conformance.NewRuntimeEnv(t, h, func(tn *runtime.Tenant) {
				slow = &slowBuilder{Builder: tn.Builder, took: 7 * time.Second}
				tn.Builder = slow
			})
			slow.clock = e.Clock
			before := e.Clock.Now().UnixMilli()
			res := e.Execute("s1", "answer:late")
			if res.Kind != runtime.ResultTerminal {
				t.Fatalf("result %s", res.Kind)
			}
			evs, err := e.Store.Events(context.Background(), "acme", res.Run.ID, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				switch ev.Type {
				case loop.EventRunStarted:
					if ev.At != before {
						t.Errorf("run_started at %d, want %d (before the build)", ev.At, before)
					}
				case loop.EventModelStepPlanned, loop.EventEffectDispatched:
					if ev.At < before+7000 {
						t.Errorf("%s at %d, before the builder returned (%d)", ev.Type, ev.At, before+7000)
					}
				}
			}
		})
	}
}

// A Run whose session driver is backing off after a store error is not
// stuck: the driver will try again. The chaos bench on PostgreSQL saw the
// watchdog report such a Run after a database restart, when two scans
// fell inside one backoff of the driver. The watchdog must report only a
// Run that nothing will move, and the Run completes once the driver
// retries.
func TestARunWhoseDriverIsBackingOffIsNotReportedStuck(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		first := e.Execute("s1", "answer:one")
		if first.Kind != runtime.ResultTerminal {
			t.Fatalf("first run %s", first.Kind)
		}
		conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
		timers := e.Clock.Pending()
		fs.FailNext("ActiveRuns", conformance.FaultError, 1)
		run, _, err := e.Runtime.Submit(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:two"})
		if err != nil {
			t.Fatal(err)
		}
		// The driver's read failed: it waits for its backoff on the fake
		// clock, which does not move until the test moves it.
		conformance.Eventually(t, "the driver to back off", func() bool {
			return len(fs.Injected()) == 1 && e.Clock.Pending() > timers && e.Clock.Running() == 0
		})
		if n := e.Runtime.WatchdogScan(context.Background()) + e.Runtime.WatchdogScan(context.Background()); n != 0 {
			t.Fatalf("the watchdog reported %d Runs while the session's driver was backing off to retry", n)
		}
		done := storedTerminal(t, e, run.ID)
		if done.Status != loop.StatusCompleted {
			t.Fatalf("run %s (%+v)", done.Status, done.Failure)
		}
		if n := e.Runtime.Recovery().WatchdogReports; n != 0 {
			t.Fatalf("%d watchdog reports", n)
		}
	})
}

package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// RuntimePlugins are the builder and executors a RuntimeSuite run uses. The
// model executor must follow the conformance/script protocol, and the tool
// executor must offer the tools ScriptedTools describes, with the same
// behaviours.
type RuntimePlugins struct {
	Builder runtime.Builder
	Model   runtime.Executor
	Tools   runtime.Executor
	// Release unblocks every current and future call of the "block" tool.
	Release func()
}

// RuntimeHarness tells RuntimeSuite how to build what it tests.
type RuntimeHarness struct {
	// NewStore returns a fresh, empty store for one test.
	NewStore func(t *testing.T, clock runtime.Clock) runtime.Store
	// NewPlugins returns the plugins for one test; nil means the Go fakes
	// (EchoBuilder, ScriptedModel, ScriptedTools with SlowPolls 1).
	NewPlugins func(t *testing.T, store runtime.Store, clock runtime.Clock) RuntimePlugins
}

// RuntimeSuite holds a runtime.Runtime over the harness's store and plugins
// to its contract: start-up, write-ahead dispatch, outcome delivery through
// the Watcher, cancellation, approvals, input, retries, the deadline,
// terminal results, quiescent waits, queued Runs, detached settlement and
// loss of ownership.
func RuntimeSuite(t *testing.T, h RuntimeHarness) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *RuntimeEnv)
	}{
		{"two parallel tool calls complete with results in order", testParallelTools},
		{"a pending effect settles through the watcher", testPendingThroughWatcher},
		{"cancel with tools in flight sends cancel to the executors", testCancelInFlight},
		{"approvals by tool call id while other calls run", testApprovals},
		{"a run waiting for input resumes with it", testAwaitInput},
		{"an input made with IfSeq applies only at that version", testInputIfSeq},
		{"a retriable failure retries with backoff up to max attempts", testRetries},
		{"an unknown attempt falls under the tool's policy", testLostEffect},
		{"the deadline fails a run with an effect in flight", testDeadline},
		{"runs of a session queue and start in order", testQueuedRuns},
		{"cancelling execute's context does not lose the settlement", testDetachedSettlement},
		{"a second runtime cannot drive an owned session", testOwnership},
		{"a runtime that loses ownership stops at the boundary", testFencedAfterTakeover},
		{"usage is summed on the run and the session history reaches the builder", testUsageAndHistory},
		{"every settlement commit is a no-op the second time", testSettleOnce},
		{"recovery re-attaches a pending effect instead of running it again", testRecoveryReattaches},
		{"recovery retries an attempt the executor does not know", testRecoveryRetriesUnknown},
		{"recovery defers an unavailable executor without blocking other runs", testRecoveryDefers},
		{"recovery applies the policy once max_defer has passed", testRecoveryMaxDefer},
		{"the watchdog reports a stuck run and drives it again", testWatchdog},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, NewRuntimeEnv(t, h, nil))
		})
	}
}

// RuntimeEnv is one runtime under test with its store, clock and counted
// executors. For tests; not a stable API.
type RuntimeEnv struct {
	T       *testing.T
	Clock   *FakeClock
	Store   runtime.Store
	Runtime *runtime.Runtime
	Tenant  *runtime.Tenant
	Model   *CountingExecutor
	Tools   *CountingExecutor
	// Gate sits between Tools and the plugins' tool executor: closing it
	// makes the tools unavailable.
	Gate    *GateExecutor
	Plugins RuntimePlugins
	h       RuntimeHarness
}

// NewRuntimeEnv builds and starts a runtime for tenant "acme" with the
// harness's store and plugins. mutate may change the tenant first.
func NewRuntimeEnv(t *testing.T, h RuntimeHarness, mutate func(*runtime.Tenant)) *RuntimeEnv {
	t.Helper()
	clock := NewFakeClock(time.Time{})
	store := h.NewStore(t, clock)
	var p RuntimePlugins
	if h.NewPlugins != nil {
		p = h.NewPlugins(t, store, clock)
	} else {
		tools := &ScriptedTools{SlowPolls: 1}
		p = RuntimePlugins{Builder: &EchoBuilder{}, Model: &ScriptedModel{}, Tools: tools, Release: tools.Release}
	}
	gate := &GateExecutor{Next: p.Tools}
	e := &RuntimeEnv{T: t, Clock: clock, Store: store, Plugins: p, h: h, Gate: gate,
		Model: &CountingExecutor{Next: p.Model}, Tools: &CountingExecutor{Next: gate}}
	e.Tenant = &runtime.Tenant{
		ID: "acme", Builder: p.Builder, Model: e.Model,
		Limits:      loop.Limits{MaxSteps: 8, MaxToolCallsPerStep: 8, MaxParallelToolCalls: 4},
		ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 1000},
	}
	for _, tl := range (&ScriptedTools{}).Tools() {
		spec := loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}
		switch tl.Name {
		case "wire":
			spec.Approval = true
		case "flaky":
			spec.Policy = loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 4000}
		}
		e.Tenant.Tools = append(e.Tenant.Tools, runtime.Tool{Descriptor: tl, Spec: spec, Executor: e.Tools})
	}
	if mutate != nil {
		mutate(e.Tenant)
	}
	e.Runtime = e.NewRuntime("node-a")
	return e
}

// NewRuntime starts another runtime over the same store, clock and tenant,
// and waits for its first recovery pass.
func (e *RuntimeEnv) NewRuntime(nodeID string) *runtime.Runtime {
	e.T.Helper()
	return e.NewRuntimeOn(e.Store, e.Tenant, nodeID)
}

// NewRuntimeOn starts another runtime, on the same clock, over store (a
// handle on the same store, for several nodes) with tenant "acme" as
// given, and waits for its first recovery pass.
func (e *RuntimeEnv) NewRuntimeOn(store runtime.Store, tenant *runtime.Tenant, nodeID string) *runtime.Runtime {
	e.T.Helper()
	rt, err := e.startRuntime(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, NodeID: nodeID})
	if err != nil {
		e.T.Fatal(err)
	}
	return rt
}

// startRuntime starts a runtime on the suite's clock and timings with the
// given Options' Store, Tenants, NodeID and NodeName, waits for its first
// recovery pass, and stops it at cleanup. It returns Start's error.
func (e *RuntimeEnv) startRuntime(opts runtime.Options) (*runtime.Runtime, error) {
	e.T.Helper()
	opts.Clock, opts.PollMin, opts.PollMax, opts.LeaseTTL = e.Clock, 100*time.Millisecond, time.Second, time.Minute
	opts.MaxDefer, opts.RecoveryInterval, opts.WatchdogInterval = 30*time.Second, time.Hour, time.Hour
	rt, err := runtime.New(opts)
	if err != nil {
		e.T.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		return nil, err
	}
	// Its first recovery pass takes over every session with a Run and no
	// live owner; let it finish before the test creates any.
	Eventually(e.T, rt.NodeID()+"'s first recovery pass", rt.Ready)
	e.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	return rt, nil
}

func (e *RuntimeEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	e.T.Cleanup(cancel)
	return ctx
}

// Execute runs a Run in session s with the given script as input.
func (e *RuntimeEnv) Execute(session, input string) runtime.Result {
	e.T.Helper()
	res, err := e.Runtime.Execute(e.ctx(), runtime.Request{Tenant: "acme", Session: session, Input: input})
	if err != nil {
		e.T.Fatalf("execute %q: %v", input, err)
	}
	return res
}

// maxJump bounds one move of the fake clock in UntilTerminal; it is well
// under the suite's lease renewal period (LeaseTTL/3 = 20s).
const maxJump = 5 * time.Second

// UntilTerminal waits for a Run to end, moving the fake clock to the Run's
// next timer (or by step) whenever it is quiescent.
func (e *RuntimeEnv) UntilTerminal(rt *runtime.Runtime, runID string, step time.Duration) loop.Run {
	e.T.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		res, err := rt.Wait(ctx, "acme", runID)
		cancel()
		if err == nil && res.Kind == runtime.ResultTerminal {
			return res.Run
		}
		if err == nil && res.Kind == runtime.ResultBoundary {
			e.T.Fatalf("run %s hit an ownership boundary: %v", runID, res.Err)
		}
		// Time moves only once every clock callback has returned: one that
		// fired at the last move (a lease renewal) must run, and re-arm,
		// before the clock passes its next instant, as it would in a real
		// process whose clock does not jump. Otherwise a quick succession
		// of moves here carries time past the lease while the renewal is
		// still on its way.
		for e.Clock.Running() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // a condition poll's cadence
		}
		// Jump to the next timer, but never by more than maxJump: a far
		// timer (the recovery interval) must not carry time past a lease
		// whose renewal is being re-armed.
		if next, ok := e.Clock.NextAt(); ok && next.After(e.Clock.Now()) && next.Sub(e.Clock.Now()) <= maxJump {
			e.Clock.Set(next)
		} else {
			e.Clock.Advance(step)
		}
	}
	run, _ := e.Store.LoadRun(context.Background(), "acme", runID)
	e.T.Fatalf("run %s not terminal in time: status %s, effects %+v", runID, run.Status, run.Effects)
	return loop.Run{}
}

// WaitUntil polls cond until it reports true, failing tb at the deadline
// with what it waited for and cond's last error. The poll interval is a
// condition check's cadence, not a wait for time to pass.
func WaitUntil(tb testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			tb.Fatalf("waited %s for %s; last error: %v", timeout, what, last)
		}
		<-tick.C
	}
}

// Eventually waits for cond, failing the test after a deadline.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func wantStatus(t *testing.T, run loop.Run, s loop.Status) {
	t.Helper()
	if run.Status != s {
		t.Fatalf("run %s is %s, want %s (failure %+v, result %q)", run.ID, run.Status, s, run.Failure, run.Result)
	}
}

func testParallelTools(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:echo({"text":"5"}),echo({"text":"20"})|answer:sums $results`)
	if res.Kind != runtime.ResultTerminal {
		t.Fatalf("result %s, want terminal", res.Kind)
	}
	wantStatus(t, res.Run, loop.StatusCompleted)
	if res.Run.Result != "sums 5,20" {
		t.Fatalf("result %q", res.Run.Result)
	}
	var order []string
	for _, m := range res.Run.Transcript {
		if m.Role == abi.MessageTool {
			order = append(order, m.ToolCallID+"="+m.Content)
		}
	}
	if strings.Join(order, " ") != "call_1_1=5 call_1_2=20" {
		t.Fatalf("tool results out of order: %v", order)
	}
	if e.Tools.Calls(abi.ExportStart) != 2 || e.Model.Calls(abi.ExportStart) != 2 {
		t.Fatalf("starts: tools %d model %d", e.Tools.Calls(abi.ExportStart), e.Model.Calls(abi.ExportStart))
	}
	evs, err := e.Store.Events(context.Background(), "acme", res.Run.ID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Write-ahead: every settlement follows the dispatch of its attempt.
	dispatched := map[string]bool{}
	for _, ev := range evs {
		switch ev.Type {
		case loop.EventEffectDispatched:
			dispatched[ev.EffectID] = true
		case loop.EventEffectSettled:
			if !dispatched[ev.EffectID] {
				t.Fatalf("%s settled before it was dispatched", ev.EffectID)
			}
		}
	}
}

func testPendingThroughWatcher(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:slow({"text":"job"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting || res.Waiting == nil || len(res.Waiting.Pending) != 1 {
		t.Fatalf("want a quiescent wait on a pending effect, got %s %+v", res.Kind, res.Waiting)
	}
	if e.Runtime.Stats().WatcherQueueDepth == 0 {
		t.Fatal("the pending effect is not registered with the watcher")
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if run.Result != "slow:job" || e.Tools.Calls(abi.ExportPoll) < 1 {
		t.Fatalf("result %q after %d polls", run.Result, e.Tools.Calls(abi.ExportPoll))
	}
}

func testCancelInFlight(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:slow({"text":"a"}),slow({"text":"b"})|answer:never`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	if _, err := e.Runtime.Cancel(e.ctx(), "acme", res.Run.ID, "user asked"); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCancelled)
	if got := e.Tools.Calls(abi.ExportCancel); got != 2 {
		t.Fatalf("executors received %d cancels, want 2", got)
	}
	if run.Failure == nil || run.Failure.Message != "user asked" {
		t.Fatalf("failure %+v", run.Failure)
	}
	if _, err := e.Runtime.Cancel(e.ctx(), "acme", res.Run.ID, "again"); !errors.Is(err, loop.ErrTerminal) {
		t.Fatalf("cancel of a terminal run: %v", err)
	}
}

func testApprovals(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:wire({"text":"w1"}),slow({"text":"s"}),wire({"text":"w2"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting || len(res.Waiting.Approvals) != 2 || res.Waiting.Approvals[0] != "call_1_1" {
		t.Fatalf("want two approvals waiting, got %s %+v", res.Kind, res.Waiting)
	}
	if _, err := e.Runtime.Approve(e.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "nope", Approved: true}}); !errors.Is(err, loop.ErrUnknownToolCall) {
		t.Fatalf("approval of an unknown call: %v", err)
	}
	if _, err := e.Runtime.Approve(e.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{
		{ToolCallID: "call_1_1", Approved: true}, {ToolCallID: "call_1_3", Approved: false, Reason: "not today"}}); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if !strings.HasPrefix(run.Result, "w1,slow:s,error (approval_denied): the call was denied: not today") {
		t.Fatalf("result %q", run.Result)
	}
}

func testInputIfSeq(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `ask:Which city?|ask:Which day?|answer:ok`)
	if res.Kind != runtime.ResultWaiting || res.Waiting.Input == nil {
		t.Fatalf("want a wait for input, got %s %+v", res.Kind, res.Waiting)
	}
	first := res.Run.Seq
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", res.Run.ID, "Paris", runtime.IfSeq(first-1)); !errors.Is(err, runtime.ErrRunChanged) {
		t.Fatalf("an input naming an older version: %v, want ErrRunChanged", err)
	}
	if run, err := e.Runtime.LoadRun(e.ctx(), "acme", res.Run.ID); err != nil || run.Seq != first {
		t.Fatalf("a refused input wrote: seq %d, want %d (%v)", run.Seq, first, err)
	}
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", res.Run.ID, "Paris", runtime.IfSeq(first)); err != nil {
		t.Fatal(err)
	}
	// The Run asks its second question. The first answer, sent again with
	// the version it was meant for (a retry), must not answer it.
	second, err := e.Runtime.Wait(e.ctx(), "acme", res.Run.ID)
	if err != nil || second.Waiting == nil || second.Waiting.Input == nil || second.Waiting.Input.Prompt != "Which day?" {
		t.Fatalf("want the second question, got %+v %v", second.Waiting, err)
	}
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", res.Run.ID, "Paris", runtime.IfSeq(first)); !errors.Is(err, runtime.ErrRunChanged) {
		t.Fatalf("a retried answer to the first question: %v, want ErrRunChanged", err)
	}
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", res.Run.ID, "Monday", runtime.IfSeq(second.Run.Seq)); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	var inputs []string
	for _, m := range run.Transcript {
		if m.Role == abi.MessageUser {
			inputs = append(inputs, m.Content)
		}
	}
	if got := strings.Join(inputs, ","); !strings.HasSuffix(got, "Paris,Monday") || strings.Count(got, "Paris") != 1 {
		t.Fatalf("user messages %q", got)
	}
	if _, err := e.Runtime.Cancel(e.ctx(), "acme", res.Run.ID, "late", runtime.IfSeq(second.Run.Seq)); !errors.Is(err, runtime.ErrRunChanged) {
		t.Fatalf("a cancel naming an older version of an ended Run: %v, want ErrRunChanged", err)
	}
}

func testAwaitInput(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `ask:Which city?|answer:ok`)
	if res.Kind != runtime.ResultWaiting || res.Waiting.Input == nil || res.Waiting.Input.Prompt != "Which city?" {
		t.Fatalf("want a wait for input, got %s %+v", res.Kind, res.Waiting)
	}
	wantStatus(t, res.Run, loop.StatusWaiting)
	if _, err := e.Runtime.Approve(e.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "x", Approved: true}}); err == nil {
		t.Fatal("an approval for a run waiting for input must be refused")
	}
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", res.Run.ID, "Paris"); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if n := len(run.Transcript); n < 2 || run.Transcript[n-2].Content != "Paris" {
		t.Fatalf("transcript %+v", run.Transcript)
	}
}

func testRetries(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:flaky()|answer:$results`)
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 500*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if run.Result != "flaky ok on attempt 2" {
		t.Fatalf("result %q", run.Result)
	}
	if e.Tools.Calls(abi.ExportStart) != 2 {
		t.Fatalf("starts %d, want 2: %v", e.Tools.Calls(abi.ExportStart), e.Tools.Keys())
	}
}

func testLostEffect(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:lost()|answer:$results`)
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if !strings.HasPrefix(run.Result, "error (lost)") {
		t.Fatalf("result %q: an unknown attempt of a fail-policy tool must become a lost tool error", run.Result)
	}
}

func testDeadline(t *testing.T, e *RuntimeEnv) {
	e.Tenant.RunTimeout = 10 * time.Second
	res := e.Execute("s1", `call:slow()|answer:never`)
	e.Clock.Advance(11 * time.Second)
	run := e.UntilTerminal(e.Runtime, res.Run.ID, time.Second)
	wantStatus(t, run, loop.StatusFailed)
	if run.Failure.Class != abi.ClassDeadlineExceeded {
		t.Fatalf("failure %+v", run.Failure)
	}
}

func testQueuedRuns(t *testing.T, e *RuntimeEnv) {
	first := e.Execute("s1", `ask:first?|answer:one`)
	second := e.Execute("s1", `answer:two`)
	if second.Kind != runtime.ResultWaiting || second.Waiting == nil || !second.Waiting.Queued {
		t.Fatalf("second run: %s %+v, want queued", second.Kind, second.Waiting)
	}
	wantStatus(t, second.Run, loop.StatusPending)
	if _, err := e.Runtime.ProvideInput(e.ctx(), "acme", first.Run.ID, "go"); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.UntilTerminal(e.Runtime, first.Run.ID, 100*time.Millisecond), loop.StatusCompleted)
	run := e.UntilTerminal(e.Runtime, second.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	runs, err := e.Store.SessionRuns(context.Background(), "acme", "s1", 0, 0)
	if err != nil || len(runs) != 2 || runs[0].Run.ID != first.Run.ID {
		t.Fatalf("session order %v %v", runs, err)
	}
	if first, _ := e.Store.LoadRun(context.Background(), "acme", first.Run.ID); first.UpdatedAt > run.UpdatedAt {
		t.Fatal("the second run finished before the first")
	}
}

func testDetachedSettlement(t *testing.T, e *RuntimeEnv) {
	ctx, cancel := context.WithCancel(context.Background())
	runID := runtime.NewRunID(e.Clock.Now())
	done := make(chan error, 1)
	go func() {
		_, err := e.Runtime.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
		done <- err
	}()
	Eventually(t, "the block tool to be started", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("execute returned %v, want context.Canceled", err)
	}
	e.Plugins.Release()
	run := e.UntilTerminal(e.Runtime, runID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if run.Result != "unblocked" {
		t.Fatalf("result %q", run.Result)
	}
}

func testOwnership(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `ask:hold?|answer:ok`)
	wantStatus(t, res.Run, loop.StatusWaiting)
	b := e.NewRuntime("node-b")
	out, err := b.Execute(e.ctx(), runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:b"})
	if err != nil {
		t.Fatal(err)
	}
	if out.Kind != runtime.ResultBoundary || !errors.Is(out.Err, runtime.ErrSessionOwned) {
		t.Fatalf("node-b drove an owned session: %s %v", out.Kind, out.Err)
	}
	if _, err := b.ProvideInput(e.ctx(), "acme", res.Run.ID, "x"); !errors.Is(err, runtime.ErrSessionOwned) {
		t.Fatalf("node-b answered a run of an owned session: %v", err)
	}
}

func testFencedAfterTakeover(t *testing.T, e *RuntimeEnv) {
	runID := runtime.NewRunID(e.Clock.Now())
	go func() {
		_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
	}()
	Eventually(t, "node-a to start the block tool", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
	// Fake time jumps past node-a's lease: its next renewal finds the lease
	// gone, and node-b may take the session over.
	e.Clock.Advance(5 * time.Minute)
	Eventually(t, "node-a to report the boundary", func() bool { return e.Runtime.Stats().Boundaries > 0 })
	Eventually(t, "node-a to say its lease is lost", func() bool {
		select {
		case <-e.Runtime.LeaseLost():
			return true
		default:
			return false
		}
	})
	if e.Runtime.Ready() {
		t.Fatal("node-a says it is ready after its lease was lost")
	}
	b := e.NewRuntime("node-b")
	run := e.UntilTerminal(b, runID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if !strings.HasPrefix(run.Result, "error (lost)") || e.Tools.Calls(abi.ExportAttach) != 1 {
		t.Fatalf("node-b must attach the orphaned call and settle it by policy: result %q, attaches %d", run.Result, e.Tools.Calls(abi.ExportAttach))
	}
	// node-a cancelled its calls when it lost its lease: its block call
	// ended with nothing to report, and no outcome of node-a's settles
	// anything (the check below).
	e.Plugins.Release()
	Eventually(t, "node-a's calls to be cancelled", e.Runtime.Idle)
	evs, err := e.Store.Events(context.Background(), "acme", runID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == loop.EventEffectSettled && ev.EffectID == runID+".t1.0" && ev.Outcome.Error == nil {
			t.Fatalf("the fenced node's outcome settled the effect: %+v", ev.Outcome)
		}
	}
}

func testUsageAndHistory(t *testing.T, e *RuntimeEnv) {
	first := e.Execute("s1", `call:echo({"text":"x"})|answer:done`)
	wantStatus(t, first.Run, loop.StatusCompleted)
	if first.Run.Usage.InputTokens != 20 || first.Run.Usage.OutputTokens != 10 {
		t.Fatalf("usage %+v, want two steps of 10/5", first.Run.Usage)
	}
	// The second Run's script is read from the first user message, which is
	// now the first Run's input in the history: it replays that script.
	second := e.Execute("s1", `answer:second`)
	wantStatus(t, second.Run, loop.StatusCompleted)
	if second.Run.Result != "script exhausted" {
		t.Fatalf("the builder did not see the session history: result %q", second.Run.Result)
	}
}

func testSettleOnce(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:echo({"text":"once"})|answer:$results`)
	wantStatus(t, res.Run, loop.StatusCompleted)
	evs, err := e.Store.Events(context.Background(), "acme", res.Run.ID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	settled := map[string]int{}
	for _, ev := range evs {
		if ev.Type == loop.EventEffectSettled {
			settled[loop.SettleCommandID(ev.EffectID, ev.Attempt)]++
		}
	}
	for k, n := range settled {
		if n != 1 {
			t.Fatalf("%s settled %d times", k, n)
		}
	}
	// A settlement repeated under its command ID writes nothing.
	run, _ := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
	cr, err := e.Store.Commit(context.Background(), runtime.Commit{Tenant: "acme", Session: "s1", RunID: run.ID,
		CommandID: loop.SettleCommandID(run.ID+".t1.0", 1), ExpectedSeq: 0, Epoch: 0, Run: run})
	if err != nil || !cr.Duplicate {
		t.Fatalf("repeated settlement: %+v %v", cr, err)
	}
}

// Crash halts rt as a crash would and moves time past its lease, so that
// another incarnation may take its sessions over.
func (e *RuntimeEnv) Crash(rt *runtime.Runtime) {
	rt.Halt()
	e.Clock.Advance(2 * time.Minute)
}

// Recover starts a new incarnation and waits for its first recovery pass.
func (e *RuntimeEnv) Recover(nodeID string) *runtime.Runtime {
	e.T.Helper()
	rt := e.NewRuntime(nodeID)
	Eventually(e.T, nodeID+" to be ready", rt.Ready)
	return rt
}

func testRecoveryReattaches(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	e.Crash(e.Runtime)
	b := e.Recover("node-b")
	run := e.UntilTerminal(b, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	key := loop.AssignmentKey{Tenant: "acme", Session: "s1", EffectID: run.ID + ".t1.0", Attempt: 1}.String()
	if n := e.Tools.CallsFor(abi.ExportStart, key); n != 1 {
		t.Fatalf("the slow job was started %d times; recovery must re-attach, not re-execute", n)
	}
	if e.Tools.CallsFor(abi.ExportAttach, key) != 1 || b.Recovery().Reattach != 1 || b.Recovery().SessionsTaken != 1 {
		t.Fatalf("attach %d, reattach decisions %d, sessions taken %d", e.Tools.CallsFor(abi.ExportAttach, key),
			b.Recovery().Reattach, b.Recovery().SessionsTaken)
	}
	if run.Result != "slow:x" {
		t.Fatalf("result %q", run.Result)
	}
}

func testRecoveryRetriesUnknown(t *testing.T, e *RuntimeEnv) {
	for i := range e.Tenant.Tools {
		if e.Tenant.Tools[i].Spec.Name == "block" {
			e.Tenant.Tools[i].Spec.Policy = loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 1000}
		}
	}
	runID := runtime.NewRunID(e.Clock.Now())
	go func() {
		_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
	}()
	Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
	e.Crash(e.Runtime)
	b := e.Recover("node-b")
	Eventually(t, "attempt 2 to start", func() bool {
		if e.Tools.Calls(abi.ExportStart) < 2 {
			e.Clock.Advance(500 * time.Millisecond)
			return false
		}
		return true
	})
	e.Plugins.Release()
	run := e.UntilTerminal(b, runID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if run.Result != "unblocked" || b.Recovery().Retry != 1 {
		t.Fatalf("result %q, retry decisions %d", run.Result, b.Recovery().Retry)
	}
}

func testRecoveryDefers(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
	e.Crash(e.Runtime)
	e.Gate.Closed.Store(true)
	b := e.Recover("node-b")
	Eventually(t, "a deferral", func() bool { return b.Recovery().Defer >= 1 })
	// The deferred record blocks no one: another session runs to the end.
	other, err := b.Execute(e.ctx(), runtime.Request{Tenant: "acme", Session: "s2", Input: "answer:free"})
	if err != nil || other.Kind != runtime.ResultTerminal || other.Run.Result != "free" {
		t.Fatalf("another session was held up: %v %s %q", err, other.Kind, other.Run.Result)
	}
	run, _ := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
	wantStatus(t, run, loop.StatusRunning)
	e.Gate.Closed.Store(false)
	run = e.UntilTerminal(b, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, run, loop.StatusCompleted)
	if run.Result != "slow:x" || b.Recovery().Reattach != 1 {
		t.Fatalf("result %q, reattach %d", run.Result, b.Recovery().Reattach)
	}
}

func testRecoveryMaxDefer(t *testing.T, e *RuntimeEnv) {
	res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
	e.Crash(e.Runtime)
	e.Gate.Closed.Store(true)
	b := e.Recover("node-b")
	Eventually(t, "a deferral", func() bool { return b.Recovery().Defer >= 1 })
	e.Clock.Advance(31 * time.Second) // past max_defer (30s in this suite)
	run := e.UntilTerminal(b, res.Run.ID, time.Second)
	wantStatus(t, run, loop.StatusCompleted)
	if !strings.HasPrefix(run.Result, "error (executor_unavailable)") || b.Recovery().Fail != 1 {
		t.Fatalf("result %q, fail decisions %d", run.Result, b.Recovery().Fail)
	}
}

func testWatchdog(t *testing.T, e *RuntimeEnv) {
	first := e.Execute("s1", "answer:one")
	wantStatus(t, first.Run, loop.StatusCompleted)
	// Once the runtime is idle, a Run written behind its back: on record,
	// but no driver knows of it.
	Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() && e.Clock.Running() == 0 })
	// One scan finds the session idle: it stays watched (a session is
	// forgotten only at its second idle scan in a row).
	if n := e.Runtime.WatchdogScan(context.Background()); n != 0 {
		t.Fatalf("a scan of an idle session reported %d", n)
	}
	ev := loop.RunCreated(loop.Spec{Tenant: "acme", Session: "s1", ID: "run_orphan", Input: "answer:two",
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 2}, ModelPolicy: loop.DefaultModelPolicy}, e.Clock.Now().UnixMilli())
	ev.Seq = 1
	run, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Store.CreateRun(context.Background(), runtime.CreateRun{Run: run, Event: ev}); err != nil {
		t.Fatal(err)
	}
	if n := e.Runtime.WatchdogScan(context.Background()); n != 0 {
		t.Fatalf("first scan reported %d; a run is only reported when seen stuck twice", n)
	}
	if n := e.Runtime.WatchdogScan(context.Background()); n != 1 || e.Runtime.Recovery().WatchdogReports != 1 {
		t.Fatalf("second scan reported %d", n)
	}
	done := e.UntilTerminal(e.Runtime, "run_orphan", 100*time.Millisecond)
	wantStatus(t, done, loop.StatusCompleted)
	if n := e.Runtime.WatchdogScan(context.Background()); n != 0 {
		t.Fatalf("a finished run was reported: %d", n)
	}
}

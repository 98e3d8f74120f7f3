package runtime_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// deadlineRecorder is a tool executor that notes the effect.deadline_ms
// of each start, by tool.
type deadlineRecorder struct {
	runtime.Executor
	mu   *sync.Mutex
	seen map[string]int64
}

func (d deadlineRecorder) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	d.mu.Lock()
	d.seen[c.Input.Effect.Tool] = c.Input.Effect.DeadlineMS
	d.mu.Unlock()
	return d.Executor.Start(ctx, c)
}

// newWaitLimitsEnv is the conformance env with the tenant's run_timeout
// and wait_timeout, its tools behind rec.
func newWaitLimitsEnv(t *testing.T, run, wait time.Duration, rec *deadlineRecorder) *conformance.RuntimeEnv {
	return conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}, func(tn *runtime.Tenant) {
		tn.RunTimeout, tn.WaitTimeout = run, wait
		if rec != nil {
			for i := range tn.Tools {
				tn.Tools[i].Executor = deadlineRecorder{Executor: tn.Tools[i].Executor, mu: rec.mu, seen: rec.seen}
			}
		}
	})
}

// TestNewRunsBoundWorkTimeAndWaits: a new Run carries the tenant's
// run_timeout and wait_timeout, not an absolute deadline; while it waits
// for an approval its one timer is the end of its wait; and an executor
// is given the Run's work deadline, which the wait moved on.
func TestNewRunsBoundWorkTimeAndWaits(t *testing.T) {
	rec := &deadlineRecorder{mu: &sync.Mutex{}, seen: map[string]int64{}}
	e := newWaitLimitsEnv(t, 10*time.Minute, time.Hour, rec)
	res := e.Execute("s1", `call:wire({"text":"w"})|call:echo({"text":"e"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting || res.Run.Status != loop.StatusWaiting {
		t.Fatalf("result %s, status %s; want a Run waiting for an approval", res.Kind, res.Run.Status)
	}
	run := res.Run
	if l := run.Limits; l.DeadlineMS != 0 || l.RunTimeoutMS != (10*time.Minute).Milliseconds() || l.WaitTimeoutMS != time.Hour.Milliseconds() {
		t.Fatalf("limits %+v: want run_timeout 10m and wait_timeout 1h, no deadline", l)
	}
	if want := run.WaitingSince + time.Hour.Milliseconds(); res.Waiting.WakeAtMS != want {
		t.Fatalf("wakes at %d while waiting, want only the end of the wait, %d", res.Waiting.WakeAtMS, want)
	}

	e.Clock.Advance(30 * time.Second)
	if _, err := e.Runtime.Approve(context.Background(), "acme", run.ID, []abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatal(err)
	}
	done := e.UntilTerminal(e.Runtime, run.ID, 100*time.Millisecond)
	if done.Status != loop.StatusCompleted || done.WaitedMS != (30*time.Second).Milliseconds() {
		t.Fatalf("status %s (failure %+v), waited %d ms; want completed after 30 s waited", done.Status, done.Failure, done.WaitedMS)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := run.CreatedAt + (10*time.Minute + 30*time.Second).Milliseconds()
	for _, tool := range []string{"wire", "echo"} {
		if got := rec.seen[tool]; got != want {
			t.Errorf("%s was started with deadline_ms %d, want creation + run_timeout + the wait, %d", tool, got, want)
		}
	}
}

// TestARecoveredNodeWakesAWaitingRunAtItsWaitDeadline: the node that
// takes a waiting Run's session over after a crash asks for the wake-up
// at the end of its wait, and the Run fails then, naming the call it
// waited for.
func TestARecoveredNodeWakesAWaitingRunAtItsWaitDeadline(t *testing.T) {
	e := newWaitLimitsEnv(t, 0, 3*time.Minute, nil)
	res := e.Execute("s1", `call:wire({"text":"w"})|answer:$results`)
	if res.Run.Status != loop.StatusWaiting {
		t.Fatalf("status %s, want waiting", res.Run.Status)
	}
	e.Crash(e.Runtime) // two minutes of the wait pass
	b := e.Recover("node-b")
	run := e.UntilTerminal(b, res.Run.ID, time.Second)
	if run.Status != loop.StatusFailed || run.Failure.Class != abi.ClassDeadlineExceeded ||
		!strings.Contains(run.Failure.Message, "wait_timeout of 3m0s passed at") ||
		!strings.Contains(run.Failure.Message, "waited for a person's approval of tool call call_1_1 (tool wire)") {
		t.Fatalf("status %s, failure %+v; want deadline_exceeded naming the wait", run.Status, run.Failure)
	}
	if end := res.Run.WaitingSince + (3 * time.Minute).Milliseconds(); run.UpdatedAt < end {
		t.Fatalf("failed at %d, before the end of the wait at %d", run.UpdatedAt, end)
	}
}

package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// stepClock moves the fake clock to target in steps, each once no clock
// callback is running (a renewal must finish, and re-arm, before the next
// step), as time passes in a real process.
func stepClock(t *testing.T, c *conformance.FakeClock, target time.Time, step time.Duration) {
	t.Helper()
	for c.Now().Before(target) {
		conformance.Eventually(t, "the clock's callbacks to return", func() bool { return c.Running() == 0 })
		next := c.Now().Add(step)
		if next.After(target) {
			next = target
		}
		c.Set(next)
	}
	conformance.Eventually(t, "the clock's callbacks to return", func() bool { return c.Running() == 0 })
}

// A node whose renewals keep failing (the store is unreachable, not
// saying the lease expired) gives its lease up once no renewal has
// succeeded within the trust window, LeaseTTL minus a fifth of it from the
// start of the last good one, and not before; it then cancels the calls
// still running. (It used to retry for ever while it kept calling
// executors, past the point where another node may own its sessions.)
func TestALeaseThatCannotBeRenewedIsLostWithinItsTrustWindow(t *testing.T) {
	eachStoreWithFaults(t, func(t *testing.T, e *conformance.RuntimeEnv, fs *conformance.FaultStore) {
		start := e.Clock.Now() // node-a registered now; LeaseTTL is 1 min in the suite
		fs.FailWhen(func(method string, _ any) (conformance.FaultKind, bool) {
			return conformance.FaultError, method == "RenewNode"
		})
		runID := runtime.NewRunID(e.Clock.Now())
		go func() {
			_, _ = e.Runtime.Execute(context.Background(), runtime.Request{Tenant: "acme", Session: "s1", RunID: runID, Input: `call:block()|answer:$results`})
		}()
		conformance.Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })

		stepClock(t, e.Clock, start.Add(47*time.Second), time.Second)
		select {
		case <-e.Runtime.LeaseLost():
			t.Fatal("the lease was given up inside its trust window (48 s of a 60 s lease)")
		default:
		}
		stepClock(t, e.Clock, start.Add(50*time.Second), time.Second)
		select {
		case <-e.Runtime.LeaseLost():
		default:
			t.Fatal("no renewal succeeded for 50 s of a 60 s lease, and the node still trusts it")
		}
		if e.Runtime.Ready() {
			t.Fatal("Ready after the lease was lost")
		}
		// The block call, which ignores everything but its context, was
		// cancelled: the runtime is idle, and nothing settled the effect
		// (its record stays executing for recovery).
		conformance.Eventually(t, "the block call to be cancelled", e.Runtime.Idle)
		run, err := e.Store.LoadRun(context.Background(), "acme", runID)
		if err != nil {
			t.Fatal(err)
		}
		if eff := run.Effect(runID + ".t1.0"); eff == nil || eff.State != loop.EffectExecuting {
			t.Fatalf("effect %+v, want it executing on record, for recovery", eff)
		}
	})
}

// Follow re-reads the log on the runtime's Clock when no notice comes (a
// commit by another process publishes none here), not on a wall-clock
// ticker that a test cannot drive.
func TestFollowFallsBackToReadingTheLogOnTheClock(t *testing.T) {
	eachStore(t, nil, func(t *testing.T, e *conformance.RuntimeEnv) {
		res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
		if res.Kind != runtime.ResultWaiting {
			t.Fatalf("result %s", res.Kind)
		}
		b := e.NewRuntime("node-b") // another process: its own hub hears nothing of node-a's commits
		timers := e.Clock.Pending()
		seen := make(chan int64, 64)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			_ = b.Follow(ctx, "acme", res.Run.ID, res.Run.Seq+1, func(it runtime.StreamItem) error {
				if it.Event != nil {
					seen <- it.Event.Seq
				}
				return nil
			})
		}()
		conformance.Eventually(t, "Follow to arm its fallback on the Clock", func() bool { return e.Clock.Pending() > timers })
		// node-a moves the Run on; node-b's hub hears nothing of it.
		run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
		conformance.Eventually(t, "node-b's Follow to read the log on its fallback", func() bool {
			select {
			case s := <-seen:
				return s == run.Seq
			default:
				if e.Clock.Running() == 0 {
					e.Clock.Advance(time.Second)
				}
				return false
			}
		})
	})
}

package runtime_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// heldLoads is a Store whose LoadRun, once armed, holds the first
// snapshot of a Run that finds two tool calls executing until release is
// closed, whether an advance loads it or takes it as a guess (hold, set
// as the runtime's guess hook): the advance of the first tool's
// settlement then waits, holding the Run's lock, while the second
// settlement queues behind it.
type heldLoads struct {
	runtime.Store
	armed   atomic.Bool
	once    sync.Once
	held    chan struct{} // closed when a load is held
	release chan struct{}
	loads   atomic.Int64 // LoadRun calls
	actives atomic.Int64 // ActiveRuns calls
}

func (s *heldLoads) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	s.loads.Add(1)
	r, err := s.Store.LoadRun(ctx, tenant, runID)
	if err == nil {
		_ = s.hold(r)
	}
	return r, err
}

func (s *heldLoads) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	s.actives.Add(1)
	return s.Store.ActiveRuns(ctx, tenant, session)
}

// hold holds the first snapshot, once armed, with two tool calls
// executing; it lets every guess be taken.
func (s *heldLoads) hold(r loop.Run) bool {
	executing := 0
	for _, e := range r.Effects {
		if e.Kind == abi.KindTool && e.State == loop.EffectExecuting {
			executing++
		}
	}
	if executing == 2 && s.armed.Load() {
		hold := false
		s.once.Do(func() { hold = true })
		if hold {
			close(s.held)
			<-s.release
		}
	}
	return true
}

// Two tool calls of a step that answer together are settled in one
// commit: the advance of the first takes the second, queued meanwhile,
// along (settlequeue), closes the step, plans and dispatches the next
// model step in the same commit, and records both settlement command IDs.
// The owner of the second finds it committed and advances no further: it
// reads nothing. The Run's last commit leaves the session idle, so no
// driver pass looks for a next Run.
func TestSettlementsThatArriveTogetherShareACommit(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			var hl *heldLoads
			hh := h
			hh.NewStore = func(t *testing.T, clock runtime.Clock) runtime.Store {
				hl = &heldLoads{Store: h.NewStore(t, clock), held: make(chan struct{}), release: make(chan struct{})}
				return hl
			}
			e := conformance.NewRuntimeEnv(t, hh, nil)
			runtime.SetGuessHook(e.Runtime, hl.hold)
			hl.armed.Store(true)
			done := make(chan runtime.Result, 1)
			go func() { done <- e.Execute("s1", `call:echo({"text":"a"}),echo({"text":"b"})|answer:$results`) }()
			<-hl.held
			conformance.Eventually(t, "both settlements to queue", func() bool { return runtime.QueuedSettlements(e.Runtime) == 2 })
			close(hl.release)
			res := <-done
			if n := hl.loads.Load(); n != 0 {
				t.Errorf("%d loads of the Run; want none: every advance starts from a snapshot this node committed", n)
			}
			conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() })
			if n := hl.actives.Load(); n != 0 {
				t.Errorf("%d reads of the session's active Runs; want none: the creation and the end say what they are", n)
			}
			run := storedTerminal(t, e, res.Run.ID)
			if run.Status != loop.StatusCompleted || run.Result != "a,b" {
				t.Fatalf("run %s, result %q", run.Status, run.Result)
			}
			if n := e.Runtime.Stats().MergedSettlements; n != 1 {
				t.Fatalf("%d settlements merged into another's commit, want 1", n)
			}
			evs, err := e.Store.Events(context.Background(), "acme", run.ID, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := loop.CheckEnded(evs); err != nil {
				t.Fatalf("event log: %v", err)
			}
			// 5 commits: create; start, plan, dispatch; the model's answer
			// and both dispatches; both settlements, the plan and the
			// dispatch of step 2; its answer and the end.
			if c := e.Runtime.Stats().Commits; c != 4 {
				t.Fatalf("%d commits after the creation, want 4", c)
			}
			// Both settlement command IDs are recorded: either settler
			// committing again is a duplicate.
			for _, i := range []int{0, 1} {
				eff := loop.ToolEffectID(run.ID, 1, i)
				cur, _ := e.Store.LoadRun(context.Background(), "acme", run.ID)
				res, err := e.Store.Commit(context.Background(), runtime.Commit{Tenant: "acme", Session: "s1", RunID: run.ID,
					CommandID: loop.SettleCommandID(eff, 1), ExpectedSeq: cur.Seq, Epoch: 1,
					Events: []loop.Event{{Type: loop.EventEffectPending, Seq: cur.Seq + 1}}, Run: cur})
				if err != nil || !res.Duplicate {
					t.Fatalf("a second settlement of %s: %+v, %v; want a duplicate", eff, res, err)
				}
			}
			conformance.Eventually(t, "the runtime to be idle with no attempt tracked", func() bool {
				return e.Runtime.Idle() && runtime.TrackedAttempts(e.Runtime) == 0 && runtime.QueuedSettlements(e.Runtime) == 0
			})
		})
	}
}

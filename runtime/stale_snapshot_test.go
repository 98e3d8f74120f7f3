package runtime_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// staleOnce is a Store that, once armed, answers loads of a Run with the
// version before its last commit, as a store whose cache kept an older
// snapshot did: one load, or every load when always is set.
type staleOnce struct {
	runtime.Store
	always bool
	mu     sync.Mutex
	before map[string]loop.Run // by Run ID: the version its last commit replaced
	armed  bool
	served []loop.Run // the stale versions answered
}

func (s *staleOnce) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	prev, err := s.Store.LoadRun(ctx, c.Tenant, c.RunID)
	if err != nil {
		return runtime.CommitResult{}, err
	}
	res, err := s.Store.Commit(ctx, c)
	if err == nil && !res.Duplicate && prev.Seq == c.ExpectedSeq {
		s.mu.Lock()
		s.before[c.RunID] = prev
		s.mu.Unlock()
	}
	return res, err
}

func (s *staleOnce) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	s.mu.Lock()
	prev, ok := s.before[runID]
	if s.armed && ok {
		s.armed = s.always
		s.served = append(s.served, prev)
		s.mu.Unlock()
		return prev, nil
	}
	s.mu.Unlock()
	return s.Store.LoadRun(ctx, tenant, runID)
}

// arm makes the next load stale, the first time it is called.
func (s *staleOnce) arm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.served) == 0 {
		s.armed = true
	}
}

// armingTools arms the store once a tool call has answered: the next load
// is its settlement's.
type armingTools struct {
	runtime.Executor
	arm func()
}

func (a armingTools) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	reply, err := a.Executor.Start(ctx, c)
	a.arm()
	return reply, err
}

// newStaleEnv starts a runtime over a staleOnce store, armed once the
// tool answers. Its advances take no guess (SetGuessHook): each loads the
// Run, as these tests are of stale loads.
func newStaleEnv(t *testing.T, h conformance.RuntimeHarness, always bool) (*conformance.RuntimeEnv, *staleOnce) {
	var s *staleOnce
	hh := h
	hh.NewStore = func(t *testing.T, clock runtime.Clock) runtime.Store {
		s = &staleOnce{Store: h.NewStore(t, clock), always: always, before: map[string]loop.Run{}}
		return s
	}
	hh.NewPlugins = func(t *testing.T, _ runtime.Store, _ runtime.Clock) conformance.RuntimePlugins {
		tools := &conformance.ScriptedTools{SlowPolls: 1}
		return conformance.RuntimePlugins{Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
			Tools: armingTools{Executor: tools, arm: func() { s.arm() }}, Release: tools.Release}
	}
	e := conformance.NewRuntimeEnv(t, hh, nil)
	runtime.SetGuessHook(e.Runtime, func(loop.Run) bool { return false })
	return e, s
}

// submitT submits a Run of script in session s1.
func submitT(t *testing.T, e *conformance.RuntimeEnv, script string) loop.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	created, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: script})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// A tool's settlement applied to a snapshot older than the committed one,
// which does not know the tool's effect yet, is refused by the Loop as an
// unknown effect. The runtime loads the Run again and commits the
// settlement. It gave up on it instead, as if the effect were truly
// unknown: a store that kept answering the older version (badgerstore's
// snapshot cache past its bound) left the Run stuck for ever, and here,
// where one load only is stale, the attempt, held by nobody, was started
// a second time.
func TestAnOutcomeRefusedOnAStaleSnapshotIsRetriedOnAReload(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e, s := newStaleEnv(t, h, false)
			created := submitT(t, e, `call:echo({"text":"a"})|answer:$results`)
			run := e.UntilTerminal(e.Runtime, created.ID, time.Second)
			if run.Status != loop.StatusCompleted || run.Result != "a" {
				t.Fatalf("run %s, result %q, failure %+v; want completed with a", run.Status, run.Result, run.Failure)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			tool := loop.ToolEffectID(run.ID, 1, 0)
			if len(s.served) != 1 || s.served[0].Effect(tool) != nil {
				t.Fatalf("%d stale loads answered (%+v); the test wants one, that does not know %s", len(s.served), s.served, tool)
			}
			// The settlement itself was committed: the tool was neither
			// started again nor attached to, as an attempt whose
			// settlement was given up is.
			if starts, attaches := e.Tools.Calls(abi.ExportStart), e.Tools.Calls(abi.ExportAttach); starts != 1 || attaches != 0 {
				t.Fatalf("the tool was started %d times and attached to %d times; want one start, no attach", starts, attaches)
			}
		})
	}
}

// An outcome that every load of the Run refuses as an unknown effect is
// tried again a bounded number of times, each on a fresh load, and then
// given up as truly unknown: the effect stays executing, for recovery.
func TestAnOutcomeThatEveryReloadRefusesAsUnknownIsGivenUp(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e, s := newStaleEnv(t, h, true)
			created := submitT(t, e, `call:echo({"text":"a"})|answer:$results`)
			conformance.Eventually(t, "the tool's answer", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.served) > 0
			})
			// The settlement's retries wait on the clock: move it until
			// the runtime has nothing left to do.
			deadline := time.Now().Add(20 * time.Second)
			for !e.Runtime.Idle() {
				if time.Now().After(deadline) {
					t.Fatal("the settlement is still being tried")
				}
				if e.Clock.Running() == 0 {
					e.Clock.Advance(time.Second)
				}
				time.Sleep(2 * time.Millisecond) // a condition poll's cadence
			}
			s.mu.Lock()
			served := len(s.served)
			s.mu.Unlock()
			if want := 1 + runtime.UnknownEffectReloads; served != want {
				t.Fatalf("the settlement was tried on %d loads; want %d, the first and its reloads", served, want)
			}
			run, err := s.Store.LoadRun(context.Background(), "acme", created.ID)
			if err != nil {
				t.Fatal(err)
			}
			tool := run.Effect(loop.ToolEffectID(run.ID, 1, 0))
			if tool == nil || tool.State != loop.EffectExecuting {
				t.Fatalf("the tool's effect on record: %+v; want it executing, for recovery", tool)
			}
		})
	}
}

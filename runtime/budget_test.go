package runtime_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/budget"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// countingModel records when (on the clock) each model start came, and
// answers the first limited ones as rate-limited, asking for retryAfter.
type countingModel struct {
	runtime.Executor
	clock      runtime.Clock
	limited    int
	retryAfter time.Duration
	// limitUntil, when set, rate-limits every start before it, too.
	limitUntil time.Time

	mu     sync.Mutex
	starts []time.Time
	byRun  map[string]time.Time // the first start of each Run
}

func (m *countingModel) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.mu.Lock()
	now := m.clock.Now()
	m.starts = append(m.starts, now)
	if _, ok := m.byRun[c.RunID]; !ok {
		m.byRun[c.RunID] = now
	}
	n := len(m.starts)
	m.mu.Unlock()
	if n <= m.limited || now.Before(m.limitUntil) {
		return abi.RateLimited("the server answered 429", m.retryAfter.Milliseconds()), nil
	}
	return m.Executor.Start(ctx, c)
}

func (m *countingModel) snapshot() ([]time.Time, map[string]time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := map[string]time.Time{}
	for k, v := range m.byRun {
		by[k] = v
	}
	return append([]time.Time(nil), m.starts...), by
}

func budgetEnv(t *testing.T, l budget.Limits, limited int, retryAfter time.Duration) (*conformance.RuntimeEnv, *countingModel, *budget.Budget) {
	var model *countingModel
	b := budget.New("model", l)
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], func(tn *runtime.Tenant) {
		model = &countingModel{Executor: tn.Model, limited: limited, retryAfter: retryAfter, byRun: map[string]time.Time{}}
		tn.Model, tn.ModelBudget = model, b
	})
	model.clock = e.Clock
	return e, model, b
}

// startBudgetNode starts a runtime of the env's tenant over store, as the
// node nodeID, with b as its model budget; it is stopped when the test
// ends.
func startBudgetNode(t *testing.T, e *conformance.RuntimeEnv, store runtime.Store, nodeID string, b *budget.Budget) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: nodeID, LeaseTTL: time.Minute, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour,
		ModelBudgets: []*budget.Budget{b}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	return rt
}

// TestAModelBudgetAdmitsAtMostItsRequestsPerMinute: six Runs, each one
// model step, against a model endpoint with a budget of 2 requests per
// minute: the model sees at most 2 starts in any minute, every Run
// completes, and the waits are counted.
func TestAModelBudgetAdmitsAtMostItsRequestsPerMinute(t *testing.T) {
	const runs, rpm = 6, 2
	e, model, b := budgetEnv(t, budget.Limits{RequestsPerMinute: rpm}, 0, 0)
	ctx := context.Background()
	var ids []string
	for i := range runs {
		run, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: "answer:ok"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
	}
	// Every Run's call reaches the budget before the clock moves (nothing
	// moves it until UntilTerminal): rpm are admitted, the rest wait. On a
	// slow machine a driver may come late, so this is waited for, not
	// assumed: once the clock moves, a late call would find the window
	// moved on and need no wait.
	conformance.Eventually(t, "every Run's model call admitted or waiting", func() bool {
		starts, _ := model.snapshot()
		return len(starts) == rpm && b.Waits() == runs-rpm
	})
	for _, id := range ids {
		if run := e.UntilTerminal(e.Runtime, id, 10*time.Second); run.Status != loop.StatusCompleted {
			t.Fatalf("run %s ended %s: %+v", id, run.Status, run.Failure)
		}
	}
	starts, _ := model.snapshot()
	if len(starts) != runs {
		t.Fatalf("the model was started %d times, want %d", len(starts), runs)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	for i := rpm; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-rpm]); gap < time.Minute {
			t.Errorf("starts %d and %d came %s apart: more than %d in a minute (starts: %v)", i-rpm+1, i+1, gap, rpm, starts)
		}
	}
	if got, want := b.Waits(), int64(runs-rpm); got != want {
		t.Errorf("%d budget waits counted, want %d", got, want)
	}
	if b.WaitedSeconds() < 60 {
		t.Errorf("the waits add up to %vs, want at least a minute", b.WaitedSeconds())
	}
}

// TestARateLimitedReplyClosesTheEndpointForEveryRun: the provider answers
// one Run's first call with a 429 asking for 20 s; a second Run,
// submitted after it, does not reach the model before those 20 s are up
// either, and both complete.
func TestARateLimitedReplyClosesTheEndpointForEveryRun(t *testing.T) {
	const retryAfter = 20 * time.Second
	e, model, _ := budgetEnv(t, budget.Limits{}, 1, retryAfter)
	ctx := context.Background()
	t0 := e.Clock.Now()
	first, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:one"})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "the first Run's call answered 429", func() bool {
		starts, _ := model.snapshot()
		return len(starts) == 1 && e.Runtime.Idle()
	})
	second, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s2", Input: "answer:two"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{first.ID, second.ID} {
		if run := e.UntilTerminal(e.Runtime, id, 5*time.Second); run.Status != loop.StatusCompleted {
			t.Fatalf("run %s ended %s: %+v", id, run.Status, run.Failure)
		}
	}
	_, byRun := model.snapshot()
	if at := byRun[second.ID]; at.Sub(t0) < retryAfter {
		t.Errorf("the second Run reached the model %s after the 429, which asked every caller to wait %s", at.Sub(t0), retryAfter)
	}
}

// TestRunsOutlastAProviderThatRateLimitsForAMinute: the provider answers
// every call with 429 and "Retry-After: 20" for a minute, and Runs come
// in all through it, one every 15 s. Every Run completes after the
// minute; no call reaches the provider within 20 s of a 429, whichever
// Run it is for (the endpoint closes for all of them); and the provider
// sees no more than the budget's requests in any minute.
func TestRunsOutlastAProviderThatRateLimitsForAMinute(t *testing.T) {
	const runs, rpm, retryAfter, every = 5, 3, 20 * time.Second, 15 * time.Second
	e, model, _ := budgetEnv(t, budget.Limits{RequestsPerMinute: rpm}, 0, retryAfter)
	t0 := e.Clock.Now()
	model.limitUntil = t0.Add(time.Minute)
	ctx := context.Background()
	var ids []string
	for i := range runs {
		run, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: "answer:ok"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
		advanceQuietly(t, e, every)
	}
	for _, id := range ids {
		if run := e.UntilTerminal(e.Runtime, id, 5*time.Second); run.Status != loop.StatusCompleted {
			t.Fatalf("run %s ended %s: %+v", id, run.Status, run.Failure)
		}
	}
	starts, _ := model.snapshot()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	var limitedAt []time.Time
	answered := 0
	for _, at := range starts {
		for _, l := range limitedAt {
			if at.After(l) && at.Sub(l) < retryAfter {
				t.Errorf("a call reached the provider %s after a 429 that asked every caller to wait %s", at.Sub(l), retryAfter)
			}
		}
		if at.Before(model.limitUntil) {
			limitedAt = append(limitedAt, at)
		} else {
			answered++
		}
	}
	if answered != runs {
		t.Errorf("%d calls were answered after the minute, want one for each of the %d Runs (calls at %v)", answered, runs, offsets(t0, starts))
	}
	for i := rpm; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-rpm]); gap < time.Minute {
			t.Errorf("calls %d and %d came %s apart: more than %d in a minute (calls at %v)", i-rpm+1, i+1, gap, rpm, offsets(t0, starts))
		}
	}
	t.Logf("calls at %v; the last Run completed at +%s", offsets(t0, starts), starts[len(starts)-1].Sub(t0))
}

// offsets are times as offsets from t0, for messages.
func offsets(t0 time.Time, ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, at := range ts {
		out[i] = at.Sub(t0)
	}
	return out
}

// advanceQuietly moves the env's clock by d, one timer at a time, each
// once the runtime is idle and the clock's callbacks have returned, as
// time passes in a process whose clock does not jump.
func advanceQuietly(t *testing.T, e *conformance.RuntimeEnv, d time.Duration) {
	t.Helper()
	target := e.Clock.Now().Add(d)
	for e.Clock.Now().Before(target) {
		conformance.Eventually(t, "the runtime idle", func() bool { return e.Clock.Running() == 0 && e.Runtime.Idle() })
		next, ok := e.Clock.NextAt()
		if !ok || next.After(target) || !next.After(e.Clock.Now()) {
			next = target
		}
		e.Clock.Set(next)
	}
	conformance.Eventually(t, "the runtime idle", func() bool { return e.Clock.Running() == 0 && e.Runtime.Idle() })
}

// countedStore is a Store that counts live nodes as told.
type countedStore struct {
	runtime.Store
	mu    sync.Mutex
	nodes int
}

func (s *countedStore) LiveNodes(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes, nil
}

func (s *countedStore) set(n int) {
	s.mu.Lock()
	s.nodes = n
	s.mu.Unlock()
}

// TestModelBudgetsAreSharedAmongTheLiveNodes: on a store several nodes
// share, a node's model budget is the configured one divided by the live
// node count, from its start, and follows the count at the next lease
// renewal.
func TestModelBudgetsAreSharedAmongTheLiveNodes(t *testing.T) {
	e, _, b := budgetEnv(t, budget.Limits{RequestsPerMinute: 90, MaxConcurrentCalls: 4}, 0, 0)
	store := &countedStore{Store: e.Store, nodes: 3}
	startBudgetNode(t, e, store, "node-shared", b)
	if got, want := b.Share(), (budget.Limits{RequestsPerMinute: 30, MaxConcurrentCalls: 1}); got != want {
		t.Fatalf("share of 3 live nodes %+v, want %+v", got, want)
	}
	store.set(2)
	conformance.Eventually(t, "the share of 2 live nodes after a lease renewal", func() bool {
		if e.Clock.Running() == 0 {
			e.Clock.Advance(5 * time.Second)
		}
		return b.Share() == budget.Limits{RequestsPerMinute: 45, MaxConcurrentCalls: 2}
	})
}

// overlapModel records the most model calls it had in flight at once.
type overlapModel struct {
	runtime.Executor
	mu            sync.Mutex
	now, mostSeen int
}

func (m *overlapModel) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.mu.Lock()
	m.now++
	m.mostSeen = max(m.mostSeen, m.now)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.now--
		m.mu.Unlock()
	}()
	return m.Executor.Start(ctx, c)
}

// TestAModelBudgetsCallsInFlightAreBoundedAndTheEndOfOneLetsTheNextIn:
// with max_concurrent_calls 1, eight Runs submitted together reach the
// model one at a time, and each call's end starts the next waiting one at
// once: every Run completes without the clock moving.
func TestAModelBudgetsCallsInFlightAreBoundedAndTheEndOfOneLetsTheNextIn(t *testing.T) {
	const runs = 8
	b := budget.New("model", budget.Limits{MaxConcurrentCalls: 1})
	var model *overlapModel
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], func(tn *runtime.Tenant) {
		model = &overlapModel{Executor: tn.Model}
		tn.Model, tn.ModelBudget = model, b
	})
	ctx := context.Background()
	start := e.Clock.Now()
	var ids []string
	for i := range runs {
		run, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: "answer:ok"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
	}
	for _, id := range ids {
		conformance.Eventually(t, "run "+id+" to complete", func() bool {
			run, err := e.Store.LoadRun(ctx, "acme", id)
			return err == nil && run.Status == loop.StatusCompleted
		})
	}
	if !e.Clock.Now().Equal(start) {
		t.Fatalf("the clock moved; the test does not move it")
	}
	model.mu.Lock()
	defer model.mu.Unlock()
	if model.mostSeen != 1 {
		t.Errorf("the model had %d calls in flight at once, want at most 1", model.mostSeen)
	}
}

// gatedStore is a Store that carries endpoint closures among the nodes
// that share it (runtime.EndpointGate), in memory, on a clock.
type gatedStore struct {
	runtime.Store
	clock runtime.Clock

	mu          sync.Mutex
	closedUntil map[string]time.Time
}

func (s *gatedStore) CloseEndpoint(_ context.Context, endpoint string, wait time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until := s.clock.Now().Add(wait); until.After(s.closedUntil[endpoint]) {
		s.closedUntil[endpoint] = until
	}
	return nil
}

func (s *gatedStore) EndpointClosedFor(_ context.Context, endpoint string) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.closedUntil[endpoint].Sub(s.clock.Now()), 0), nil
}

// gatedEnv is budgetEnv with a runtime of its own on a gatedStore over
// the env's store: one node of several that share the endpoint's
// closures.
func gatedEnv(t *testing.T, limited int, retryAfter time.Duration) (*conformance.RuntimeEnv, *runtime.Runtime, *countingModel, *gatedStore) {
	e, model, b := budgetEnv(t, budget.Limits{MaxConcurrentCalls: 100}, limited, retryAfter)
	store := &gatedStore{Store: e.Store, clock: e.Clock, closedUntil: map[string]time.Time{}}
	return e, startBudgetNode(t, e, store, "node-gated", b), model, store
}

// TestAnEndpointAnotherNodeClosedIsClosedHere: another node that shares
// the store got a 429 asking for 20 s and closed the endpoint there; a
// Run submitted here then does not reach the model before the 20 s are
// up, waits for the endpoint's budget meanwhile, and completes.
func TestAnEndpointAnotherNodeClosedIsClosedHere(t *testing.T) {
	const retryAfter = 20 * time.Second
	e, rt, model, store := gatedEnv(t, 0, 0)
	ctx := context.Background()
	t0 := e.Clock.Now()
	if err := store.CloseEndpoint(ctx, "model", retryAfter); err != nil {
		t.Fatal(err)
	}
	run, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:one"})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "the model step to wait for the endpoint's budget", func() bool {
		r, err := rt.LoadRun(ctx, "acme", run.ID)
		if err != nil || len(r.Effects) == 0 {
			return false
		}
		w, ok := rt.BudgetWait(r, r.Effects[0].ID)
		return ok && w.Until.Equal(t0.Add(retryAfter))
	})
	if done := e.UntilTerminal(rt, run.ID, 5*time.Second); done.Status != loop.StatusCompleted {
		t.Fatalf("run %s ended %s: %+v", run.ID, done.Status, done.Failure)
	}
	if _, byRun := model.snapshot(); byRun[run.ID].Sub(t0) < retryAfter {
		t.Errorf("the Run reached the model %s after another node closed the endpoint for %s", byRun[run.ID].Sub(t0), retryAfter)
	}
}

// TestARateLimitedReplyClosesTheEndpointForTheOtherNodes: the provider
// answers a call with a 429 asking for 20 s; by the time the attempt has
// settled, the store says the endpoint is closed for those 20 s, to every
// node that asks it.
func TestARateLimitedReplyClosesTheEndpointForTheOtherNodes(t *testing.T) {
	const retryAfter = 20 * time.Second
	e, rt, _, store := gatedEnv(t, 1, retryAfter)
	ctx := context.Background()
	run, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:one"})
	if err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "the 429 settled", func() bool {
		r, err := rt.LoadRun(ctx, "acme", run.ID)
		return err == nil && len(r.Effects) > 0 && r.Effects[0].RateLimited > 0
	})
	if d, _ := store.EndpointClosedFor(ctx, "model"); d != retryAfter {
		t.Fatalf("the store has the endpoint closed for %s, want the %s the provider asked", d, retryAfter)
	}
	if done := e.UntilTerminal(rt, run.ID, 5*time.Second); done.Status != loop.StatusCompleted {
		t.Fatalf("run %s ended %s: %+v", run.ID, done.Status, done.Failure)
	}
}

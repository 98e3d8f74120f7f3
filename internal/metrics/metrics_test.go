package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/metrics"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

func TestObserverCounts(t *testing.T) {
	m := metrics.New()
	var o runtime.Observer = m
	o.RunStatus("acme", "", loop.StatusPending)
	o.RunStatus("acme", loop.StatusPending, loop.StatusRunning)
	o.RunStatus("acme", loop.StatusRunning, loop.StatusCompleted)
	o.EffectSettled("acme", abi.KindTool, loop.OutcomeDone, "")
	o.EffectSettled("acme", abi.KindTool, loop.OutcomeFailed, abi.ClassPluginTimeout)
	o.Usage("acme", abi.Usage{InputTokens: 10, OutputTokens: 5})
	o.Usage("acme", abi.Usage{InputTokens: 1})
	o.RecoveryDecision("reattach")
	o.WatchdogReport("globex")
	o.Committed(3*time.Millisecond, nil)
	o.Committed(time.Millisecond, fmt.Errorf("wrapped: %w", runtime.ErrVersionConflict))
	m.Pruned(runtime.PruneStats{Runs: 2, Events: 30, Commands: 7})

	expect := `
# HELP agenthost_effects_settled_total Effect attempts settled, by tenant, kind (model|tool), outcome state (done|failed|cancelled) and error class (empty unless failed or cancelled with one).
# TYPE agenthost_effects_settled_total counter
agenthost_effects_settled_total{class="",kind="tool",state="done",tenant="acme"} 1
agenthost_effects_settled_total{class="plugin_timeout",kind="tool",state="failed",tenant="acme"} 1
# HELP agenthost_model_tokens_total Model tokens used by the tenant's Runs, by tenant and type (input|output).
# TYPE agenthost_model_tokens_total counter
agenthost_model_tokens_total{tenant="acme",type="input"} 11
agenthost_model_tokens_total{tenant="acme",type="output"} 5
# HELP agenthost_retention_pruned_total What retention pruned from terminal Runs, by what (runs, events, commands).
# TYPE agenthost_retention_pruned_total counter
agenthost_retention_pruned_total{what="commands"} 7
agenthost_retention_pruned_total{what="events"} 30
agenthost_retention_pruned_total{what="runs"} 2
# HELP agenthost_store_commit_errors_total Store commits that failed, by reason (version_conflict, fenced, unavailable, closed, other).
# TYPE agenthost_store_commit_errors_total counter
agenthost_store_commit_errors_total{reason="version_conflict"} 1
`
	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(expect),
		"agenthost_effects_settled_total", "agenthost_model_tokens_total", "agenthost_retention_pruned_total", "agenthost_store_commit_errors_total"))
	require.Equal(t, 3, testutil.CollectAndCount(m.Registry(), "agenthost_run_transitions_total"))
	require.Equal(t, 1, testutil.CollectAndCount(m.Registry(), "agenthost_recovery_actions_total"))
	require.Equal(t, 1, testutil.CollectAndCount(m.Registry(), "agenthost_watchdog_reports_total"))
	require.Equal(t, 1, testutil.CollectAndCount(m.Registry(), "agenthost_store_commit_duration_seconds"))
	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP agenthost_retention_prunes_total Retention passes run.
# TYPE agenthost_retention_prunes_total counter
agenthost_retention_prunes_total 1
`), "agenthost_retention_prunes_total"))
}

// failingExecutor answers every call with err.
type failingExecutor struct{ err error }

func (f failingExecutor) Start(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{}, f.err
}
func (f failingExecutor) Poll(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{State: abi.StatePending}, nil
}
func (f failingExecutor) Attach(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{}, f.err
}
func (f failingExecutor) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{}, f.err
}

func TestExecutorDecoratorTimesCallsAndCountsErrorsByClass(t *testing.T) {
	m := metrics.New()
	ex := m.Executor("calc", failingExecutor{err: &runtime.PluginError{Class: abi.ClassPluginTrap, Plugin: "calc", Export: "start", Err: errors.New("trap")}})
	_, err := ex.Start(context.Background(), runtime.EffectCall{})
	var pe *runtime.PluginError
	require.ErrorAs(t, err, &pe, "the error passes through unchanged")
	_, err = ex.Poll(context.Background(), runtime.EffectCall{})
	require.NoError(t, err)
	unavailable := m.Executor("gone", failingExecutor{err: fmt.Errorf("host: %w", runtime.ErrExecutorUnavailable)})
	_, _ = unavailable.Attach(context.Background(), runtime.EffectCall{})
	b := m.Builder("builder", &conformance.EchoBuilder{})
	_, err = b.Build(context.Background(), "acme", abi.BuildInput{})
	require.NoError(t, err)

	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP agenthost_plugin_call_errors_total Plugin calls that returned an error instead of a reply, by plugin, export and error class.
# TYPE agenthost_plugin_call_errors_total counter
agenthost_plugin_call_errors_total{class="executor_unavailable",export="attach",plugin="gone"} 1
agenthost_plugin_call_errors_total{class="plugin_trap",export="start",plugin="calc"} 1
`), "agenthost_plugin_call_errors_total"))
	// One histogram series per (plugin, export) called.
	require.Equal(t, 4, testutil.CollectAndCount(m.Registry(), "agenthost_plugin_call_duration_seconds"))

	require.Equal(t, "plugin_timeout", metrics.ErrorClass(context.DeadlineExceeded))
	require.Equal(t, "cancelled", metrics.ErrorClass(fmt.Errorf("x: %w", context.Canceled)))
	require.Equal(t, "other", metrics.ErrorClass(errors.New("boom")))
}

func TestTeeReachesEveryObserver(t *testing.T) {
	a, b := metrics.New(), metrics.New()
	tee := metrics.Tee{a, b}
	tee.Usage("acme", abi.Usage{InputTokens: 4})
	tee.WatchdogReport("acme")
	for _, m := range []*metrics.Metrics{a, b} {
		require.Equal(t, 4.0, mustCounter(t, m, "agenthost_model_tokens_total"))
		require.Equal(t, 1, testutil.CollectAndCount(m.Registry(), "agenthost_watchdog_reports_total"))
	}
}

func mustCounter(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, mt := range mf.GetMetric() {
				sum += mt.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// groupCounts is a store's count of its group commits.
type groupCounts struct{ groups, commits int64 }

func (g *groupCounts) CommitGroups() (int64, int64) { return g.groups, g.commits }

// A store that groups its commits has their two counters, read at scrape
// time; one that does not has neither.
func TestCommitGroupsAreCountedForAStoreThatGroups(t *testing.T) {
	m := metrics.New()
	g := &groupCounts{groups: 3, commits: 10}
	require.NoError(t, m.RegisterCommitGroups(g))
	g.groups, g.commits = 4, 12
	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP agenthost_store_commit_groups_total Transactions, one sync each, that wrote a group of Run creations and commits.
# TYPE agenthost_store_commit_groups_total counter
agenthost_store_commit_groups_total 4
# HELP agenthost_store_grouped_commits_total Run creations and commits written by group transactions; divided by agenthost_store_commit_groups_total, how many shared a sync.
# TYPE agenthost_store_grouped_commits_total counter
agenthost_store_grouped_commits_total 12
`), "agenthost_store_commit_groups_total", "agenthost_store_grouped_commits_total"))

	none := metrics.New()
	require.NoError(t, none.RegisterCommitGroups(conformance.NewMemStore(conformance.NewFakeClock(time.Unix(0, 0)), conformance.KVLimits{})))
	require.Equal(t, 0, testutil.CollectAndCount(none.Registry(), "agenthost_store_commit_groups_total"))
}

// replyingExecutor answers every start, poll and attach with reply and
// err, and every cancel as cancelled.
type replyingExecutor struct {
	reply abi.EffectReply
	err   error
}

func (x replyingExecutor) Start(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return x.reply, x.err
}
func (x replyingExecutor) Poll(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return x.reply, x.err
}
func (x replyingExecutor) Attach(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return x.reply, x.err
}
func (x replyingExecutor) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{State: abi.StateCancelled}, nil
}

// histogram returns the sample count and sum of the series of the
// histogram name whose labels are exactly labels; ok is false when there is
// no such series.
func histogram(t *testing.T, m *metrics.Metrics, name string, labels map[string]string) (count uint64, sum float64, ok bool) {
	t.Helper()
	families, err := m.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			if len(s.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range s.GetLabel() {
				if v, found := labels[lp.GetName()]; !found || v != lp.GetValue() {
					continue series
				}
			}
			return s.GetHistogram().GetSampleCount(), s.GetHistogram().GetSampleSum(), true
		}
	}
	return 0, 0, false
}

// An executor's calls are counted by plugin, kind, export and what they
// came back with; a model call that settles its attempt is timed from the
// attempt's dispatch, by plugin and outcome, and one that does not (a
// pending reply, an executor found unavailable) is not timed.
func TestExecutorCallsAreCountedByOutcomeAndModelCallsTimedFromDispatch(t *testing.T) {
	m := metrics.New()
	model := func(dispatchedAgo time.Duration) runtime.EffectCall {
		return runtime.EffectCall{Tenant: "acme", RunID: "r1", DispatchedAt: time.Now().Add(-dispatchedAgo),
			Input: abi.EffectInput{Effect: abi.Effect{ID: "r1/model/1", Attempt: 1, Kind: abi.KindModel}}}
	}
	ctx := context.Background()
	done := m.Executor("openai", replyingExecutor{reply: abi.EffectReply{State: abi.StateDone}})
	require.Equal(t, "openai", runtime.EndpointOf(done), "the decorator names its plugin as the endpoint")
	_, _ = done.Start(ctx, model(2*time.Second))
	_, _ = done.Poll(ctx, model(5*time.Second)) // a pending attempt that settles at its poll
	limited := m.Executor("openai", replyingExecutor{reply: abi.RateLimited("the server answered 429", 20_000)})
	_, _ = limited.Start(ctx, model(time.Second))
	pending := m.Executor("openai", replyingExecutor{reply: abi.EffectReply{State: abi.StatePending, Handle: "h"}})
	_, _ = pending.Start(ctx, model(time.Second))
	timedOut := m.Executor("openai", replyingExecutor{err: &runtime.PluginError{Class: abi.ClassPluginTimeout, Plugin: "openai", Export: "start", Err: context.DeadlineExceeded}})
	_, _ = timedOut.Start(ctx, model(3*time.Second))
	gone := m.Executor("anthropic", replyingExecutor{err: fmt.Errorf("host: %w", runtime.ErrExecutorUnavailable)})
	_, _ = gone.Attach(ctx, model(time.Second))
	calc := m.Executor("calc", replyingExecutor{reply: abi.EffectReply{State: abi.StateDone}})
	tool := runtime.EffectCall{Tenant: "acme", RunID: "r1", DispatchedAt: time.Now(), Input: abi.EffectInput{Effect: abi.Effect{Kind: abi.KindTool}}}
	_, _ = calc.Start(ctx, tool)
	_, _ = calc.Cancel(ctx, tool)

	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP agenthost_executor_calls_total Executor plugin calls, by plugin, effect kind (model|tool), export (start, poll, attach, cancel), what the call came back with (state: pending, done, failed, cancelled, unknown, or error when it returned no reply) and error class (empty unless failed, cancelled with one, or error).
# TYPE agenthost_executor_calls_total counter
agenthost_executor_calls_total{class="",export="cancel",kind="tool",plugin="calc",state="cancelled"} 1
agenthost_executor_calls_total{class="",export="poll",kind="model",plugin="openai",state="done"} 1
agenthost_executor_calls_total{class="",export="start",kind="model",plugin="openai",state="done"} 1
agenthost_executor_calls_total{class="",export="start",kind="model",plugin="openai",state="pending"} 1
agenthost_executor_calls_total{class="",export="start",kind="tool",plugin="calc",state="done"} 1
agenthost_executor_calls_total{class="executor_unavailable",export="attach",kind="model",plugin="anthropic",state="error"} 1
agenthost_executor_calls_total{class="plugin_timeout",export="start",kind="model",plugin="openai",state="error"} 1
agenthost_executor_calls_total{class="rate_limited",export="start",kind="model",plugin="openai",state="failed"} 1
`), "agenthost_executor_calls_total"))

	// Three series: the pending start, the unavailable attach and the
	// tool are not model calls that settled.
	require.Equal(t, 3, testutil.CollectAndCount(m.Registry(), "agenthost_model_call_seconds"))
	for _, c := range []struct {
		state, class string
		count        uint64
		atLeast      float64
	}{
		{"done", "", 2, 7}, // 2 s for the start, 5 s for the poll
		{"failed", "rate_limited", 1, 1},
		{"failed", "plugin_timeout", 1, 3},
	} {
		count, sum, ok := histogram(t, m, "agenthost_model_call_seconds", map[string]string{"plugin": "openai", "state": c.state, "class": c.class})
		require.True(t, ok, "a series for %s/%s", c.state, c.class)
		require.Equal(t, c.count, count, "%s/%s", c.state, c.class)
		require.GreaterOrEqual(t, sum, c.atLeast, "%s/%s is timed from the dispatch", c.state, c.class)
		require.Less(t, sum, c.atLeast+60, "%s/%s", c.state, c.class)
	}
}

// A Run's end is observed by tenant, agent and status with the time it
// took.
func TestRunDurationIsObservedByAgentAndStatus(t *testing.T) {
	m := metrics.New()
	var o runtime.Observer = metrics.Tee{m}
	o.RunEnded("acme", "triage", loop.StatusFailed, 90*time.Second)
	o.RunEnded("acme", "triage", loop.StatusCompleted, 2*time.Second)
	o.RunEnded("acme", "triage", loop.StatusCompleted, 3*time.Second)
	o.RunEnded("globex", runtime.DefaultAgent, loop.StatusCancelled, time.Second)
	require.Equal(t, 3, testutil.CollectAndCount(m.Registry(), "agenthost_run_duration_seconds"))
	count, sum, ok := histogram(t, m, "agenthost_run_duration_seconds", map[string]string{"tenant": "acme", "agent": "triage", "status": "completed"})
	require.True(t, ok)
	require.Equal(t, uint64(2), count)
	require.InDelta(t, 5.0, sum, 1e-9)
	count, sum, ok = histogram(t, m, "agenthost_run_duration_seconds", map[string]string{"tenant": "acme", "agent": "triage", "status": "failed"})
	require.True(t, ok)
	require.Equal(t, uint64(1), count)
	require.InDelta(t, 90.0, sum, 1e-9)
}

// emittingExecutor emits through sink from inside its calls, as the
// plugin host does with the call's context.
type emittingExecutor struct {
	replyingExecutor
	sink runtime.EventSink
	evs  []runtime.EmitScope
}

func (x emittingExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	for _, s := range x.evs {
		typ := abi.EmitProgress
		var d *abi.ModelDelta
		if s.DeltaSeq > 0 {
			typ, d = abi.EmitModelDelta, &abi.ModelDelta{Text: "x"}
		}
		if err := x.sink.Emit(ctx, s, abi.EmitEvent{Type: typ, Delta: d}); err != nil {
			return abi.EffectReply{}, err
		}
	}
	return x.replyingExecutor.Start(ctx, c)
}

type countingSink struct{ n *int }

func (s countingSink) Emit(context.Context, runtime.EmitScope, abi.EmitEvent) error {
	*s.n++
	return nil
}

// A streamed model call's first delta is timed from the call's start, by
// plugin; later deltas, progress and a tool call's emits are not; every
// emit reaches the sink behind.
func TestTheFirstDeltaOfAModelCallIsTimed(t *testing.T) {
	m := metrics.New()
	passed := 0
	sink := m.Events(countingSink{&passed})
	deltas := []runtime.EmitScope{{RunID: "r1"}, {RunID: "r1", DeltaSeq: 1}, {RunID: "r1", DeltaSeq: 2}}
	done := abi.EffectReply{State: abi.StateDone}
	model := runtime.EffectCall{Tenant: "acme", RunID: "r1", Input: abi.EffectInput{Effect: abi.Effect{Kind: abi.KindModel}}}
	tool := runtime.EffectCall{Tenant: "acme", RunID: "r1", Input: abi.EffectInput{Effect: abi.Effect{Kind: abi.KindTool}}}
	ctx := context.Background()
	_, _ = m.Executor("openai", emittingExecutor{replyingExecutor{reply: done}, sink, deltas}).Start(ctx, model)
	_, _ = m.Executor("anthropic", emittingExecutor{replyingExecutor{reply: done}, sink, deltas}).Start(ctx, model)
	_, _ = m.Executor("calc", emittingExecutor{replyingExecutor{reply: done}, sink, deltas}).Start(ctx, tool)
	require.NoError(t, sink.Emit(ctx, runtime.EmitScope{DeltaSeq: 1}, abi.EmitEvent{Type: abi.EmitModelDelta}), "an emit outside a timed call")
	require.Equal(t, 10, passed, "every emit reaches the sink behind")
	require.Equal(t, 2, testutil.CollectAndCount(m.Registry(), "agenthost_model_time_to_first_token_seconds"))
	for _, plugin := range []string{"openai", "anthropic"} {
		count, _, ok := histogram(t, m, "agenthost_model_time_to_first_token_seconds", map[string]string{"plugin": plugin})
		require.True(t, ok, plugin)
		require.Equal(t, uint64(1), count, "%s: one first delta", plugin)
	}
}

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
# HELP agenthost_store_commit_groups_total Transactions, one sync each, that wrote a group of Run creations and commits (Badger store).
# TYPE agenthost_store_commit_groups_total counter
agenthost_store_commit_groups_total 4
# HELP agenthost_store_grouped_commits_total Run creations and commits written by group transactions (Badger store); divided by agenthost_store_commit_groups_total, how many shared a sync.
# TYPE agenthost_store_grouped_commits_total counter
agenthost_store_grouped_commits_total 12
`), "agenthost_store_commit_groups_total", "agenthost_store_grouped_commits_total"))

	none := metrics.New()
	require.NoError(t, none.RegisterCommitGroups(conformance.NewMemStore(conformance.NewFakeClock(time.Unix(0, 0)), conformance.KVLimits{})))
	require.Equal(t, 0, testutil.CollectAndCount(none.Registry(), "agenthost_store_commit_groups_total"))
}

package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// RuntimeCounters is what RegisterRuntime reads; *runtime.Runtime has it.
type RuntimeCounters interface {
	Stats() runtime.Stats
	Recovery() runtime.RecoveryStats
	Ready() bool
}

var _ RuntimeCounters = (*runtime.Runtime)(nil)

// RegisterRuntime registers collectors that read the runtime's own
// counters at scrape time: commits, conflicts, dropped outcomes, ownership
// boundaries, executors found unavailable, recovery passes and
// take-overs, the Watcher's queue depth and readiness (the executor calls
// themselves are counted by plugin through Executor). Call it once, after
// runtime.New.
func (m *Metrics) RegisterRuntime(rt RuntimeCounters) error {
	counter := func(name, help string, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	cs := []prometheus.Collector{
		counter("agenthost_store_commits_total", "Commits the runtime made that wrote.", func() int64 { return rt.Stats().Commits }),
		counter("agenthost_store_duplicate_commits_total", "Commits answered from an applied command ID (nothing written).", func() int64 { return rt.Stats().DuplicateCommits }),
		counter("agenthost_store_conflicts_total", "Version conflicts the runtime retried.", func() int64 { return rt.Stats().Conflicts }),
		counter("agenthost_runtime_dropped_outcomes_total", "Stale or repeated effect outcomes dropped.", func() int64 { return rt.Stats().DroppedOutcomes }),
		counter("agenthost_runtime_ownership_boundaries_total", "Sessions this node gave up on lost ownership.", func() int64 { return rt.Stats().Boundaries }),
		counter("agenthost_executor_unavailable_total", "Executor calls that found the executor unavailable.", func() int64 { return rt.Stats().UnavailableErrors }),
		counter("agenthost_recovery_passes_total", "Recovery passes run.", func() int64 { return rt.Recovery().Passes }),
		counter("agenthost_recovery_sessions_taken_total", "Orphaned sessions recovery took over.", func() int64 { return rt.Recovery().SessionsTaken }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "agenthost_watcher_queue_depth",
			Help: "Pending polls and Run wake-ups in the Watcher's timer heap.",
		}, func() float64 { return float64(rt.Stats().WatcherQueueDepth) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "agenthost_ready",
			Help: "1 once recovery's first pass is done, else 0.",
		}, func() float64 {
			if rt.Ready() {
				return 1
			}
			return 0
		}),
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// CommitGrouper is a store's count of the transactions its
// Run creations and commits shared (*badgerstore.Store and
// *pgstore.Store have it).
type CommitGrouper interface {
	CommitGroups() (groups, commits int64)
}

// RegisterCommitGroups registers, for a store that groups its Run
// writes, agenthost_store_commit_groups_total (the group transactions,
// one sync each) and agenthost_store_grouped_commits_total (the Run
// creations and commits they wrote): their ratio is how many shared a
// sync. A store without groups registers nothing.
func (m *Metrics) RegisterCommitGroups(store any) error {
	g, ok := store.(CommitGrouper)
	if !ok {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "agenthost_store_commit_groups_total",
			Help: "Transactions, one sync each, that wrote a group of Run creations and commits."},
			func() float64 { n, _ := g.CommitGroups(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "agenthost_store_grouped_commits_total",
			Help: "Run creations and commits written by group transactions; divided by agenthost_store_commit_groups_total, how many shared a sync."},
			func() float64 { _, n := g.CommitGroups(); return float64(n) }),
	} {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// RunIndex is what the active-runs gauge reads: the store's status index.
// runtime.Store has it.
type RunIndex interface {
	RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error)
}

// RegisterActiveRuns registers agenthost_runs_active, read from the store's
// status index at scrape time for each tenant tenants returns then (the
// tenants in force: a reload adds and removes some): the Runs pending,
// running and waiting, counted up to limit per status (a value at limit
// means "at least"). It reads the index, so it is right after a restart
// too.
func (m *Metrics) RegisterActiveRuns(store RunIndex, tenants func() []string, limit int, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return m.reg.Register(&activeRuns{store: store, tenants: tenants, limit: limit, log: log,
		desc: prometheus.NewDesc("agenthost_runs_active",
			"Runs of the tenant in a non-terminal status (pending, running, waiting), read from the store's index; capped at the configured limit per status.",
			[]string{"tenant", "status"}, nil)})
}

type activeRuns struct {
	store   RunIndex
	tenants func() []string
	limit   int
	log     *slog.Logger
	desc    *prometheus.Desc
}

func (a *activeRuns) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

func (a *activeRuns) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range a.tenants() {
		for _, st := range []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting} {
			ids, err := a.store.RunsByStatus(ctx, t, st, "", a.limit)
			if err != nil {
				// A scrape that cannot read the index leaves the series
				// out rather than reporting a wrong 0.
				a.log.Warn("metrics: count active runs", "tenant", t, "status", st, "err", err)
				continue
			}
			ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, float64(len(ids)), t, string(st))
		}
	}
}

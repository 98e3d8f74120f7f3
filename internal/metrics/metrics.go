package metrics

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Metrics holds agenthost's Prometheus registry and the collectors the
// package doc lists. It is a runtime.Observer.
//
// Metrics is safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	runTransitions  *prometheus.CounterVec
	effectsSettled  *prometheus.CounterVec
	pluginCalls     *prometheus.HistogramVec
	pluginErrors    *prometheus.CounterVec
	commitDuration  prometheus.Histogram
	commitErrors    *prometheus.CounterVec
	recoveryActions *prometheus.CounterVec
	watchdogReports *prometheus.CounterVec
	tokens          *prometheus.CounterVec
	pruned          *prometheus.CounterVec
	prunes          prometheus.Counter
	limited         *prometheus.CounterVec
	executorCalls   *prometheus.CounterVec
	modelCalls      *prometheus.HistogramVec
	firstToken      *prometheus.HistogramVec
	runDuration     *prometheus.HistogramVec
	configReloads   *prometheus.CounterVec
}

var _ runtime.Observer = (*Metrics)(nil)

// New returns Metrics on a fresh registry, with the Go and process
// collectors registered too.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		runTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_run_transitions_total",
			Help: "Runs that entered a status, by tenant and the status entered (pending counts submissions).",
		}, []string{"tenant", "status"}),
		effectsSettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_effects_settled_total",
			Help: "Effect attempts settled, by tenant, kind (model|tool), outcome state (done|failed|cancelled) and error class (empty unless failed or cancelled with one).",
		}, []string{"tenant", "kind", "state", "class"}),
		pluginCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agenthost_plugin_call_duration_seconds",
			Help:    "Duration of plugin calls (builder build; executor start, poll, attach, cancel), by plugin and export.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"plugin", "export"}),
		pluginErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_plugin_call_errors_total",
			Help: "Plugin calls that returned an error instead of a reply, by plugin, export and error class.",
		}, []string{"plugin", "export", "class"}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "agenthost_store_commit_duration_seconds",
			Help:    "Duration of the runtime's store commits, failed ones included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		commitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_store_commit_errors_total",
			Help: "Store commits that failed, by reason (version_conflict, fenced, unavailable, closed, other).",
		}, []string{"reason"}),
		recoveryActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_recovery_actions_total",
			Help: "Decisions recovery took for orphaned effects, by decision (reattach, settle, retry, fail, fail_run, defer).",
		}, []string{"decision"}),
		watchdogReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_watchdog_reports_total",
			Help: "Runs the watchdog found stuck (non-terminal, nothing in flight, nothing awaited, no timer), by tenant.",
		}, []string{"tenant"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_model_tokens_total",
			Help: "Model tokens used by the tenant's Runs, by tenant and type (input|output).",
		}, []string{"tenant", "type"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_retention_pruned_total",
			Help: "What retention pruned from terminal Runs, by what (runs, events, commands).",
		}, []string{"what"}),
		prunes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agenthost_retention_prunes_total",
			Help: "Retention passes run.",
		}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_http_limited_total",
			Help: "Connections and requests a limit of the API refused, by limit (max_connections, max_connections_per_client, max_connections_hard, max_unauthenticated_connections, unauthenticated_rate, request_rate, submission_rate, max_concurrent_reads, ...) and tenant (empty when the request had none).",
		}, []string{"limit", "tenant"}),
		executorCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_executor_calls_total",
			Help: "Executor plugin calls, by plugin, effect kind (model|tool), export (start, poll, attach, cancel), what the call came back with (state: pending, done, failed, cancelled, unknown, or error when it returned no reply) and error class (empty unless failed, cancelled with one, or error).",
		}, []string{"plugin", "kind", "export", "state", "class"}),
		modelCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agenthost_model_call_seconds",
			Help:    "Model calls, from the attempt's dispatch to the start, poll or attach call that settled it (done, failed, or an error that fails it), by plugin, state (done|failed) and error class.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600},
		}, []string{"plugin", "state", "class"}),
		firstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agenthost_model_time_to_first_token_seconds",
			Help:    "Streamed model calls, from the start of the executor call to its first model_delta (the answer's first piece), by plugin.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60},
		}, []string{"plugin"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agenthost_run_duration_seconds",
			Help:    "Runs that ended, from their creation to their end (waits for people included), by tenant, agent and status (completed, failed, cancelled).",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600},
		}, []string{"tenant", "agent", "status"}),
		configReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_config_reloads_total",
			Help: "Config reloads (SIGHUP, agenthost reload), by result: applied (the new config is in force), refused (it was invalid or could not be applied; the old one stays).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.firstToken, m.configReloads)
	reg.MustRegister(m.runTransitions, m.effectsSettled, m.pluginCalls, m.pluginErrors, m.commitDuration,
		m.commitErrors, m.recoveryActions, m.watchdogReports, m.tokens, m.pruned, m.prunes, m.limited,
		m.executorCalls, m.modelCalls, m.runDuration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry, to register more collectors or gather.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Committed implements runtime.Observer.
func (m *Metrics) Committed(d time.Duration, err error) {
	m.commitDuration.Observe(d.Seconds())
	if err == nil {
		return
	}
	reason := "other"
	switch {
	case errors.Is(err, runtime.ErrVersionConflict):
		reason = "version_conflict"
	case errors.Is(err, runtime.ErrFenced):
		reason = "fenced"
	case errors.Is(err, runtime.ErrStoreUnavailable):
		reason = "unavailable"
	case errors.Is(err, runtime.ErrClosed):
		reason = "closed"
	}
	m.commitErrors.WithLabelValues(reason).Inc()
}

// RunStatus implements runtime.Observer.
func (m *Metrics) RunStatus(tenant string, _, to loop.Status) {
	m.runTransitions.WithLabelValues(tenant, string(to)).Inc()
}

// RunEnded implements runtime.Observer.
func (m *Metrics) RunEnded(tenant, agent string, status loop.Status, d time.Duration) {
	m.runDuration.WithLabelValues(tenant, agent, string(status)).Observe(d.Seconds())
}

// EffectSettled implements runtime.Observer.
func (m *Metrics) EffectSettled(tenant string, kind abi.EffectKind, state loop.OutcomeState, class abi.ErrorClass) {
	m.effectsSettled.WithLabelValues(tenant, string(kind), string(state), string(class)).Inc()
}

// Usage implements runtime.Observer.
func (m *Metrics) Usage(tenant string, u abi.Usage) {
	if u.InputTokens > 0 {
		m.tokens.WithLabelValues(tenant, "input").Add(float64(u.InputTokens))
	}
	if u.OutputTokens > 0 {
		m.tokens.WithLabelValues(tenant, "output").Add(float64(u.OutputTokens))
	}
}

// RecoveryDecision implements runtime.Observer.
func (m *Metrics) RecoveryDecision(decision string) {
	m.recoveryActions.WithLabelValues(decision).Inc()
}

// WatchdogReport implements runtime.Observer.
func (m *Metrics) WatchdogReport(tenant string) {
	m.watchdogReports.WithLabelValues(tenant).Inc()
}

// Limited counts a connection or request that a limit refused; the API
// server and its listener call it (httpapi.Config.OnLimit).
func (m *Metrics) Limited(limit, tenant string) {
	m.limited.WithLabelValues(limit, tenant).Inc()
}

// Config reload results, the result label of agenthost_config_reloads_total.
const (
	ReloadApplied = "applied"
	ReloadRefused = "refused"
)

// ConfigReloaded counts a config reload by its result (ReloadApplied or
// ReloadRefused).
func (m *Metrics) ConfigReloaded(result string) {
	m.configReloads.WithLabelValues(result).Inc()
}

// Pruned counts what one retention pass removed; serve calls it after
// each Store.Prune that succeeded.
func (m *Metrics) Pruned(s runtime.PruneStats) {
	m.prunes.Inc()
	m.pruned.WithLabelValues("runs").Add(float64(s.Runs))
	m.pruned.WithLabelValues("events").Add(float64(s.Events))
	m.pruned.WithLabelValues("commands").Add(float64(s.Commands))
}

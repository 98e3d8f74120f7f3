package metrics

import (
	"context"
	"errors"
	"github.com/agenthost/agenthost/internal/budget"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Executor wraps a runtime.Executor so that every call is timed in
// agenthost_plugin_call_duration_seconds{plugin, export}, every error
// counted in agenthost_plugin_call_errors_total{plugin, export, class},
// every call counted by what it came back with in
// agenthost_executor_calls_total{plugin, kind, export, state, class}, and
// every model call that settles its attempt timed from the attempt's
// dispatch in agenthost_model_call_seconds{plugin, state, class}. The
// wrapper names plugin as its endpoint (runtime.EndpointNamer).
// serve wraps each host adapter with it before handing it to the runtime.
// The wrapper is a runtime.CapacityWaiter when next is, so the runtime
// still starts the call's timeout only once the host has an instance.
func (m *Metrics) Executor(plugin string, next runtime.Executor) runtime.Executor {
	t := &timedExecutor{m: m, plugin: plugin, next: next}
	if _, ok := next.(runtime.CapacityWaiter); ok {
		return waitingExecutor{t}
	}
	return t
}

// Builder wraps a runtime.Builder the same way (export "build").
func (m *Metrics) Builder(plugin string, next runtime.Builder) runtime.Builder {
	t := &timedBuilder{m: m, plugin: plugin, next: next}
	if _, ok := next.(runtime.CapacityWaiter); ok {
		return waitingBuilder{t}
	}
	return t
}

// waitingExecutor and waitingBuilder pass next's runtime.CapacityWaiter on.
type (
	waitingExecutor struct{ *timedExecutor }
	waitingBuilder  struct{ *timedBuilder }
)

func (waitingExecutor) WaitsForCapacity() {}
func (waitingBuilder) WaitsForCapacity()  {}

type timedExecutor struct {
	m      *Metrics
	plugin string
	next   runtime.Executor
}

var _ runtime.Executor = (*timedExecutor)(nil)

func (t *timedExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	began := time.Now()
	r, err := t.next.Start(t.streamTimed(ctx, c, began), c)
	t.m.observeCall(t.plugin, abi.ExportStart, began, err)
	t.m.observeEffectCall(t.plugin, abi.ExportStart, c, r, err)
	return r, err
}

func (t *timedExecutor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	began := time.Now()
	r, err := t.next.Poll(t.streamTimed(ctx, c, began), c)
	t.m.observeCall(t.plugin, abi.ExportPoll, began, err)
	t.m.observeEffectCall(t.plugin, abi.ExportPoll, c, r, err)
	return r, err
}

func (t *timedExecutor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	began := time.Now()
	r, err := t.next.Attach(ctx, c)
	t.m.observeCall(t.plugin, abi.ExportAttach, began, err)
	t.m.observeEffectCall(t.plugin, abi.ExportAttach, c, r, err)
	return r, err
}

func (t *timedExecutor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	began := time.Now()
	r, err := t.next.Cancel(ctx, c)
	t.m.observeCall(t.plugin, abi.ExportCancel, began, err)
	state, class := string(r.State), ""
	if err != nil {
		state, class = "error", ErrorClass(err)
	}
	t.m.executorCalls.WithLabelValues(t.plugin, string(c.Input.Effect.Kind), abi.ExportCancel, state, class).Inc()
	return r, err
}

// streamTimed marks a model call's context with the plugin and the
// call's start, for the time to its first model_delta (Events).
func (t *timedExecutor) streamTimed(ctx context.Context, c runtime.EffectCall, began time.Time) context.Context {
	if c.Input.Effect.Kind != abi.KindModel {
		return ctx
	}
	return context.WithValue(ctx, modelCallKey{}, modelCallStart{plugin: t.plugin, began: began})
}

// modelCallKey is the context key of a model call's modelCallStart.
type modelCallKey struct{}

// modelCallStart is which model executor a call went to, and when.
type modelCallStart struct {
	plugin string
	began  time.Time
}

// Events wraps the plugins' event sink so that a model call's first
// model_delta (its answer's first piece) is timed from the start of the
// call in agenthost_model_time_to_first_token_seconds{plugin}. A call
// that did not pass through Executor's wrapper is not timed.
func (m *Metrics) Events(next runtime.EventSink) runtime.EventSink {
	return timedEvents{m: m, next: next}
}

type timedEvents struct {
	m    *Metrics
	next runtime.EventSink
}

func (e timedEvents) Emit(ctx context.Context, scope runtime.EmitScope, ev abi.EmitEvent) error {
	if ev.Type == abi.EmitModelDelta && scope.DeltaSeq == 1 {
		if c, ok := ctx.Value(modelCallKey{}).(modelCallStart); ok {
			e.m.firstToken.WithLabelValues(c.plugin).Observe(time.Since(c.began).Seconds())
		}
	}
	return e.next.Emit(ctx, scope, ev)
}

// Endpoint implements runtime.EndpointNamer: the plugin's ID.
func (t *timedExecutor) Endpoint() string { return t.plugin }

// RouteTo implements runtime.VersionRouter: the wrapped executor's, or
// held itself when it keeps one version.
func (t *timedExecutor) RouteTo(held *loop.PluginRef) (loop.PluginRef, error) {
	if r, ok := t.next.(runtime.VersionRouter); ok {
		return r.RouteTo(held)
	}
	if held == nil {
		return loop.PluginRef{}, nil
	}
	return *held, nil
}

// PluginRef implements runtime.PluginReporter: the wrapped executor's.
func (t *timedExecutor) PluginRef() (loop.PluginRef, bool) {
	if ref := runtime.PluginOf(t.next); ref != nil {
		return *ref, true
	}
	return loop.PluginRef{}, false
}

type timedBuilder struct {
	m      *Metrics
	plugin string
	next   runtime.Builder
}

var _ runtime.Builder = (*timedBuilder)(nil)

func (t *timedBuilder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	began := time.Now()
	out, err := t.next.Build(ctx, tenant, in)
	t.m.observeCall(t.plugin, abi.ExportBuild, began, err)
	return out, err
}

// The wall clock, not the runtime's Clock, times plugin calls: a fake
// clock does not move during a call.
func (m *Metrics) observeCall(plugin, export string, began time.Time, err error) {
	m.pluginCalls.WithLabelValues(plugin, export).Observe(time.Since(began).Seconds())
	if err != nil {
		m.pluginErrors.WithLabelValues(plugin, export, ErrorClass(err)).Inc()
	}
}

// observeEffectCall counts a start, poll or attach call by what it came
// back with and, for a model call that settles its attempt, observes the
// time since the attempt's dispatch. A call settles its attempt when it
// returns done or failed, or a *runtime.PluginError, which the runtime
// settles as failed with its class; pending, unknown and the errors that
// leave the outcome unknown (the context ended, the executor is
// unavailable) do not. The dispatch time is the runtime's clock, which in
// serve is the wall clock; an attempt without one (never the case for a
// dispatched attempt) is timed from now, as 0.
func (m *Metrics) observeEffectCall(plugin, export string, c runtime.EffectCall, r abi.EffectReply, err error) {
	kind := c.Input.Effect.Kind
	state, class := string(r.State), ""
	settles := r.State == abi.StateDone || r.State == abi.StateFailed
	var pe *runtime.PluginError
	switch {
	case err != nil:
		state, class = "error", ErrorClass(err)
		settles = errors.As(err, &pe)
	case r.State == abi.StateFailed && r.Error != nil:
		class = string(r.Error.HostClass()) // as the runtime settles it
	case r.State == abi.StateFailed:
		class = string(abi.ClassPluginFailed)
	case r.Error != nil:
		class = string(r.Error.Class)
	}
	m.executorCalls.WithLabelValues(plugin, string(kind), export, state, class).Inc()
	if kind != abi.KindModel || !settles {
		return
	}
	if err != nil {
		state = string(abi.StateFailed)
	}
	took := time.Duration(0)
	if !c.DispatchedAt.IsZero() {
		took = max(time.Since(c.DispatchedAt), 0)
	}
	m.modelCalls.WithLabelValues(plugin, state, class).Observe(took.Seconds())
}

// ErrorClass names the class of a plugin call's error for the metrics: the
// class of a *runtime.PluginError; executor_unavailable; cancelled or
// plugin_timeout when the call's context ended; other otherwise.
func ErrorClass(err error) string {
	var pe *runtime.PluginError
	switch {
	case errors.As(err, &pe):
		return string(pe.Class)
	case errors.Is(err, runtime.ErrExecutorUnavailable):
		return string(abi.ClassExecutorUnavailable)
	case errors.Is(err, context.DeadlineExceeded):
		return string(abi.ClassPluginTimeout)
	case errors.Is(err, context.Canceled):
		return string(abi.ClassCancelled)
	}
	return "other"
}

// HTTPRefusals reads one plugin's agenthost_http refusals: requests to a
// host or port not on its allow-list (denied), and dials refused for the
// address a host name resolved to (refused). serve passes one for each
// plugin in force, from host.Plugin.HTTPStats.
type HTTPRefusals func() (denied, refused int64)

// RegisterPluginHTTP registers agenthost_plugin_http_refused_total{plugin,
// reason}, read at scrape time from the plugins plugins returns then (the
// plugins in force: a reload adds, removes and replaces some): reason
// "host" for a destination off the allow-list, "address" for a host name
// that resolved to an address no plugin may reach (loopback, private,
// link-local, ...), the one to alert on. A plugin a reload loaded from
// another file counts from 0 again, as after a restart.
func (m *Metrics) RegisterPluginHTTP(plugins func() map[string]HTTPRefusals) error {
	desc := prometheus.NewDesc("agenthost_plugin_http_refused_total",
		"agenthost_http requests a plugin made that the host refused, by plugin and reason (host: not on the allow-list; address: a host name resolved to an address no plugin may reach).",
		[]string{"plugin", "reason"}, nil)
	return m.reg.Register(&pluginCounters[HTTPRefusals]{descs: []*prometheus.Desc{desc}, plugins: plugins,
		collect: func(ch chan<- prometheus.Metric, plugin string, read HTTPRefusals) {
			denied, refused := read()
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(denied), plugin, "host")
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(refused), plugin, "address")
		}})
}

// pluginCounters is a collector of counters by plugin, read at scrape time
// from the plugins in force then.
type pluginCounters[R any] struct {
	descs   []*prometheus.Desc
	plugins func() map[string]R
	collect func(ch chan<- prometheus.Metric, plugin string, read R)
}

func (c *pluginCounters[R]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *pluginCounters[R]) Collect(ch chan<- prometheus.Metric) {
	for plugin, read := range c.plugins() {
		c.collect(ch, plugin, read)
	}
}

// RegisterModelBudgets registers, for each model budget (by plugin ID),
// agenthost_model_budget_waits_total{plugin}, the model calls that had to
// wait for the endpoint's budget, and
// agenthost_model_budget_wait_seconds_total{plugin}, the time they
// waited; both read at scrape time.
func (m *Metrics) RegisterModelBudgets(budgets map[string]*budget.Budget) error {
	for plugin, b := range budgets {
		for _, c := range []prometheus.Collector{
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "agenthost_model_budget_waits_total",
				Help:        "Model calls that waited for their endpoint's budget (plugins.ID.budget) before they started, by plugin.",
				ConstLabels: prometheus.Labels{"plugin": plugin},
			}, func() float64 { return float64(b.Waits()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "agenthost_model_budget_wait_seconds_total",
				Help:        "Time model calls waited for their endpoint's budget, counted when each wait ended, by plugin.",
				ConstLabels: prometheus.Labels{"plugin": plugin},
			}, b.WaitedSeconds),
		} {
			if err := m.reg.Register(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// InstanceWaits reads one plugin's waits for an instance: the calls that
// waited and their waits in seconds, summed. serve passes one for each
// plugin in force, from host.Plugin.InstanceWaits.
type InstanceWaits func() (waits int64, seconds float64)

// RegisterInstanceWaits registers, read at scrape time from the plugins
// plugins returns then (the plugins in force),
// agenthost_plugin_instance_waits_total{plugin}, the calls that found
// every one of their tenant's max_instances instances busy (or no room
// under max_instance_memory) and waited for one, and
// agenthost_plugin_instance_wait_seconds_total{plugin}, their waits. A
// plugin a reload loaded from another file counts from 0 again.
func (m *Metrics) RegisterInstanceWaits(plugins func() map[string]InstanceWaits) error {
	waits := prometheus.NewDesc("agenthost_plugin_instance_waits_total",
		"Plugin calls that waited for an instance: max_instances of their tenant's were busy, or max_instance_memory left no room for another.",
		[]string{"plugin"}, nil)
	seconds := prometheus.NewDesc("agenthost_plugin_instance_wait_seconds_total",
		"Seconds plugin calls spent waiting for an instance, summed.",
		[]string{"plugin"}, nil)
	return m.reg.Register(&pluginCounters[InstanceWaits]{descs: []*prometheus.Desc{waits, seconds}, plugins: plugins,
		collect: func(ch chan<- prometheus.Metric, plugin string, read InstanceWaits) {
			n, s := read()
			ch <- prometheus.MustNewConstMetric(waits, prometheus.CounterValue, float64(n), plugin)
			ch <- prometheus.MustNewConstMetric(seconds, prometheus.CounterValue, s, plugin)
		}})
}

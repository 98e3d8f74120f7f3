package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/loop"
)

// scrape reads /metrics and returns the value of every sample, keyed by
// its series (name{labels} in the exposition order of labels).
func (e *env) scrape() map[string]float64 {
	e.t.Helper()
	r := e.do("GET", "/metrics", "", "")
	require.Equal(e.t, http.StatusOK, r.Status)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(r.Body)))
	require.NoError(e.t, err)
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			key := name
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestMetricsExposeTheDocumentedNamesAndMove(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:echo({"text":"a"})|answer:$results`)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)

	toolDone := "agenthost_effects_settled_total{class=,kind=tool,state=done,tenant=acme}"
	tokensIn := "agenthost_model_tokens_total{tenant=acme,type=input}"
	completed := "agenthost_run_transitions_total{status=completed,tenant=acme}"
	took := "agenthost_run_duration_seconds{agent=default,status=completed,tenant=acme}"
	var got map[string]float64
	// The Run's end is visible in the store a moment before the observer
	// has seen its last commit, and the observer counts that commit's
	// settlement, usage and transition one after another: wait for all
	// three, then check exact values.
	waitFor(t, "the settlement, the usage and the completion in the metrics", func() bool {
		got = e.scrape()
		return got[toolDone] == 1 && got[tokensIn] >= 20 && got[completed] == 1 && got[took] == 1
	})
	for _, series := range []string{
		"agenthost_run_transitions_total{status=pending,tenant=acme}",
		"agenthost_run_transitions_total{status=completed,tenant=acme}",
		"agenthost_effects_settled_total{class=,kind=model,state=done,tenant=acme}",
		"agenthost_plugin_call_duration_seconds{export=start,plugin=scripted-tools}",
		"agenthost_plugin_call_duration_seconds{export=start,plugin=scripted-model}",
		"agenthost_plugin_call_duration_seconds{export=build,plugin=echo-builder}",
		"agenthost_store_commit_duration_seconds",
		"agenthost_store_commits_total",
		"agenthost_watcher_queue_depth",
		"agenthost_recovery_passes_total",
		"agenthost_ready",
		"agenthost_model_tokens_total{tenant=acme,type=input}",
		"agenthost_model_tokens_total{tenant=acme,type=output}",
		"agenthost_runs_active{status=waiting,tenant=acme}",
		"agenthost_executor_calls_total{class=,export=start,kind=model,plugin=scripted-model,state=done}",
		"agenthost_executor_calls_total{class=,export=start,kind=tool,plugin=scripted-tools,state=done}",
		"agenthost_model_call_seconds{class=,plugin=scripted-model,state=done}",
		took,
	} {
		require.Contains(t, got, series)
	}
	require.Equal(t, 20.0, got["agenthost_model_tokens_total{tenant=acme,type=input}"])
	require.Equal(t, 1.0, got["agenthost_ready"])
	require.Equal(t, 2.0, got["agenthost_plugin_call_duration_seconds{export=start,plugin=scripted-model}"])
	require.Positive(t, got["agenthost_store_commits_total"])
	// Both model calls settled at their start, and were timed; the tool's
	// call is counted by its plugin and not timed as a model call.
	require.Equal(t, 2.0, got["agenthost_executor_calls_total{class=,export=start,kind=model,plugin=scripted-model,state=done}"])
	require.Equal(t, 1.0, got["agenthost_executor_calls_total{class=,export=start,kind=tool,plugin=scripted-tools,state=done}"])
	require.Equal(t, 2.0, got["agenthost_model_call_seconds{class=,plugin=scripted-model,state=done}"])
	require.NotContains(t, got, "agenthost_model_call_seconds{class=,plugin=scripted-tools,state=done}")
	require.Equal(t, 1.0, got[took])

	// The values move with the next Run.
	waiting := e.submit(tokenAcme, "s2", `call:echo({"text":"b"})|ask:More?|answer:ok`)
	e.waitStatus(tokenAcme, waiting.ID, loop.StatusWaiting)
	waitFor(t, "the second settlement in the metrics", func() bool { got = e.scrape(); return got[toolDone] == 2 })
	require.Equal(t, 1.0, got["agenthost_runs_active{status=waiting,tenant=acme}"])
	require.Equal(t, 0.0, got["agenthost_runs_active{status=waiting,tenant=globex}"])
}

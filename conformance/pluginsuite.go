package conformance

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/conformance/pluginsuite"
)

// PluginSuite holds one plugin .wasm to ABI v1: it runs
// pluginsuite.Run, which reports through its own pluginsuite.Reporter, so
// the suite itself links no testing. It lives in the subpackage
// conformance/pluginsuite because this package links testing (the store
// and runtime suites take *testing.T); `agenthost plugin verify` imports
// the subpackage. Use TestReporter to run it under go test.
func PluginSuite(ctx context.Context, p pluginsuite.Plugin, opts pluginsuite.Options, r pluginsuite.Reporter) pluginsuite.Summary {
	return pluginsuite.Run(ctx, p, opts, r)
}

// TestReporter adapts t to a pluginsuite.Reporter: a FAIL is a test error,
// PASS and WARN lines are logged. It also keeps every result.
func TestReporter(t testing.TB) *TReporter { return &TReporter{t: t} }

// TReporter is the testing adapter TestReporter returns.
type TReporter struct {
	t       testing.TB
	Results []pluginsuite.Result
}

// Report implements pluginsuite.Reporter.
func (r *TReporter) Report(res pluginsuite.Result) {
	r.t.Helper()
	r.Results = append(r.Results, res)
	if res.Verdict == pluginsuite.Fail {
		r.t.Errorf("%s", res)
		return
	}
	r.t.Logf("%s", res)
}

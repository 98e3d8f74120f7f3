package conformance

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/plugins/abicheck"
)

// PluginSuite holds one plugin .wasm to ABI v1: it runs abicheck.Run,
// the check `agenthost plugin verify` runs, which reports through its own
// abicheck.Reporter and links no testing (package abicheck lives outside
// conformance because this package links testing). Use TestReporter to
// run it under go test.
func PluginSuite(ctx context.Context, p abicheck.Plugin, opts abicheck.Options, r abicheck.Reporter) abicheck.Summary {
	return abicheck.Run(ctx, p, opts, r)
}

// TestReporter adapts t to a abicheck.Reporter: a FAIL is a test error,
// PASS and WARN lines are logged. It also keeps every result.
func TestReporter(t testing.TB) *TReporter { return &TReporter{t: t} }

// TReporter is the testing adapter TestReporter returns.
type TReporter struct {
	t       testing.TB
	Results []abicheck.Result
}

// Report implements abicheck.Reporter.
func (r *TReporter) Report(res abicheck.Result) {
	r.t.Helper()
	r.Results = append(r.Results, res)
	if res.Verdict == abicheck.Fail {
		r.t.Errorf("%s", res)
		return
	}
	r.t.Logf("%s", res)
}

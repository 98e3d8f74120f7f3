package config

import (
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/budget"
)

const budgetTenants = `
tenants:
  acme:
    builder: b
    model: openai
`

// TestModelBudgetIsDecoded: plugins.ID.budget's three keys, each
// optional.
func TestModelBudgetIsDecoded(t *testing.T) {
	cfg, err := parse(t, `
plugins:
  b: {path: b.wasm, role: builder}
  openai:
    path: o.wasm
    role: executor
    budget: {max_concurrent_calls: 8, requests_per_minute: 500, tokens_per_minute: 200000}
  calc: {path: c.wasm, role: executor, budget: {requests_per_minute: 60}}
  quantized: {path: q.wasm, role: executor, budget: {requests_per_minute: 600, window: 5s}}
`+budgetTenants)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Plugins["quantized"].Budget, (budget.Limits{RequestsPerMinute: 600, Window: 5 * time.Second}); got != want {
		t.Errorf("quantized's budget %+v, want %+v", got, want)
	}
	if got, want := cfg.Plugins["openai"].Budget, (budget.Limits{MaxConcurrentCalls: 8, RequestsPerMinute: 500, TokensPerMinute: 200000}); got != want {
		t.Errorf("openai's budget %+v, want %+v", got, want)
	}
	if got, want := cfg.Plugins["calc"].Budget, (budget.Limits{RequestsPerMinute: 60}); got != want {
		t.Errorf("calc's budget %+v, want %+v", got, want)
	}
	if !cfg.Plugins["b"].Budget.IsZero() {
		t.Errorf("a plugin without a budget has %+v", cfg.Plugins["b"].Budget)
	}
}

// TestModelBudgetProblemsNameTheirKeys: a bad value, an unknown key and a
// budget on a builder each name the key path.
func TestModelBudgetProblemsNameTheirKeys(t *testing.T) {
	_, err := parse(t, `
plugins:
  b: {path: b.wasm, role: builder, budget: {requests_per_minute: 10}}
  openai:
    path: o.wasm
    role: executor
    budget: {max_concurrent_calls: -1, requests_per_minute: lots, tokens_per_hour: 5}
  odd: {path: o.wasm, role: executor, budget: {requests_per_minute: 60, window: 7s}}
  short: {path: o.wasm, role: executor, budget: {tokens_per_minute: 60, window: 500ms}}
  bare: {path: o.wasm, role: executor, budget: {max_concurrent_calls: 2, window: 10s}}
`+budgetTenants)
	if err == nil {
		t.Fatal("bad budgets loaded")
	}
	for _, want := range []string{
		"plugins.openai.budget.max_concurrent_calls: -1 is out of range",
		"plugins.openai.budget.requests_per_minute: want an integer",
		"plugins.openai.budget.tokens_per_hour",
		"plugins.b.budget: a budget bounds the calls of a model executor",
		"plugins.odd.budget.window: 7s does not divide a minute into whole windows of at least 1s",
		"plugins.short.budget.window: 500ms does not divide a minute",
		"plugins.bare.budget.window: is set, and neither requests_per_minute nor tokens_per_minute is",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

package config

import (
	"strings"
	"testing"

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
`+budgetTenants)
	if err != nil {
		t.Fatal(err)
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
`+budgetTenants)
	if err == nil {
		t.Fatal("bad budgets loaded")
	}
	for _, want := range []string{
		"plugins.openai.budget.max_concurrent_calls: -1 is out of range",
		"plugins.openai.budget.requests_per_minute: want an integer",
		"plugins.openai.budget.tokens_per_hour",
		"plugins.b.budget: a budget bounds the calls of a model executor",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

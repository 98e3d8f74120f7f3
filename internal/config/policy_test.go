package config

import (
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
)

// A policy block takes each key it leaves out from the documented
// defaults (docs/OPERATIONS.md: mode retry, max_attempts 3, backoff 1s,
// max_backoff 30s), not from zero: a block that sets only max_attempts
// must not lose the 30s cap on the backoff.

func TestAModelPolicyBlockKeepsTheDefaultsOfFieldsItDoesNotSet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block string
		env   string // AGENTHOST_TENANTS_ACME_MODEL_POLICY_MAX_ATTEMPTS, when set
		want  loop.Policy
	}{
		{"no block", "", "", loop.DefaultModelPolicy},
		{"an empty block", "model_policy: {}", "", loop.DefaultModelPolicy},
		{"mode and max_attempts", "model_policy: {mode: retry, max_attempts: 5}", "", loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 5, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		{"max_attempts alone", "model_policy: {max_attempts: 5}", "", loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 5, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		{"backoff alone", "model_policy: {backoff: 2s}", "", loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 2000, MaxBackoffMS: 30_000}},
		{"max_backoff 0, no cap", "model_policy: {max_backoff: 0}", "", loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 1000}},
		{"mode alone", "model_policy: {mode: fail}", "", loop.Policy{Mode: loop.PolicyFail, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		{"max_attempts from the environment", "", "5", loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 5, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		{"every key", "model_policy: {mode: retry, max_attempts: 8, backoff: 100ms, max_backoff: 1s, max_rate_limited_attempts: 40, max_retry_after: 10m}", "",
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 8, BackoffMS: 100, MaxBackoffMS: 1000, MaxRateLimitedAttempts: 40, MaxRetryAfterMS: 600_000}},
		// Left out, the rate-limit keys stay 0: the Loop's defaults.
		{"the rate-limit keys alone", "model_policy: {max_rate_limited_attempts: 5, max_retry_after: 90s}", "",
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000, MaxRateLimitedAttempts: 5, MaxRetryAfterMS: 90_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("AGENTHOST_TENANTS_ACME_MODEL_POLICY_MAX_ATTEMPTS", tc.env)
			}
			cfg, err := parse(t, minimal+indent(tc.block))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Tenants["acme"].ModelPolicy; got != tc.want {
				t.Errorf("model policy %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAToolPolicyBlockKeepsTheDefaultsOfFieldsItDoesNotSet(t *testing.T) {
	for _, tc := range []struct {
		name       string
		block      string
		idempotent loop.Policy // the policy of an idempotent tool
		other      loop.Policy // of a tool that is not
	}{
		{"no block", "tools: {calc: {approval: never}}", loop.DefaultToolPolicy(true), loop.DefaultToolPolicy(false)},
		{"mode and max_attempts", "tools: {calc: {policy: {mode: retry, max_attempts: 5}}}",
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 5, BackoffMS: 1000, MaxBackoffMS: 30_000},
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 5, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		// Without a mode, the tool's default mode: a tool that is not
		// idempotent is never retried unless the block says retry.
		{"backoff alone", "tools: {calc: {policy: {backoff: 2s}}}",
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 2000, MaxBackoffMS: 30_000},
			loop.Policy{Mode: loop.PolicyFail, MaxAttempts: 3, BackoffMS: 2000, MaxBackoffMS: 30_000}},
		{"mode alone", "tools: {calc: {policy: {mode: fail_run}}}",
			loop.Policy{Mode: loop.PolicyFailRun, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000},
			loop.Policy{Mode: loop.PolicyFailRun, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000}},
		{"the rate-limit keys", "tools: {calc: {policy: {max_rate_limited_attempts: 7, max_retry_after: 2m}}}",
			loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000, MaxRateLimitedAttempts: 7, MaxRetryAfterMS: 120_000},
			loop.Policy{Mode: loop.PolicyFail, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000, MaxRateLimitedAttempts: 7, MaxRetryAfterMS: 120_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, minimal+indent(tc.block))
			if err != nil {
				t.Fatal(err)
			}
			acme := cfg.Tenants["acme"]
			if got := acme.ToolPolicy("calc", true); got != tc.idempotent {
				t.Errorf("an idempotent tool's policy %+v, want %+v", got, tc.idempotent)
			}
			if got := acme.ToolPolicy("calc", false); got != tc.other {
				t.Errorf("another tool's policy %+v, want %+v", got, tc.other)
			}
		})
	}
}

func TestAPolicyBlockThatCannotWorkWithTheDefaultsIsRefused(t *testing.T) {
	for _, tc := range []struct {
		block string
		want  string
	}{
		{"model_policy: {backoff: 1m}", "tenants.acme.model_policy.max_backoff: max_backoff (by default) is 30s, less than backoff 1m0s"},
		{"model_policy: {backoff: 10s, max_backoff: 5s}", "tenants.acme.model_policy.max_backoff: max_backoff is 5s, less than backoff 10s"},
		{"model_policy: {max_attempts: 0}", "tenants.acme.model_policy.max_attempts: retry needs max_attempts of at least 1"},
		{`model_policy: {mode: ""}`, `tenants.acme.model_policy.mode: "" is not a policy`},
		{"tools: {calc: {policy: {max_attempts: 0}}}", "tenants.acme.tools.calc.policy.max_attempts: must be at least 1"},
		{"model_policy: {max_rate_limited_attempts: 0}", "tenants.acme.model_policy.max_rate_limited_attempts: must be at least 1"},
		{"model_policy: {max_rate_limited_attempts: -2}", "tenants.acme.model_policy.max_rate_limited_attempts: -2 is out of range: want 0 to 10000"},
		{"model_policy: {max_rate_limited_attempts: many}", "tenants.acme.model_policy.max_rate_limited_attempts: want an integer"},
		{"model_policy: {max_retry_after: 0}", "tenants.acme.model_policy.max_retry_after: must be more than 0"},
		{"model_policy: {max_retry_after: soon}", `tenants.acme.model_policy.max_retry_after: "soon" is not a duration`},
		{"tools: {calc: {policy: {max_retry_after: 0s}}}", "tenants.acme.tools.calc.policy.max_retry_after: must be more than 0"},
	} {
		t.Run(tc.block, func(t *testing.T) {
			_, err := parse(t, minimal+indent(tc.block))
			text := strings.Join(problems(t, err), "\n")
			if !strings.Contains(text, tc.want) {
				t.Errorf("no problem says %q; got:\n%s", tc.want, text)
			}
		})
	}
}

// indent puts a line of YAML under tenant acme of minimal.
func indent(line string) string {
	if line == "" {
		return ""
	}
	return "    " + line + "\n"
}

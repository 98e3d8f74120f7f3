package config

import (
	"strings"
	"testing"
	"time"
)

// TestWaitTimeoutDefaultsToAWeekAndZeroDisablesIt: limits.wait_timeout
// is DefaultWaitTimeout when no level sets it; a tenant's value is its
// agents' default, an agent's own wins, and 0 means no bound.
func TestWaitTimeoutDefaultsToAWeekAndZeroDisablesIt(t *testing.T) {
	cfg, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    agents:
      support: {model: {plugin: openai}}
      forever: {model: {plugin: openai}, limits: {wait_timeout: 0}}
  beta:
    builder: b
    limits: {wait_timeout: 36h, run_timeout: 10m}
    agents:
      support: {model: {plugin: openai}}
      quick: {model: {plugin: openai}, limits: {wait_timeout: 15m}}
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant, agent string
		want          time.Duration
	}{
		{"acme", "support", DefaultWaitTimeout},
		{"acme", "forever", 0},
		{"beta", "support", 36 * time.Hour},
		{"beta", "quick", 15 * time.Minute},
	} {
		if got := cfg.Tenants[c.tenant].Agents[c.agent].Limits.WaitTimeout; got != c.want {
			t.Errorf("tenants.%s.agents.%s: wait_timeout %v, want %v", c.tenant, c.agent, got, c.want)
		}
	}
	if DefaultWaitTimeout != 7*24*time.Hour {
		t.Errorf("DefaultWaitTimeout is %v; the documented default is 7 days", DefaultWaitTimeout)
	}
	if got := cfg.Tenants["acme"].Limits.WaitTimeout; got != DefaultWaitTimeout {
		t.Errorf("a tenant that sets none: wait_timeout %v", got)
	}
	if got := cfg.Tenants["beta"].Agents["quick"].Limits.RunTimeout; got != 10*time.Minute {
		t.Errorf("run_timeout beside wait_timeout: %v", got)
	}
}

// TestWaitTimeoutProblemsNameTheirKeys: a bad wait_timeout names its key
// path at both levels, and a day unit is told how to write it.
func TestWaitTimeoutProblemsNameTheirKeys(t *testing.T) {
	t.Setenv("AGENTHOST_TENANTS_BETA_LIMITS_WAIT_TIMEOUT", "a while")
	_, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    limits: {wait_timeout: 7d}
    agents:
      support: {model: {plugin: openai}, limits: {wait_timeout: -1h}}
      other: {model: {plugin: openai}, limits: {wait_timeout: [1h]}}
  beta:
    builder: b
    model: openai
`)
	text := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		`tenants.acme.limits.wait_timeout: "7d" is not a duration: write it like "30s", "5m" or "1h30m" (there is no unit of days: write 168h for 7 days)`,
		`tenants.acme.agents.support.limits.wait_timeout: "-1h" is not a duration`,
		`tenants.acme.agents.other.limits.wait_timeout: want a duration such as "30s" or "5m", got a list`,
		`tenants.beta.limits.wait_timeout: "a while" is not a duration`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
}

package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

const agentPlugins = `
plugins:
  b: {path: b.wasm, role: builder}
  b2: {path: b2.wasm, role: builder}
  openai: {path: o.wasm, role: executor}
  calc: {path: c.wasm, role: executor}
  slow: {path: s.wasm, role: executor}
`

// TestAgentsAreDecoded: each agent of a tenant, with its instructions
// (inline or from a file beside the config), builder, model plugin and
// settings, tools and rules; the tenant's builder, limits, history_runs
// and model_policy are the defaults of its agents' own.
func TestAgentsAreDecoded(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "research.md"), []byte("You research.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+`
tenants:
  acme:
    builder: b
    limits: {max_steps: 5, run_timeout: 1m}
    history_runs: 7
    model_policy: {mode: retry, max_attempts: 2}
    agents:
      support:
        description: Answers customers.
        instructions: You help customers.
        model:
          plugin: openai
          settings: {model: gpt-4o-mini, temperature: 0.2, max_output_tokens: 300, stop: ["\n\n"]}
        tools:
          - {plugin: calc}
          - {plugin: slow, tool: slow_job, approval: always, policy: {mode: fail}}
        limits: {max_steps: 3}
      research:
        instructions_file: research.md
        builder: b2
        model: {plugin: openai}
        history_runs: 2
        model_policy: {max_attempts: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	acme := cfg.Tenants["acme"]
	if got := sortedKeys(acme.Agents); !reflect.DeepEqual(got, []string{"research", "support"}) {
		t.Fatalf("agents %v, want research and support (no default: the tenant has no top-level model)", got)
	}
	s := acme.Agents["support"]
	settings, _ := json.Marshal(s.Settings)
	if s.Name != "support" || s.Description != "Answers customers." || s.Instructions != "You help customers." || s.Builder != "b" || s.Model != "openai" ||
		string(settings) != `{"max_output_tokens":300,"model":"gpt-4o-mini","stop":["\n\n"],"temperature":0.2}` {
		t.Errorf("support: %+v, settings %s", s, settings)
	}
	wantTools := []AgentTool{{Plugin: "calc"}, {Plugin: "slow", Tool: "slow_job", ToolOverride: ToolOverride{Approval: abi.ApprovalAlways,
		Policy: &loop.Policy{Mode: loop.PolicyFail, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000}}}}
	if !reflect.DeepEqual(s.Tools, wantTools) {
		t.Errorf("support's tools: %+v, want %+v", s.Tools, wantTools)
	}
	if s.Limits.MaxSteps != 3 || s.Limits.RunTimeout != time.Minute || s.Limits.MaxParallelToolCalls != loop.DefaultLimits.MaxParallelToolCalls || s.HistoryRuns != 7 ||
		s.ModelPolicy.MaxAttempts != 2 {
		t.Errorf("support's rules do not take the tenant's as defaults: %+v, history %d, policy %+v", s.Limits, s.HistoryRuns, s.ModelPolicy)
	}
	if !s.ToolApproval(s.Tools[1], "slow_job", abi.ApprovalNever) || s.ToolApproval(s.Tools[0], "calculate", abi.ApprovalNever) {
		t.Error("an entry's approval is not the tool's")
	}
	if p := s.ToolPolicy(s.Tools[1], "slow_job", true); p.Mode != loop.PolicyFail {
		t.Errorf("an entry's policy is not the tool's: %+v", p)
	}
	r := acme.Agents["research"]
	if r.Instructions != "You research.\n" || r.InstructionsFile != filepath.Join(dir, "research.md") || r.Builder != "b2" || r.Settings != nil ||
		r.Tools != nil || r.HistoryRuns != 2 || r.Limits.MaxSteps != 5 || r.ModelPolicy.MaxAttempts != 5 || r.ModelPolicy.Mode != loop.PolicyRetry {
		t.Errorf("research: %+v", r)
	}
	if got := s.Plugins(); !reflect.DeepEqual(got, []string{"b", "openai", "calc", "slow"}) {
		t.Errorf("support uses plugins %v", got)
	}
}

// TestATenantWithoutAgentsIsItsDefaultAgent: the one-agent form keeps
// working, as the agent "default"; beside an agents block, the top-level
// form is the default agent when it names a model.
func TestATenantWithoutAgentsIsItsDefaultAgent(t *testing.T) {
	cfg, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    model: openai
    tool_executors: [calc]
    history_runs: 4
    tools:
      calculate: {approval: always}
`)
	if err != nil {
		t.Fatal(err)
	}
	acme := cfg.Tenants["acme"]
	def, ok := acme.Agents[DefaultAgent]
	if !ok || len(acme.Agents) != 1 {
		t.Fatalf("agents %v, want default only", sortedKeys(acme.Agents))
	}
	if def.Builder != "b" || def.Model != "openai" || !reflect.DeepEqual(def.Tools, []AgentTool{{Plugin: "calc"}}) || def.HistoryRuns != 4 || def.Instructions != "" {
		t.Errorf("default: %+v", def)
	}
	if !def.ToolApproval(def.Tools[0], "calculate", abi.ApprovalNever) {
		t.Error("the tenant's tools map does not reach its default agent")
	}

	cfg, err = parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    model: openai
    agents:
      support: {model: {plugin: openai}, tools: [{plugin: calc}]}
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := sortedKeys(cfg.Tenants["acme"].Agents); !reflect.DeepEqual(got, []string{"default", "support"}) {
		t.Errorf("agents %v, want default (the top-level form) and support", got)
	}
}

// TestAgentProblemsNameTheirKeys: every problem of an agent names the
// key path it is at.
func TestAgentProblemsNameTheirKeys(t *testing.T) {
	_, err := parse(t, agentPlugins+`
tenants:
  acme:
    model: openai
    agents:
      default: {builder: b, model: {plugin: openai}}
      Bad_Name: {builder: b, model: {plugin: openai}}
      support:
        builder: calc
        instructions: hi
        instructions_file: hi.md
        colour: blue
        model: {plugin: nope, settings: 3, temperature: 1}
        tools:
          - {plugin: calc}
          - {plugin: calc, tool: calculate}
          - {plugin: b}
          - {tool: x}
          - calc
          - {plugin: slow, tool: "bad name", approval: maybe, when: now, policy: {mode: sometimes}}
        limits: {max_steps: 0}
      research:
        model: {plugin: openai}
        instructions_file: missing.md
      nomodel:
        builder: b
        model: openai
  beta:
    builder: b
    tool_executors: [calc]
    agents:
      x: {model: {plugin: openai}}
  gamma:
    builder: b
    agents: {}
`)
	text := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		`tenants.acme.agents.default: is defined twice`,
		`tenants.acme.agents.bad_name: "bad_name" is not a valid agent name`,
		`tenants.acme.agents.support.builder: names plugin "calc", which is a executor; a builder is needed here`,
		`tenants.acme.agents.support.instructions_file: is set, and so is instructions`,
		`tenants.acme.agents.support.colour: unknown key`,
		`tenants.acme.agents.support.model.plugin: names plugin "nope", which is not declared`,
		`tenants.acme.agents.support.model.settings: want a map of model settings`,
		`tenants.acme.agents.support.model.temperature: unknown key`,
		`tenants.acme.agents.support.tools[1]: lists tool "calculate" of plugin "calc", whose every tool is listed already`,
		`tenants.acme.agents.support.tools[2].plugin: names plugin "b", which is a builder; a executor is needed here`,
		`tenants.acme.agents.support.tools[3].plugin: is required`,
		`tenants.acme.agents.support.tools[4]: want a map such as {plugin: calculator}`,
		`tenants.acme.agents.support.tools[5].tool: "bad name" is not a valid tool name`,
		`tenants.acme.agents.support.tools[5].approval: "maybe" is not an approval`,
		`tenants.acme.agents.support.tools[5].when: unknown key`,
		`tenants.acme.agents.support.tools[5].policy.mode: "sometimes" is not a policy`,
		`tenants.acme.agents.support.limits.max_steps: must be at least 1, got 0`,
		`tenants.acme.agents.research.builder: is required`,
		`tenants.acme.agents.research.instructions_file: ` + "", // the path follows
		`missing.md does not exist: write the agent's instructions there`,
		`tenants.acme.agents.nomodel.model: want a map, got the string "openai"`,
		`tenants.beta.model: is not set, but the tenant's top-level tool_executors or tools are`,
		`tenants.gamma.model: is required`, // an empty agents block is none
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
}

// TestAgentKeysTakeEnvironmentOverrides: a variable reaches an agent's
// keys, as it does a tenant's.
func TestAgentKeysTakeEnvironmentOverrides(t *testing.T) {
	t.Setenv("AGENTHOST_TENANTS_ACME_AGENTS_SUPPORT_INSTRUCTIONS", "From the environment.")
	t.Setenv("AGENTHOST_TENANTS_ACME_AGENTS_SUPPORT_LIMITS_MAX_STEPS", "2")
	cfg, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    agents:
      support: {instructions: From the file., model: {plugin: openai}}
`)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Tenants["acme"].Agents["support"]; s.Instructions != "From the environment." || s.Limits.MaxSteps != 2 {
		t.Errorf("support: instructions %q, max_steps %d", s.Instructions, s.Limits.MaxSteps)
	}
}

// TestAgentsAsToolsOfAgents: an entry {agent: NAME} lists another agent
// of the tenant as a tool, with the approval and policy any tool entry
// takes; it brings in no plugin; max_agent_depth bounds the nesting.
func TestAgentsAsToolsOfAgents(t *testing.T) {
	cfg, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    max_agent_depth: 3
    agents:
      lead:
        model: {plugin: openai}
        tools: [{plugin: calc}, {agent: research, approval: always}, {agent: writer}]
      research: {model: {plugin: openai}, tools: [{agent: writer}]}
      writer: {model: {plugin: openai}}
  beta:
    builder: b
    model: openai
`)
	if err != nil {
		t.Fatal(err)
	}
	acme := cfg.Tenants["acme"]
	lead := acme.Agents["lead"]
	want := []AgentTool{{Plugin: "calc"}, {Agent: "research", ToolOverride: ToolOverride{Approval: abi.ApprovalAlways}}, {Agent: "writer"}}
	if !reflect.DeepEqual(lead.Tools, want) {
		t.Errorf("lead's tools %+v, want %+v", lead.Tools, want)
	}
	if got := lead.Plugins(); !reflect.DeepEqual(got, []string{"b", "openai", "calc"}) {
		t.Errorf("lead uses plugins %v", got)
	}
	if acme.MaxAgentDepth != 3 || cfg.Tenants["beta"].MaxAgentDepth != DefaultMaxAgentDepth {
		t.Errorf("max_agent_depth %d and %d, want 3 and the default %d", acme.MaxAgentDepth, cfg.Tenants["beta"].MaxAgentDepth, DefaultMaxAgentDepth)
	}
}

// TestAgentCallCyclesAreRefused: an agent entry must name an agent of the
// tenant, once, alone; a cycle of agents calling agents is refused at
// load, naming the entry that closes it and the whole cycle.
func TestAgentCallCyclesAreRefused(t *testing.T) {
	_, err := parse(t, agentPlugins+`
tenants:
  acme:
    builder: b
    max_agent_depth: 0
    agents:
      a: {model: {plugin: openai}, tools: [{agent: b}, {agent: nobody}]}
      b: {model: {plugin: openai}, tools: [{agent: c}, {agent: c}]}
      c: {model: {plugin: openai}, tools: [{agent: a}]}
      d: {model: {plugin: openai}, tools: [{agent: a, plugin: calc}]}
      self: {model: {plugin: openai}, tools: [{agent: self}]}
  beta:
    builder: b
    max_agent_depth: 99
    agents:
      x: {model: {plugin: openai}}
`)
	text := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		`tenants.acme.agents.a.tools[1].agent: the tenant has no agent "nobody" (its agents: a, b, c, d, self): fix the name`,
		`tenants.acme.agents.b.tools[1]: lists agent "c" again`,
		`tenants.acme.agents.d.tools[0]: names agent "a" and a plugin or tool`,
		`tenants.acme.agents.c.tools[0].agent: makes a cycle of agents calling agents (a → b → c → a)`,
		`tenants.acme.agents.self.tools[0].agent: makes a cycle of agents calling agents (self → self)`,
		`tenants.acme.max_agent_depth: must be at least 1, got 0`,
		`tenants.beta.max_agent_depth: 99 is out of range: want 0 to 32`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "makes a cycle"); n != 2 {
		t.Errorf("%d cycles reported, want 2 (each once); got:\n%s", n, text)
	}
}

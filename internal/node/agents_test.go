package node

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// versionInputs is one agent's definition as AgentVersion takes it.
type versionInputs struct {
	a       config.Agent
	ra      runtime.Agent
	sha     map[string]string
	sources []string
}

func baseVersionInputs() versionInputs {
	schema := json.RawMessage(`{"type":"object"}`)
	return versionInputs{
		a: config.Agent{Name: "support", Description: "Answers.", Instructions: "Be kind.", Builder: "b", Model: "m",
			Settings: map[string]any{"model": "gpt-4o-mini", "temperature": 0.2, "stop": []any{"x"}}},
		ra: runtime.Agent{
			Tools: []runtime.Tool{
				{Descriptor: abi.Tool{Name: "calculate", Description: "Math", InputSchema: schema, Approval: abi.ApprovalNever},
					Spec: loop.ToolSpec{Name: "calculate", Policy: loop.DefaultToolPolicy(true)}},
				{Descriptor: abi.Tool{Name: "wire", Description: "Money", Approval: abi.ApprovalAlways},
					Spec: loop.ToolSpec{Name: "wire", Approval: true, Policy: loop.DefaultToolPolicy(false)}},
			},
			Limits: loop.DefaultLimits, RunTimeout: time.Minute, EffectTimeout: time.Second,
			ModelPolicy: loop.DefaultModelPolicy, HistoryRuns: 20,
		},
		sha:     map[string]string{"b": "b1", "m": "m1", "calc": "c1", "bank": "k1"},
		sources: []string{"calc", "bank"},
	}
}

func (v versionInputs) version(t *testing.T) string {
	t.Helper()
	got, err := AgentVersion(v.a, &v.ra, func(id string) string { return v.sha[id] }, v.sources)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestAgentVersionsAreDeterministic: the same definition gives the same
// version, whatever the order its settings' keys and its tools come in.
func TestAgentVersionsAreDeterministic(t *testing.T) {
	base := baseVersionInputs()
	want := base.version(t)
	if !strings.HasPrefix(want, VersionPrefix) || len(want) != len(VersionPrefix)+versionHexDigits {
		t.Fatalf("version %q is not %s and %d hex digits", want, VersionPrefix, versionHexDigits)
	}
	for i := 0; i < 20; i++ {
		again := baseVersionInputs()
		// Maps iterate in another order each time; the settings are
		// built again, key by key.
		again.a.Settings = map[string]any{}
		for k, v := range base.a.Settings {
			again.a.Settings[k] = v
		}
		if got := again.version(t); got != want {
			t.Fatalf("the same definition gave %s, then %s", want, got)
		}
	}
	swapped := baseVersionInputs()
	swapped.ra.Tools[0], swapped.ra.Tools[1] = swapped.ra.Tools[1], swapped.ra.Tools[0]
	swapped.sources[0], swapped.sources[1] = swapped.sources[1], swapped.sources[0]
	if got := swapped.version(t); got != want {
		t.Errorf("the same tools in another order gave %s, want %s", got, want)
	}
}

// TestAgentVersionsChangeWithEveryInput: each part of the definition
// changes the version.
func TestAgentVersionsChangeWithEveryInput(t *testing.T) {
	want := baseVersionInputs().version(t)
	for what, change := range map[string]func(*versionInputs){
		"instructions":          func(v *versionInputs) { v.a.Instructions = "Be brief." },
		"description":           func(v *versionInputs) { v.a.Description = "Answers questions." },
		"a setting":             func(v *versionInputs) { v.a.Settings["temperature"] = 0.3 },
		"a new setting":         func(v *versionInputs) { v.a.Settings["max_output_tokens"] = 100 },
		"the builder plugin":    func(v *versionInputs) { v.a.Builder = "b2"; v.sha["b2"] = "b1" },
		"the builder's file":    func(v *versionInputs) { v.sha["b"] = "b2" },
		"the model plugin":      func(v *versionInputs) { v.a.Model = "m2"; v.sha["m2"] = "m1" },
		"the model's file":      func(v *versionInputs) { v.sha["m"] = "m2" },
		"a tool executor":       func(v *versionInputs) { v.sha["calc"] = "c2" },
		"a tool's plugin":       func(v *versionInputs) { v.sources[0] = "bank" },
		"a tool's description":  func(v *versionInputs) { v.ra.Tools[0].Descriptor.Description = "Arithmetic" },
		"a tool's schema":       func(v *versionInputs) { v.ra.Tools[1].Descriptor.InputSchema = json.RawMessage(`{"type":"object"}`) },
		"a tool's approval":     func(v *versionInputs) { v.ra.Tools[0].Spec.Approval = true },
		"a tool's policy":       func(v *versionInputs) { v.ra.Tools[1].Spec.Policy = loop.Policy{Mode: loop.PolicyFailRun} },
		"a tool removed":        func(v *versionInputs) { v.ra.Tools = v.ra.Tools[:1]; v.sources = v.sources[:1] },
		"max_steps":             func(v *versionInputs) { v.ra.Limits.MaxSteps++ },
		"max_tool_calls":        func(v *versionInputs) { v.ra.Limits.MaxToolCallsPerStep++ },
		"max_parallel":          func(v *versionInputs) { v.ra.Limits.MaxParallelToolCalls++ },
		"run_timeout":           func(v *versionInputs) { v.ra.RunTimeout = time.Hour },
		"wait_timeout":          func(v *versionInputs) { v.ra.WaitTimeout = time.Hour },
		"effect_timeout":        func(v *versionInputs) { v.ra.EffectTimeout = time.Hour },
		"model_policy":          func(v *versionInputs) { v.ra.ModelPolicy.MaxAttempts++ },
		"history_runs":          func(v *versionInputs) { v.ra.HistoryRuns = 3 },
		"settings absent":       func(v *versionInputs) { v.a.Settings = nil },
		"instructions absent":   func(v *versionInputs) { v.a.Instructions = "" },
		"a tool's idempotency":  func(v *versionInputs) { v.ra.Tools[1].Descriptor.Idempotent = true },
		"a tool's descr. name":  func(v *versionInputs) { v.ra.Tools[1].Descriptor.Name = "wire2"; v.ra.Tools[1].Spec.Name = "wire2" },
		"a setting's type":      func(v *versionInputs) { v.a.Settings["stop"] = "x" },
		"the model setting":     func(v *versionInputs) { v.a.Settings["model"] = "gpt-4o" },
		"a nested setting":      func(v *versionInputs) { v.a.Settings["stop"] = []any{"y"} },
		"the effect policy cap": func(v *versionInputs) { v.ra.ModelPolicy.MaxBackoffMS++ },
		"an agent tool added": func(v *versionInputs) {
			v.ra.Tools = append(v.ra.Tools, agentTool(v.a, config.AgentTool{Agent: "research"}, config.Agent{Name: "research"}))
			v.sources = append(v.sources, "")
		},
		"a tool made an agent": func(v *versionInputs) { v.ra.Tools[0].Spec.Agent = "calculate"; v.sources[0] = "" },
		"an output schema":     func(v *versionInputs) { v.a.OutputSchema = json.RawMessage(`{"type":"object"}`) },
	} {
		v := baseVersionInputs()
		change(&v)
		if got := v.version(t); got == want {
			t.Errorf("changing %s left the version at %s", what, got)
		}
	}
}

// TestAnAgentToolIsTheCalleeAsATool: an agent tool is named after the
// agent it calls, described by its description, takes the task as its
// input, and carries the entry's approval and policy; its version input
// names no plugin.
func TestAnAgentToolIsTheCalleeAsATool(t *testing.T) {
	lead := config.Agent{Name: "lead", Builder: "b", Model: "m"}
	entry := config.AgentTool{Agent: "research", ToolOverride: config.ToolOverride{Approval: abi.ApprovalAlways}}
	tl := agentTool(lead, entry, config.Agent{Name: "research", Description: "Finds sources."})
	if tl.Descriptor.Name != "research" || tl.Descriptor.Description != "Finds sources." || tl.Spec.Agent != "research" ||
		!tl.Spec.Approval || tl.Descriptor.Approval != abi.ApprovalAlways || !tl.Descriptor.Idempotent || tl.Executor != nil {
		t.Fatalf("agent tool %+v", tl)
	}
	if tl.Spec.Policy.Mode != loop.PolicyRetry {
		t.Errorf("an agent tool's default policy is %+v, want retry (a child is found again by its ID)", tl.Spec.Policy)
	}
	s, err := loop.CompileToolSchema(tl.Spec.InputSchema)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(json.RawMessage(`{"input":"find three sources"}`)); err != nil {
		t.Errorf("a task is refused: %v", err)
	}
	for _, bad := range []string{`{}`, `{"input":""}`, `{"input":"x","extra":1}`} {
		if s.Check(json.RawMessage(bad)) == nil {
			t.Errorf("arguments %s are accepted", bad)
		}
	}
	plain := agentTool(lead, config.AgentTool{Agent: "writer"}, config.Agent{Name: "writer"})
	if plain.Spec.Approval || !strings.Contains(plain.Descriptor.Description, "writer") {
		t.Errorf("an agent tool without approval or description: %+v", plain)
	}
	if _, err := AgentVersion(lead, &runtime.Agent{Tools: []runtime.Tool{tl}}, func(id string) string {
		if id != "b" && id != "m" {
			t.Fatalf("an agent tool's version asked for plugin %q's hash", id)
		}
		return id + "-sha"
	}, []string{""}); err != nil {
		t.Fatal(err)
	}
}

// TestAnAgentWithoutAnOutputSchemaKeepsItsVersion: output_schema is in
// the definition only when the agent has one, so that a config that
// sets none gives the versions it gave before agents had output schemas;
// two schemas give two versions.
func TestAnAgentWithoutAnOutputSchemaKeepsItsVersion(t *testing.T) {
	const before = "v-11efef12f55b" // baseVersionInputs' version before output_schema existed
	if got := baseVersionInputs().version(t); got != before {
		t.Errorf("the version of an agent without an output schema is %s, want %s as before", got, before)
	}
	a, b := baseVersionInputs(), baseVersionInputs()
	a.a.OutputSchema = json.RawMessage(`{"type":"object"}`)
	b.a.OutputSchema = json.RawMessage(`{"type":"array"}`)
	if a.version(t) == b.version(t) {
		t.Errorf("two output schemas gave one version, %s", a.version(t))
	}
}

package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
)

// requestsWithSystem returns the requests f was sent whose system
// message is system, in the order they came.
func requestsWithSystem(f *conformance.FakeOpenAI, system string) []conformance.OpenAIRequest {
	return slices.DeleteFunc(f.Requests(), func(r conformance.OpenAIRequest) bool { return r.System() != system })
}

// sortedTools are the names of r's tools, sorted.
func sortedTools(r conformance.OpenAIRequest) []string {
	names := r.ToolNames()
	slices.Sort(names)
	return names
}

// agentsAPIKey is the API key agentsConfig gives the openai plugin: the
// one its fake OpenAI server takes.
const agentsAPIKey = "not-a-real-key"

// agentsConfig writes the config of a serve on dir/data whose tenant
// "demo" (bearer token) has the given agents block, over the example
// prompt-builder, openai (pointed at model), calculator and slow-job
// plugins.
func agentsConfig(t *testing.T, dir, token string, model *conformance.FakeOpenAI, agents string) string {
	t.Helper()
	return providerServe{Token: token, Model: "openai", Addr: model.Addr, URL: model.URL,
		Config: "model: config-model, api_key: " + agentsAPIKey, Builder: `{system_prompt: "the builder's own prompt"}`,
		Tools:  []string{"calculator", "slow-job"},
		Tenant: "    model_policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 1s}\n    agents:\n" + agents,
	}.write(t, dir)
}

// agentsRunView is the part of a Run's JSON these tests read.
type agentsRunView struct {
	runView
	Agent        string `json:"agent"`
	AgentVersion string `json:"agent_version"`
}

func (c *apiClient) submitAs(t *testing.T, session, agent, input string) agentsRunView {
	t.Helper()
	var run agentsRunView
	code, raw, err := c.Do("POST", "/v1/sessions/"+session+"/runs", map[string]any{"input": input, "agent": agent}, nil, &run)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("submit %q as %s: %d %v %s", input, agent, code, err, raw)
	}
	return run
}

func (c *apiClient) agentRun(t *testing.T, id string) agentsRunView {
	t.Helper()
	var run agentsRunView
	code, raw, err := c.Do("GET", "/v1/runs/"+id, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		t.Fatalf("get run %s: %d %v %s", id, code, err, raw)
	}
	return run
}

// agentVersions returns each agent's version, from GET /v1/agents.
func (c *apiClient) agentVersions(t *testing.T) map[string]string {
	t.Helper()
	var list httpapi.AgentListJSON
	code, raw, err := c.Do("GET", "/v1/agents", nil, nil, &list)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/agents: %d %v %s", code, err, raw)
	}
	out := map[string]string{}
	for _, a := range list.Agents {
		out[a.Name] = a.Version
	}
	return out
}

// TestTwoAgentsOfOneTenantRunSideBySide: two agents of one tenant, with
// their own instructions, model settings and tools over one openai
// plugin, run at once through serve; the model server sees each agent's
// own system message, model name, temperature, max tokens and tools.
func TestTwoAgentsOfOneTenantRunSideBySide(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "agents-token"
	model := conformance.NewFakeOpenAI(t, agentsAPIKey)
	cfg := agentsConfig(t, dir, token, model, `
      support:
        description: Answers customers, with a calculator.
        instructions: You are SUPPORT.
        model: {plugin: openai, settings: {model: support-model, temperature: 0.1}}
        tools: [{plugin: calculator}]
      research:
        instructions: You are RESEARCH.
        model: {plugin: openai, settings: {model: research-model, temperature: 0.9, max_output_tokens: 77}}
        tools: [{plugin: slow-job}]
`)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)
	versions := c.agentVersions(t)
	if len(versions) != 2 || versions["support"] == "" || versions["research"] == "" || versions["support"] == versions["research"] {
		t.Fatalf("GET /v1/agents: versions %v, want support and research, each its own", versions)
	}

	var support, research agentsRunView
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); support = c.submitAs(t, "s1", "support", "use calculate") }()
	go func() { defer wg.Done(); research = c.submitAs(t, "s2", "research", "What is new?") }()
	wg.Wait()
	for _, r := range []agentsRunView{support, research} {
		done := c.waitRun(t, r.ID, 60*time.Second, "to end", runView.terminal)
		if done.Status != "completed" {
			t.Fatalf("run %s of %s: %s %+v", r.ID, r.Agent, done.Status, done.Failure)
		}
	}
	if got := c.agentRun(t, support.ID); got.Agent != "support" || got.AgentVersion != versions["support"] || got.Result == nil || got.Result.Content != "done: 42" {
		t.Errorf("the support Run: agent %s %s, result %+v; want support %s, done: 42", got.Agent, got.AgentVersion, got.Result, versions["support"])
	}
	if got := c.agentRun(t, research.ID); got.Agent != "research" || got.AgentVersion != versions["research"] || got.Result == nil || got.Result.Content != "hello from research-model" {
		t.Errorf("the research Run: agent %s %s, result %+v", got.Agent, got.AgentVersion, got.Result)
	}

	sup := requestsWithSystem(model, "You are SUPPORT.")
	if len(sup) != 2 {
		t.Fatalf("the model server saw %d requests with support's instructions, want 2 (the call, then the answer)", len(sup))
	}
	for i, r := range sup {
		if r.Model != "support-model" || r.Temperature == nil || *r.Temperature != 0.1 || r.MaxTokens != nil || !slices.Equal(sortedTools(r), []string{"calculate"}) {
			t.Errorf("support's request %d: model %q, temperature %v, max_tokens %v, tools %v; want support-model, 0.1, none, [calculate]",
				i+1, r.Model, ptr(r.Temperature), ptr(r.MaxTokens), sortedTools(r))
		}
	}
	res := requestsWithSystem(model, "You are RESEARCH.")
	if len(res) != 1 {
		t.Fatalf("the model server saw %d requests with research's instructions, want 1", len(res))
	}
	if r := res[0]; r.Model != "research-model" || r.Temperature == nil || *r.Temperature != 0.9 || r.MaxTokens == nil || *r.MaxTokens != 77 || !slices.Equal(sortedTools(r), []string{"slow_job"}) {
		t.Errorf("research's request: model %q, temperature %v, max_tokens %v, tools %v; want research-model, 0.9, 77, [slow_job]",
			r.Model, ptr(r.Temperature), ptr(r.MaxTokens), sortedTools(r))
	}
	for _, r := range model.Requests() {
		if strings.Contains(r.System(), "the builder's own prompt") {
			t.Errorf("a request had the builder's own prompt (system %q): the agents' instructions did not reach it", r.System())
		}
	}

	// The CLI lists one agent's Runs.
	r := runCLI(t, bin, nil, "runs", "list", "--agent", "support", "--server", "http://"+p.Addr(), "--token", token)
	if r.code != 0 || !strings.Contains(r.stdout, support.ID) || strings.Contains(r.stdout, research.ID) {
		t.Errorf("runs list --agent support: exit %d, want %s listed and %s not", r.code, support.ID, research.ID)
	}
}

// TestARunKeepsItsAgentVersionAcrossAConfigChange: a Run created under
// version 1 of an agent, waiting for an approval, completes with version
// 1's instructions, model settings and tools after serve restarts on
// version 2 of the config (other instructions and model, a tool removed);
// a Run created after the restart runs as version 2.
func TestARunKeepsItsAgentVersionAcrossAConfigChange(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "agents-token"
	model := conformance.NewFakeOpenAI(t, agentsAPIKey)
	v1 := `
      support:
        instructions: You are support, version 1.
        model: {plugin: openai, settings: {model: model-v1, temperature: 0.1}}
        tools: [{plugin: calculator, approval: always}, {plugin: slow-job}]
`
	v2 := `
      support:
        instructions: You are support, version 2.
        model: {plugin: openai, settings: {model: model-v2, temperature: 0.7}}
        tools: [{plugin: calculator, approval: always}]
`
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, agentsConfig(t, dir, token, model, v1), logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)
	version1 := c.agentVersions(t)["support"]
	old := c.submitAs(t, "s1", "support", "use calculate")
	if old.AgentVersion != version1 {
		t.Fatalf("the Run was created with agent version %q, want %q", old.AgentVersion, version1)
	}
	waiting := c.waitRun(t, old.ID, 60*time.Second, "to wait for an approval", func(r runView) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})
	callID := waiting.Waiting.Approvals[0].ToolCallID

	// The operator changes the config and restarts serve.
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	mustExit(t, p, 60*time.Second)
	agentsConfig(t, dir, token, model, v2)
	p = startServe(t, bin, filepath.Join(dir, "agenthost.yaml"), logPath)
	mustReady(t, p, 90*time.Second)
	c = newClient(p.Addr(), token)
	version2 := c.agentVersions(t)["support"]
	if version2 == "" || version2 == version1 {
		t.Fatalf("the agent's version after the change is %q; want one other than %q", version2, version1)
	}

	code, raw, err := c.Do("POST", "/v1/runs/"+old.ID+"/input", map[string]any{"approvals": []any{map[string]any{"tool_call_id": callID, "approved": true}}}, nil, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("approve: %d %v %s", code, err, raw)
	}
	done := c.waitRun(t, old.ID, 60*time.Second, "to end", runView.terminal)
	if done.Status != "completed" || done.Result == nil || done.Result.Content != "done: 42" {
		t.Fatalf("the Run created under version 1: %s, result %+v, failure %+v", done.Status, done.Result, done.Failure)
	}
	if got := c.agentRun(t, old.ID); got.AgentVersion != version1 {
		t.Errorf("the Run created under version 1 shows version %q", got.AgentVersion)
	}
	steps := requestsWithSystem(model, "You are support, version 1.")
	if len(steps) != 2 {
		t.Fatalf("the model server saw %d requests with version 1's instructions, want 2 (before and after the restart); with version 2's: %d",
			len(steps), len(requestsWithSystem(model, "You are support, version 2.")))
	}
	for i, r := range steps {
		if r.Model != "model-v1" || r.Temperature == nil || *r.Temperature != 0.1 || !slices.Equal(sortedTools(r), []string{"calculate", "slow_job"}) {
			t.Errorf("step %d of the Run created under version 1: model %q, temperature %v, tools %v; want version 1's model-v1, 0.1, [calculate slow_job]",
				i+1, r.Model, ptr(r.Temperature), sortedTools(r))
		}
	}

	fresh := c.submitAs(t, "s2", "support", "Hi")
	if fresh.AgentVersion != version2 {
		t.Errorf("a Run created after the change has version %q, want %q", fresh.AgentVersion, version2)
	}
	if got := c.waitRun(t, fresh.ID, 60*time.Second, "to end", runView.terminal); got.Status != "completed" || got.Result == nil || got.Result.Content != "hello from model-v2" {
		t.Fatalf("the Run created after the change: %s %+v %+v", got.Status, got.Result, got.Failure)
	}
	if rs := requestsWithSystem(model, "You are support, version 2."); len(rs) != 1 || !slices.Equal(sortedTools(rs[0]), []string{"calculate"}) || *rs[0].Temperature != 0.7 {
		t.Errorf("the Run created after the change was sent %d requests with version 2's instructions (want 1, with tools [calculate], temperature 0.7)", len(rs))
	}
}

func ptr[T any](p *T) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

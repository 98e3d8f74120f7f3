package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/httpapi"
)

// chatModel is an OpenAI-compatible chat-completions server on 127.0.0.1
// that records every request it is sent. It answers a conversation whose
// last message is the user's "use TOOL" by calling TOOL (with the
// calculator's arguments), one whose last message is a tool result with
// "done: RESULT", and anything else with "hello from MODEL".
type chatModel struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []chatRequest
}

// chatRequest is what a test reads of one request.
type chatRequest struct {
	Model       string   `json:"model"`
	Temperature *float64 `json:"temperature"`
	MaxTokens   *int     `json:"max_tokens"`
	Messages    []struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

func (r chatRequest) system() string {
	if len(r.Messages) > 0 && r.Messages[0].Role == "system" && r.Messages[0].Content != nil {
		return *r.Messages[0].Content
	}
	return ""
}

func (r chatRequest) toolNames() []string {
	out := []string{}
	for _, t := range r.Tools {
		out = append(out, t.Function.Name)
	}
	slices.Sort(out)
	return out
}

func newChatModel(t *testing.T) *chatModel {
	m := &chatModel{}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *chatModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	if r.URL.Path != "/v1/chat/completions" || json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"not a chat completion"}}`, http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.seen = append(m.seen, req)
	m.mu.Unlock()
	last := req.Messages[len(req.Messages)-1]
	content := ""
	if last.Content != nil {
		content = *last.Content
	}
	msg := map[string]any{"role": "assistant", "content": "hello from " + req.Model}
	switch {
	case last.Role == "user" && strings.HasPrefix(content, "use "):
		msg = map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
			"id": "call_1", "type": "function",
			"function": map[string]any{"name": strings.TrimPrefix(content, "use "), "arguments": `{"expression":"6*7"}`}}}}
	case last.Role == "tool":
		msg = map[string]any{"role": "assistant", "content": "done: " + content}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"choices": []any{map[string]any{"message": msg, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5},
	})
}

// requests returns the requests whose system message is system.
func (m *chatModel) requests(system string) []chatRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []chatRequest
	for _, r := range m.seen {
		if r.system() == system {
			out = append(out, r)
		}
	}
	return out
}

// agentsConfig writes the config of a serve on dir/data whose tenant
// "demo" (bearer token) has the given agents block, over the example
// prompt-builder, openai (pointed at model), calculator and slow-job
// plugins.
func agentsConfig(t *testing.T, dir, token string, model *chatModel, agents string) string {
	t.Helper()
	host := model.srv.Listener.Addr().String()
	return providerServe{Token: token, Model: "openai", Addr: host, URL: "http://" + host + "/v1",
		Config: "model: config-model, api_key: not-a-real-key", Builder: `{system_prompt: "the builder's own prompt"}`,
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
	model := newChatModel(t)
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

	sup := model.requests("You are SUPPORT.")
	if len(sup) != 2 {
		t.Fatalf("the model server saw %d requests with support's instructions, want 2 (the call, then the answer)", len(sup))
	}
	for i, r := range sup {
		if r.Model != "support-model" || r.Temperature == nil || *r.Temperature != 0.1 || r.MaxTokens != nil || !slices.Equal(r.toolNames(), []string{"calculate"}) {
			t.Errorf("support's request %d: model %q, temperature %v, max_tokens %v, tools %v; want support-model, 0.1, none, [calculate]",
				i+1, r.Model, ptr(r.Temperature), ptr(r.MaxTokens), r.toolNames())
		}
	}
	res := model.requests("You are RESEARCH.")
	if len(res) != 1 {
		t.Fatalf("the model server saw %d requests with research's instructions, want 1", len(res))
	}
	if r := res[0]; r.Model != "research-model" || r.Temperature == nil || *r.Temperature != 0.9 || r.MaxTokens == nil || *r.MaxTokens != 77 || !slices.Equal(r.toolNames(), []string{"slow_job"}) {
		t.Errorf("research's request: model %q, temperature %v, max_tokens %v, tools %v; want research-model, 0.9, 77, [slow_job]",
			r.Model, ptr(r.Temperature), ptr(r.MaxTokens), r.toolNames())
	}
	if n := len(model.requests("the builder's own prompt")); n != 0 {
		t.Errorf("%d requests had the builder's own prompt: the agents' instructions did not reach it", n)
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
	model := newChatModel(t)
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
	steps := model.requests("You are support, version 1.")
	if len(steps) != 2 {
		t.Fatalf("the model server saw %d requests with version 1's instructions, want 2 (before and after the restart); with version 2's: %d",
			len(steps), len(model.requests("You are support, version 2.")))
	}
	for i, r := range steps {
		if r.Model != "model-v1" || r.Temperature == nil || *r.Temperature != 0.1 || !slices.Equal(r.toolNames(), []string{"calculate", "slow_job"}) {
			t.Errorf("step %d of the Run created under version 1: model %q, temperature %v, tools %v; want version 1's model-v1, 0.1, [calculate slow_job]",
				i+1, r.Model, ptr(r.Temperature), r.toolNames())
		}
	}

	fresh := c.submitAs(t, "s2", "support", "Hi")
	if fresh.AgentVersion != version2 {
		t.Errorf("a Run created after the change has version %q, want %q", fresh.AgentVersion, version2)
	}
	if got := c.waitRun(t, fresh.ID, 60*time.Second, "to end", runView.terminal); got.Status != "completed" || got.Result == nil || got.Result.Content != "hello from model-v2" {
		t.Fatalf("the Run created after the change: %s %+v %+v", got.Status, got.Result, got.Failure)
	}
	if rs := model.requests("You are support, version 2."); len(rs) != 1 || !slices.Equal(rs[0].toolNames(), []string{"calculate"}) || *rs[0].Temperature != 0.7 {
		t.Errorf("the Run created after the change was sent %d requests with version 2's instructions (want 1, with tools [calculate], temperature 0.7)", len(rs))
	}
}

func ptr[T any](p *T) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

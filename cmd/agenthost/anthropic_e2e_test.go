package main

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// TestAnthropicPluginRunsARealRun: the anthropic example plugin passes
// `agenthost plugin verify`, and a serve Run of an agent on it completes
// against a fake Messages API that checks every request as the API
// reference describes it. The first answer is 529 overloaded_error, which
// the model policy retries; then the model calls the calculator, and its
// result is in the answer. Every request carries the agent's
// instructions as the system prompt and its settings.
func TestAnthropicPluginRunsARealRun(t *testing.T) {
	bin := buildBinary(t)
	if r := runCLI(t, bin, nil, "plugin", "verify", "--cache-dir", conformance.WazeroCacheDir(), conformance.ExampleWasm(t, "anthropic")); r.code != 0 {
		t.Fatalf("plugin verify anthropic.wasm: exit %d, want 0", r.code)
	}

	fake := conformance.NewFakeAnthropic(t, "sk-ant-test")
	fake.FailNext(conformance.AnthropicFailure{Status: 529, Message: "Overloaded", RetryAfter: "1"})
	dir := t.TempDir()
	const token = "anthropic-token"
	cfg := providerServe{Token: token, Model: "anthropic", Addr: fake.Addr, URL: fake.URL,
		Config: "model: config-model, api_key: sk-ant-test", Builder: `{system_prompt: "the builder's own prompt"}`,
		Tools: []string{"calculator"},
		Tenant: `    model_policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 1s}
    agents:
      support:
        instructions: You are SUPPORT.
        model: {plugin: anthropic, settings: {model: claude-support, temperature: 0.1, max_output_tokens: 77}}
        tools: [{plugin: calculator}]
`,
	}.write(t, dir)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)

	run := c.submitAs(t, "s1", "support", "use calculate")
	done := c.waitRun(t, run.ID, 60*time.Second, "to end", runView.terminal)
	if done.Status != "completed" || done.Result == nil || done.Result.Content != "done: 42" {
		t.Fatalf("the Run: %s, result %+v, failure %+v; want completed with done: 42", done.Status, done.Result, done.Failure)
	}

	// The overloaded answer, its retry (the same request), then the
	// answer to the tool's result.
	reqs := fake.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the fake saw %d requests, want 3: the 529, its retry, the answer to the tool result", len(reqs))
	}
	if string(reqs[0].Body) != string(reqs[1].Body) {
		t.Errorf("the retry sent another request:\n%s\n%s", reqs[0].Body, reqs[1].Body)
	}
	for i, r := range reqs {
		if r.SystemText() != "You are SUPPORT." || r.Model != "claude-support" || r.Temperature == nil || *r.Temperature != 0.1 ||
			r.MaxTokens != 77 || !slices.Equal(r.ToolNames(), []string{"calculate"}) {
			t.Errorf("request %d: system %q, model %q, temperature %v, max_tokens %d, tools %v; want the agent's: You are SUPPORT., claude-support, 0.1, 77, [calculate]",
				i+1, r.SystemText(), r.Model, ptr(r.Temperature), r.MaxTokens, r.ToolNames())
		}
	}
	last := reqs[2].Messages
	if len(last) != 3 || last[2].Role != "user" || len(last[2].Content) != 1 || last[2].Content[0].Type != "tool_result" || string(last[2].Content[0].Content) != `"42"` {
		t.Errorf("the last request's turns: %s", reqs[2].Body)
	}
	// Usage: the fake counts 10 input tokens a message and 5 output
	// tokens; the failed attempt used none.
	if done.Usage.InputTokens != 10+30 || done.Usage.OutputTokens != 10 {
		t.Errorf("the Run's usage %+v, want 40 in, 10 out", done.Usage)
	}
}

package examples_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

// loadAnthropic loads the anthropic plugin as name, pointed at f, allowed
// to reach the hosts given, with the config's stream set to stream ("":
// not set, which streams).
func loadAnthropic(t *testing.T, e *env, f *conformance.FakeAnthropic, name, stream string, allowed ...string) *host.Executor {
	return e.executor(t, "anthropic", func(s *host.PluginSpec) {
		s.Name = name
		s.Sandbox.AllowedHosts = allowed
		s.Sandbox.Config = map[string]string{"base_url": f.URL, "model": "claude-test", "api_key": "sk-ant-test", "temperature": "0"}
		if stream != "" {
			s.Sandbox.Config["stream"] = stream
		}
	})
}

// TestAnthropic runs the anthropic plugin in the real host against a fake
// Messages API that checks every request as the API reference describes
// it, streamed (the default) and not (stream: false): a tool call and its
// result, the agent's settings, the server's errors (retriable or not,
// with retry-after), a host not allowed, and a config without a model.
func TestAnthropic(t *testing.T) {
	for _, stream := range []string{"", "false"} {
		t.Run("stream="+stream, func(t *testing.T) { testAnthropic(t, stream) })
	}
}

func testAnthropic(t *testing.T, stream string) {
	f := conformance.NewFakeAnthropic(t, "sk-ant-test")
	e := newEnv(t)
	ctx := context.Background()
	x := loadAnthropic(t, e, f, "anthropic", stream, f.Addr) // a port-less entry allows 80 and 443 only

	req := abi.ModelRequest{Messages: []abi.Message{
		{Role: "system", Content: "Use the tools."},
		{Role: "user", Content: "use calculate"},
	}, Tools: []abi.Tool{calculateTool}, Params: map[string]any{"max_output_tokens": 300, "stop": "END"}}
	out := model(t)(x.Start(ctx, modelCall("run_1.m1", req)))
	calls := out.Message.ToolCalls
	if len(calls) != 1 || calls[0].ID != "toolu_1" || calls[0].Name != "calculate" || expressionArg(t, calls[0]) != "6*7" || out.Message.Content != "Calling calculate." {
		t.Fatalf("tool call mapping: %+v", out.Message)
	}
	if out.Usage != (abi.Usage{InputTokens: 10, OutputTokens: 5}) {
		t.Fatalf("usage %+v", out.Usage)
	}
	req.Messages = append(req.Messages, out.Message, abi.Message{Role: "tool", ToolCallID: calls[0].ID, Content: "42"})
	final := model(t)(x.Start(ctx, modelCall("run_1.m2", req)))
	if final.Message.Content != "done: 42" || len(final.Message.ToolCalls) != 0 || final.Usage.InputTokens != 30 {
		t.Fatalf("final: %+v", final)
	}

	// The requests had the shape the API documents (the fake refuses any
	// other); what the plugin made of the config and the params.
	reqs := f.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[1]
	if r.Model != "claude-test" || r.MaxTokens != 300 || r.SystemText() != "Use the tools." || r.Temperature == nil || *r.Temperature != 0 ||
		strings.Join(r.StopSequences, ",") != "END" || strings.Join(r.ToolNames(), ",") != "calculate" || len(r.Messages) != 3 || r.Stream != (stream != "false") {
		t.Fatalf("second request: %s", r.Body)
	}
	if b := r.Messages[1].Content; r.Messages[1].Role != "assistant" || len(b) != 2 || b[0].Type != "text" || b[1].Type != "tool_use" || b[1].ID != "toolu_1" || string(b[1].Input) != `{"expression":"6*7"}` {
		t.Errorf("assistant turn: %s", r.Body)
	}
	if b := r.Messages[2].Content; r.Messages[2].Role != "user" || len(b) != 1 || b[0].Type != "tool_result" || b[0].ToolUseID != "toolu_1" || string(b[0].Content) != `"42"` {
		t.Errorf("tool result turn: %s", r.Body)
	}

	// Server errors: 429 and 529 may be retried, 4xx not; each carries the
	// server's error type and message, and retry-after when sent.
	ask := func(text string) abi.ModelRequest {
		return abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}}
	}
	f.FailNext(conformance.AnthropicFailure{Status: 429, Message: "Number of request tokens has exceeded your per-minute rate limit", RetryAfter: "20"})
	rep, err := x.Start(ctx, modelCall("run_1.m1", ask("hi")))
	if err != nil || rep.State != abi.StateFailed || !rep.Error.Retriable ||
		!strings.Contains(rep.Error.Message, "429 rate_limit_error: Number of request tokens has exceeded your per-minute rate limit") || !strings.Contains(rep.Error.Message, "retry after 20 s") {
		t.Errorf("429: %+v %v", rep.Error, err)
	}
	rep, err = x.Start(ctx, modelCall("run_1.m1", ask("answer 529")))
	if err != nil || rep.State != abi.StateFailed || !rep.Error.Retriable || !strings.Contains(rep.Error.Message, "529 overloaded_error") {
		t.Errorf("529: %+v %v", rep.Error, err)
	}
	rep, err = x.Start(ctx, modelCall("run_1.m1", ask("answer 401")))
	if err != nil || rep.State != abi.StateFailed || rep.Error.Retriable || !strings.Contains(rep.Error.Message, "401 authentication_error") {
		t.Errorf("401: %+v %v", rep.Error, err)
	}
	// After the errors, the script answers again.
	if got := model(t)(x.Start(ctx, modelCall("run_1.m1", ask("hi")))); got.Message.Content != "hello from claude-test" {
		t.Errorf("after the errors: %+v", got)
	}

	// A host that is not allowed never hears from the plugin; the host
	// turns the plugin's failed reply after the refusal into plugin_denied.
	before := len(f.Requests())
	_, err = loadAnthropic(t, e, f, "anthropic-denied", stream).Start(ctx, modelCall("run_1.m1", req))
	if classOf(t, err) != abi.ClassPluginDenied || !strings.Contains(err.Error(), "allowed_hosts") {
		t.Errorf("denied: %v", err)
	}
	if len(f.Requests()) != before {
		t.Errorf("a denied request reached the server")
	}
	// A config without a model fails, naming the key.
	bare := e.executor(t, "anthropic", func(s *host.PluginSpec) { s.Name = "anthropic-bare" })
	rep, err = bare.Start(ctx, modelCall("run_1.m1", req))
	if err != nil || rep.State != abi.StateFailed || rep.Error.Retriable || !strings.Contains(rep.Error.Message, "model is missing") {
		t.Errorf("no config: %+v %v", rep, err)
	}
}

// TestAnthropicStreams: streaming, the plugin emits the answer's pieces
// as model_delta events while the server is still sending it, and they
// add up to the reply: text, and a tool call numbered among the calls
// (0), though it is the message's second block (checkStreamedAnswers).
// An error event in the stream (overloaded_error: rate limited) fails
// the attempt, retriable, after the pieces that came.
func TestAnthropicStreams(t *testing.T) {
	f := conformance.NewFakeAnthropic(t, "sk-ant-test")
	e := newEnv(t)
	checkStreamedAnswers(t, e, loadAnthropic(t, e, f, "anthropic", "", f.Addr), loadAnthropic(t, e, f, "anthropic-whole", "false", f.Addr),
		f.Hold, f.CutNext, "hello from claude-test", []streamFailure{
			{"overloaded in the stream", func() {
				f.FailNext(conformance.AnthropicFailure{Status: 529, Message: "Overloaded", InStream: true, AfterDeltas: 2})
			}, abi.ClassRateLimited, "the server reported an error in the answer's stream: overloaded_error: Overloaded"},
			{"api_error in the stream", func() {
				f.FailNext(conformance.AnthropicFailure{Status: 500, Message: "Internal", InStream: true, AfterDeltas: 2})
			}, "", "api_error: Internal"},
		})
}

package examples_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

// loadOpenAI loads the openai plugin as name, pointed at f, allowed to
// reach the hosts given, with the config's stream set to stream ("": not
// set, which streams).
func loadOpenAI(t testing.TB, e *env, f *conformance.FakeOpenAI, name, stream string, allowed ...string) *host.Executor {
	return e.executor(t, "openai", func(s *host.PluginSpec) {
		s.Name = name
		s.Sandbox.AllowedHosts = allowed
		s.Sandbox.Config = map[string]string{"base_url": f.URL, "model": "gpt-test", "api_key": "sk-test", "temperature": "0"}
		if stream != "" {
			s.Sandbox.Config["stream"] = stream
		}
	})
}

// TestOpenAI runs the openai plugin in the real host against a fake
// chat-completions API that checks every request as the API reference
// describes it, streamed (the default) and not (stream: false): a tool
// call and its result, the request's shape, the server's errors
// (retriable or not, with the wait a 429 asks for), a host not allowed,
// and a config without base_url and model.
func TestOpenAI(t *testing.T) {
	for _, stream := range []string{"", "false"} {
		t.Run("stream="+stream, func(t *testing.T) { testOpenAI(t, stream) })
	}
}

func testOpenAI(t *testing.T, stream string) {
	f := conformance.NewFakeOpenAI(t, "sk-test")
	f.Script(func(r conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		if r.LastUser() != "What is (2+3)*4?" {
			return conformance.OpenAIAnswer{}, false
		}
		if r.Messages[len(r.Messages)-1].Role == "tool" {
			return conformance.OpenAIAnswer{Content: "(2+3)*4 = 20", PromptTokens: 80, CompletionTokens: 9}, true
		}
		return conformance.OpenAIAnswer{ToolCalls: []conformance.OpenAIToolCall{conformance.OpenAICall("call_abc", "calculate", `{"expression":"(2+3)*4"}`)},
			PromptTokens: 61, CompletionTokens: 17}, true
	})
	e := newEnv(t)
	ctx := context.Background()
	x := loadOpenAI(t, e, f, "openai", stream, f.Addr) // a port-less entry allows 80 and 443 only

	req := abi.ModelRequest{Messages: []abi.Message{
		{Role: "system", Content: "Use the tools."},
		{Role: "user", Content: "What is (2+3)*4?"},
	}, Tools: []abi.Tool{calculateTool}}
	out := model(t)(x.Start(ctx, modelCall("run_1.m1", req)))
	calls := out.Message.ToolCalls
	if len(calls) != 1 || calls[0].ID != "call_abc" || calls[0].Name != "calculate" || expressionArg(t, calls[0]) != "(2+3)*4" {
		t.Fatalf("tool call mapping: %+v", out.Message)
	}
	if out.Usage != (abi.Usage{InputTokens: 61, OutputTokens: 17}) {
		t.Fatalf("usage %+v", out.Usage)
	}
	req.Messages = append(req.Messages, out.Message, abi.Message{Role: "tool", ToolCallID: "call_abc", Content: "20"})
	final := model(t)(x.Start(ctx, modelCall("run_1.m2", req)))
	if final.Message.Content != "(2+3)*4 = 20" || len(final.Message.ToolCalls) != 0 || final.Usage.InputTokens != 80 {
		t.Fatalf("final: %+v", final)
	}

	// The requests had the shape the API documents (the fake refuses any
	// other); what the plugin made of the config.
	reqs := f.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	streams := stream != "false"
	for i, r := range reqs {
		if r.Stream != streams || (r.StreamOptions != nil && r.StreamOptions.IncludeUsage) != streams {
			t.Errorf("request %d: stream %v, stream_options %+v; want streaming %v", i, r.Stream, r.StreamOptions, streams)
		}
	}
	if r := reqs[0]; len(r.Tools) != 1 || r.Tools[0].Type != "function" || r.Tools[0].Function.Name != "calculate" || !strings.Contains(string(r.Tools[0].Function.Parameters), `"type":"object"`) {
		t.Errorf("tools: %s", r.Body)
	}
	if r := reqs[0]; r.Temperature == nil || *r.Temperature != 0 || r.System() != "Use the tools." {
		t.Errorf("temperature, system: %s", r.Body)
	}
	msgs := reqs[1].Messages
	if len(msgs) != 4 {
		t.Fatalf("messages of the second request: %s", reqs[1].Body)
	}
	if asst := msgs[2]; asst.Role != "assistant" || asst.Content != nil || len(asst.ToolCalls) != 1 || asst.ToolCalls[0].ID != "call_abc" ||
		asst.ToolCalls[0].Type != "function" || asst.ToolCalls[0].Function.Arguments != `{"expression":"(2+3)*4"}` {
		t.Errorf("assistant message: %+v", asst)
	}
	if tm := msgs[3]; tm.Role != "tool" || tm.ToolCallID != "call_abc" || tm.Text() != "20" {
		t.Errorf("tool message: %+v", tm)
	}

	// Server errors: 5xx may be retried, 4xx not; both carry the server's
	// message.
	ask := func(text string) abi.ModelRequest {
		return abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}}
	}
	f.FailNext(conformance.OpenAIFailure{Status: 500, Message: "the server is on fire"})
	r, err := x.Start(ctx, modelCall("run_1.m1", ask("hi")))
	if err != nil || r.State != abi.StateFailed || !r.Error.Retriable || !strings.Contains(r.Error.Message, "500: the server is on fire") {
		t.Errorf("500: %+v %v", r, err)
	}
	// A 429 is rate_limited, with the wait the server asked for: in
	// seconds, or as a date, by the response's own Date.
	for name, c := range map[string]struct {
		failure conformance.OpenAIFailure
		wait    int64
	}{
		"in seconds": {conformance.OpenAIFailure{Status: 429, RetryAfter: "20", Headers: map[string]string{"X-Ratelimit-Reset-Requests": "1s"}}, 20_000},
		"by date": {conformance.OpenAIFailure{Status: 429, Message: "Rate limit reached for tokens", Type: "tokens",
			RetryAfter: "Sat, 01 Mar 2025 12:00:42 GMT", Headers: map[string]string{"Date": "Sat, 01 Mar 2025 12:00:00 GMT"}}, 42_000},
	} {
		f.FailNext(c.failure)
		r, err = x.Start(ctx, modelCall("run_1.m1", ask("hi")))
		if err != nil || r.State != abi.StateFailed || !r.Error.Retriable || r.Error.Class != abi.ClassRateLimited ||
			r.Error.RetryAfterMS != c.wait || !strings.Contains(r.Error.Message, "Rate limit reached") {
			t.Errorf("429 %s: %+v %+v %v", name, r, r.Error, err)
		}
	}
	r, err = x.Start(ctx, modelCall("run_1.m1", ask("answer 401")))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable || !strings.Contains(r.Error.Message, "Incorrect API key") {
		t.Errorf("401: %+v %v", r, err)
	}
	// After the errors, the default answers.
	if got := model(t)(x.Start(ctx, modelCall("run_1.m1", ask("hi")))); got.Message.Content != "hello from gpt-test" {
		t.Errorf("after the errors: %+v", got)
	}
	// A host that is not allowed never hears from the plugin; the host
	// turns the plugin's failed reply after the refusal into plugin_denied.
	before := f.Count()
	_, err = loadOpenAI(t, e, f, "openai-denied", stream).Start(ctx, modelCall("run_1.m1", req))
	if classOf(t, err) != abi.ClassPluginDenied || !strings.Contains(err.Error(), "allowed_hosts") {
		t.Errorf("denied: %v", err)
	}
	if f.Count() != before {
		t.Errorf("a denied request reached the server")
	}
	// A config without base_url or model fails, naming the keys.
	bare := e.executor(t, "openai", func(s *host.PluginSpec) { s.Name = "openai-bare" })
	r, err = bare.Start(ctx, modelCall("run_1.m1", req))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable || !strings.Contains(r.Error.Message, "base_url") || !strings.Contains(r.Error.Message, "model") {
		t.Errorf("no config: %+v %v", r, err)
	}
}

// TestOpenAIStreams: streaming, the plugin emits the answer's pieces as
// model_delta events while the server is still sending it, and they add
// up to the reply, a call's arguments in pieces numbered by the call
// (checkStreamedAnswers); an error or a rate limit reported in the stream
// fails the attempt, retriable, after the pieces that came.
func TestOpenAIStreams(t *testing.T) {
	f := conformance.NewFakeOpenAI(t, "sk-test")
	e := newEnv(t)
	checkStreamedAnswers(t, e, loadOpenAI(t, e, f, "openai", "", f.Addr), loadOpenAI(t, e, f, "openai-whole", "false", f.Addr),
		f.Hold, f.CutNext, "hello from gpt-test", []streamFailure{
			{"error in the stream", func() {
				f.FailNext(conformance.OpenAIFailure{Status: 500, Message: "mid-stream trouble", InStream: true, AfterDeltas: 2})
			}, "", "mid-stream trouble"},
			{"rate limit in the stream", func() { f.FailNext(conformance.OpenAIFailure{Status: 429, InStream: true, AfterDeltas: 2}) }, abi.ClassRateLimited, "Rate limit reached"},
		})
}

// jsonEqual reports whether a and b are the same JSON document.
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// BenchmarkOpenAIStreamedAnswer measures one model call of the openai
// plugin through the host's whole call path against the fake provider on
// 127.0.0.1, for an answer of 400 characters that the fake streams in 100
// pieces: whole (stream: false, one agenthost_http) and streamed (the
// default: agenthost_http_open, a read and a model_delta emit for each
// piece that arrives). The whole call is the baseline: the difference is
// what streaming costs the host and the guest (docs/BENCHMARKS.md,
// "What streaming an answer costs").
func BenchmarkOpenAIStreamedAnswer(b *testing.B) {
	ctx := context.Background()
	answer := strings.Repeat("Water boils at 93 °C up there. ", 13)[:400]
	f := conformance.NewFakeOpenAI(b, "sk-test")
	f.Script(func(conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		return conformance.OpenAIAnswer{Content: answer}, true
	})
	e := newEnv(b)
	req := modelCall("run_1.m1", abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "How hot does water boil up there?"}}})
	for _, c := range []struct{ name, stream string }{{"baseline-whole", "false"}, {"streamed", ""}} {
		x := loadOpenAI(b, e, f, "openai-"+c.name, c.stream, f.Addr)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if o := model(b)(x.Start(ctx, req)); o.Message.Content != answer {
					b.Fatalf("the answer: %q", o.Message.Content)
				}
			}
		})
	}
}

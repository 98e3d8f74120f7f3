package examples_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

// fakeOpenAI is a chat-completions server on 127.0.0.1 that checks the
// request's shape. At /v1/chat/completions it answers a tool call while
// the conversation has no tool result, then a final answer; to a last
// message "answer N" it answers status N with an OpenAI-style error (a
// 429 with a Retry-After in seconds, or as a date for "answer 429 by
// date").
type fakeOpenAI struct {
	t    *testing.T
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []map[string]any
}

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOpenAI) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.reqs...)
}

func (f *fakeOpenAI) fail(w http.ResponseWriter, format string, args ...any) {
	f.t.Errorf("fake server: "+format, args...)
	w.WriteHeader(http.StatusBadRequest)
	io.WriteString(w, `{"error":{"message":"the fake server refused the request"}}`)
}

func (f *fakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("content-type", "application/json")
	if r.URL.Path != "/v1/chat/completions" {
		f.fail(w, "path %q, want /v1/chat/completions", r.URL.Path)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer sk-test" || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		f.fail(w, "%s with authorization %q and content-type %q", r.Method, r.Header.Get("Authorization"), r.Header.Get("Content-Type"))
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.fail(w, "body: %v", err)
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, body)
	f.mu.Unlock()
	if body["model"] != "gpt-test" {
		f.fail(w, "model %v", body["model"])
		return
	}
	msgs, _ := body["messages"].([]any)
	if len(msgs) == 0 {
		f.fail(w, "no messages")
		return
	}
	last, _ := msgs[len(msgs)-1].(map[string]any)
	switch last["content"] {
	case "answer 500":
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"the server is on fire","type":"server_error"}}`)
		return
	case "answer 429":
		w.Header().Set("Retry-After", "20")
		w.Header().Set("X-Ratelimit-Reset-Requests", "1s")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	case "answer 429 by date":
		w.Header().Set("Date", "Sat, 01 Mar 2025 12:00:00 GMT")
		w.Header().Set("Retry-After", "Sat, 01 Mar 2025 12:00:42 GMT")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"Rate limit reached for tokens","type":"tokens","code":"rate_limit_exceeded"}}`)
		return
	case "answer 401":
		w.WriteHeader(401)
		io.WriteString(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`)
		return
	}
	if last["role"] == "tool" {
		io.WriteString(w, `{"id":"chatcmpl-2","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop",
			"message":{"role":"assistant","content":"(2+3)*4 = 20"}}],"usage":{"prompt_tokens":80,"completion_tokens":9,"total_tokens":89}}`)
		return
	}
	io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"finish_reason":"tool_calls",
		"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"calculate","arguments":"{\"expression\":\"(2+3)*4\"}"}}]}}],
		"usage":{"prompt_tokens":61,"completion_tokens":17,"total_tokens":78}}`)
}

func TestOpenAI(t *testing.T) {
	f := newFakeOpenAI(t)
	e := newEnv(t)
	ctx := context.Background()
	load := func(name, baseURL string, allowed ...string) *host.Executor {
		return e.executor(t, "openai", func(s *host.PluginSpec) {
			s.Name = name
			s.Sandbox.AllowedHosts = allowed
			s.Sandbox.Config = map[string]string{"base_url": baseURL, "model": "gpt-test", "api_key": "sk-test", "temperature": "0"}
		})
	}
	x := load("openai", f.srv.URL+"/v1", f.srv.Listener.Addr().String()) // a port-less entry allows 80 and 443 only

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

	// The requests had the shape the API documents.
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	tools, _ := reqs[0]["tools"].([]any)
	fn, _ := tools[0].(map[string]any)["function"].(map[string]any)
	if len(tools) != 1 || tools[0].(map[string]any)["type"] != "function" || fn["name"] != "calculate" || fn["parameters"].(map[string]any)["type"] != "object" {
		t.Errorf("tools: %v", reqs[0]["tools"])
	}
	if reqs[0]["temperature"] != 0.0 {
		t.Errorf("temperature: %v", reqs[0]["temperature"])
	}
	msgs, _ := reqs[1]["messages"].([]any)
	if len(msgs) != 4 {
		t.Fatalf("messages of the second request: %v", msgs)
	}
	asst := msgs[2].(map[string]any)
	tc := asst["tool_calls"].([]any)[0].(map[string]any)
	if asst["role"] != "assistant" || asst["content"] != nil || tc["id"] != "call_abc" || tc["type"] != "function" ||
		tc["function"].(map[string]any)["arguments"] != `{"expression":"(2+3)*4"}` {
		t.Errorf("assistant message: %v", asst)
	}
	if tm := msgs[3].(map[string]any); tm["role"] != "tool" || tm["tool_call_id"] != "call_abc" || tm["content"] != "20" {
		t.Errorf("tool message: %v", tm)
	}

	// Server errors: 5xx may be retried, 4xx not; both carry the server's message.
	ask := func(text string) abi.ModelRequest {
		return abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}}
	}
	r, err := x.Start(ctx, modelCall("run_1.m1", ask("answer 500")))
	if err != nil || r.State != abi.StateFailed || !r.Error.Retriable || !strings.Contains(r.Error.Message, "the server is on fire") {
		t.Errorf("500: %+v %v", r, err)
	}
	// A 429 is rate_limited, with the wait the server asked for: in
	// seconds, or as a date, by the response's own Date.
	for text, wait := range map[string]int64{"answer 429": 20_000, "answer 429 by date": 42_000} {
		r, err = x.Start(ctx, modelCall("run_1.m1", ask(text)))
		if err != nil || r.State != abi.StateFailed || !r.Error.Retriable || r.Error.Class != abi.ClassRateLimited ||
			r.Error.RetryAfterMS != wait || !strings.Contains(r.Error.Message, "Rate limit reached") {
			t.Errorf("%s: %+v %+v %v", text, r, r.Error, err)
		}
	}
	r, err = x.Start(ctx, modelCall("run_1.m1", ask("answer 401")))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable || !strings.Contains(r.Error.Message, "Incorrect API key") {
		t.Errorf("401: %+v %v", r, err)
	}
	// A host that is not allowed never hears from the plugin; the host
	// turns the plugin's failed reply after the refusal into plugin_denied.
	before := len(f.requests())
	_, err = load("openai-denied", f.srv.URL+"/v1").Start(ctx, modelCall("run_1.m1", req))
	if classOf(t, err) != abi.ClassPluginDenied || !strings.Contains(err.Error(), "allowed_hosts") {
		t.Errorf("denied: %v", err)
	}
	if len(f.requests()) != before {
		t.Errorf("a denied request reached the server")
	}
	// A config without base_url or model fails, naming the keys.
	bare := e.executor(t, "openai", func(s *host.PluginSpec) { s.Name = "openai-bare" })
	r, err = bare.Start(ctx, modelCall("run_1.m1", req))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable || !strings.Contains(r.Error.Message, "base_url") || !strings.Contains(r.Error.Message, "model") {
		t.Errorf("no config: %+v %v", r, err)
	}
}

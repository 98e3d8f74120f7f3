package messages

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/plugins/abi"
)

func get(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(get(map[string]string{"model": "claude-test", "api_key": "k", "temperature": "0.2", "max_tokens": "256", "structured_outputs": "true"}))
	if err != nil || c.BaseURL != DefaultBaseURL || c.Model != "claude-test" || c.APIKey != "k" || *c.Temperature != 0.2 || c.MaxTokens != 256 || !c.StructuredOutputs {
		t.Fatalf("%+v %v", c, err)
	}
	c, err = ParseConfig(get(map[string]string{"base_url": "http://127.0.0.1:8080/", "model": "m"}))
	if err != nil || c.BaseURL != "http://127.0.0.1:8080" || c.MaxTokens != DefaultMaxTokens || c.Temperature != nil || c.StructuredOutputs {
		t.Fatalf("%+v %v", c, err)
	}
	_, err = ParseConfig(get(map[string]string{"base_url": "api.anthropic.com", "temperature": "warm", "max_tokens": "-1", "timeout_ms": "soon", "structured_outputs": "maybe"}))
	for _, key := range []string{"base_url", "model", "temperature", "max_tokens", "timeout_ms", "structured_outputs"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s: %v", key, err)
		}
	}
	// A base URL with /v1 would be sent to /v1/v1/messages: refused, saying what to do.
	_, err = ParseConfig(get(map[string]string{"base_url": "https://api.anthropic.com/v1", "model": "m"}))
	if err == nil || !strings.Contains(err.Error(), "drop the /v1") {
		t.Errorf("base_url with /v1: %v", err)
	}
}

func encode(t *testing.T, c Config, req abi.ModelRequest) string {
	t.Helper()
	b, err := Encode(c, req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEncode: system messages become the system prompt, tool calls
// tool_use blocks, tool results tool_result blocks of a user turn, and the
// tools carry their input schemas (none: an empty object schema).
func TestEncode(t *testing.T) {
	temp := 0.5
	c := Config{Config: modelcall.Config{Model: "m", MaxTokens: 100, Temperature: &temp}}
	req := abi.ModelRequest{
		Messages: []abi.Message{
			{Role: "system", Content: "S"},
			{Role: "user", Content: "What is 2+3?"},
			{Role: "assistant", Content: "Let me see.", ToolCalls: []abi.ToolCall{{ID: "c1", Name: "calculate", Arguments: json.RawMessage(`{"expression":"2+3"}`)}, {ID: "c2", Name: "noargs"}}},
			{Role: "tool", ToolCallID: "c1", Content: "5"},
			{Role: "tool", ToolCallID: "c2", Content: "no such tool", IsError: true},
		},
		Tools: []abi.Tool{{Name: "calculate", Description: "D", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "noargs"}},
	}
	want := `{"model":"m","max_tokens":100,"system":"S","messages":[` +
		`{"role":"user","content":[{"type":"text","text":"What is 2+3?"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"Let me see."},{"type":"tool_use","id":"c1","name":"calculate","input":{"expression":"2+3"}},{"type":"tool_use","id":"c2","name":"noargs","input":{}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"5"},{"type":"tool_result","tool_use_id":"c2","content":"no such tool","is_error":true}]}],` +
		`"tools":[{"name":"calculate","description":"D","input_schema":{"type":"object"}},{"name":"noargs","input_schema":{"type":"object","properties":{}}}],` +
		`"temperature":0.5}`
	if got := encode(t, c, req); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestEncodeMergesConsecutiveTurns: the API wants roles to alternate, so
// consecutive messages of one side merge into one turn; two system
// messages join into one prompt; a tool result comes before the text of
// its turn; empty text is left out.
func TestEncodeMergesConsecutiveTurns(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{
		{Role: "system", Content: "one"},
		{Role: "user", Content: "first"},
		{Role: "user", Content: "second"},
		{Role: "system", Content: "two"},
		{Role: "assistant", Content: "thinking"},
		{Role: "assistant", ToolCalls: []abi.ToolCall{{ID: "c1", Name: "f", Arguments: json.RawMessage(`{}`)}}},
		{Role: "user", Content: "[agenthost] a note"},
		{Role: "tool", ToolCallID: "c1", Content: "r"},
		{Role: "assistant", Content: ""},
		{Role: "user", Content: "   "},
	}}
	want := `{"model":"m","max_tokens":4096,"system":"one\n\ntwo","messages":[` +
		`{"role":"user","content":[{"type":"text","text":"first"},{"type":"text","text":"second"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"thinking"},{"type":"tool_use","id":"c1","name":"f","input":{}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"r"},{"type":"text","text":"[agenthost] a note"}]}]}`
	if got := encode(t, Config{Config: modelcall.Config{Model: "m"}}, req); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestEncodePairsToolBlocks: the API refuses a tool_use without its
// tool_result in the next turn and a tool_result without its tool_use in
// the turn before, and a conversation that starts with the assistant.
// Encode leaves those out: a history window that starts mid-call, calls of
// a Run cancelled before their results; and IDs keep only the characters
// the API takes.
func TestEncodePairsToolBlocks(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{
		{Role: "assistant", ToolCalls: []abi.ToolCall{{ID: "old", Name: "f"}}}, // the window cut the user before it
		{Role: "tool", ToolCallID: "old", Content: "r0"},
		{Role: "assistant", Content: "earlier answer"},
		{Role: "user", Content: "go on"},
		{Role: "assistant", ToolCalls: []abi.ToolCall{{ID: "cancelled", Name: "slow"}}}, // its Run was cancelled: no result
		{Role: "user", Content: "next Run"},
		{Role: "tool", ToolCallID: "nobody", Content: "orphan"},
		{Role: "assistant", Content: "ok", ToolCalls: []abi.ToolCall{{ID: "run_a.t1.0", Name: "f"}}},
		{Role: "tool", ToolCallID: "run_a.t1.0", Content: "r1"},
	}}
	want := `{"model":"m","max_tokens":4096,"messages":[` +
		`{"role":"user","content":[{"type":"text","text":"go on"},{"type":"text","text":"next Run"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"run_a_t1_0","name":"f","input":{}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"run_a_t1_0","content":"r1"}]}]}`
	if got := encode(t, Config{Config: modelcall.Config{Model: "m"}}, req); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	// Nothing left to answer is an error, not an empty conversation.
	if _, err := Encode(Config{Config: modelcall.Config{Model: "m"}}, abi.ModelRequest{Messages: []abi.Message{{Role: "system", Content: "S"}}}); err == nil || !strings.Contains(err.Error(), "no user message") {
		t.Fatalf("a request of a system message only: %v", err)
	}
}

// TestEncodeTakesTheAgentsSettingsFromParams: model, temperature and
// max_output_tokens in params win over the config; stop and tool_choice
// are read; a setting the plugin does not know is not sent.
func TestEncodeTakesTheAgentsSettingsFromParams(t *testing.T) {
	temp := 0.5
	c := Config{Config: modelcall.Config{Model: "config-model", Temperature: &temp, MaxTokens: 64}}
	msgs := []abi.Message{{Role: "user", Content: "hi"}}
	tools := []abi.Tool{{Name: "calculate", InputSchema: json.RawMessage(`{"type":"object"}`)}}
	got := encode(t, c, abi.ModelRequest{Messages: msgs, Tools: tools, Params: map[string]any{
		"model": "agent-model", "temperature": 0.25, "max_output_tokens": float64(300), "stop": []any{"END", ""}, "stop_sequences": "STOP",
		"tool_choice": "required", "seed_of_another_executor": "x"}})
	want := `{"model":"agent-model","max_tokens":300,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],` +
		`"tools":[{"name":"calculate","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},"temperature":0.25,"stop_sequences":["END","STOP"]}`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if got, want := encode(t, c, abi.ModelRequest{Messages: msgs}), `{"model":"config-model","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"temperature":0.5}`; got != want {
		t.Fatalf("without params: got\n%s\nwant\n%s", got, want)
	}
	for choice, want := range map[string]string{
		"calculate": `"tool_choice":{"name":"calculate","type":"tool"}`,
		"none":      `"tool_choice":{"type":"none"}`,
		"auto":      `"tool_choice":{"type":"auto"}`,
	} {
		if got := encode(t, c, abi.ModelRequest{Messages: msgs, Tools: tools, Params: map[string]any{"tool_choice": choice}}); !strings.Contains(got, want) {
			t.Errorf("tool_choice %v: %s", choice, got)
		}
	}
	// An object is sent as it is.
	obj := map[string]any{"type": "auto", "disable_parallel_tool_use": true}
	if got := encode(t, c, abi.ModelRequest{Messages: msgs, Tools: tools, Params: map[string]any{"tool_choice": obj}}); !strings.Contains(got, `"tool_choice":{"disable_parallel_tool_use":true,"type":"auto"}`) {
		t.Errorf("tool_choice object: %s", got)
	}
	// Without tools there is nothing to choose from: not sent.
	if got := encode(t, c, abi.ModelRequest{Messages: msgs, Params: map[string]any{"tool_choice": "any"}}); strings.Contains(got, "tool_choice") {
		t.Errorf("tool_choice without tools: %s", got)
	}
}

// TestEncodeSendsTheOutputSchemaWhenTold: output_schema is sent as
// output_config only when the config turns structured outputs on.
func TestEncodeSendsTheOutputSchemaWhenTold(t *testing.T) {
	msgs := []abi.Message{{Role: "user", Content: "hi"}}
	params := map[string]any{"output_schema": map[string]any{"type": "object", "required": []any{"city"}}}
	if got := encode(t, Config{Config: modelcall.Config{Model: "m"}}, abi.ModelRequest{Messages: msgs, Params: params}); strings.Contains(got, "output_config") {
		t.Fatalf("sent without structured_outputs: %s", got)
	}
	got := encode(t, Config{Config: modelcall.Config{Model: "m"}, StructuredOutputs: true}, abi.ModelRequest{Messages: msgs, Params: params})
	if want := `"output_config":{"format":{"type":"json_schema","schema":{"required":["city"],"type":"object"}}}`; !strings.Contains(got, want) {
		t.Fatalf("got\n%s\nwant it to contain\n%s", got, want)
	}
}

func TestHTTPRequest(t *testing.T) {
	r, err := HTTPRequest(Config{Config: modelcall.Config{BaseURL: "http://127.0.0.1:9", Model: "m", APIKey: "sk-ant-test", TimeoutMS: 5000}}, abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Method != "POST" || r.URL != "http://127.0.0.1:9/v1/messages" || r.TimeoutMS != 5000 ||
		r.Headers["x-api-key"] != "sk-ant-test" || r.Headers["anthropic-version"] != "2023-06-01" || r.Headers["content-type"] != "application/json" {
		t.Fatalf("%+v", r)
	}
	if _, ok := r.Headers["authorization"]; ok {
		t.Errorf("an authorization header was sent: %+v", r.Headers)
	}
}

func decodeModel(t *testing.T, resp abi.HTTPResponse) abi.ModelOutcome {
	t.Helper()
	r := Decode(resp)
	var o abi.ModelOutcome
	if r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil {
		t.Fatalf("%+v %+v", r, r.Error)
	}
	return o
}

func TestDecode(t *testing.T) {
	// A tool call: the text before it kept, the input as the arguments, a
	// repeated ID renamed; usage counts cached input too.
	o := decodeModel(t, abi.HTTPResponse{Status: 200, Body: `{"id":"msg_1","type":"message","role":"assistant","model":"m",
		"content":[{"type":"text","text":"I'll compute that."},{"type":"tool_use","id":"toolu_1","name":"calculate","input":{"expression": "2+3"}},
		{"type":"tool_use","id":"toolu_1","name":"calculate","input":{}},{"type":"thinking","thinking":"…","signature":"x"}],
		"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":3,"cache_read_input_tokens":5,"output_tokens":7}}`})
	tc := o.Message.ToolCalls
	if o.Message.Content != "I'll compute that." || len(tc) != 2 || tc[0].ID != "toolu_1" || tc[1].ID != "toolu_2" ||
		string(tc[0].Arguments) != `{"expression":"2+3"}` || string(tc[1].Arguments) != `{}` {
		t.Fatalf("message %+v", o.Message)
	}
	if o.Usage != (abi.Usage{InputTokens: 20, OutputTokens: 7}) {
		t.Fatalf("usage %+v", o.Usage)
	}
	// Text blocks concatenate; end_turn, stop_sequence and max_tokens answer with the text.
	for _, stop := range []string{"end_turn", "stop_sequence", "max_tokens"} {
		o = decodeModel(t, abi.HTTPResponse{Status: 200, Body: `{"type":"message","role":"assistant","content":[{"type":"text","text":"(2+3)*4 "},{"type":"text","text":"= 20"}],"stop_reason":"` + stop + `","usage":{"input_tokens":1,"output_tokens":2}}`})
		if o.Message.Content != "(2+3)*4 = 20" || len(o.Message.ToolCalls) != 0 {
			t.Errorf("%s: %+v", stop, o.Message)
		}
	}
}

// TestDecodeFailures: error bodies and stop reasons become failed replies,
// retriable or not, with the server's words.
func TestDecodeFailures(t *testing.T) {
	errBody := func(typ, msg string) string {
		return `{"type":"error","error":{"type":"` + typ + `","message":"` + msg + `"},"request_id":"req_011"}`
	}
	msg := func(content, stop string) string {
		return `{"type":"message","role":"assistant","content":[` + content + `],"stop_reason":"` + stop + `","usage":{"input_tokens":1,"output_tokens":1}}`
	}
	cases := []struct {
		name      string
		resp      abi.HTTPResponse
		retriable bool
		want      string
	}{
		{"429", abi.HTTPResponse{Status: 429, Headers: map[string]string{"Retry-After": "20"}, Body: errBody("rate_limit_error", "Number of requests has exceeded your rate limit")},
			true, "429 rate_limit_error: Number of requests has exceeded your rate limit (request req_011); it asks to retry after 20 s"},
		{"529", abi.HTTPResponse{Status: 529, Body: errBody("overloaded_error", "Overloaded")}, true, "529 overloaded_error: Overloaded"},
		{"500", abi.HTTPResponse{Status: 500, Body: errBody("api_error", "Internal server error")}, true, "500 api_error: Internal server error"},
		{"503 without a body", abi.HTTPResponse{Status: 503}, true, "503 (no body)"},
		{"400", abi.HTTPResponse{Status: 400, Body: errBody("invalid_request_error", "messages: roles must alternate")}, false, "invalid_request_error: messages: roles must alternate"},
		{"401", abi.HTTPResponse{Status: 401, Body: errBody("authentication_error", "invalid x-api-key")}, false, "401 authentication_error: invalid x-api-key"},
		{"403", abi.HTTPResponse{Status: 403, Body: errBody("permission_error", "no")}, false, "permission_error"},
		{"404", abi.HTTPResponse{Status: 404, Body: errBody("not_found_error", "model: claude-nope")}, false, "model: claude-nope"},
		{"413", abi.HTTPResponse{Status: 413, Body: errBody("request_too_large", "Request exceeds the maximum size")}, false, "request_too_large"},
		{"retry-after as a date", abi.HTTPResponse{Status: 429, Headers: map[string]string{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, Body: errBody("rate_limit_error", "slow down")},
			true, "retry after Wed, 21 Oct 2015 07:28:00 GMT"},
		{"an error body with status 200", abi.HTTPResponse{Status: 200, Body: errBody("overloaded_error", "Overloaded")}, true, "200 overloaded_error"},
		{"denied", abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPDenied, Message: "host x"}}, false, "allowed_hosts"},
		{"timeout", abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPTimeout, Message: "10s"}}, true, "timeout"},
		{"not JSON", abi.HTTPResponse{Status: 200, Body: `<html>`}, false, "not a message"},
		{"a chat completion", abi.HTTPResponse{Status: 200, Body: `{"choices":[{"message":{"content":"hi"}}]}`}, false, `of type "", not a message`},
		{"refusal", abi.HTTPResponse{Status: 200, Body: msg(`{"type":"text","text":"I can't help with that."}`, "refusal")}, false, "declined to answer (stop_reason refusal): I can't help with that."},
		{"pause_turn", abi.HTTPResponse{Status: 200, Body: msg(`{"type":"text","text":"…"}`, "pause_turn")}, true, "pause_turn"},
		{"a call cut at max_tokens", abi.HTTPResponse{Status: 200, Body: msg(`{"type":"tool_use","id":"t","name":"calculate","input":{}}`, "max_tokens")}, false, "raise max_output_tokens"},
		{"input not an object", abi.HTTPResponse{Status: 200, Body: msg(`{"type":"tool_use","id":"t","name":"f","input":[1]}`, "tool_use")}, true, "not a JSON object"},
		{"a call without a name", abi.HTTPResponse{Status: 200, Body: msg(`{"type":"tool_use","id":"t","name":"","input":{}}`, "tool_use")}, true, "breaks the ABI"},
	}
	for _, c := range cases {
		r := Decode(c.resp)
		if r.State != abi.StateFailed || r.Error.Retriable != c.retriable || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: %+v, want failed, retriable %v, saying %q", c.name, r.Error, c.retriable, c.want)
		}
	}
	// A rate limit and an overloaded API are rate_limited, with the wait
	// a retry-after in seconds asks for; other failures are not.
	for _, c := range []struct {
		resp   abi.HTTPResponse
		class  abi.ErrorClass
		waitMS int64
	}{
		{cases[0].resp, abi.ClassRateLimited, 20_000},
		{cases[1].resp, abi.ClassRateLimited, 0},
		{abi.HTTPResponse{Status: 429, Headers: map[string]string{"retry-after": "99999999"}, Body: errBody("rate_limit_error", "x")}, abi.ClassRateLimited, maxRetryAfterSeconds * 1000},
		{cases[9].resp, abi.ClassRateLimited, 0}, // a date: the host's own backoff
		{cases[2].resp, "", 0},
		{cases[4].resp, "", 0},
	} {
		r := Decode(c.resp)
		if r.Error.Class != c.class || r.Error.RetryAfterMS != c.waitMS {
			t.Errorf("%d %s: class %q, retry_after_ms %d; want %q, %d", c.resp.Status, c.resp.Body, r.Error.Class, r.Error.RetryAfterMS, c.class, c.waitMS)
		}
	}
}

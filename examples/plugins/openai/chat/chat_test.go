package chat

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
)

func get(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(get(map[string]string{"base_url": "http://localhost:11434/v1/", "model": "llama3.1", "temperature": "0.2", "max_tokens": "256"}))
	if err != nil || c.BaseURL != "http://localhost:11434/v1" || c.Model != "llama3.1" || c.APIKey != "" || *c.Temperature != 0.2 || c.MaxTokens != 256 || !c.Stream {
		t.Fatalf("%+v %v", c, err)
	}
	_, err = ParseConfig(get(map[string]string{"temperature": "warm", "max_tokens": "-1"}))
	for _, key := range []string{"base_url", "model", "temperature", "max_tokens"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s: %v", key, err)
		}
	}
}

func TestEncode(t *testing.T) {
	temp := 0.5
	c := Config{Model: "m", Temperature: &temp}
	req := abi.ModelRequest{
		Messages: []abi.Message{
			{Role: "system", Content: "S"},
			{Role: "user", Content: "What is 2+3?"},
			{Role: "assistant", ToolCalls: []abi.ToolCall{{ID: "c1", Name: "calculate", Arguments: json.RawMessage(`{"expression":"2+3"}`)}, {ID: "c2", Name: "noargs"}}},
			{Role: "tool", ToolCallID: "c1", Content: "5"},
		},
		Tools:  []abi.Tool{{Name: "calculate", Description: "D", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "noargs"}},
		Params: map[string]any{"max_tokens": float64(64)},
	}
	b, err := Encode(c, req)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"What is 2+3?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calculate","arguments":"{\"expression\":\"2+3\"}"}},{"id":"c2","type":"function","function":{"name":"noargs","arguments":"{}"}}]},` +
		`{"role":"tool","content":"5","tool_call_id":"c1"}],` +
		`"tools":[{"type":"function","function":{"name":"calculate","description":"D","parameters":{"type":"object"}}},{"type":"function","function":{"name":"noargs","parameters":{"type":"object","properties":{}}}}],` +
		`"temperature":0.5,"max_tokens":64}`
	if string(b) != want {
		t.Fatalf("got\n%s\nwant\n%s", b, want)
	}
}

func TestDecode(t *testing.T) {
	body := `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"x","type":"function","function":{"name":"calculate","arguments":"{\"expression\": \"2+3\"}"}},` +
		`{"id":"x","type":"function","function":{"name":"calculate","arguments":""}}]}}],"usage":{"prompt_tokens":12,"completion_tokens":7}}`
	r := Decode(abi.HTTPResponse{Status: 200, Body: body}, testNow)
	var o abi.ModelOutcome
	if r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil {
		t.Fatalf("%+v", r)
	}
	tc := o.Message.ToolCalls
	if len(tc) != 2 || tc[0].ID != "x" || tc[1].ID != "call_1" || string(tc[0].Arguments) != `{"expression":"2+3"}` || string(tc[1].Arguments) != `{}` {
		t.Fatalf("tool calls %+v", tc)
	}
	if o.Usage != (abi.Usage{InputTokens: 12, OutputTokens: 7}) {
		t.Fatalf("usage %+v", o.Usage)
	}

	cases := []struct {
		resp      abi.HTTPResponse
		retriable bool
		want      string
	}{
		{abi.HTTPResponse{Status: 500, Body: `{"error":{"message":"overloaded"}}`}, true, "500: overloaded"},
		{abi.HTTPResponse{Status: 429, Body: `{"error":{"message":"slow down"}}`}, true, "429: slow down"},
		{abi.HTTPResponse{Status: 429, Body: `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`}, false, "quota is used up"},
		{abi.HTTPResponse{Status: 401, Body: `{"error":{"message":"Incorrect API key"}}`}, false, "401: Incorrect API key"},
		{abi.HTTPResponse{Status: 404, Body: `{"error":"model \"x\" not found"}`}, false, `model "x" not found`},
		{abi.HTTPResponse{Status: 400, Body: ``}, false, "(no body)"},
		{abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPDenied, Message: "host x"}}, false, "allowed_hosts"},
		{abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPTimeout, Message: "10s"}}, true, "timeout"},
		{abi.HTTPResponse{Status: 200, Body: `<html>`}, false, "not a chat completion"},
		{abi.HTTPResponse{Status: 200, Body: `{"choices":[]}`}, false, "no choices"},
		{abi.HTTPResponse{Status: 200, Body: `{"choices":[{"message":{"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}}]}`}, true, "not a JSON object"},
		{abi.HTTPResponse{Status: 200, Body: `{"choices":[{"message":{"tool_calls":[{"function":{"name":"","arguments":"{}"}}]}}]}`}, true, "breaks the ABI"},
	}
	for _, c := range cases {
		r := Decode(c.resp, testNow)
		if r.State != abi.StateFailed || r.Error.Retriable != c.retriable || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%+v: %+v", c.resp, r.Error)
		}
	}
}

// TestEncodeTakesTheAgentsSettingsFromParams: model, temperature and
// max_output_tokens in params win over the config; a setting the plugin
// does not know is not sent.
func TestEncodeTakesTheAgentsSettingsFromParams(t *testing.T) {
	temp, maxTokens := 0.5, 64
	c := Config{Model: "config-model", Temperature: &temp, MaxTokens: maxTokens}
	req := abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}},
		Params: map[string]any{"model": "agent-model", "temperature": 0.25, "max_output_tokens": float64(300), "seed_of_another_executor": "x"}}
	b, err := Encode(c, req)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"agent-model","messages":[{"role":"user","content":"hi"}],"temperature":0.25,"max_tokens":300}`
	if string(b) != want {
		t.Fatalf("got\n%s\nwant\n%s", b, want)
	}
	b, err = Encode(c, abi.ModelRequest{Messages: req.Messages})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"config-model","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"max_tokens":64}`; string(b) != want {
		t.Fatalf("without params: got\n%s\nwant\n%s", b, want)
	}
}

// TestEncodeSendsTheOutputSchemaAsResponseFormat: the param output_schema
// (the agent's output schema) is sent as a json_schema response_format,
// not strict; one that is not an object is not sent.
func TestEncodeSendsTheOutputSchemaAsResponseFormat(t *testing.T) {
	c := Config{Model: "m"}
	msgs := []abi.Message{{Role: "user", Content: "hi"}}
	schema := map[string]any{"type": "object", "required": []any{"city"}}
	b, err := Encode(c, abi.ModelRequest{Messages: msgs, Params: map[string]any{"output_schema": schema}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":{"required":["city"],"type":"object"},"strict":false}}}`
	if string(b) != want {
		t.Fatalf("got\n%s\nwant\n%s", b, want)
	}
	b, err = Encode(c, abi.ModelRequest{Messages: msgs, Params: map[string]any{"output_schema": "not an object"}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "response_format") {
		t.Fatalf("an output_schema that is not an object was sent: %s", b)
	}
}

// testNow is the host clock of the Decode tests.
var testNow = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// TestATooManyRequestsAnswerIsRateLimitedWithTheServersWait: a 429, and
// a 503 that says when to come back, fail as rate_limited (retriable),
// with the wait the headers ask for; another 5xx that says when carries
// the wait as a plain retriable failure.
func TestATooManyRequestsAnswerIsRateLimitedWithTheServersWait(t *testing.T) {
	body := `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`
	for _, tc := range []struct {
		name    string
		status  int
		headers map[string]string
		class   abi.ErrorClass
		wait    int64
	}{
		{"429 with Retry-After seconds", 429, map[string]string{"Retry-After": "20"}, abi.ClassRateLimited, 20_000},
		{"429 with no hint", 429, nil, abi.ClassRateLimited, 0},
		{"429 with OpenAI's reset headers", 429, map[string]string{"X-Ratelimit-Reset-Requests": "6m0s", "X-Ratelimit-Remaining-Requests": "0",
			"X-Ratelimit-Reset-Tokens": "20ms", "X-Ratelimit-Remaining-Tokens": "512"}, abi.ClassRateLimited, 360_000},
		{"503 with Retry-After", 503, map[string]string{"retry-after": "7"}, abi.ClassRateLimited, 7000},
		{"503 without Retry-After is not a rate limit", 503, nil, abi.ClassPluginFailed, 0},
		{"502 with Retry-After carries the wait", 502, map[string]string{"Retry-After": "3"}, abi.ClassPluginFailed, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Decode(abi.HTTPResponse{Status: tc.status, Headers: tc.headers, Body: body}, testNow)
			if r.State != abi.StateFailed || !r.Error.Retriable || r.Error.HostClass() != tc.class || r.Error.RetryAfterMS != tc.wait {
				t.Fatalf("got %+v, want a retriable %s failure with retry_after_ms %d", r.Error, tc.class, tc.wait)
			}
			if !strings.Contains(r.Error.Message, "Rate limit reached for requests") {
				t.Fatalf("the message %q lost the server's words", r.Error.Message)
			}
			if err := abi.ValidateEffectReply(r, abi.KindModel, abi.ExportStart); err != nil {
				t.Fatalf("the reply breaks the ABI: %v", err)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	date := func(d time.Duration) string { return testNow.Add(d).Format("Mon, 02 Jan 2006 15:04:05 GMT") }
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    time.Duration
		said    bool
	}{
		{"none", nil, 0, false},
		{"delta-seconds", map[string]string{"Retry-After": "20"}, 20 * time.Second, true},
		{"delta-seconds with a fraction", map[string]string{"retry-after": "1.5"}, 1500 * time.Millisecond, true},
		{"zero", map[string]string{"Retry-After": "0"}, 0, true},
		{"an HTTP-date, by the host clock", map[string]string{"Retry-After": date(30 * time.Second)}, 30 * time.Second, true},
		{"an HTTP-date, by the response's Date", map[string]string{"Retry-After": date(90 * time.Second), "Date": date(80 * time.Second)}, 10 * time.Second, true},
		{"an RFC 850 date", map[string]string{"Retry-After": testNow.Add(time.Minute).Format("Monday, 02-Jan-06 15:04:05 GMT")}, time.Minute, true},
		{"an asctime date", map[string]string{"Retry-After": testNow.Add(2 * time.Minute).Format("Mon Jan _2 15:04:05 2006")}, 2 * time.Minute, true},
		{"a date in the past is no wait", map[string]string{"Retry-After": date(-time.Hour)}, 0, true},
		{"an unreadable Date is the host clock", map[string]string{"Retry-After": date(5 * time.Second), "Date": "yesterday"}, 5 * time.Second, true},
		{"retry-after-ms wins", map[string]string{"retry-after-ms": "250", "Retry-After": "1"}, 250 * time.Millisecond, true},
		{"a huge Retry-After is bounded", map[string]string{"Retry-After": "99999999999999999999"}, MaxRetryAfter, true},
		{"a date far ahead is bounded", map[string]string{"Retry-After": date(1000 * time.Hour)}, MaxRetryAfter, true},
		{"garbage is skipped", map[string]string{"Retry-After": "soon", "retry-after-ms": "-5"}, 0, false},
		{"NaN is garbage", map[string]string{"Retry-After": "NaN"}, 0, false},
		{"a negative value is garbage", map[string]string{"Retry-After": "-20"}, 0, false},
		{"reset headers: the exhausted limit's reset", map[string]string{"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "12",
			"x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "0"}, 6 * time.Minute, true},
		{"reset headers: both exhausted, the longer", map[string]string{"x-ratelimit-reset-requests": "1m30.5s", "x-ratelimit-remaining-requests": "0",
			"x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "0"}, 90*time.Second + 500*time.Millisecond, true},
		{"reset headers: none known exhausted, the shorter", map[string]string{"x-ratelimit-reset-requests": "20ms", "x-ratelimit-reset-tokens": "6m0s"}, 20 * time.Millisecond, true},
		{"reset headers: an unreadable one is skipped", map[string]string{"x-ratelimit-reset-requests": "soon", "x-ratelimit-reset-tokens": "2s"}, 2 * time.Second, true},
		{"Retry-After wins over the reset headers", map[string]string{"Retry-After": "3", "x-ratelimit-reset-requests": "1m"}, 3 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, said := RetryAfter(tc.headers, testNow)
			if got != tc.want || said != tc.said {
				t.Fatalf("RetryAfter(%v) = %s, %v; want %s, %v", tc.headers, got, said, tc.want, tc.said)
			}
		})
	}
}

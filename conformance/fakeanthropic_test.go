package conformance

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFakeAnthropicRefusesWhatTheAPIRefuses: the fake's checks, one rule
// at a time, on requests that break it; and a valid conversation with a
// tool call and its result passes.
func TestFakeAnthropicRefusesWhatTheAPIRefuses(t *testing.T) {
	f := &FakeAnthropic{apiKey: "k"}
	const tools = `"tools":[{"name":"calculate","input_schema":{"type":"object"}}]`
	const call = `{"role":"assistant","content":[{"type":"text","text":"Calling."},{"type":"tool_use","id":"toolu_1","name":"calculate","input":{"expression":"6*7"}}]}`
	check := func(body string, headers map[string]string) error {
		r := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(body))
		r.Header.Set("x-api-key", "k")
		r.Header.Set("anthropic-version", "2023-06-01")
		r.Header.Set("content-type", "application/json")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		_, err := f.check(r)
		return err
	}
	valid := `{"model":"m","max_tokens":10,"system":"S",` + tools + `,"tool_choice":{"type":"auto"},"messages":[` +
		`{"role":"user","content":"use calculate"},` + call + `,` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"42"},{"type":"text","text":"and then?"}]}]}`
	if err := check(valid, nil); err != nil {
		t.Fatalf("a valid request was refused: %v", err)
	}
	for _, c := range []struct {
		name, body string
		headers    map[string]string
		want       string
	}{
		{"no api key", valid, map[string]string{"x-api-key": ""}, "x-api-key"},
		{"another version", valid, map[string]string{"anthropic-version": "2024-01-01"}, "anthropic-version"},
		{"an unknown field", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"response_format":{}}`, nil, "response_format: Extra inputs"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil, "max_tokens"},
		{"max_tokens not an integer", `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, nil, "max_tokens"},
		{"a system message", `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}`, nil, `"system" is not user or assistant`},
		{"starts with the assistant", `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"hi"}]}`, nil, "first message"},
		{"two user turns", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`, nil, "alternate"},
		{"empty text", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":""}]}]}`, nil, "non-empty"},
		{"a call left unanswered", `{"model":"m","max_tokens":1,` + tools + `,"messages":[{"role":"user","content":"a"},` + call + `,{"role":"user","content":"b"}]}`, nil, "without tool_result"},
		{"a result after text", `{"model":"m","max_tokens":1,` + tools + `,"messages":[{"role":"user","content":"a"},` + call + `,{"role":"user","content":[{"type":"text","text":"b"},{"type":"tool_result","tool_use_id":"toolu_1"}]}]}`, nil, "must come first"},
		{"a result of no call", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x"}]}]}`, nil, "unexpected tool_use_id"},
		{"an ID with a dot", `{"model":"m","max_tokens":1,` + tools + `,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"run.t1.0","name":"calculate","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"run.t1.0"}]}]}`, nil, "not a valid, unique tool_use ID"},
		{"a schema not an object", `{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{"type":"string"}}],"messages":[{"role":"user","content":"a"}]}`, nil, "input_schema"},
		{"tool_choice without tools", `{"model":"m","max_tokens":1,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"a"}]}`, nil, "tool_choice"},
		{"temperature over 1", `{"model":"m","max_tokens":1,"temperature":1.5,"messages":[{"role":"user","content":"a"}]}`, nil, "temperature"},
	} {
		if err := check(c.body, c.headers); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error that says %q", c.name, err, c.want)
		}
	}
}

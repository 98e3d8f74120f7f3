package conformance

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// waitReached waits for a hold to be reached, for at most a minute.
func waitReached(t *testing.T, h *StreamHold) {
	t.Helper()
	select {
	case <-h.Reached():
	case <-time.After(time.Minute):
		t.Fatal("the hold was not reached in a minute")
	}
}

// TestFakeOpenAIRefusesWhatTheAPIRefuses: the fake's checks, one rule at
// a time, on requests that break it; and a valid conversation with tool
// calls and their results passes.
func TestFakeOpenAIRefusesWhatTheAPIRefuses(t *testing.T) {
	f := &FakeOpenAI{apiKey: "k"}
	const tools = `"tools":[{"type":"function","function":{"name":"calculate","parameters":{"type":"object"}}}]`
	const call = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"calculate","arguments":"{}"}}]}`
	check := func(body string, headers map[string]string) (int, error) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("authorization", "Bearer k")
		r.Header.Set("content-type", "application/json")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		_, status, err := f.check(r)
		return status, err
	}
	valid := `{"model":"m","temperature":0,"max_tokens":10,"stream":true,"stream_options":{"include_usage":true},` + tools + `,"tool_choice":"auto",` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":{"type":"object"},"strict":false}},"messages":[` +
		`{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"use calculate"}]},` + call + `,` +
		`{"role":"tool","tool_call_id":"call_1","content":"42"},{"role":"user","content":"and then?"}]}`
	if _, err := check(valid, nil); err != nil {
		t.Fatalf("a valid request was refused: %v", err)
	}
	for _, c := range []struct {
		name, body string
		headers    map[string]string
		status     int
		want       string
	}{
		{"no api key", valid, map[string]string{"authorization": ""}, 401, "Incorrect API key"},
		{"not JSON", valid, map[string]string{"content-type": "text/plain"}, 400, "content-type"},
		{"an unknown field", `{"model":"m","messages":[{"role":"user","content":"hi"}],"system":"S"}`, nil, 400, "Unrecognized request argument supplied: system"},
		{"no model", `{"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "model"},
		{"no messages", `{"model":"m","messages":[]}`, nil, 400, "messages"},
		{"a role", `{"model":"m","messages":[{"role":"bot","content":"hi"}]}`, nil, 400, `"bot" is not system`},
		{"null user content", `{"model":"m","messages":[{"role":"user","content":null}]}`, nil, 400, "needs content"},
		{"temperature over 2", `{"model":"m","temperature":2.5,"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "temperature"},
		{"max_tokens not an integer", `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "max_tokens"},
		{"stream_options without stream", `{"model":"m","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "only allowed when 'stream' is enabled"},
		{"tool_choice without tools", `{"model":"m","tool_choice":"auto","messages":[{"role":"user","content":"hi"}]}`, nil, 400, "tool_choice"},
		{"a tool name", `{"model":"m","tools":[{"type":"function","function":{"name":"a.b"}}],"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "function name"},
		{"a call left unanswered", `{"model":"m",` + tools + `,"messages":[{"role":"user","content":"a"},` + call + `,{"role":"user","content":"b"}]}`, nil, 400, "must be followed by tool messages"},
		{"a result of no call", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"x","content":"1"}]}`, nil, 400, "must be a response to a preceding message with 'tool_calls'"},
		{"a schema without a name", `{"model":"m","response_format":{"type":"json_schema","json_schema":{"schema":{}}},"messages":[{"role":"user","content":"a"}]}`, nil, 400, "json_schema"},
	} {
		status, err := check(c.body, c.headers)
		if err == nil || status != c.status || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %d %v, want %d and an error that says %q", c.name, status, err, c.status, c.want)
		}
	}
	// A fake with no key takes no key.
	f.apiKey = ""
	if status, err := check(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil); status != 401 || err == nil {
		t.Errorf("a key sent to a server that takes none: %d %v", status, err)
	}
	if _, err := check(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"authorization": ""}); err != nil {
		t.Errorf("no key to a server that takes none: %v", err)
	}
}

// completion is the part of a chat completion the tests read.
type completion struct {
	Choices []struct {
		Message struct {
			Content   *string          `json:"content"`
			ToolCalls []OpenAIToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message, Type string
		Code          any
	} `json:"error"`
}

func chatBody(stream bool, msgs ...string) string {
	b, _ := json.Marshal(map[string]any{"model": "gpt-test", "messages": json.RawMessage("[" + strings.Join(msgs, ",") + "]"),
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "calculate", "parameters": map[string]any{"type": "object"}}}}})
	if stream {
		s := strings.TrimSuffix(string(b), "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
		return s
	}
	return string(b)
}

func user(text string) string {
	b, _ := json.Marshal(map[string]any{"role": "user", "content": text})
	return string(b)
}

// TestFakeOpenAIAnswers: the default answers, whole, a failure queued
// with its headers, a scripted answer, and what the fake records of each
// request.
func TestFakeOpenAIAnswers(t *testing.T) {
	f := NewFakeOpenAI(t, "sk-test")
	h := map[string]string{"authorization": "Bearer sk-test", "content-type": "application/json"}
	ask := func(body string) (int, http.Header, completion) {
		t.Helper()
		resp := post(t, f.URL+"/chat/completions", h, body)
		var c completion
		b, _ := io.ReadAll(resp.Body)
		decodeJSON(t, string(b), &c)
		return resp.StatusCode, resp.Header, c
	}
	if _, _, c := ask(chatBody(false, user("hi"))); *c.Choices[0].Message.Content != "hello from gpt-test" || c.Choices[0].FinishReason != "stop" || c.Usage.PromptTokens != 10 {
		t.Errorf("hello: %+v", c)
	}
	_, _, c := ask(chatBody(false, user("use calculate")))
	calls := c.Choices[0].Message.ToolCalls
	if c.Choices[0].Message.Content != nil || len(calls) != 1 || calls[0].ID != "call_1" || calls[0].Function.Name != "calculate" ||
		calls[0].Function.Arguments != `{"expression":"6*7"}` || c.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("use: %+v", c)
	}
	asst := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"calculate","arguments":"{}"}}]}`
	if _, _, c := ask(chatBody(false, user("use calculate"), asst, `{"role":"tool","tool_call_id":"call_1","content":"42"}`)); *c.Choices[0].Message.Content != "done: 42" {
		t.Errorf("done: %+v", c)
	}
	if status, _, c := ask(chatBody(false, user("answer 500"))); status != 500 || c.Error == nil || c.Error.Type != "server_error" {
		t.Errorf("answer 500: %d %+v", status, c.Error)
	}

	f.FailNext(OpenAIFailure{Status: 429, RetryAfter: "20", Headers: map[string]string{"x-ratelimit-reset-requests": "1s"}})
	status, headers, c := ask(chatBody(false, user("hi")))
	if status != 429 || headers.Get("retry-after") != "20" || headers.Get("x-ratelimit-reset-requests") != "1s" ||
		c.Error == nil || c.Error.Message != "Rate limit reached for requests" || c.Error.Code != "rate_limit_exceeded" {
		t.Errorf("429: %d %v %+v", status, headers, c.Error)
	}

	f.Script(func(r OpenAIRequest) (OpenAIAnswer, bool) {
		if r.LastUser() != "script" {
			return OpenAIAnswer{}, false
		}
		return OpenAIAnswer{Content: "scripted for " + r.System(), PromptTokens: 7, CompletionTokens: 3}, true
	})
	if _, _, c := ask(chatBody(false, `{"role":"system","content":"S"}`, user("script"))); *c.Choices[0].Message.Content != "scripted for S" || c.Usage.PromptTokens != 7 {
		t.Errorf("script: %+v", c)
	}
	if _, _, c := ask(chatBody(false, user("hi"))); *c.Choices[0].Message.Content != "hello from gpt-test" {
		t.Errorf("a request the script leaves: %+v", c)
	}

	reqs := f.Requests()
	if f.Count() != 7 || len(reqs) != 7 {
		t.Fatalf("%d requests, count %d", len(reqs), f.Count())
	}
	for i, r := range reqs {
		if r.Received.IsZero() || r.Answered.Before(r.Received) || r.Authorization != "Bearer sk-test" || r.Model != "gpt-test" {
			t.Errorf("request %d: %+v", i, r)
		}
	}
	if reqs[4].Status != 429 || reqs[5].Status != 200 || reqs[5].System() != "S" || reqs[2].Messages[2].ToolCallID != "call_1" {
		t.Errorf("requests: %+v", reqs)
	}
}

// streamedAnswer reads a streamed chat completion the way a client puts
// it together: the text, each call's pieces, the finish reason, the
// usage, and whether [DONE] came.
type streamedAnswer struct {
	text   string
	calls  []OpenAIToolCall
	finish string
	usage  int
	done   bool
	deltas int
	err    string
}

func readChunks(t *testing.T, events []sseEvent) streamedAnswer {
	t.Helper()
	var a streamedAnswer
	for _, ev := range events {
		if ev.Type != "" {
			t.Errorf("an event name %q: chat completions' chunks have none", ev.Type)
		}
		if ev.Data == "[DONE]" {
			a.done = true
			continue
		}
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name, Arguments string
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct{ Message string } `json:"error"`
		}
		decodeJSON(t, ev.Data, &c)
		if c.Error != nil {
			a.err = c.Error.Message
			continue
		}
		if c.Usage != nil {
			a.usage = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				a.text += *ch.Delta.Content
				a.deltas++
			}
			for _, tc := range ch.Delta.ToolCalls {
				a.deltas++
				for len(a.calls) <= tc.Index {
					a.calls = append(a.calls, OpenAIToolCall{})
				}
				call := &a.calls[tc.Index]
				call.ID += tc.ID
				call.Function.Name += tc.Function.Name
				call.Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				a.finish = *ch.FinishReason
			}
		}
	}
	return a
}

// TestFakeOpenAIStreams: a request with stream: true is answered with the
// same answer as chunks, in several pieces, with the usage and [DONE];
// a hold stops it after the deltas asked, with them sent, until it is
// released; a cut drops the connection, or ends the body early; a
// failure in the stream comes as an error chunk after the deltas asked.
func TestFakeOpenAIStreams(t *testing.T) {
	f := NewFakeOpenAI(t, "")
	h := map[string]string{"content-type": "application/json"}
	open := func(msgs ...string) *sseReader {
		t.Helper()
		return stream(t, post(t, f.URL+"/chat/completions", h, chatBody(true, msgs...)))
	}
	events, err := open(user("hi")).all()
	if a := readChunks(t, events); err != io.EOF || a.text != "hello from gpt-test" || a.deltas != 5 || a.finish != "stop" || a.usage != 5 || !a.done {
		t.Errorf("hello: %+v %v", a, err)
	}
	events, err = open(user("use calculate")).all()
	a := readChunks(t, events)
	if err != io.EOF || a.text != "" || len(a.calls) != 1 || a.calls[0].ID != "call_1" || a.calls[0].Function.Name != "calculate" ||
		a.calls[0].Function.Arguments != `{"expression":"6*7"}` || a.finish != "tool_calls" || !a.done {
		t.Errorf("use: %+v %v", a, err)
	}

	hold := f.Hold(2)
	s := open(user("hi"))
	var first []sseEvent
	for readChunks(t, first).deltas < 2 {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("before the hold: %v", err)
		}
		first = append(first, ev)
	}
	waitReached(t, hold)
	if a := readChunks(t, first); a.text != "hello fr" || a.done {
		t.Errorf("held: %+v", a)
	}
	hold.Release()
	rest, err := s.all()
	if a := readChunks(t, append(first, rest...)); err != io.EOF || a.text != "hello from gpt-test" || !a.done {
		t.Errorf("after the hold: %+v %v", a, err)
	}

	f.CutNext(1, CutConnection)
	events, err = open(user("hi")).all()
	if a := readChunks(t, events); err == nil || errors.Is(err, io.EOF) || a.text != "hell" || a.done {
		t.Errorf("cut connection: %+v %v, want a broken body after one delta", a, err)
	}
	f.CutNext(2, CutBody)
	events, err = open(user("hi")).all()
	if a := readChunks(t, events); err != io.EOF || a.text != "hello fr" || a.done || a.finish != "" {
		t.Errorf("cut body: %+v %v, want a clean end after two deltas", a, err)
	}
	f.FailNext(OpenAIFailure{Status: 500, InStream: true, AfterDeltas: 1})
	events, err = open(user("hi")).all()
	if a := readChunks(t, events); err != io.EOF || a.deltas != 1 || a.err != openAIErrors[500][0] || a.done {
		t.Errorf("a failure in the stream: %+v %v", a, err)
	}
	// The next answer is whole again.
	events, _ = open(user("hi")).all()
	if a := readChunks(t, events); a.text != "hello from gpt-test" || !a.done {
		t.Errorf("after: %+v", a)
	}
}

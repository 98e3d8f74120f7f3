package conformance

import (
	"errors"
	"io"
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

// anthropicStreamed is a streamed message as a client puts it together.
type anthropicStreamed struct {
	types         []string // the events' types, in order
	text          string
	calls         []string // "ID NAME INPUT"
	stop          string
	input, output int
	deltas        int
	err           string
}

func readMessageEvents(t *testing.T, events []sseEvent) anthropicStreamed {
	t.Helper()
	var a anthropicStreamed
	inputs := map[int]*strings.Builder{}
	heads := map[int]string{}
	for _, ev := range events {
		var e struct {
			Type    string `json:"type"`
			Index   int    `json:"index"`
			Message struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			ContentBlock struct{ Type, ID, Name string } `json:"content_block"`
			Delta        struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
			Error struct{ Type, Message string } `json:"error"`
		}
		decodeJSON(t, ev.Data, &e)
		if e.Type != ev.Type {
			t.Errorf("event %q has data of type %q", ev.Type, e.Type)
		}
		a.types = append(a.types, e.Type)
		switch e.Type {
		case "message_start":
			a.input = e.Message.Usage.InputTokens
		case "content_block_start":
			if e.ContentBlock.Type == "tool_use" {
				heads[e.Index] = e.ContentBlock.ID + " " + e.ContentBlock.Name
				inputs[e.Index] = &strings.Builder{}
			}
		case "content_block_delta":
			a.deltas++
			a.text += e.Delta.Text
			if b := inputs[e.Index]; b != nil {
				b.WriteString(e.Delta.PartialJSON)
			}
		case "content_block_stop":
			if head, ok := heads[e.Index]; ok {
				a.calls = append(a.calls, head+" "+inputs[e.Index].String())
			}
		case "message_delta":
			a.stop, a.output = e.Delta.StopReason, e.Usage.OutputTokens
		case "error":
			a.err = e.Error.Type + ": " + e.Error.Message
		}
	}
	return a
}

// TestFakeAnthropicStreams: a request with stream: true is answered with
// the same message as the reference's events, its text and tool input in
// several pieces; a hold stops it after the deltas asked, with them sent,
// until it is released; a cut drops the connection, or ends the body
// early; a failure in the stream comes as an error event after the
// deltas asked.
func TestFakeAnthropicStreams(t *testing.T) {
	f := NewFakeAnthropic(t, "k")
	h := map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"}
	body := func(text string) string {
		return `{"model":"claude-test","max_tokens":10,"stream":true,"tools":[{"name":"calculate","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"` + text + `"}]}`
	}
	open := func(text string) *sseReader {
		t.Helper()
		return stream(t, post(t, f.URL+"/v1/messages", h, body(text)))
	}
	events, err := open("use calculate").all()
	a := readMessageEvents(t, events)
	want := []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if err != io.EOF || strings.Join(a.types, ",") != strings.Join(want, ",") || a.text != "Calling calculate." ||
		strings.Join(a.calls, ";") != `toolu_1 calculate {"expression":"6*7"}` || a.stop != "tool_use" || a.input != 10 || a.output != 5 {
		t.Errorf("use: %+v %v", a, err)
	}
	if reqs := f.Requests(); !reqs[0].Stream {
		t.Errorf("the request's stream: %+v", reqs[0])
	}

	hold := f.Hold(2)
	s := open("hi")
	var first []sseEvent
	for readMessageEvents(t, first).deltas < 2 {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("before the hold: %v", err)
		}
		first = append(first, ev)
	}
	waitReached(t, hold)
	if a := readMessageEvents(t, first); a.text != "hello fr" || a.stop != "" {
		t.Errorf("held: %+v", a)
	}
	hold.Release()
	rest, err := s.all()
	if a := readMessageEvents(t, append(first, rest...)); err != io.EOF || a.text != "hello from claude-test" || a.types[len(a.types)-1] != "message_stop" {
		t.Errorf("after the hold: %+v %v", a, err)
	}

	f.CutNext(1, CutConnection)
	events, err = open("hi").all()
	if a := readMessageEvents(t, events); err == nil || errors.Is(err, io.EOF) || a.text != "hell" || a.stop != "" {
		t.Errorf("cut connection: %+v %v, want a broken body after one delta", a, err)
	}
	f.CutNext(3, CutBody)
	events, err = open("hi").all()
	if a := readMessageEvents(t, events); err != io.EOF || a.text != "hello from c" || a.stop != "" {
		t.Errorf("cut body: %+v %v, want a clean end after three deltas", a, err)
	}
	f.FailNext(AnthropicFailure{Status: 529, Message: "Overloaded", InStream: true, AfterDeltas: 1})
	events, err = open("hi").all()
	if a := readMessageEvents(t, events); err != io.EOF || a.deltas != 1 || a.err != "overloaded_error: Overloaded" || a.types[len(a.types)-1] != "error" {
		t.Errorf("a failure in the stream: %+v %v", a, err)
	}
	// The next answer is whole again.
	events, _ = open("hi").all()
	if a := readMessageEvents(t, events); a.text != "hello from claude-test" || a.stop != "end_turn" {
		t.Errorf("after: %+v", a)
	}
}

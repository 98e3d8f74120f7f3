package chat

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall/modelcalltest"
	"github.com/agenthost/agenthost/plugins/abi"
)

// chunk is one chunk of a streamed chat completion as the API reference
// shows them, with choice 0's delta (and finish reason) given.
func chunk(delta, finish string) string {
	if finish == "" {
		finish = "null"
	} else {
		finish = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb",` +
		`"choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}],"usage":null}` + "\n\n"
}

// recorded is a streamed answer with text and two tool calls, whose
// arguments come in pieces, a keep-alive, the usage in a last chunk
// without choices (stream_options.include_usage) and [DONE]; whole is
// the same answer unstreamed.
var recorded = chunk(`{"role":"assistant","content":"","refusal":null}`, "") +
	chunk(`{"content":"Let me "}`, "") +
	chunk(`{"content":"compute thät."}`, "") +
	chunk(`{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"calculate","arguments":""}}]}`, "") +
	chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"expr"}}]}`, "") +
	": keep-alive\n\n" +
	chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"ession\": \"(2+3)*4\"}"}}]}`, "") +
	chunk(`{"tool_calls":[{"index":1,"id":"call_def","type":"function","function":{"name":"lookup","arguments":"{}"}}]}`, "") +
	chunk(`{}`, "tool_calls") +
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":61,"completion_tokens":17,"total_tokens":78}}` + "\n\n" +
	"data: [DONE]\n\n"

const whole = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":"Let me compute thät.",` +
	`"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"calculate","arguments":"{\"expression\": \"(2+3)*4\"}"}},` +
	`{"id":"call_def","type":"function","function":{"name":"lookup","arguments":"{}"}}]}}],"usage":{"prompt_tokens":61,"completion_tokens":17,"total_tokens":78}}`

// wantDeltas is what recorded's deltas add up to.
var wantDeltas = abi.ModelDelta{Text: "Let me compute thät.", ToolCalls: []abi.ToolCallDelta{
	{Index: 0, ID: "call_abc", Name: "calculate", Arguments: `{"expression": "(2+3)*4"}`},
	{Index: 1, ID: "call_def", Name: "lookup", Arguments: "{}"},
}}

var streaming = Config{Model: "m", Stream: true}

// show is a reply as JSON, for messages.
func show(r abi.EffectReply) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func stream(h *modelcalltest.Host) abi.EffectReply {
	h.Now = testNow.UnixMilli()
	return Call(h, streaming, abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}}})
}

// TestStreamRepliesAsTheWholeResponseWould: the recorded stream, split
// into two reads at every byte offset, into many at random ones, and read
// a byte at a time, with LF or CRLF line breaks, replies exactly what the
// same answer unstreamed decodes to; its deltas add up to the answer, one
// per read that brought any of it.
func TestStreamRepliesAsTheWholeResponseWould(t *testing.T) {
	want := Decode(abi.HTTPResponse{Status: 200, Body: whole}, testNow)
	if want.State != abi.StateDone {
		t.Fatalf("the whole response: %+v", want)
	}
	modelcalltest.CheckSplits(t, recorded, 1, want, wantDeltas, stream)
	// One read of everything emits one delta with all of it.
	h := modelcalltest.Stream([]byte(recorded))
	modelcalltest.CheckRead(t, "one read", h, want, wantDeltas, stream)
	if len(h.Deltas) != 1 {
		t.Errorf("one read emitted %d deltas", len(h.Deltas))
	}
}

// TestStreamRequest: streaming asks for the stream and its usage, and
// accepts an event stream; stream: false sends neither.
func TestStreamRequest(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}}}
	r, err := HTTPRequest(streaming, req)
	if err != nil || r.Headers["accept"] != "text/event-stream" ||
		r.Body != `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}` {
		t.Fatalf("%+v %v", r, err)
	}
	r, _ = HTTPRequest(Config{Model: "m"}, req)
	if r.Headers["accept"] != "application/json" || strings.Contains(r.Body, "stream") {
		t.Fatalf("not streaming: %+v", r)
	}
}

// TestStreamFailures: an error the server sends in the stream fails the
// attempt, retriable (rate_limited for a rate limit; not retriable for a
// used-up quota), after the deltas before it; a status that is not 2xx
// fails exactly as it does unstreamed; an event that is not a chunk, and
// a stream without choices, fail, not retriable; a stream cut before
// its end fails, retriable; one that ends after the finish reason and
// usage without [DONE] is whole.
func TestStreamFailures(t *testing.T) {
	head := chunk(`{"role":"assistant","content":"Hel"}`, "")
	for _, c := range []struct {
		name      string
		body      string
		retriable bool
		class     abi.ErrorClass
		want      string
	}{
		{"server error", head + `data: {"error":{"message":"The server had an error while processing your request.","type":"server_error"}}` + "\n\n", true, "",
			"openai: the server reported an error in the answer's stream: The server had an error while processing your request."},
		{"event: error", head + "event: error\ndata: overloaded\n\n", true, "", "in the answer's stream: overloaded"},
		{"rate limit", head + `data: {"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}` + "\n\n", true, abi.ClassRateLimited, "Rate limit reached"},
		{"quota", head + `data: {"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}` + "\n\n", false, "", "quota is used up"},
		{"not a chunk", head + "data: <html>\n\n", false, "", "is not a chat completion chunk"},
		{"no choices", `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0}}` + "\n\ndata: [DONE]\n\n", false, "", "the answer's stream has no choices"},
		{"cut", head + chunk(`{"content":"lo"}`, ""), true, "", "the answer's stream ended after"},
	} {
		h := modelcalltest.Stream([]byte(c.body))
		r := stream(h)
		if r.State != abi.StateFailed || r.Error.Retriable != c.retriable || r.Error.Class != c.class || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: %s, want failed (retriable %v, class %q) saying %q", c.name, show(r), c.retriable, c.class, c.want)
		}
		if c.name != "no choices" && h.Joined().Text == "" {
			t.Errorf("%s: the text before the failure was not emitted", c.name)
		}
	}

	// A status that is not 2xx reads as it does unstreamed.
	body := `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`
	headers := map[string]string{"Retry-After": "20", "content-type": "application/json"}
	h := &modelcalltest.Host{Status: 429, Headers: headers, Pieces: modelcalltest.Split([]byte(body), 10)}
	want := Decode(abi.HTTPResponse{Status: 429, Headers: headers, Body: body}, testNow)
	if got := stream(h); !reflect.DeepEqual(got, want) || got.Error.Class != abi.ClassRateLimited || got.Error.RetryAfterMS != 20_000 {
		t.Errorf("429: %s, want %s", show(got), show(want))
	}

	// Without [DONE], after the finish reason and the usage: whole.
	cut := strings.TrimSuffix(recorded, "data: [DONE]\n\n")
	if got, want := stream(modelcalltest.Stream([]byte(cut))), Decode(abi.HTTPResponse{Status: 200, Body: whole}, testNow); !reflect.DeepEqual(got, want) {
		t.Errorf("no [DONE]: %s, want %s", show(got), show(want))
	}
}

// TestStreamToolCallsWithoutIndex: a server that leaves out the tool
// calls' index (some OpenAI-compatible ones do) still has its calls told
// apart by their IDs.
func TestStreamToolCallsWithoutIndex(t *testing.T) {
	body := chunk(`{"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\""}}]}`, "") +
		chunk(`{"tool_calls":[{"function":{"arguments":":1}"}}]}`, "") +
		chunk(`{"tool_calls":[{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}`, "tool_calls") + "data: [DONE]\n\n"
	r := stream(modelcalltest.Stream([]byte(body)))
	want := Decode(abi.HTTPResponse{Status: 200, Body: `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[` +
		`{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}}]}`}, testNow)
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("%s\nwant %s", show(r), show(want))
	}
}

package messages

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall/modelcalltest"
	"github.com/agenthost/agenthost/plugins/abi"
)

func event(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

func textDelta(index int, text string) string {
	return event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%q}}`, index, text))
}

func inputDelta(index int, partial string) string {
	return event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"input_json_delta","partial_json":%q}}`, index, partial))
}

const messageStart = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,` +
	`"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":2}}}`

// recorded is a streamed message as the API reference shows them: a
// thinking block (skipped), a text block and two tool_use blocks whose
// input comes in pieces, pings, the stop reason and the output tokens in
// message_delta, and message_stop; whole is the same message unstreamed.
var recorded = event("message_start", messageStart) +
	event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`) +
	event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants the weather."}}`) +
	event("content_block_stop", `{"type":"content_block_stop","index":0}`) +
	event("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
	event("ping", `{"type": "ping"}`) +
	textDelta(1, "Okay, let's") + textDelta(1, " check the wéather.") +
	event("content_block_stop", `{"type":"content_block_stop","index":1}`) +
	event("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01T1","name":"get_weather","input":{}}}`) +
	inputDelta(2, "") + inputDelta(2, `{"location":`) + inputDelta(2, ` "San Francisco, CA"`) + inputDelta(2, `}`) +
	event("content_block_stop", `{"type":"content_block_stop","index":2}`) +
	event("content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_01T2","name":"get_time","input":{}}}`) +
	event("content_block_stop", `{"type":"content_block_stop","index":3}`) +
	event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`) +
	event("message_stop", `{"type":"message_stop"}`)

const whole = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[` +
	`{"type":"thinking","thinking":"The user wants the weather.","signature":"x"},` +
	`{"type":"text","text":"Okay, let's check the wéather."},` +
	`{"type":"tool_use","id":"toolu_01T1","name":"get_weather","input":{"location": "San Francisco, CA"}},` +
	`{"type":"tool_use","id":"toolu_01T2","name":"get_time","input":{}}],` +
	`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":10,"output_tokens":89}}`

// wantDeltas is what recorded's deltas add up to: the calls numbered
// among the calls (0, 1), not among the blocks (2, 3).
var wantDeltas = abi.ModelDelta{Text: "Okay, let's check the wéather.", ToolCalls: []abi.ToolCallDelta{
	{Index: 0, ID: "toolu_01T1", Name: "get_weather", Arguments: `{"location": "San Francisco, CA"}`},
	{Index: 1, ID: "toolu_01T2", Name: "get_time"},
}}

var streaming = Config{Config: modelcall.Config{Model: "m", Stream: true}}

// show is a reply as JSON, for messages.
func show(r abi.EffectReply) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func stream(h *modelcalltest.Host) abi.EffectReply {
	return Call(h, streaming, abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}}})
}

// TestStreamRepliesAsTheWholeResponseWould: the recorded stream, split
// into two reads at every byte offset, into many at random ones, and read
// a byte at a time, with LF or CRLF line breaks, replies exactly what the
// same message unstreamed decodes to; its deltas add up to the answer,
// one per read that brought any of it.
func TestStreamRepliesAsTheWholeResponseWould(t *testing.T) {
	want := Decode(abi.HTTPResponse{Status: 200, Body: whole})
	if want.State != abi.StateDone {
		t.Fatalf("the whole response: %+v", want)
	}
	modelcalltest.CheckSplits(t, recorded, 3, want, wantDeltas, stream)
}

// TestStreamRequest: streaming asks for the stream and accepts an event
// stream; stream: false does not.
func TestStreamRequest(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "hi"}}}
	r, err := HTTPRequest(streaming, req)
	if err != nil || r.Headers["accept"] != "text/event-stream" || !strings.HasSuffix(r.Body, `,"stream":true}`) {
		t.Fatalf("%+v %v", r, err)
	}
	r, _ = HTTPRequest(Config{Config: modelcall.Config{Model: "m"}}, req)
	if r.Headers["accept"] != "application/json" || strings.Contains(r.Body, "stream") {
		t.Fatalf("not streaming: %+v", r)
	}
}

// TestStreamFailures: an error event fails the attempt as an error body
// of its type does (overloaded_error and rate_limit_error rate_limited,
// api_error retriable, invalid_request_error not), after the deltas
// before it; a stop reason the whole message would fail on fails the
// same; a status that is not 2xx fails exactly as it does unstreamed; a
// stream cut before its end fails, retriable; one that ends after the
// stop reason without message_stop is whole.
func TestStreamFailures(t *testing.T) {
	head := event("message_start", messageStart) + event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) + textDelta(0, "Hel")
	errorEvent := func(typ, msg string) string {
		return event("error", fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, msg))
	}
	for _, c := range []struct {
		name      string
		body      string
		retriable bool
		class     abi.ErrorClass
		want      string
	}{
		{"overloaded", head + errorEvent("overloaded_error", "Overloaded"), true, abi.ClassRateLimited,
			"anthropic: the server reported an error in the answer's stream: overloaded_error: Overloaded"},
		{"rate limited", head + errorEvent("rate_limit_error", "Slow down"), true, abi.ClassRateLimited, "rate_limit_error: Slow down"},
		{"api error", head + errorEvent("api_error", "Internal server error"), true, "", "api_error: Internal server error"},
		{"invalid", head + errorEvent("invalid_request_error", "Bad"), false, "", "invalid_request_error: Bad"},
		{"not JSON", head + "event: content_block_delta\ndata: <html>\n\n", false, "", "is not JSON"},
		{"cut", head + textDelta(0, "lo"), true, "", "the answer's stream ended after"},
		{"refusal", head + event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":3}}`) + event("message_stop", `{"type":"message_stop"}`),
			false, "", "the model declined to answer (stop_reason refusal): Hel"},
	} {
		h := modelcalltest.Stream([]byte(c.body))
		r := stream(h)
		if r.State != abi.StateFailed || r.Error.Retriable != c.retriable || r.Error.Class != c.class || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: %s, want failed (retriable %v, class %q) saying %q", c.name, show(r), c.retriable, c.class, c.want)
		}
		if h.Joined().Text != "Hel" && h.Joined().Text != "Hello" {
			t.Errorf("%s: the text before the failure was not emitted: %+v", c.name, h.Deltas)
		}
	}

	// A status that is not 2xx reads as it does unstreamed.
	body := `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`
	headers := map[string]string{"retry-after": "7", "content-type": "application/json"}
	h := &modelcalltest.Host{Status: 529, Headers: headers, Pieces: modelcalltest.Split([]byte(body), 10)}
	want := Decode(abi.HTTPResponse{Status: 529, Headers: headers, Body: body})
	if got := stream(h); !reflect.DeepEqual(got, want) || got.Error.Class != abi.ClassRateLimited || got.Error.RetryAfterMS != 7000 {
		t.Errorf("529: %s, want %s", show(got), show(want))
	}

	// Without message_stop, after the stop reason: whole.
	cut := strings.TrimSuffix(recorded, event("message_stop", `{"type":"message_stop"}`))
	if got, want := stream(modelcalltest.Stream([]byte(cut))), Decode(abi.HTTPResponse{Status: 200, Body: whole}); !reflect.DeepEqual(got, want) {
		t.Errorf("no message_stop: %s, want %s", show(got), show(want))
	}
}

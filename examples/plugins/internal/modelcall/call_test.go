package modelcall_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall/modelcalltest"
	"github.com/agenthost/agenthost/examples/plugins/internal/sse"
	"github.com/agenthost/agenthost/plugins/abi"
)

// words is an Answer of a made-up provider: each event's data is a piece
// of text, "FIN" its finish reason, "END" the stream's end.
type words struct {
	text          strings.Builder
	over, finised bool
}

func (w *words) Event(ev sse.Event) abi.ModelDelta {
	switch ev.Data {
	case "END":
		w.over = true
	case "FIN":
		w.finised = true
	default:
		w.text.WriteString(ev.Data)
		return abi.ModelDelta{Text: ev.Data}
	}
	return abi.ModelDelta{}
}
func (w *words) Over() bool     { return w.over }
func (w *words) Finished() bool { return w.finised }
func (w *words) Reply() abi.EffectReply {
	return abi.DoneModel(abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, Content: w.text.String()}})
}

// decoded is what the made-up provider's Decode saw.
var decoded []abi.HTTPResponse

var api = modelcall.API{
	Name: "words",
	Decode: func(resp abi.HTTPResponse) abi.EffectReply {
		decoded = append(decoded, resp)
		if resp.Error != nil {
			return abi.Failed("words: "+resp.Error.Code+": "+resp.Error.Message, resp.Error.Code != abi.HTTPDenied)
		}
		return abi.Failed("words: decoded "+resp.Body, false)
	},
	NewAnswer: func() modelcall.Answer { return &words{} },
}

func call(t *testing.T, h *modelcalltest.Host) abi.EffectReply {
	t.Helper()
	decoded = nil
	return modelcall.Call(h, api, abi.HTTPRequest{Method: "POST", URL: "http://x/y"}, true)
}

func text(t *testing.T, r abi.EffectReply) string {
	t.Helper()
	var o abi.ModelOutcome
	if r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil {
		t.Fatalf("reply %+v %+v, want done", r, r.Error)
	}
	return o.Message.Content
}

// TestCallEmitsOneDeltaPerRead: the events a read brings are emitted as
// one model_delta; a read that brings none (a keep-alive, half an event)
// emits nothing; the reading stops at the stream's end, and the stream is
// closed once.
func TestCallEmitsOneDeltaPerRead(t *testing.T) {
	h := modelcalltest.Stream([]byte("data: He\n\ndata: l\n\ndata: lo\n"), []byte(": keep-alive\n"), []byte("\ndata: FIN\n\ndata: END\n\n"), []byte("data: never read\n\n"))
	if got := text(t, call(t, h)); got != "Hello" {
		t.Fatalf("text %q", got)
	}
	if want := []abi.ModelDelta{{Text: "Hel"}, {Text: "lo"}}; !reflect.DeepEqual(h.Deltas, want) {
		t.Errorf("deltas %+v, want %+v", h.Deltas, want)
	}
	if h.Reads != 3 || h.Closed != 1 || len(decoded) != 0 {
		t.Errorf("%d reads, %d closes, decoded %v", h.Reads, h.Closed, decoded)
	}
}

// TestCallEndsAStreamByItsAnswer: a body that ends cleanly after the
// finish reason is a whole answer; one that ends before it, or breaks
// (the host's close says how), fails, retriable, saying so; a body over
// the plugin's limit fails, not retriable, naming the setting to raise.
func TestCallEndsAStreamByItsAnswer(t *testing.T) {
	h := modelcalltest.Stream([]byte("data: a\n\ndata: FIN\n\n"))
	if got := text(t, call(t, h)); got != "a" {
		t.Errorf("ended after the finish reason: %q", got)
	}
	for _, c := range []struct {
		name      string
		end       *abi.HTTPError
		retriable bool
		want      string
	}{
		{"ended early", nil, true, "the answer's stream ended after 9 bytes, before the answer was complete"},
		{"broke", &abi.HTTPError{Code: abi.HTTPFailed, Message: "connection reset"}, true, "the answer's stream broke after 9 bytes, before the answer was complete: failed: connection reset"},
		{"idle", &abi.HTTPError{Code: abi.HTTPTimeout, Message: "no bytes for 30s"}, true, "timeout: no bytes for 30s"},
		{"too large", &abi.HTTPError{Code: abi.HTTPTooLarge, Message: "over 1 MiB"}, false, "raise the plugin's max_http_response_bytes"},
	} {
		h := modelcalltest.Stream([]byte("data: a\n\n"))
		h.End = abi.HTTPStreamEnd{Error: c.end}
		r := call(t, h)
		if r.State != abi.StateFailed || r.Error.Retriable != c.retriable || !strings.Contains(r.Error.Message, c.want) || !strings.HasPrefix(r.Error.Message, "words: ") {
			t.Errorf("%s: %+v %+v, want failed (retriable %v) saying %q", c.name, r, r.Error, c.retriable, c.want)
		}
		if len(h.Deltas) != 1 || h.Deltas[0].Text != "a" {
			t.Errorf("%s: deltas %+v", c.name, h.Deltas)
		}
	}
	// A break after the finish reason fails too: the usage may be missing.
	h = modelcalltest.Stream([]byte("data: a\n\ndata: FIN\n\n"))
	h.End = abi.HTTPStreamEnd{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "reset"}}
	if r := call(t, h); r.State != abi.StateFailed || !r.Error.Retriable {
		t.Errorf("broke after the finish reason: %+v", r)
	}
}

// TestCallDecodesWhatIsNotAnAnswersStream: a head with an error, a status
// that is not 2xx (its body read up to MaxErrorBody), and a 2xx body
// that is not an event stream go to the provider's Decode as a whole
// response would; without stream the call is agenthost_http's.
func TestCallDecodesWhatIsNotAnAnswersStream(t *testing.T) {
	denied := &abi.HTTPError{Code: abi.HTTPDenied, Message: "not on the allowed hosts"}
	h := &modelcalltest.Host{HeadError: denied}
	if r := call(t, h); r.Error == nil || r.Error.Message != "words: denied: not on the allowed hosts" || len(decoded) != 1 || decoded[0].Error != denied {
		t.Errorf("a head with an error: %+v, decoded %+v", r, decoded)
	}

	big := strings.Repeat("x", modelcall.MaxErrorBody)
	h = &modelcalltest.Host{Status: 429, Headers: map[string]string{"Retry-After": "20", "content-type": "application/json"},
		Pieces: [][]byte{[]byte(`{"error":`), []byte(big), []byte("never read")}}
	call(t, h)
	if len(decoded) != 1 || decoded[0].Status != 429 || decoded[0].Headers["Retry-After"] != "20" || decoded[0].Body != (`{"error":` + big)[:modelcall.MaxErrorBody] || h.Closed != 1 {
		t.Errorf("a 429: decoded %d, status %d, headers %v, body of %d bytes; %d closes", len(decoded), decoded[0].Status, decoded[0].Headers, len(decoded[0].Body), h.Closed)
	}

	h = &modelcalltest.Host{Status: 200, Headers: map[string]string{"Content-Type": "application/json"}, Pieces: [][]byte{[]byte(`{"whole":`), []byte(`true}`)}}
	if r := call(t, h); r.Error == nil || r.Error.Message != `words: decoded {"whole":true}` {
		t.Errorf("a server that does not stream: %+v", r.Error)
	}
	h.Pieces, h.End = [][]byte{[]byte(`{"whole":`)}, abi.HTTPStreamEnd{Error: &abi.HTTPError{Code: abi.HTTPTimeout, Message: "idle"}}
	if r := call(t, h); r.Error == nil || r.Error.Message != "words: timeout: idle" || !r.Error.Retriable {
		t.Errorf("a whole body that broke: %+v", r.Error)
	}

	h = &modelcalltest.Host{Whole: abi.HTTPResponse{Status: 200, Body: "buffered"}}
	decoded = nil
	if r := modelcall.Call(h, api, abi.HTTPRequest{}, false); r.Error == nil || r.Error.Message != "words: decoded buffered" || h.Opened {
		t.Errorf("without stream: %+v, opened %v", r.Error, h.Opened)
	}
}

func TestMergeJoinsPiecesOfOneCall(t *testing.T) {
	var d abi.ModelDelta
	modelcall.Merge(&d, abi.ModelDelta{Text: "a", ToolCalls: []abi.ToolCallDelta{{Index: 0, ID: "c0", Name: "f", Arguments: `{"x"`}}})
	modelcall.Merge(&d, abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: 1, ID: "c1", Name: "g"}, {Index: 0, Arguments: `:1}`}}})
	modelcall.Merge(&d, abi.ModelDelta{Text: "b"})
	want := abi.ModelDelta{Text: "ab", ToolCalls: []abi.ToolCallDelta{{Index: 0, ID: "c0", Name: "f", Arguments: `{"x":1}`}, {Index: 1, ID: "c1", Name: "g"}}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("got %+v, want %+v", d, want)
	}
}

func TestParseConfigReadsStream(t *testing.T) {
	get := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	spec := modelcall.ConfigSpec{Plugin: "p", BaseURLExample: "http://x", ModelExample: "m"}
	if c, problems := modelcall.ParseConfig(get(map[string]string{"base_url": "http://x", "model": "m"}), spec); !c.Stream || problems != nil {
		t.Errorf("by default: %+v %v", c, problems)
	}
	if c, _ := modelcall.ParseConfig(get(map[string]string{"stream": "false"}), spec); c.Stream {
		t.Errorf("stream: false streams")
	}
	_, problems := modelcall.ParseConfig(get(map[string]string{"stream": "sometimes"}), spec)
	if err := modelcall.Err("p", problems); err == nil || !strings.Contains(err.Error(), `stream "sometimes" is not true or false`) || !strings.HasPrefix(err.Error(), "p: config: ") {
		t.Errorf("a bad stream: %v", err)
	}
}

package runcodec

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestMarshalJSONWritesHTMLCharactersAsThemselves: an event whose strings
// and raw request hold <, > and & is written with each as one byte, not
// as json.Marshal's six (\u003c), and decodes to the same event as
// json.Marshal's encoding does. Raw JSON someone else escaped stays as it
// was given, and the escapes JSON requires are still written.
func TestMarshalJSONWritesHTMLCharactersAsThemselves(t *testing.T) {
	text := strings.Repeat("<a&b>", 20)
	ev := loop.Event{Type: loop.EventInputProvided, At: 1, Seq: 7, Input: text + "\"quoted\"\n\u2028",
		Request:   json.RawMessage(`{"messages": [{"role": "user", "content": "` + text + `"}], "escaped": "\u003c"}`),
		Approvals: []abi.ApprovalDecision{{ToolCallID: "call_1", Reason: text}}}
	got, err := MarshalJSON(ev)
	if err != nil {
		t.Fatalf("MarshalJSON: %v", err)
	}
	std, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(got) {
		t.Fatalf("MarshalJSON wrote invalid JSON: %s", got)
	}
	if bytes.HasSuffix(got, []byte("\n")) {
		t.Fatalf("MarshalJSON ended the value with a newline: %q", got[len(got)-10:])
	}
	for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`} {
		// The one \u003c the raw request was given stays as it was.
		want := 0
		if esc == `\u003c` {
			want = 1
		}
		if n := bytes.Count(got, []byte(esc)); n != want {
			t.Errorf("MarshalJSON wrote %s %d times, want %d: %s", esc, n, want, got)
		}
	}
	for _, kept := range []string{`\"quoted\"`, `\n`, `\u2028`, `"escaped":"\u003c"`} {
		if !bytes.Contains(got, []byte(kept)) {
			t.Errorf("MarshalJSON lost the escape %s: %s", kept, got)
		}
	}
	// Each of the 3 times 60 characters (the input, the request, the
	// reason) is 1 byte instead of 6.
	if saved := len(std) - len(got); saved != 3*60*5 {
		t.Errorf("MarshalJSON wrote %d bytes, json.Marshal %d: %d fewer, want %d", len(got), len(std), saved, 3*60*5)
	}

	var fromOurs, fromStd loop.Event
	if err := json.Unmarshal(got, &fromOurs); err != nil {
		t.Fatalf("decoding MarshalJSON's output: %v", err)
	}
	if err := json.Unmarshal(std, &fromStd); err != nil {
		t.Fatal(err)
	}
	// The raw request decodes to the same value from either, not to the
	// same bytes: json.Marshal escaped what it compacted.
	var reqOurs, reqStd any
	if err := json.Unmarshal(fromOurs.Request, &reqOurs); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(fromStd.Request, &reqStd); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reqOurs, reqStd) {
		t.Errorf("the request decodes as %v from MarshalJSON and as %v from json.Marshal", reqOurs, reqStd)
	}
	fromOurs.Request, fromStd.Request = nil, nil
	if !reflect.DeepEqual(fromOurs, fromStd) {
		t.Errorf("MarshalJSON's output decodes as %+v, json.Marshal's as %+v", fromOurs, fromStd)
	}
	ev.Request = nil
	if !reflect.DeepEqual(fromOurs, ev) {
		t.Errorf("the event does not round-trip: %+v, was %+v", fromOurs, ev)
	}

	// What json.Marshal refuses, MarshalJSON refuses.
	if _, err := MarshalJSON(map[string]any{"c": make(chan int)}); err == nil {
		t.Error("MarshalJSON encoded a channel")
	}
	if _, err := MarshalJSON(json.RawMessage(`{"unterminated": `)); err == nil {
		t.Error("MarshalJSON passed malformed raw JSON through")
	}
}

package sse

import (
	"reflect"
	"strings"
	"testing"
)

// stream has every kind of line the standard defines: comments (a
// keep-alive), event types, data over several lines, fields without a
// colon or a space, id and retry, an unknown field, an event with no
// data (not dispatched), and each kind of line break.
const stream = "\xef\xbb\xbf: keep-alive\n" +
	"event: message_start\r\n" +
	"data: {\"type\":\"message_start\"}\r\n" +
	"\r\n" +
	"data:no space\n" +
	"data:  two spaces\n" +
	"data\n" +
	"id: 7\n" +
	"retry: 1000\n" +
	"unknown: field\n" +
	"\n" +
	"event: ping\r" +
	"\r" +
	"data: after an event with no data\r\n" +
	"\n" +
	"data: [DONE]\n\n" +
	"data: an event never ended"

var want = []Event{
	{Type: "message_start", Data: `{"type":"message_start"}`},
	{Data: "no space\n two spaces\n"},
	{Data: "after an event with no data"},
	{Data: "[DONE]"},
}

func feed(pieces ...string) []Event {
	var p Parser
	var out []Event
	for _, s := range pieces {
		out = append(out, p.Feed([]byte(s))...)
	}
	return out
}

func TestParserReadsTheStandardsLines(t *testing.T) {
	if got := feed(stream); !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// TestParserTakesPiecesThatEndAnywhere: the stream split at every offset
// into two pieces, and fed a byte at a time, reads the same events,
// whether the offset falls within a line, between a CR and its LF, or
// within the byte order mark.
func TestParserTakesPiecesThatEndAnywhere(t *testing.T) {
	for i := 0; i <= len(stream); i++ {
		if got := feed(stream[:i], stream[i:]); !reflect.DeepEqual(got, want) {
			t.Fatalf("split at %d (%q | %q): got %q, want %q", i, stream[max(0, i-5):i], stream[i:min(len(stream), i+5)], got, want)
		}
	}
	bytes := strings.Split(stream, "")
	if got := feed(bytes...); !reflect.DeepEqual(got, want) {
		t.Fatalf("a byte at a time: got %q", got)
	}
}

// TestParserKeepsALoneCRBreakApartFromTheNextLine: a CR at the end of a
// piece is a line break of its own when the next piece does not start
// with LF: the next line is not lost.
func TestParserKeepsALoneCRBreakApartFromTheNextLine(t *testing.T) {
	got := feed("data: a\r", "\r", "data: b\r", "\n", "\r\n")
	if w := []Event{{Data: "a"}, {Data: "b"}}; !reflect.DeepEqual(got, w) {
		t.Fatalf("got %q, want %q", got, w)
	}
}

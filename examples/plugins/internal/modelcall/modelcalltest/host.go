// Package modelcalltest has a fake modelcall.Host for tests: it answers
// with a scripted response, whole or in the pieces a stream would read,
// and records what the call sent and emitted.
package modelcalltest

import (
	"github.com/agenthost/agenthost/plugins/abi"
)

// Host is a fake modelcall.Host. HTTP answers Whole; HTTPOpen answers a
// head of Status and Headers, or HeadError, and HTTPRead gives Pieces in
// order, then nil; HTTPClose answers End once every piece was read, and
// no error when the call closed the stream early. The zero Host answers
// 200 with an empty body.
type Host struct {
	Whole     abi.HTTPResponse
	Status    int
	Headers   map[string]string
	HeadError *abi.HTTPError
	Pieces    [][]byte
	End       abi.HTTPStreamEnd
	Now       int64 // NowMS, in Unix milliseconds

	// What the call did.
	Requests []abi.HTTPRequest // sent through HTTP or HTTPOpen
	Opened   bool              // HTTPOpen was called
	Reads    int               // HTTPRead calls that returned bytes
	Closed   int               // HTTPClose calls
	Deltas   []abi.ModelDelta  // emitted, in order
	next     int
}

// Stream is a Host that answers 200 text/event-stream with the body in
// pieces.
func Stream(pieces ...[]byte) *Host {
	return &Host{Status: 200, Headers: map[string]string{"content-type": "text/event-stream; charset=utf-8"}, Pieces: pieces}
}

// Split cuts body at the given offsets (increasing, within body) into
// pieces.
func Split(body []byte, at ...int) [][]byte {
	var out [][]byte
	from := 0
	for _, i := range at {
		out = append(out, body[from:i])
		from = i
	}
	return append(out, body[from:])
}

// HTTP records req and answers Whole.
func (h *Host) HTTP(req abi.HTTPRequest) abi.HTTPResponse {
	h.Requests = append(h.Requests, req)
	return h.Whole
}

// HTTPOpen records req and answers HeadError, or a head of Status (200
// when 0) and Headers with stream 1.
func (h *Host) HTTPOpen(req abi.HTTPRequest) abi.HTTPStreamHead {
	h.Requests = append(h.Requests, req)
	h.Opened = true
	if h.HeadError != nil {
		return abi.HTTPStreamHead{Error: h.HeadError}
	}
	status := h.Status
	if status == 0 {
		status = 200
	}
	return abi.HTTPStreamHead{Status: status, Headers: h.Headers, Stream: 1}
}

// HTTPRead returns the next piece, at most max bytes of it (max > 0): the
// rest is the next read's. Empty pieces are skipped: the host never
// returns an empty block.
func (h *Host) HTTPRead(stream int64, max int) []byte {
	if stream != 1 {
		return nil
	}
	for h.next < len(h.Pieces) && len(h.Pieces[h.next]) == 0 {
		h.next++
	}
	if h.next >= len(h.Pieces) {
		return nil
	}
	b := h.Pieces[h.next]
	if max > 0 && len(b) > max {
		h.Pieces[h.next] = b[max:]
		b = b[:max]
	} else {
		h.next++
	}
	h.Reads++
	return append([]byte(nil), b...)
}

// HTTPClose answers End when every piece was read, and no error when
// some were left: the call closed the stream early, by choice.
func (h *Host) HTTPClose(stream int64) abi.HTTPStreamEnd {
	h.Closed++
	for h.next < len(h.Pieces) && len(h.Pieces[h.next]) == 0 {
		h.next++
	}
	if h.next < len(h.Pieces) {
		return abi.HTTPStreamEnd{} // closed early, by choice
	}
	return h.End
}

// EmitDelta records d.
func (h *Host) EmitDelta(d abi.ModelDelta) { h.Deltas = append(h.Deltas, d) }

// NowMS answers Now.
func (h *Host) NowMS() int64 { return h.Now }

// Joined is the deltas joined into one: the text, and each call's
// pieces, as the host's subscribers would put them together.
func (h *Host) Joined() abi.ModelDelta {
	var all abi.ModelDelta
	for _, d := range h.Deltas {
		all.Text += d.Text
		for _, tc := range d.ToolCalls {
			found := false
			for i := range all.ToolCalls {
				if all.ToolCalls[i].Index == tc.Index {
					c := &all.ToolCalls[i]
					c.ID += tc.ID
					c.Name += tc.Name
					c.Arguments += tc.Arguments
					found = true
				}
			}
			if !found {
				all.ToolCalls = append(all.ToolCalls, tc)
			}
		}
	}
	return all
}

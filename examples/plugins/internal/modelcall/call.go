package modelcall

import (
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins/internal/sse"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Host is what a model call needs of the host: package guest's Host in a
// plugin, a fake in tests.
type Host interface {
	// HTTP is agenthost_http: the whole response at once.
	HTTP(req abi.HTTPRequest) abi.HTTPResponse
	// HTTPOpen, HTTPRead and HTTPClose are agenthost_http_open, _read
	// and _close: the response's head, then its body as it arrives (nil
	// at its end or when reading it failed), then how reading it ended.
	HTTPOpen(req abi.HTTPRequest) abi.HTTPStreamHead
	HTTPRead(stream int64, max int) []byte
	HTTPClose(stream int64) abi.HTTPStreamEnd
	// EmitDelta is agenthost_emit of a model_delta event; whether the
	// host took it changes nothing.
	EmitDelta(d abi.ModelDelta)
	// NowMS is agenthost_now_ms: the host clock, in Unix milliseconds.
	NowMS() int64
}

// API is one provider's side of a call.
type API struct {
	// Name starts the messages of the failures Call makes, such as
	// "openai".
	Name string
	// Decode is the reply for a whole response: what agenthost_http
	// answered, or, for a streamed request, a head with an error, a
	// response whose status is not 2xx with its body (at most
	// MaxErrorBody bytes of it), or a 2xx body that is not an event
	// stream (a server that does not stream), read whole.
	Decode func(resp abi.HTTPResponse) abi.EffectReply
	// NewAnswer starts reading one answer streamed as events.
	NewAnswer func() Answer
}

// Answer reads one answer streamed as Server-Sent Events.
type Answer interface {
	// Event reads the next event and returns the pieces of the answer it
	// carries (none for an event that carries none).
	Event(ev sse.Event) abi.ModelDelta
	// Over reports whether the stream has said it is over: the answer
	// is complete, or the server reported an error in the stream. No
	// more is read after.
	Over() bool
	// Finished reports whether the answer is complete though the stream
	// has not said it is over: the server sent the answer's finish
	// reason. A body that ends cleanly after it is a whole answer.
	Finished() bool
	// Reply is the effect's reply for the answer read; Call asks for it
	// when Over, or when the body ended cleanly after Finished.
	Reply() abi.EffectReply
}

// MaxErrorBody bounds how much of the body of a response whose status is
// not 2xx a streamed call reads: enough for any provider's error body.
const MaxErrorBody = 64 << 10

// Call sends req and returns the effect's reply. Without stream it sends
// it through agenthost_http and decodes the whole response. With stream
// (the request asks the provider to stream) it opens the response
// (agenthost_http_open), reads the body as it arrives and gives its
// events to a new Answer, and emits what each read brought of the answer
// as one model_delta event; the reply is the Answer's, the same a whole
// response with the same answer decodes to. A head that failed, a status
// that is not 2xx and a body that is not an event stream are decoded as
// a whole response would be. A stream that ends before the answer is
// complete fails, retriable: it broke (the host's error says how), or the
// server ended it early; a body over the plugin's response limit
// (too_large) fails, not retriable, as agenthost_http's does.
func Call(h Host, api API, req abi.HTTPRequest, stream bool) abi.EffectReply {
	if !stream {
		return api.Decode(h.HTTP(req))
	}
	head := h.HTTPOpen(req)
	if head.Error != nil {
		return api.Decode(abi.HTTPResponse{Error: head.Error})
	}
	if head.Stream == 0 {
		return api.Decode(abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: fmt.Sprintf("agenthost_http_open answered status %d with no stream to read", head.Status)}})
	}
	ok := head.Status >= 200 && head.Status <= 299
	if !ok || !IsEventStream(head.Headers) {
		limit := MaxErrorBody
		if ok {
			limit = 0 // the host bounds it, by the plugin's response limit
		}
		body, end := readBody(h, head.Stream, limit)
		if ok && end.Error != nil {
			return api.Decode(abi.HTTPResponse{Error: end.Error})
		}
		return api.Decode(abi.HTTPResponse{Status: head.Status, Headers: head.Headers, Body: string(body)})
	}
	a := api.NewAnswer()
	var p sse.Parser
	read := 0
	for !a.Over() {
		b := h.HTTPRead(head.Stream, 0)
		if b == nil {
			break
		}
		read += len(b)
		var d abi.ModelDelta
		for _, ev := range p.Feed(b) {
			Merge(&d, a.Event(ev))
			if a.Over() {
				break
			}
		}
		if !Empty(d) {
			h.EmitDelta(d)
		}
	}
	end := h.HTTPClose(head.Stream)
	switch e := end.Error; {
	case a.Over(), e == nil && a.Finished():
		return a.Reply()
	case e != nil && e.Code == abi.HTTPTooLarge:
		return abi.Failed(fmt.Sprintf("%s: the answer's stream is over the plugin's response limit after %d bytes (%s): raise the plugin's max_http_response_bytes", api.Name, read, e.Message), false)
	case e != nil:
		return abi.Failed(fmt.Sprintf("%s: the answer's stream broke after %d bytes, before the answer was complete: %s: %s", api.Name, read, e.Code, e.Message), true)
	default:
		return abi.Failed(fmt.Sprintf("%s: the answer's stream ended after %d bytes, before the answer was complete: the server or a proxy on the way cut it short", api.Name, read), true)
	}
}

// readBody reads a body to its end, or its first limit bytes (limit > 0),
// and closes its stream.
func readBody(h Host, stream int64, limit int) ([]byte, abi.HTTPStreamEnd) {
	var body []byte
	for limit <= 0 || len(body) < limit {
		b := h.HTTPRead(stream, 0)
		if b == nil {
			break
		}
		body = append(body, b...)
	}
	if limit > 0 && len(body) > limit {
		body = body[:limit]
	}
	return body, h.HTTPClose(stream)
}

// IsEventStream reports whether headers say the body is an event stream
// (content-type text/event-stream, the name in any case).
func IsEventStream(headers map[string]string) bool {
	for k, v := range headers {
		if strings.EqualFold(k, "content-type") {
			return strings.HasPrefix(strings.ToLower(strings.TrimSpace(v)), "text/event-stream")
		}
	}
	return false
}

// Merge adds the pieces of d to into: its text after into's, and each
// tool call's piece to the piece of the same call in into (its ID and
// name if into has none, its arguments after into's), or as a new piece.
func Merge(into *abi.ModelDelta, d abi.ModelDelta) {
	into.Text += d.Text
	for _, tc := range d.ToolCalls {
		i := -1
		for j := range into.ToolCalls {
			if into.ToolCalls[j].Index == tc.Index {
				i = j
				break
			}
		}
		if i < 0 {
			into.ToolCalls = append(into.ToolCalls, tc)
			continue
		}
		have := &into.ToolCalls[i]
		if have.ID == "" {
			have.ID = tc.ID
		}
		if have.Name == "" {
			have.Name = tc.Name
		}
		have.Arguments += tc.Arguments
	}
}

// Empty reports whether d carries nothing: no text, no tool call piece.
func Empty(d abi.ModelDelta) bool { return d.Text == "" && len(d.ToolCalls) == 0 }

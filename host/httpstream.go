package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
)

// agenthost_http_open, agenthost_http_read and agenthost_http_close: a
// response body read as it arrives (docs/ABI.md, "agenthost_http_open,
// _read, _close"). The request goes through the gate as agenthost_http's
// does (httpGate.send): the same allow-list, address checks, redirects,
// header limit and answers. A stream belongs to the call that opened it:
// it lives in the call's scope, under a number only that call knows, and
// the call's end closes every stream it left open ((*Plugin).run, on both
// call paths), so that no connection outlives its call.
//
// A stream's request runs under a context of its own, which no host
// function's end cancels; the waits of the call (for the head, and each
// read's for its next bytes) are bounded by linking that context, for
// the wait's length only, to the host function's context (the call's
// deadline and its caller) and to a timer of the request's timeout_ms.
// Whichever ends first cancels the request, which breaks the wait off and
// closes the connection. Between the waits nothing of the host's runs for
// a stream: it starts no goroutine and keeps no timer.

const (
	// maxHTTPStreams bounds the streams one call holds at once.
	maxHTTPStreams = 4
	// httpChunkCap bounds the bytes one agenthost_http_read returns.
	httpChunkCap = 64 << 10
)

// httpStream is one response body a call reads as it arrives.
type httpStream struct {
	gate *httpGate
	body io.ReadCloser
	dest string
	// idle bounds each read's wait for the body's next bytes: the
	// request's timeout.
	idle time.Duration
	// ctx is the request's; cancel ends it, with the cause
	// context.DeadlineExceeded when a wait ran out of time.
	ctx    context.Context
	cancel context.CancelCauseFunc
	read   int64 // body bytes read so far
	// end is set once the body is done with: read to its end (no error),
	// failed, or released.
	end *abi.HTTPStreamEnd
}

// openStream sends req and, once the response's head has come, returns
// it with the stream to read its body from.
func (g *httpGate) openStream(ctx context.Context, s *callScope, req abi.HTTPRequest) (abi.HTTPStreamHead, *httpStream) {
	if n := s.openStreams(); n >= maxHTTPStreams {
		return abi.HTTPStreamHead{Error: httpFailure(abi.HTTPTooLarge, fmt.Sprintf(
			"the call holds %d streams, the most one call may hold open at once: close one with agenthost_http_close first", n))}, nil
	}
	timeout := g.requestTimeout(req)
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	st := &httpStream{gate: g, idle: timeout, ctx: sctx, cancel: cancel}
	release := st.bound(ctx, timeout)
	resp, dest, failure := g.send(sctx, s, req, timeout)
	release()
	if failure != nil {
		cancel(nil)
		return abi.HTTPStreamHead{Error: failure}, nil
	}
	st.body, st.dest = resp.Body, dest
	return abi.HTTPStreamHead{Status: resp.StatusCode, Headers: responseHeaders(resp)}, st
}

// bound ends the stream's request when ctx ends or after d, whichever
// comes first, until the returned release is called.
func (st *httpStream) bound(ctx context.Context, d time.Duration) (release func()) {
	timer := time.AfterFunc(d, func() { st.cancel(context.DeadlineExceeded) })
	stop := context.AfterFunc(ctx, func() { st.cancel(ctx.Err()) })
	return func() {
		timer.Stop()
		stop()
	}
}

// next waits, within ctx and the stream's idle bound, for the body's
// next bytes and returns 1 to limit of them (the chunk cap when limit is
// out of range); nil at the end of the body or once reading it failed.
func (st *httpStream) next(ctx context.Context, s *callScope, limit int64) []byte {
	if st.end != nil {
		return nil
	}
	if limit <= 0 || limit > httpChunkCap {
		limit = httpChunkCap
	}
	// One byte past the body's limit is enough to know it is over.
	buf := make([]byte, min(limit, st.gate.maxBytes-st.read+1))
	release := st.bound(ctx, st.idle)
	n, err := readSome(st.body, buf)
	release()
	st.read += int64(n)
	switch {
	case st.read > st.gate.maxBytes:
		st.finish(st.gate.bodyTooLarge())
		return nil
	case errors.Is(err, io.EOF):
		st.finish(nil)
	case err != nil:
		st.finish(st.gate.bodyFailure(st.ctx, s, st.dest, err, fmt.Sprintf("no more of the response body within %s", st.idle)))
	}
	if n == 0 {
		return nil
	}
	return buf[:n]
}

// readSome reads into buf until it has at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// finish ends the stream's body with failure (nil: read to its end, or
// released) and lets its connection go: back to the pool after a body
// read to its end, closed otherwise.
func (st *httpStream) finish(failure *abi.HTTPError) {
	if st.end != nil {
		return
	}
	st.end = &abi.HTTPStreamEnd{Error: failure}
	st.body.Close()
	st.cancel(nil)
}

// openStreams is the number of streams the call holds.
func (s *callScope) openStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// addStream gives st the call's next stream number; 0 once the call has
// ended, when st is closed at once.
func (s *callScope) addStream(st *httpStream) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streamsClosed {
		st.finish(nil)
		return 0
	}
	if s.streams == nil {
		s.streams = map[int64]*httpStream{}
	}
	s.lastStream++
	s.streams[s.lastStream] = st
	return s.lastStream
}

// stream is the call's stream number id, or nil.
func (s *callScope) stream(id int64) *httpStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

// removeStream takes stream id from the call, or nil when it holds none
// of that number.
func (s *callScope) removeStream(id int64) *httpStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	delete(s.streams, id)
	return st
}

// closeStreams closes every stream the call left open; it runs when the
// call ends, and no stream opens after it.
func (s *callScope) closeStreams() {
	s.mu.Lock()
	streams := s.streams
	s.streams, s.streamsClosed = nil, true
	s.mu.Unlock()
	for _, st := range streams {
		st.finish(nil)
	}
}

// httpOpen is agenthost_http_open: (request) -> the response's head.
func (h *Host) httpOpen(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	req, failure := readHTTPRequest(s, m, stack[0])
	head := abi.HTTPStreamHead{Error: failure}
	if failure == nil {
		var st *httpStream
		head, st = s.plugin.http.openStream(ctx, s, req)
		if st != nil {
			if head.Stream = s.addStream(st); head.Stream == 0 {
				head = abi.HTTPStreamHead{Error: httpFailure(abi.HTTPFailed, "the call has ended")}
			}
		}
	}
	stack[0] = writeJSON(m, head)
}

// httpRead is agenthost_http_read: (stream, max) -> a block of the next
// body bytes, or 0 at the end, after a failure, or for a stream the call
// does not hold.
func (h *Host) httpRead(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	id, limit := int64(stack[0]), int64(stack[1])
	stack[0] = 0
	if s == nil {
		return
	}
	st := s.stream(id)
	if st == nil {
		return
	}
	b := st.next(ctx, s, limit)
	if len(b) == 0 {
		return
	}
	off, ok := writeResult(m, b)
	if !ok {
		st.finish(httpFailure(abi.HTTPFailed, fmt.Sprintf("no room in the plugin's memory for %d bytes of the response body", len(b))))
		return
	}
	stack[0] = off
}

// httpClose is agenthost_http_close: (stream) -> how reading the body
// ended.
func (h *Host) httpClose(_ context.Context, s *callScope, m guestMemory, stack []uint64) {
	id := int64(stack[0])
	var st *httpStream
	if s != nil {
		st = s.removeStream(id)
	}
	if st == nil {
		stack[0] = writeJSON(m, abi.HTTPStreamEnd{Error: httpFailure(abi.HTTPFailed, fmt.Sprintf("the call holds no stream %d", id))})
		return
	}
	st.finish(nil) // closed early by choice, unless it had ended already
	stack[0] = writeJSON(m, *st.end)
}

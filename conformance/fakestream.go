package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"unicode/utf8"
)

// StreamHold holds a fake provider's streamed answer open after some of
// its deltas (FakeAnthropic.Hold, FakeOpenAI.Hold): the events so far
// are sent and flushed, the connection stays open, and the rest waits
// for Release, or for the client to go away.
type StreamHold struct {
	after            int
	reached, release chan struct{}
	reachOnce, once  sync.Once
}

func newStreamHold(after int) *StreamHold {
	return &StreamHold{after: after, reached: make(chan struct{}), release: make(chan struct{})}
}

// Reached is closed when the held answer has sent its deltas up to the
// hold and waits.
func (h *StreamHold) Reached() <-chan struct{} { return h.reached }

// Release lets the held answer go on; it may be called more than once,
// and before the hold is reached (the answer then does not stop).
func (h *StreamHold) Release() { h.once.Do(func() { close(h.release) }) }

// StreamCut is how a fake provider cuts a streamed answer short
// (FakeAnthropic.CutNext, FakeOpenAI.CutNext).
type StreamCut int

const (
	// CutConnection drops the connection in the middle of the body, as
	// a network failure or a crashed server does: the client's read
	// fails.
	CutConnection StreamCut = iota + 1
	// CutBody ends the body properly where it is, without the stream's
	// end ([DONE], message_stop): the client reads to a clean end of an
	// answer that is not complete, as from a proxy that gave up.
	CutBody
)

// streamCut is a cut queued for the next streamed answer.
type streamCut struct {
	after int
	how   StreamCut
}

// fakeStreams are the streaming hooks a fake provider shares with its
// streamed answers: the holds and cuts queued for the next ones.
type fakeStreams struct {
	mu    sync.Mutex
	holds []*StreamHold
	cuts  []streamCut
	all   []*StreamHold
}

// hold queues a hold after n deltas for the next streamed answer.
func (s *fakeStreams) hold(n int) *StreamHold {
	h := newStreamHold(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds = append(s.holds, h)
	s.all = append(s.all, h)
	return h
}

// cut queues a cut after n deltas for the next streamed answer.
func (s *fakeStreams) cut(n int, how StreamCut) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cuts = append(s.cuts, streamCut{after: n, how: how})
}

// releaseAll lets every held answer go on: the fake's cleanup, so that
// its server can shut down.
func (s *fakeStreams) releaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.all {
		h.Release()
	}
}

// start begins a streamed answer on w: the text/event-stream head, and
// the hold and cut queued for it, if any.
func (s *fakeStreams) start(ctx context.Context, w http.ResponseWriter) *sseWriter {
	s.mu.Lock()
	sw := &sseWriter{ctx: ctx, w: w}
	if len(s.holds) > 0 {
		sw.hold, s.holds = s.holds[0], s.holds[1:]
	}
	if len(s.cuts) > 0 {
		sw.cut, s.cuts = &s.cuts[0], s.cuts[1:]
	}
	s.mu.Unlock()
	sw.f, _ = w.(http.Flusher)
	w.Header().Set("content-type", "text/event-stream; charset=utf-8")
	w.Header().Set("cache-control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return sw
}

// sseWriter writes one streamed answer, an event at a time, each flushed
// at once, and applies its hold and cut after the deltas they name.
type sseWriter struct {
	ctx    context.Context
	w      http.ResponseWriter
	f      http.Flusher
	hold   *StreamHold
	cut    *streamCut
	deltas int
	ended  bool // cut short (CutBody) or the client went away: write nothing more
}

// event writes an event of type typ ("": none, as OpenAI's chunks have
// none) with data encoded as JSON (a string is sent as it is), and flushes
// it.
func (s *sseWriter) event(typ string, data any) {
	if s.ended {
		return
	}
	var b []byte
	if str, ok := data.(string); ok {
		b = []byte(str)
	} else {
		b, _ = json.Marshal(data)
	}
	if typ != "" {
		_, _ = s.w.Write([]byte("event: " + typ + "\n"))
	}
	_, _ = s.w.Write(append(append([]byte("data: "), b...), "\n\n"...))
	if s.f != nil {
		s.f.Flush()
	}
}

// delta writes an event that carries a piece of the answer, then applies
// the hold and the cut that come after it. It reports whether the answer
// goes on.
func (s *sseWriter) delta(typ string, data any) bool {
	if s.ended {
		return false
	}
	s.event(typ, data)
	s.deltas++
	return s.checkpoint(false)
}

// begun is called after the events that open the stream, before its
// first delta: a hold or a cut after 0 deltas applies here. It reports
// whether the answer goes on.
func (s *sseWriter) begun() bool { return s.checkpoint(false) }

// end is called before the events that end the stream: a hold or a cut
// after more deltas than the answer has applies here. It reports whether
// the answer goes on.
func (s *sseWriter) end() bool { return s.checkpoint(true) }

func (s *sseWriter) checkpoint(last bool) bool {
	if s.ended {
		return false
	}
	if h := s.hold; h != nil && (s.deltas >= h.after || last) {
		s.hold = nil
		h.reachOnce.Do(func() { close(h.reached) })
		select {
		case <-h.release:
		case <-s.ctx.Done():
			s.ended = true
			return false
		}
	}
	if c := s.cut; c != nil && (s.deltas >= c.after || last) {
		s.cut = nil
		if c.how == CutConnection {
			// The server drops the connection: net/http closes it without
			// the chunked body's end, and logs nothing.
			panic(http.ErrAbortHandler)
		}
		s.ended = true
		return false
	}
	return true
}

// pieces splits s into pieces of at most n runes: how the fakes chunk an
// answer's text and a call's arguments into several deltas.
func pieces(s string, n int) []string {
	var out []string
	for s != "" {
		i, runes := 0, 0
		for i < len(s) && runes < n {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			runes++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// fakeDeltaRunes is the size of the pieces the fakes stream, in runes.
const fakeDeltaRunes = 4

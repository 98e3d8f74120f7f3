package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/runtime"
)

// ProgressJSON is the data of a "progress" event: a plugin's emit. It is
// not durable and has no event ID.
type ProgressJSON struct {
	Effect  string          `json:"effect,omitempty"`
	Plugin  string          `json:"plugin,omitempty"`
	Type    string          `json:"type"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// streamEvents serves a Run's committed events as Server-Sent Events:
//
//	id: <seq>
//	event: <event type>
//	data: <the event as JSON>
//
// from the event after Last-Event-ID (or ?after=), in order, until the
// Run's terminal event. Plugin emits come as "event: progress" without an
// id; a comment line every Heartbeat keeps idle connections open.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, tenant string) error {
	after, err := resumePoint(r)
	if err != nil {
		return err
	}
	run, err := s.loadRun(r, tenant)
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	// An event stream outlives any write timeout the http.Server has.
	if err := rc.SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.drain, cancel)
	defer stop()

	sw := &sseWriter{w: w, rc: rc}
	if err := sw.send(func(b *bytes.Buffer) { b.WriteString("retry: 2000\n\n") }); err != nil {
		return nil
	}
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		t := time.NewTicker(s.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if sw.send(func(b *bytes.Buffer) { b.WriteString(": heartbeat\n\n") }) != nil {
					cancel()
					return
				}
			}
		}
	}()
	defer beats.Wait()
	defer cancel()

	err = s.cfg.Runtime.Follow(ctx, tenant, run.ID, after+1, func(it runtime.StreamItem) error {
		switch {
		case it.Event != nil:
			data, err := json.Marshal(it.Event)
			if err != nil {
				return fmt.Errorf("httpapi: encode event %d of run %s: %w", it.Event.Seq, run.ID, err)
			}
			return sw.send(func(b *bytes.Buffer) {
				fmt.Fprintf(b, "id: %d\nevent: %s\n", it.Event.Seq, it.Event.Type)
				writeData(b, data)
			})
		case it.Emit != nil:
			data, err := json.Marshal(ProgressJSON{Effect: it.EffectID, Plugin: it.Plugin, Type: it.Emit.Type,
				Message: it.Emit.Message, Data: it.Emit.Data})
			if err != nil {
				// A plugin's emit data that cannot be re-encoded is dropped;
				// emits are not durable.
				s.log.Debug("progress event dropped", "run", run.ID, "err", err)
				return nil
			}
			return sw.send(func(b *bytes.Buffer) {
				b.WriteString("event: progress\n")
				writeData(b, data)
			})
		}
		return nil
	})
	switch {
	case err == nil, ctx.Err() != nil, errors.Is(err, errClientGone):
		// Ended at the terminal event, or the client or the server left.
	default:
		// The status line is sent: the stream can only end. The client
		// resumes from its Last-Event-ID.
		s.log.Warn("event stream ended early", "tenant", tenant, "run", run.ID, "err", err)
	}
	return nil
}

// resumePoint reads where a stream resumes: after Last-Event-ID, or after
// ?after=, or from the start.
func resumePoint(r *http.Request) (int64, error) {
	if v := strings.TrimSpace(r.Header.Get("Last-Event-ID")); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, badRequest("the Last-Event-ID header is %q; it must be the id of an event of this stream (a whole number)", truncate(v, 40))
		}
		return n, nil
	}
	return queryInt(r, "after", 0, 0, 1<<62)
}

var errClientGone = errors.New("httpapi: the client left the event stream")

// sseWriter serializes the writes of the event loop and the heartbeat and
// flushes each one.
type sseWriter struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer
}

func (s *sseWriter) send(fill func(*bytes.Buffer)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	fill(&s.buf)
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		return errClientGone
	}
	if err := s.rc.Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// writeData writes a data field; JSON from encoding/json has no newline,
// but split on them anyway so that no payload can end the event early.
func writeData(b *bytes.Buffer, data []byte) {
	for _, line := range bytes.Split(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
}

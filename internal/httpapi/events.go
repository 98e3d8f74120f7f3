package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
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

// ModelDeltaJSON is the data of a "model_delta" event: a piece of a
// model's answer as it streams in, from the call of attempt Attempt of
// effect Effect. It is not durable and has no event ID; Seq numbers the
// call's deltas from 1, so a gap says one was dropped (for a client that
// read too slowly). The committed model reply, in effect_settled, is the
// answer; the text of one attempt's deltas, concatenated, is its text.
type ModelDeltaJSON struct {
	Effect    string              `json:"effect"`
	Plugin    string              `json:"plugin,omitempty"`
	Attempt   int                 `json:"attempt"`
	Seq       int64               `json:"seq"`
	Text      string              `json:"text,omitempty"`
	ToolCalls []abi.ToolCallDelta `json:"tool_calls,omitempty"`
}

// The event streams' limits. Config will carry them (MaxStreamsPerTenant
// and StreamWriteTimeout); until it does, these are in force.
const (
	// DefaultMaxStreamsPerTenant bounds the event streams one tenant may
	// have open on this server at once; past it: 429 too_many_streams.
	DefaultMaxStreamsPerTenant = 256
	// DefaultStreamWriteTimeout bounds each send of an event stream (an
	// event, an emit, a heartbeat); a client that takes none of it for
	// that long is dropped.
	DefaultStreamWriteTimeout = 10 * time.Second
)

// CodeTooManyStreams answers a stream past the tenant's stream limit
// (429, with Retry-After).
const CodeTooManyStreams = "too_many_streams"

// The event streams' limits as OnLimit names them: a stream refused for
// the tenant's stream limit, and one dropped because its client took
// nothing for the write timeout.
const (
	LimitStreams            = "max_streams_per_tenant"
	LimitStreamWriteTimeout = "stream_write_timeout"
)

// maxResumeID bounds Last-Event-ID and ?after=: no log is that long, and
// one past it still fits an int64.
const maxResumeID = 1 << 62

// streamEvents serves a Run's committed events as Server-Sent Events:
//
//	id: <seq>
//	event: <event type>
//	data: <the event as JSON>
//
// from the event after Last-Event-ID (or ?after=), in order, until the
// Run's terminal event. Plugin emits come as "event: progress" without an
// id, and what the Run waits for, when it begins to wait for a person, as
// "event: run_waiting" without an id (waitwatch.go); a comment line every
// Heartbeat keeps idle connections open.
//
// The stream holds no goroutine of its own: the handler's one loop waits
// for the Run's follower (whose tail reads the Run's new events once for
// all its streams) and the heartbeat. It lifts the http.Server's read and
// write deadlines for itself and gives each send its own write deadline:
// a client that takes nothing for that long is dropped. A tenant may have
// Config.MaxStreamsPerTenant streams open at once.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, tenant string) error {
	after, err := resumePoint(r)
	if err != nil {
		return err
	}
	run, err := s.loadRun(r, tenant)
	if err != nil {
		return err
	}
	limit := s.maxStreamsPerTenant()
	f, err := s.cfg.Runtime.NewFollower(tenant, run.ID, after+1, runtime.FollowOptions{MaxPerTenant: limit})
	if errors.Is(err, runtime.ErrTooManyFollowers) {
		s.cfg.OnLimit(LimitStreams, tenant)
		e := errorf(http.StatusTooManyRequests, CodeTooManyStreams,
			"too many event streams: this tenant has %d event streams open on this server, its limit; close one, or retry after the Retry-After delay (the operator sets the limit with http.max_streams_per_tenant)",
			limit)
		e.RetryAfter = s.cfg.RetryAfter
		return e
	}
	if err != nil {
		return err
	}
	dropped := false
	defer func() {
		if dropped {
			f.Drop()
		} else {
			f.Close()
		}
	}()

	rc := http.NewResponseController(w)
	// An event stream outlives the http.Server's read and write timeouts;
	// each send has a deadline of its own instead.
	for _, lift := range []func(time.Time) error{rc.SetReadDeadline, rc.SetWriteDeadline} {
		if err := lift(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
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

	sw := &sseWriter{w: w, rc: rc, timeout: s.streamWriteTimeout()}
	// What net/http writes after the handler (the end of the chunked
	// body) has a deadline too; it clears the deadline once the answer is
	// written, before the connection serves another request.
	defer func() { _ = sw.extendDeadline() }()
	ww := s.newWaitWatch(tenant, run, after)
	defer ww.closeChildren()
	err = s.pump(ctx, sw, f, run.ID, ww)
	switch {
	case errors.Is(err, errWriteTimeout):
		dropped = true
		s.cfg.OnLimit(LimitStreamWriteTimeout, tenant)
		s.log.Warn("event stream dropped: the client took nothing for the stream write timeout; it may resume with Last-Event-ID",
			"tenant", tenant, "run", run.ID, "write_timeout", sw.timeout)
	case err == nil, ctx.Err() != nil, errors.Is(err, errClientGone):
		// Ended at the terminal event, or the client or the server left.
	default:
		// The status line is sent: the stream can only end. The client
		// resumes from its Last-Event-ID.
		s.log.Warn("event stream ended early", "tenant", tenant, "run", run.ID, "err", err)
	}
	return nil
}

// pump sends the follower's items, the run_waiting events ww owes, and
// the heartbeats until the Run's terminal event is sent (nil), ctx ends,
// or a send or a read fails.
func (s *Server) pump(ctx context.Context, sw *sseWriter, f *runtime.Follower, runID string, ww *waitWatch) error {
	if err := sw.send(func(b *bytes.Buffer) { b.WriteString("retry: 2000\n\n") }); err != nil {
		return err
	}
	if err := ww.start(ctx, sw); err != nil {
		return err
	}
	beat := time.NewTicker(s.cfg.Heartbeat)
	defer beat.Stop()
	for {
		items, done, err := f.Next(ctx)
		for _, it := range items {
			if err := s.sendItem(sw, it, runID); err != nil {
				return err
			}
			if it.Event != nil {
				if err := ww.rootEvent(ctx, sw, *it.Event); err != nil {
					return err
				}
			}
		}
		if err != nil || done {
			return err
		}
		if err := ww.pollChildren(ctx, sw); err != nil {
			return err
		}
		// Wait for the Run's follower, a followed child's, or the
		// heartbeat.
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(f.Ready())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(beat.C)},
		}
		for _, c := range ww.ready() {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
		}
		switch i, _, _ := reflect.Select(cases); i {
		case 0:
			return ctx.Err()
		case 2:
			if err := sw.send(func(b *bytes.Buffer) { b.WriteString(": heartbeat\n\n") }); err != nil {
				return err
			}
		}
	}
}

// sendItem sends one event or emit.
func (s *Server) sendItem(sw *sseWriter, it runtime.StreamItem, runID string) error {
	switch {
	case it.Event != nil:
		data, err := json.Marshal(it.Event)
		if err != nil {
			return fmt.Errorf("httpapi: encode event %d of run %s: %w", it.Event.Seq, runID, err)
		}
		// Raw JSON in an event (metadata stored before bodies were
		// checked, a model's tool arguments) is copied as it is: keep
		// the stream valid UTF-8, as GET /v1/runs/{id} does.
		data = validUTF8(data)
		return sw.send(func(b *bytes.Buffer) {
			fmt.Fprintf(b, "id: %d\nevent: %s\n", it.Event.Seq, it.Event.Type)
			writeData(b, data)
		})
	case it.Emit != nil && it.Emit.Type == abi.EmitModelDelta:
		if it.Emit.Delta == nil {
			return nil
		}
		data, err := json.Marshal(ModelDeltaJSON{Effect: it.EffectID, Plugin: it.Plugin, Attempt: it.Attempt, Seq: it.DeltaSeq,
			Text: it.Emit.Delta.Text, ToolCalls: it.Emit.Delta.ToolCalls})
		if err != nil {
			return fmt.Errorf("httpapi: encode a model delta of run %s: %w", runID, err)
		}
		data = validUTF8(data)
		return sw.send(func(b *bytes.Buffer) {
			b.WriteString("event: " + abi.EmitModelDelta + "\n")
			writeData(b, data)
		})
	case it.Emit != nil:
		data, err := json.Marshal(ProgressJSON{Effect: it.EffectID, Plugin: it.Plugin, Type: it.Emit.Type,
			Message: it.Emit.Message, Data: it.Emit.Data})
		if err != nil {
			// A plugin's emit data that cannot be re-encoded is dropped;
			// emits are not durable.
			s.log.Debug("progress event dropped", "run", runID, "err", err)
			return nil
		}
		data = validUTF8(data)
		return sw.send(func(b *bytes.Buffer) {
			b.WriteString("event: progress\n")
			writeData(b, data)
		})
	}
	return nil
}

// maxStreamsPerTenant is the tenant's stream limit in force.
// A negative Config.MaxStreamsPerTenant is no limit: 0 for FollowOptions.
func (s *Server) maxStreamsPerTenant() int { return max(s.cfg.MaxStreamsPerTenant, 0) }

// streamWriteTimeout is the write deadline of each send of a stream.
func (s *Server) streamWriteTimeout() time.Duration { return s.cfg.StreamWriteTimeout }

// resumePoint reads where a stream resumes: after Last-Event-ID, or after
// ?after=, or from the start.
func resumePoint(r *http.Request) (int64, error) {
	if v := strings.TrimSpace(r.Header.Get("Last-Event-ID")); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxResumeID {
			return 0, badRequest("the Last-Event-ID header is %q; it must be the id of an event of this stream (a whole number from 0 to %d)", truncate(v, 40), int64(maxResumeID))
		}
		return n, nil
	}
	return queryInt(r, "after", 0, 0, maxResumeID)
}

var (
	errClientGone   = errors.New("httpapi: the client left the event stream")
	errWriteTimeout = errors.New("httpapi: the client of the event stream took nothing for the write timeout")
)

// sseWriter writes the sends of one event stream, each flushed at once and
// under a write deadline of its own. One goroutine uses it.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	buf     bytes.Buffer
}

// send writes what fill writes, and flushes it, within the write timeout.
func (s *sseWriter) send(fill func(*bytes.Buffer)) error {
	s.buf.Reset()
	fill(&s.buf)
	if err := s.extendDeadline(); err != nil {
		return errClientGone
	}
	_, err := s.w.Write(s.buf.Bytes())
	if err == nil {
		err = s.rc.Flush()
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errWriteTimeout
	default:
		return errClientGone
	}
}

// sendJSON sends an event that is not in the Run's log (no id): its
// type, and v as its data.
func (s *sseWriter) sendJSON(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("httpapi: encode a %s event: %w", event, err)
	}
	// Raw JSON of the Run (a model's tool arguments) is copied as it is:
	// keep the stream valid UTF-8.
	data = validUTF8(data)
	return s.send(func(b *bytes.Buffer) {
		b.WriteString("event: " + event + "\n")
		writeData(b, data)
	})
}

// extendDeadline sets the connection's write deadline a write timeout
// from now.
func (s *sseWriter) extendDeadline() error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
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

package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The tests of agenthost_http_open, _read and _close, through the hostile
// plugin's http_stream tool (conformance/plugins/hostile), on both call
// paths, against a real server on 127.0.0.1.

// streamFixture is the server the streams read from.
type streamFixture struct {
	srv  *httptest.Server
	port string
	// gone receives once for every request to /hold or /no-head whose
	// context ended: its connection was closed.
	gone chan struct{}
}

// streamWait bounds every wait of these tests for something the host
// must do: far longer than it takes, so only a broken host reaches it.
const streamWait = 20 * time.Second

func newStreamFixture(t *testing.T, sink *recordSink) *streamFixture {
	f := &streamFixture{gone: make(chan struct{}, 16)}
	flush := func(w http.ResponseWriter) { w.(http.Flusher).Flush() }
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	// The first chunk, then the second only once the plugin has said
	// (agenthost_emit) that it read the first: a host that buffered the
	// body would never let it.
	mux.HandleFunc("/two-chunks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/event-stream")
		io.WriteString(w, "chunk-1")
		flush(w)
		ctx, cancel := context.WithTimeout(r.Context(), streamWait)
		defer cancel()
		if !awaitRead(ctx, sink, "chunk-1") {
			t.Errorf("/two-chunks: the plugin did not read the first chunk while the response was open (it read %q)", readSoFar(sink))
			return
		}
		io.WriteString(w, "chunk-2")
	})
	// One chunk, then nothing until the client goes away.
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first")
		flush(w)
		<-r.Context().Done()
		f.closed()
	})
	// No head until the client goes away.
	mux.HandleFunc("/no-head", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		f.closed()
	})
	// Answers once a held request's connection has been closed.
	mux.HandleFunc("/after-gone", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-f.gone:
			io.WriteString(w, "gone")
		case <-r.Context().Done():
		}
	})
	// n bytes, in pieces of 1000.
	mux.HandleFunc("/sized", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		for n > 0 {
			k := min(n, 1000)
			w.Write([]byte(strings.Repeat("x", k)))
			flush(w)
			n -= k
		}
	})
	mux.HandleFunc("/on-fire", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "the server is on fire")
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://localhost:"+f.port+"/hello", http.StatusFound)
	})
	mux.HandleFunc("/big-headers", func(w http.ResponseWriter, r *http.Request) {
		for i := range 100 { // 100 KiB of headers
			w.Header().Set(fmt.Sprintf("X-Filler-%d", i), strings.Repeat("h", 1<<10))
		}
	})
	f.srv = httptest.NewServer(mux)
	// A connection a broken host left open would hold Close for ever.
	t.Cleanup(func() {
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	_, f.port, _ = net.SplitHostPort(f.srv.Listener.Addr().String())
	return f
}

// closed records a held request's end.
func (f *streamFixture) closed() {
	select {
	case f.gone <- struct{}{}:
	default: // more than a test waits for
	}
}

func (f *streamFixture) url(path string) string { return "http://127.0.0.1:" + f.port + path }

// waitGone waits for a held request's connection to be closed.
func (f *streamFixture) waitGone(t *testing.T, what string) {
	t.Helper()
	select {
	case <-f.gone:
	case <-time.After(streamWait):
		t.Fatalf("%s: the server's request is still open %s later: the connection was not closed", what, streamWait)
	}
}

// readSoFar is what the plugin said it read: its "read: " progress
// events, joined.
func readSoFar(sink *recordSink) string {
	var b strings.Builder
	for _, e := range sink.all() {
		if s, ok := strings.CutPrefix(e.ev.Message, "read: "); ok {
			b.WriteString(s)
		}
	}
	return b.String()
}

// awaitRead waits until the plugin said it read want, or ctx ends.
func awaitRead(ctx context.Context, sink *recordSink, want string) bool {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for readSoFar(sink) != want {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// streamResult is the http_stream tool's content.
type streamResult struct {
	Heads  []abi.HTTPStreamHead `json:"heads"`
	Chunks []string             `json:"chunks"`
	End    *abi.HTTPStreamEnd   `json:"end"`
	Then   string               `json:"then"`
}

func (r streamResult) body() string { return strings.Join(r.Chunks, "") }

// endError is the close's error code and message, "" for none.
func (r streamResult) endError() string {
	if r.End == nil || r.End.Error == nil {
		return ""
	}
	return r.End.Error.Code + ": " + r.End.Error.Message
}

// streamDone runs the http_stream tool with args and decodes its done
// reply.
func streamDone(t *testing.T, x *Executor, effect string, args map[string]any) streamResult {
	t.Helper()
	content := doneIn(t)(x.Start(context.Background(), toolCall("acme", effect, 1, "http_stream", args)))
	var r streamResult
	if err := json.Unmarshal([]byte(content), &r); err != nil {
		t.Fatalf("http_stream's content %q: %v", content, err)
	}
	return r
}

// streamExecutor loads the hostile plugin on path, allowed the fixture.
func streamExecutor(t *testing.T, path CallPath, f func(*env) *streamFixture, mod func(*PluginSpec)) (*Executor, *streamFixture, *env) {
	e := newEnv(t, Config{CallPath: path})
	web := f(e)
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port}
		if mod != nil {
			mod(s)
		}
	})
	return x, web, e
}

func fixtureFor(t *testing.T) func(*env) *streamFixture {
	return func(e *env) *streamFixture { return newStreamFixture(t, e.sink) }
}

// The plugin reads the first chunk while the server still holds the
// response open, and the rest when it comes.
func TestHTTPStreamReadsTheBodyAsItArrives(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), nil)
			r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url("/two-chunks"), "emit": true})
			if len(r.Heads) != 1 || r.Heads[0].Status != 200 || r.Heads[0].Stream != 1 || r.Heads[0].Headers["Content-Type"] != "text/event-stream" {
				t.Errorf("the head: %+v", r.Heads)
			}
			if r.body() != "chunk-1chunk-2" || len(r.Chunks) < 2 || r.Chunks[0] != "chunk-1" {
				t.Errorf("read %q, want chunk-1, then chunk-2", r.Chunks)
			}
			if r.End == nil || r.End.Error != nil {
				t.Errorf("close: %+v, want {}", r.End)
			}
		})
	}
}

// What the buffered call refuses, the stream refuses the same way: a
// host off the list (on the URL and on a redirect), headers over the
// limit; and a head that does not come in timeout_ms times out.
func TestHTTPStreamRefusesAsAgenthostHTTPDoes(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), nil)
			for i, c := range []struct {
				url   string
				class abi.ErrorClass
				want  string
			}{
				{"http://localhost:" + web.port + "/hello", abi.ClassPluginDenied, `http_stream: denied: host "localhost" is not in the plugin's allowed hosts`},
				{web.url("/redirect"), abi.ClassPluginDenied, `http_stream: denied: host "localhost" is not in the plugin's allowed hosts`},
				{web.url("/big-headers"), abi.ClassPluginFailed, fmt.Sprintf("http_stream: too_large: response headers from 127.0.0.1:%s are over the limit of %d bytes", web.port, DefaultMaxHTTPResponseHeaderBytes)},
				{web.url("/no-head"), abi.ClassPluginFailed, "http_stream: timeout: no response within 200ms"},
			} {
				r, err := x.Start(context.Background(), toolCall("acme", fmt.Sprintf("r.t1.%d", i), 1, "http_stream", map[string]any{"url": c.url, "timeout_ms": 200}))
				switch c.class {
				case abi.ClassPluginDenied:
					if err == nil || classOf(t, err) != c.class || !strings.Contains(err.Error(), c.want) {
						t.Errorf("GET %s: %v (reply %+v), want %s saying %q", c.url, err, r, c.class, c.want)
					}
				default:
					if err != nil || r.State != abi.StateFailed || r.Error == nil || r.Error.Message != c.want {
						t.Errorf("GET %s: %v (reply %+v), want failed saying %q", c.url, err, r, c.want)
					}
				}
			}
			web.waitGone(t, "the head that did not come")
			if got := x.Plugin().HTTPStats().Denied; got != 2 {
				t.Errorf("HTTPStats().Denied = %d, want 2", got)
			}
		})
	}
}

// The body is bounded by max_http_response_bytes in total, each read by
// the chunk cap, and a head of any status has a stream.
func TestHTTPStreamLimits(t *testing.T) {
	const limit = 200 << 10
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), func(s *PluginSpec) { s.Sandbox.MaxHTTPResponseBytes = limit })
			// At the limit: read to its end, no read over the cap.
			for _, chunk := range []int64{0, -1, 1 << 30} {
				r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url(fmt.Sprintf("/sized?n=%d", limit)), "chunk": chunk})
				if len(r.body()) != limit || r.endError() != "" {
					t.Errorf("chunk %d: read %d bytes, close %q; want %d and no error", chunk, len(r.body()), r.endError(), limit)
				}
				for _, c := range r.Chunks {
					if len(c) > httpChunkCap {
						t.Errorf("chunk %d: a read returned %d bytes, over the cap of %d", chunk, len(c), httpChunkCap)
					}
				}
			}
			// One byte over: too_large, and never more than the limit read.
			r := streamDone(t, x, "r.t1.1", map[string]any{"url": web.url(fmt.Sprintf("/sized?n=%d", limit+1)), "chunk": 3000})
			if want := fmt.Sprintf("too_large: response body is over the limit of %d bytes", limit); r.endError() != want {
				t.Errorf("one byte over the limit: close %q, want %q", r.endError(), want)
			}
			if len(r.body()) > limit {
				t.Errorf("one byte over the limit: the plugin read %d bytes", len(r.body()))
			}
			// A small max: reads of at most that many bytes.
			r = streamDone(t, x, "r.t1.2", map[string]any{"url": web.url("/hello"), "chunk": 2})
			if strings.Join(r.Chunks, "|") != "he|ll|o" || r.endError() != "" {
				t.Errorf("reads of 2: %q, close %q", r.Chunks, r.endError())
			}
			// A 500 has a stream, with its body.
			r = streamDone(t, x, "r.t1.3", map[string]any{"url": web.url("/on-fire")})
			if r.Heads[0].Status != 500 || r.Heads[0].Stream == 0 || r.body() != "the server is on fire" {
				t.Errorf("a 500: %+v, %q", r.Heads, r.body())
			}
		})
	}
}

// A call holds at most 4 streams, and only its own: a stream number it
// was not given reads nothing and closes with an error.
func TestHTTPStreamCountAndNumbers(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), nil)
			r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url("/hello"), "opens": maxHTTPStreams + 1})
			for i, h := range r.Heads[:maxHTTPStreams] {
				if h.Status != 200 || h.Stream != int64(i+1) || h.Error != nil {
					t.Errorf("open %d: %+v", i+1, h)
				}
			}
			if last := r.Heads[maxHTTPStreams]; last.Stream != 0 || last.Error == nil || last.Error.Code != abi.HTTPTooLarge || !strings.Contains(last.Error.Message, "holds 4 streams") {
				t.Errorf("open %d: %+v, want too_large", maxHTTPStreams+1, last)
			}
			if r.body() != "hello" || r.endError() != "" {
				t.Errorf("stream 1: %q, close %q", r.body(), r.endError())
			}
			r = streamDone(t, x, "r.t1.1", map[string]any{"stream": 99})
			if len(r.Chunks) != 0 || r.endError() != "failed: the call holds no stream 99" {
				t.Errorf("stream 99: %q, close %q", r.Chunks, r.endError())
			}
		})
	}
}

// Another call cannot read a call's stream: call A holds stream 1 open
// on a response that is still coming; call B asks for stream 1 and gets
// nothing. A's caller then gives up: its read ends, and the connection is
// closed.
func TestHTTPStreamBelongsToItsCall(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, e := streamExecutor(t, path, fixtureFor(t), nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errA := make(chan error, 1)
			go func() {
				_, err := x.Start(ctx, toolCall("acme", "r.t1.0", 1, "http_stream", map[string]any{"url": web.url("/hold"), "emit": true, "timeout_ms": 60000}))
				errA <- err
			}()
			waitCtx, stop := context.WithTimeout(context.Background(), streamWait)
			defer stop()
			if !awaitRead(waitCtx, e.sink, "first") {
				t.Fatalf("call A did not read the first chunk")
			}
			r := streamDone(t, x, "r.t1.1", map[string]any{"stream": 1})
			if len(r.Chunks) != 0 || r.endError() != "failed: the call holds no stream 1" {
				t.Errorf("call B read call A's stream: %q, close %q", r.Chunks, r.endError())
			}
			cancel()
			select {
			case err := <-errA:
				// Whether the plugin or the halt ends the call first is
				// the machine's timing, not the host's semantics.
				t.Logf("call A, its caller gone: %v", err)
			case <-time.After(streamWait):
				t.Fatalf("call A still reads %s after its caller gave up", streamWait)
			}
			web.waitGone(t, "call A's stream")
		})
	}
}

// A read waits timeout_ms at most for the next bytes; the close says
// the body timed out, and the connection is closed.
func TestHTTPStreamIdleTimeout(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), nil)
			r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url("/hold"), "timeout_ms": 200})
			if r.body() != "first" || r.endError() != "timeout: no more of the response body within 200ms" {
				t.Errorf("read %q, close %q", r.Chunks, r.endError())
			}
			web.waitGone(t, "the idle stream")
		})
	}
}

// A stream closed early closes its connection at once, while the call
// goes on: the server sees it before the call's next request.
func TestHTTPStreamCloseEarly(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), nil)
			r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url("/hold"), "reads": 1, "then": web.url("/after-gone"), "timeout_ms": 5000})
			if r.body() != "first" || r.End == nil || r.End.Error != nil {
				t.Errorf("read %q, close %+v; want first and {}", r.Chunks, r.End)
			}
			if r.Then != "200 gone" {
				t.Errorf("after the close, the server's request was still open: %q", r.Then)
			}
		})
	}
}

// A call that ends with a stream open closes it: the connection does not
// outlive the call, whether the call returned or ran out of time.
func TestHTTPStreamClosedWhenTheCallEnds(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			x, web, _ := streamExecutor(t, path, fixtureFor(t), func(s *PluginSpec) {
				s.Limits.CallTimeout = 2 * time.Second
				s.Sandbox.HTTPTimeout = time.Minute // longer than every wait here: only the call's end may end a read
			})
			r := streamDone(t, x, "r.t1.0", map[string]any{"url": web.url("/hold"), "reads": 1, "leave_open": true})
			if r.body() != "first" || r.End != nil {
				t.Errorf("read %q, end %+v", r.Chunks, r.End)
			}
			web.waitGone(t, "the stream the call left open")

			// A call that runs out of time with its stream open.
			_, err := x.Start(context.Background(), toolCall("acme", "r.t1.1", 1, "http_stream", map[string]any{"url": web.url("/hold"), "reads": 1, "spin": true}))
			if err == nil || classOf(t, err) != abi.ClassPluginTimeout {
				t.Fatalf("a call spinning with its stream open: %v, want plugin_timeout", err)
			}
			web.waitGone(t, "the stream of the call that timed out")

			// A read that waits past the call's timeout returns at the
			// call's deadline: the call ends (timed out, or with the
			// plugin's answer, whichever the machine's timing gives), and
			// so does the connection.
			done := make(chan struct{})
			go func() {
				defer close(done)
				r, err := x.Start(context.Background(), toolCall("acme", "r.t1.2", 1, "http_stream", map[string]any{"url": web.url("/hold"), "timeout_ms": 60000}))
				var pe *runtime.PluginError
				if err != nil {
					if !errors.As(err, &pe) || pe.Class != abi.ClassPluginTimeout {
						t.Errorf("a read past the call timeout: %v, want plugin_timeout", err)
					}
					return
				}
				var o abi.ToolOutcome
				var res streamResult
				_ = json.Unmarshal(r.Outcome, &o)
				_ = json.Unmarshal([]byte(o.Content), &res)
				if res.End == nil || res.End.Error == nil || res.End.Error.Code != abi.HTTPTimeout {
					t.Errorf("a read past the call timeout answered %+v, want a timeout", r)
				}
			}()
			select {
			case <-done:
			case <-time.After(streamWait):
				t.Fatalf("a read past the call timeout still waits %s later", streamWait)
			}
			web.waitGone(t, "the stream whose read outlasted the call")
		})
	}
}

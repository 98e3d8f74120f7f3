package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// rawStream is an event stream over a bare TCP connection: no client
// goroutine, and nothing read that the test does not read.
type rawStream struct {
	conn net.Conn
	resp *http.Response
	sse  *sseStream // nil until the head is read
}

// dialStream sends the stream's request on a connection of its own to
// addr and returns before reading anything.
func dialStream(t *testing.T, addr, token, runID string, header ...string) *rawStream {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	req := fmt.Sprintf("GET /v1/runs/%s/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n", runID, addr, token)
	for i := 0; i+1 < len(header); i += 2 {
		req += header[i] + ": " + header[i+1] + "\r\n"
	}
	_, err = io.WriteString(conn, req+"\r\n")
	require.NoError(t, err)
	return &rawStream{conn: conn}
}

// head reads the answer's status line and headers.
func (s *rawStream) head(t *testing.T) *http.Response {
	t.Helper()
	require.NoError(t, s.conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(s.conn), nil)
	require.NoError(t, err)
	require.NoError(t, s.conn.SetReadDeadline(time.Time{}))
	s.resp = resp
	s.sse = &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body)}
	return resp
}

// openStream opens a stream on addr and reads its head, which must be 200.
func openStream(t *testing.T, addr, token, runID string, header ...string) *rawStream {
	t.Helper()
	s := dialStream(t, addr, token, runID, header...)
	resp := s.head(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return s
}

// until reads events until one with the given seq, and returns them.
func (s *rawStream) until(t *testing.T, seq int64) []sseEvent {
	t.Helper()
	require.NoError(t, s.conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	defer s.conn.SetReadDeadline(time.Time{})
	var out []sseEvent
	for {
		ev, ok := s.sse.next()
		require.True(t, ok, "the stream ended before event %d: %v", seq, out)
		out = append(out, ev)
		if ev.ID != "" && seqOf(t, ev) == seq {
			return out
		}
	}
}

// streamLimits records what OnLimit is told.
type streamLimits struct {
	mu   sync.Mutex
	seen []string // limit/tenant
}

func (l *streamLimits) option() envOption {
	return func(c *httpapi.Config, _ *runtime.Options) {
		c.OnLimit = func(limit, tenant string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.seen = append(l.seen, limit+"/"+tenant)
		}
	}
}

func (l *streamLimits) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// streamStore counts the log reads and the commits of each Run.
type streamStore struct {
	runtime.Store
	mu      sync.Mutex
	reads   map[string]int
	commits map[string]int
}

func (c *streamStore) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	c.mu.Lock()
	c.reads[runID]++
	c.mu.Unlock()
	return c.Store.Events(ctx, tenant, runID, fromSeq, limit)
}

func (c *streamStore) Commit(ctx context.Context, cm runtime.Commit) (runtime.CommitResult, error) {
	c.mu.Lock()
	c.commits[cm.RunID]++
	c.mu.Unlock()
	return c.Store.Commit(ctx, cm)
}

func (c *streamStore) counts(runID string) (reads, commits int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[runID], c.commits[runID]
}

// goroutinesPerBlockedRequest measures what net/http itself holds for
// each of n requests whose handler blocks: the goroutines a stream may
// hold, at most, with none of its own.
func goroutinesPerBlockedRequest(t *testing.T, n int) float64 {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
	}))
	defer ts.Close()
	defer close(release)
	before := goruntime.NumGoroutine()
	for range n {
		s := dialStream(t, ts.Listener.Addr().String(), "x", "r")
		require.Equal(t, http.StatusOK, s.head(t).StatusCode)
	}
	return float64(goruntime.NumGoroutine()-before) / float64(n)
}

// TestManyStreamsOfOneRunShareOneReaderAndHoldNoGoroutine: 200 streams of
// one Run hold no goroutine beyond the ones net/http holds for any
// request, and each commit of the Run costs the store one read of its
// log, not one per stream; every stream still gets every event once, in
// order, to the end.
func TestManyStreamsOfOneRunShareOneReaderAndHoldNoGoroutine(t *testing.T) {
	var store *streamStore
	e := newEnv(t, func(_ *httpapi.Config, o *runtime.Options) {
		store = &streamStore{Store: o.Store, reads: map[string]int{}, commits: map[string]int{}}
		o.Store = store
	})
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|answer:$results`)
	waiting := e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})

	const n = 200
	perRequest := goroutinesPerBlockedRequest(t, n)
	t.Logf("net/http holds %.2f goroutines per blocked request", perRequest)
	addr := e.ts.Listener.Addr().String()
	before := goruntime.NumGoroutine()
	streams := make([]*rawStream, n)
	for i := range streams {
		streams[i] = openStream(t, addr, tokenAcme, run.ID)
		streams[i].until(t, waiting.Seq)
	}
	grown := goruntime.NumGoroutine() - before
	t.Logf("%d streams of one Run: %d more goroutines", n, grown)
	// The Run's tail may run its reader; a tenth of a goroutine per
	// stream is slack for the runtime's own.
	require.LessOrEqual(t, float64(grown), perRequest*n+n/10,
		"%d streams hold %d goroutines, net/http %.2f per request: a stream holds goroutines of its own", n, grown, perRequest)

	reads0, commits0 := store.counts(run.ID)
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	final := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	for i, s := range streams {
		rest := s.until(t, final.Seq)
		// The stream read from the start sent what the Run waited for
		// after the event that made it wait, without an id.
		require.Equal(t, "run_waiting", rest[0].Event, "stream %d", i)
		rest = rest[1:]
		_, more := s.sse.next()
		require.False(t, more, "stream %d goes on after the terminal event", i)
		for j, ev := range rest {
			require.Equal(t, waiting.Seq+1+int64(j), seqOf(t, ev), "stream %d", i)
		}
		require.Equal(t, string(loop.EventRunCompleted), rest[len(rest)-1].Event)
	}
	reads, commits := store.counts(run.ID)
	reads, commits = reads-reads0, commits-commits0
	t.Logf("%d streams, %d commits: %d reads of the log", n, commits, reads)
	require.Positive(t, commits)
	require.LessOrEqual(t, reads, commits+1, "%d streams, %d commits: %d reads of the log, want one per commit", n, commits, reads)
	waitFor(t, "the streams' followers to close", func() bool { return e.rt.Hub().FollowStats().Followers == 0 })
}

// TestStreamsPerTenantAreCapped: past DefaultMaxStreamsPerTenant open
// streams, a tenant's next one answers 429 too_many_streams with
// Retry-After; another tenant's stream is served, and a stream that ends
// frees its place.
func TestStreamsPerTenantAreCapped(t *testing.T) {
	var limits streamLimits
	e := newEnv(t, limits.option())
	acme := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	globex := e.submit(tokenGlobex, "s1", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, acme.ID, loop.StatusWaiting)
	e.waitStatus(tokenGlobex, globex.ID, loop.StatusWaiting)
	addr := e.ts.Listener.Addr().String()
	open := make([]*rawStream, httpapi.DefaultMaxStreamsPerTenant)
	for i := range open {
		open[i] = openStream(t, addr, tokenAcme, acme.ID)
	}

	over := dialStream(t, addr, tokenAcme, acme.ID)
	resp := over.head(t)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "stream %d of the tenant", len(open)+1)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	refused := reply{Status: resp.StatusCode, Header: resp.Header, Body: body}
	require.Equal(t, httpapi.CodeTooManyStreams, refused.errCode(t))
	require.Contains(t, refused.message(t), fmt.Sprint(httpapi.DefaultMaxStreamsPerTenant))
	require.Contains(t, refused.message(t), "max_streams_per_tenant")
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.EqualValues(t, 1, e.rt.Hub().FollowStats().Refused)
	require.Equal(t, []string{httpapi.LimitStreams + "/acme"}, limits.all())

	// Another tenant is not refused.
	other := openStream(t, addr, tokenGlobex, globex.ID)
	other.until(t, globex.Seq)

	// A stream the client closes frees its place.
	open[0].conn.Close()
	waitFor(t, "a place for a new stream of acme", func() bool {
		s := dialStream(t, addr, tokenAcme, acme.ID)
		defer s.conn.Close()
		return s.head(t).StatusCode == http.StatusOK
	})
}

// TestAStreamWhoseClientDoesNotReadIsDropped: a client that sends the
// request and never reads is dropped once a send waits longer than the
// write timeout; the drop is logged and counted, and frees the follower.
func TestAStreamWhoseClientDoesNotReadIsDropped(t *testing.T) {
	var limits streamLimits
	e := newEnv(t, limits.option())
	run := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	s := dialStream(t, e.ts.Listener.Addr().String(), tokenAcme, run.ID)
	require.NoError(t, s.conn.(*net.TCPConn).SetReadBuffer(4<<10))
	waitFor(t, "the stream to follow the Run", func() bool { return e.rt.Hub().FollowStats().Followers == 1 })

	// The Run's plugin emits fast; the stream's sends fill the socket
	// buffers, then one waits past the write timeout.
	big := abi.EmitEvent{Type: "progress", Message: strings.Repeat("x", 64<<10)}
	scope := runtime.EmitScope{Tenant: "acme", RunID: run.ID, EffectID: run.ID + ".m1.0", Plugin: "scripted-model"}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(httpapi.DefaultStreamWriteTimeout + time.Minute)
	for !strings.Contains(e.logs.String(), "event stream dropped") {
		require.True(t, time.Now().Before(deadline), "the stream was not dropped; logs: %s", tailOf(e.logs.String(), 2000))
		require.NoError(t, e.rt.Hub().Emit(context.Background(), scope, big))
		<-tick.C
	}
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, "event stream dropped") {
			require.Contains(t, line, `"run":"`+run.ID+`"`)
			require.Contains(t, line, `"tenant":"acme"`)
		}
	}
	waitFor(t, "the dropped stream's follower to close", func() bool { return e.rt.Hub().FollowStats().Followers == 0 })
	require.EqualValues(t, 1, e.rt.Hub().FollowStats().Dropped)
	require.Equal(t, []string{httpapi.LimitStreamWriteTimeout + "/acme"}, limits.all())

	// The server let the connection go (the kernel still sends what it
	// holds, then the end).
	e.ts.Client().CloseIdleConnections()
	waitFor(t, "the server to close the connection", func() bool { return connectionsServed() == 0 })
}

// connectionsServed counts the connections the process's http.Servers
// hold a goroutine for.
func connectionsServed() int {
	buf := make([]byte, 8<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	return strings.Count(string(buf), "net/http.(*conn).serve(")
}

func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestAStreamOutlivesTheServersTimeouts: on an http.Server with short
// read and write timeouts, an event stream lifts them for itself: it stays
// open well past both and streams the Run to its end.
func TestAStreamOutlivesTheServersTimeouts(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) { c.Heartbeat = 10 * time.Millisecond })
	ts := httptest.NewUnstartedServer(e.srv.Handler())
	ts.Config.ReadTimeout = 200 * time.Millisecond
	ts.Config.WriteTimeout = 200 * time.Millisecond
	ts.Start()
	t.Cleanup(ts.Close)

	run := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	waiting := e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	s := openStream(t, ts.Listener.Addr().String(), tokenAcme, run.ID)
	s.until(t, waiting.Seq)
	// A hundred heartbeats: a second at the least, five times the
	// timeouts.
	require.NoError(t, s.conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	for beats := 0; beats < 100; {
		require.True(t, s.sse.sc.Scan(), "the stream ended after %d heartbeats: %v", beats, s.sse.sc.Err())
		if strings.HasPrefix(s.sse.sc.Text(), ":") {
			beats++
		}
	}
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "that one"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	final := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	rest := s.until(t, final.Seq)
	require.Equal(t, string(loop.EventRunCompleted), rest[len(rest)-1].Event)
}

// TestLastEventIDPastTheBoundIs400: a Last-Event-ID past the bound that
// ?after= has (1<<62), the largest int64 among them, is refused with 400
// instead of wrapping around to replay the stream from its first event.
func TestLastEventIDPastTheBoundIs400(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "answer:hi")
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	for _, id := range []string{"9223372036854775807", "4611686018427387905"} {
		r := e.do("GET", "/v1/runs/"+run.ID+"/events", tokenAcme, "", "Last-Event-ID", id)
		require.Equal(t, http.StatusBadRequest, r.Status, "Last-Event-ID %s: %s", id, r.Body)
		require.Equal(t, httpapi.CodeBadRequest, r.errCode(t))
		require.Contains(t, r.message(t), "Last-Event-ID")
	}
	r := e.do("GET", "/v1/runs/"+run.ID+"/events?after=9223372036854775807", tokenAcme, "")
	require.Equal(t, http.StatusBadRequest, r.Status)
	// The bound itself is an event ID past the end of the log: nothing
	// more to send.
	r = e.do("GET", "/v1/runs/"+run.ID+"/events", tokenAcme, "", "Last-Event-ID", "4611686018427387904")
	require.Equal(t, http.StatusOK, r.Status)
	require.NotContains(t, string(r.Body), "id: ")
}

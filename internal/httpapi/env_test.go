package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/metrics"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// Tokens of the two tenants every test server has.
const (
	tokenAcme   = "token-acme-1"
	tokenGlobex = "token-globex-1"
)

// env is an API server on 127.0.0.1 over a runtime with the conformance
// fakes: a MemStore, a FakeClock, the scripted model and tools.
type env struct {
	t      *testing.T
	clock  *conformance.FakeClock
	store  *conformance.MemStore
	rt     *runtime.Runtime
	tools  *conformance.CountingExecutor
	ledger *httpapi.UsageLedger
	m      *metrics.Metrics
	srv    *httpapi.Server
	ts     *httptest.Server
	ready  atomic.Bool
	logs   *conformance.LogBuffer
}

type envOption func(*httpapi.Config, *runtime.Options)

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	e := &env{t: t, clock: conformance.NewFakeClock(time.Time{}), ledger: httpapi.NewUsageLedger(), logs: &conformance.LogBuffer{},
		m: metrics.New()}
	e.ready.Store(true)
	e.store = conformance.NewMemStore(e.clock, conformance.KVLimits{})
	scripted := &conformance.ScriptedTools{SlowPolls: 1}
	e.tools = &conformance.CountingExecutor{Next: e.m.Executor("scripted-tools", scripted)}
	t.Cleanup(scripted.Release)
	tenants := runtime.TenantMap{}
	for _, id := range []string{"acme", "globex"} {
		tn := &runtime.Tenant{ID: id, Builder: e.m.Builder("echo-builder", &conformance.EchoBuilder{}),
			Model:       e.m.Executor("scripted-model", &conformance.ScriptedModel{}),
			Limits:      loop.Limits{MaxSteps: 8, MaxToolCallsPerStep: 8, MaxParallelToolCalls: 4},
			ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 1000}}
		for _, tl := range scripted.Tools() {
			spec := loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}, Approval: tl.Name == "wire"}
			tn.Tools = append(tn.Tools, runtime.Tool{Descriptor: tl, Spec: spec, Executor: e.tools})
		}
		tenants[id] = tn
	}
	auth, err := httpapi.NewTokenAuthenticator(map[string][]string{
		"acme": {httpapi.HashToken(tokenAcme)}, "globex": {httpapi.HashToken(tokenGlobex)},
	})
	require.NoError(t, err)
	ropts := runtime.Options{Store: e.store, Tenants: tenants, Clock: e.clock, NodeID: "node-api",
		PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		RecoveryInterval: time.Hour, WatchdogInterval: time.Hour, Observer: metrics.Tee{e.m, e.ledger}}
	cfg := httpapi.Config{Store: e.store, Auth: auth, Usage: e.ledger, Ready: e.ready.Load, Metrics: e.m.Handler(),
		Logger: slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, o := range opts {
		o(&cfg, &ropts)
	}
	e.rt, err = runtime.New(ropts)
	require.NoError(t, err)
	require.NoError(t, e.m.RegisterRuntime(e.rt))
	require.NoError(t, e.m.RegisterActiveRuns(e.store, func() []string { return []string{"acme", "globex"} }, 1000, nil))
	require.NoError(t, e.rt.Start(context.Background()))
	conformance.Eventually(t, "the runtime's first recovery pass", e.rt.Ready)
	cfg.Runtime = e.rt
	e.srv, err = httpapi.New(cfg)
	require.NoError(t, err)
	e.ts = httptest.NewServer(e.srv.Handler())
	t.Cleanup(func() {
		e.srv.Drain()
		e.ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.rt.Stop(ctx)
	})
	return e
}

func withQuota(tenant string, q httpapi.Quota) envOption {
	return func(c *httpapi.Config, _ *runtime.Options) {
		if c.Quotas == nil {
			c.Quotas = map[string]httpapi.Quota{}
		}
		c.Quotas[tenant] = q
	}
}

// reply is an HTTP answer, read whole.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r reply) run(t *testing.T) httpapi.RunJSON {
	t.Helper()
	var run httpapi.RunJSON
	require.NoError(t, json.Unmarshal(r.Body, &run), "body: %s", r.Body)
	return run
}

// errCode returns the code of a JSON error body, failing unless the body
// has the documented shape with a message.
func (r reply) errCode(t *testing.T) string {
	t.Helper()
	var b struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &b), "body: %s", r.Body)
	require.NotNil(t, b.Error, "no error object in %s", r.Body)
	require.NotEmpty(t, b.Error.Code, "body: %s", r.Body)
	require.NotEmpty(t, b.Error.Message, "body: %s", r.Body)
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	return b.Error.Code
}

func (r reply) message(t *testing.T) string {
	t.Helper()
	var b struct {
		Error struct{ Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &b))
	return b.Error.Message
}

func (e *env) do(method, path, token, body string, header ...string) reply {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// submit posts a Run with the script as input and returns its JSON.
func (e *env) submit(token, session, script string) httpapi.RunJSON {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"input": script})
	r := e.do("POST", "/v1/sessions/"+session+"/runs", token, string(body))
	require.Equal(e.t, http.StatusCreated, r.Status, "body: %s", r.Body)
	return r.run(e.t)
}

func (e *env) get(token, runID string) httpapi.RunJSON {
	e.t.Helper()
	r := e.do("GET", "/v1/runs/"+runID, token, "")
	require.Equal(e.t, http.StatusOK, r.Status, "body: %s", r.Body)
	return r.run(e.t)
}

// waitRun waits, through the API, until cond holds for the Run.
func (e *env) waitRun(token, runID, what string, cond func(httpapi.RunJSON) bool) httpapi.RunJSON {
	e.t.Helper()
	var last httpapi.RunJSON
	conformance.Eventually(e.t, "run "+runID+" "+what, func() bool {
		last = e.get(token, runID)
		return cond(last)
	})
	return last
}

func (e *env) waitStatus(token, runID string, s loop.Status) httpapi.RunJSON {
	e.t.Helper()
	return e.waitRun(token, runID, "to be "+string(s), func(r httpapi.RunJSON) bool { return r.Status == s })
}

// sseEvent is one event of a stream.
type sseEvent struct {
	ID    string
	Event string
	Data  string
}

// sseStream reads a Server-Sent Events stream.
type sseStream struct {
	resp     *http.Response
	sc       *bufio.Scanner
	comments atomic.Int64
}

func (e *env) stream(token, runID string, header ...string) *sseStream {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.ts.URL+"/v1/runs/"+runID+"/events", nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	require.Equal(e.t, http.StatusOK, resp.StatusCode)
	require.Equal(e.t, "text/event-stream", resp.Header.Get("Content-Type"))
	e.t.Cleanup(func() { resp.Body.Close() })
	return &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the next event, or false at the end of the stream.
func (s *sseStream) next() (sseEvent, bool) {
	var ev sseEvent
	has := false
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if has {
				return ev, true
			}
		case strings.HasPrefix(line, ":"):
			s.comments.Add(1)
		case strings.HasPrefix(line, "id: "):
			ev.ID, has = strings.TrimPrefix(line, "id: "), true
		case strings.HasPrefix(line, "event: "):
			ev.Event, has = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			ev.Data, has = ev.Data+strings.TrimPrefix(line, "data: "), true
		case strings.HasPrefix(line, "retry: "):
		}
	}
	return ev, false
}

// all reads events until the stream ends.
func (s *sseStream) all(t *testing.T) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, ok := s.next()
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

func (s *sseStream) close() { s.resp.Body.Close() }

func seqOf(t *testing.T, ev sseEvent) int64 {
	t.Helper()
	n, err := strconv.ParseInt(ev.ID, 10, 64)
	require.NoError(t, err, "event %+v has no numeric id", ev)
	return n
}

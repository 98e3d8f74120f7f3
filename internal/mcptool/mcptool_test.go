package mcptool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/mcptool"
	"github.com/agenthost/agenthost/internal/mcptool/mcptest"
	"github.com/agenthost/agenthost/internal/tracing/tracingtest"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// stdioServerEnv, set, makes this test binary the stdio MCP server of the
// tests (mcptest.ServeStdio) instead of running the tests.
const stdioServerEnv = "AGENTHOST_MCPTEST_STDIO"

func TestMain(m *testing.M) {
	if os.Getenv(stdioServerEnv) == "1" {
		if err := mcptest.ServeStdio(context.Background()); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// httpServer is the config of an HTTP MCP server at url, with short
// backoffs for the tests.
func httpServer(name, url string) config.MCPServer {
	return config.MCPServer{Name: name, URL: url, CallTimeout: 20 * time.Second, TaskTTL: time.Hour,
		MaxResultBytes: 64 << 10, Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
}

// stdioServer is the config of this test binary as a stdio MCP server.
func stdioServer(name string) config.MCPServer {
	s := httpServer(name, "")
	s.Command = []string{os.Args[0]}
	s.Env = map[string]string{stdioServerEnv: "1"}
	return s
}

// logBuffer collects a test's logs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start starts a Manager of servers, closed when the test ends.
func start(t *testing.T, opts mcptool.Options, servers ...config.MCPServer) (*mcptool.Manager, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	m := map[string]config.MCPServer{}
	for _, s := range servers {
		m[s.Name] = s
	}
	mgr, err := mcptool.Start(m, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		if t.Failed() {
			t.Logf("logs:\n%s", logs)
		}
	})
	return mgr, logs
}

// waitTools waits until server lists tool (the name agents see).
func waitTools(t *testing.T, s *mcptool.Server, tool string) mcptool.Tool {
	t.Helper()
	var found mcptool.Tool
	conformance.WaitUntil(t, 30*time.Second, "server "+s.Name()+" to list "+tool, func() (bool, error) {
		for _, tl := range s.Tools() {
			if tl.Name == tool {
				found = tl
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// runtimeTools are the tools of the servers as a tenant's, each with the
// default policy of a tool that is not idempotent.
func runtimeTools(servers ...*mcptool.Server) []runtime.Tool {
	var out []runtime.Tool
	for _, s := range servers {
		for _, tl := range s.Tools() {
			out = append(out, runtime.Tool{Descriptor: tl.Descriptor, Executor: s.Executor(tl.Original),
				Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.DefaultToolPolicy(false)}})
		}
	}
	return out
}

// newRuntime starts a runtime over the in-memory store whose tenant
// "acme" has the scripted model and tools.
func newRuntime(t *testing.T, tools []runtime.Tool) *runtime.Runtime {
	t.Helper()
	store := conformance.NewMemStore(nil, conformance.KVLimits{})
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy, Tools: tools}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: runtime.SystemClock{},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rt.Stop(ctx)
		store.Close()
	})
	return rt
}

func startHTTP(t *testing.T) *mcptest.Server {
	t.Helper()
	srv := mcptest.New()
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// TestARunCallsAStdioToolAndAnHTTPTool: a Run whose model calls a tool of
// a stdio MCP server (this binary, started by the host) and one of an HTTP
// MCP server at once completes with both results; the HTTP tool's input
// schema reached the Loop, which refuses a call that breaks it before any
// server hears of it.
func TestARunCallsAStdioToolAndAnHTTPTool(t *testing.T) {
	srv := startHTTP(t)
	mgr, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()), stdioServer("files"))
	waitTools(t, mgr.Server("web"), "web__add")
	waitTools(t, mgr.Server("files"), "files__upper")
	rt := newRuntime(t, runtimeTools(mgr.Server("web"), mgr.Server("files")))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1",
		Input: `call:web__add({"a":2,"b":3}),files__upper({"text":"abc"})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Status != loop.StatusCompleted || res.Run.Result != "2 + 3 = 5,ABC" {
		t.Fatalf("the Run ended %s with %q (failure %+v); want completed with \"2 + 3 = 5,ABC\"", res.Run.Status, res.Run.Result, res.Run.Failure)
	}

	res, err = rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s2", Input: `call:web__add({"a":"two","b":3})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Run.Result, "do not match its input_schema") {
		t.Fatalf("a call with bad arguments answered %q; want the Loop's refusal", res.Run.Result)
	}
	if n := srv.Runs(mcptest.ToolAdd); n != 1 {
		t.Fatalf("add ran %d times, want 1 (the bad call never reaches the server)", n)
	}
}

// TestATaskToolRunsOnceAsATask: a tool that supports tasks is called as a
// task; the Run waits, polling tasks/get, until the job is released, and
// completes with its result; the job ran once, as one task.
func TestATaskToolRunsOnceAsATask(t *testing.T) {
	srv := startHTTP(t)
	mgr, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, mgr.Server("web"), "web__slow")
	rt := newRuntime(t, runtimeTools(mgr.Server("web")))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", RunID: "run-slow", Input: `call:web__slow({"label":"j1"})|answer:$results`}); err != nil {
		t.Fatal(err)
	}
	conformance.WaitUntil(t, 30*time.Second, "the slow job's task", func() (bool, error) { return srv.Tasks() == 1, nil })
	conformance.WaitUntil(t, 30*time.Second, "the effect pending with the task's handle", func() (bool, error) {
		run, err := rt.LoadRun(ctx, "acme", "run-slow")
		if err != nil {
			return false, err
		}
		for _, e := range run.Effects {
			if e.Kind == abi.KindTool && e.Handle != "" {
				return true, nil
			}
		}
		return false, nil
	})
	srv.Release("j1")
	var run loop.Run
	conformance.WaitUntil(t, 30*time.Second, "the Run to end", func() (bool, error) {
		var err error
		run, err = rt.LoadRun(ctx, "acme", "run-slow")
		return run.Status.Terminal(), err
	})
	if run.Status != loop.StatusCompleted || run.Result != "slow job j1 finished" {
		t.Fatalf("the Run ended %s with %q (failure %+v)", run.Status, run.Result, run.Failure)
	}
	if n, tasks := srv.Runs("slow:j1"), srv.Tasks(); n != 1 || tasks != 1 {
		t.Fatalf("the slow job ran %d times in %d tasks, want once in one", n, tasks)
	}
}

// call is an effect call of tool with arguments, as the runtime makes it.
func call(tool, args, handle string) runtime.EffectCall {
	req, _ := json.Marshal(abi.ToolRequest{Arguments: json.RawMessage(args)})
	return runtime.EffectCall{Tenant: "acme", Session: "s1", RunID: "r1", Input: abi.EffectInput{ABI: abi.Version, Handle: handle,
		Effect: abi.Effect{ID: "r1.t1.0", AssignmentKey: "acme/s1/r1.t1.0#1", Attempt: 1, Kind: abi.KindTool, Tool: tool, Request: req}}}
}

// TestAttachFindsTheTaskAfterARestart: the executor's start answers
// pending with the task's ID as the handle; a new connection (the host
// restarted) attaches to it with tasks/get, pending while it works and
// done with its result once it has ended, the job having run once. An
// attach without a handle (the crash came before it was stored), or of a
// task the server does not know, answers unknown; so does any attach of
// a plain call.
func TestAttachFindsTheTaskAfterARestart(t *testing.T) {
	srv := startHTTP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, first.Server("web"), "web__slow")
	r, err := first.Server("web").Executor(mcptest.ToolSlow).Start(ctx, call("web__slow", `{"label":"k"}`, ""))
	if err != nil || r.State != abi.StatePending || r.Handle == "" {
		t.Fatalf("start: %+v %v; want pending with a handle", r, err)
	}
	first.Close()

	again, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, again.Server("web"), "web__slow")
	ex := again.Server("web").Executor(mcptest.ToolSlow)
	if a, err := ex.Attach(ctx, call("web__slow", `{"label":"k"}`, r.Handle)); err != nil || a.State != abi.StatePending || a.Handle != r.Handle {
		t.Fatalf("attach while it works: %+v %v; want pending", a, err)
	}
	srv.Release("k")
	var a abi.EffectReply
	conformance.WaitUntil(t, 30*time.Second, "the attached task to end", func() (bool, error) {
		a, err = ex.Attach(ctx, call("web__slow", `{"label":"k"}`, r.Handle))
		return a.State == abi.StateDone, err
	})
	var o abi.ToolOutcome
	if err := json.Unmarshal(a.Outcome, &o); err != nil || o.Content != "slow job k finished" || o.IsError {
		t.Fatalf("the outcome: %s %v", a.Outcome, err)
	}
	if n := srv.Runs("slow:k"); n != 1 {
		t.Fatalf("the job ran %d times, want once", n)
	}
	for _, handle := range []string{"", "no-such-task"} {
		if u, err := ex.Attach(ctx, call("web__slow", `{"label":"k"}`, handle)); err != nil || u.State != abi.StateUnknown {
			t.Errorf("attach with handle %q: %+v %v; want unknown", handle, u, err)
		}
	}
	plain := again.Server("web").Executor(mcptest.ToolAdd)
	d, err := plain.Start(ctx, call("web__add", `{"a":1,"b":1}`, ""))
	if err != nil || d.State != abi.StateDone || d.Handle != "" {
		t.Fatalf("a plain call: %+v %v; want done", d, err)
	}
	if u, err := plain.Attach(ctx, call("web__add", `{"a":1,"b":1}`, "")); err != nil || u.State != abi.StateUnknown {
		t.Fatalf("attach of a plain call: %+v %v; want unknown", u, err)
	}
}

// TestACancelledTaskIsCancelledOnTheServer: cancel of a pending call is
// tasks/cancel of its task.
func TestACancelledTaskIsCancelledOnTheServer(t *testing.T) {
	srv := startHTTP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mgr, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, mgr.Server("web"), "web__slow")
	ex := mgr.Server("web").Executor(mcptest.ToolSlow)
	r, err := ex.Start(ctx, call("web__slow", `{"label":"c"}`, ""))
	if err != nil || r.State != abi.StatePending {
		t.Fatalf("start: %+v %v", r, err)
	}
	c, err := ex.Cancel(ctx, call("web__slow", `{"label":"c"}`, r.Handle))
	if err != nil || c.State != abi.StateCancelled {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	p, err := ex.Poll(ctx, call("web__slow", `{"label":"c"}`, r.Handle))
	if err != nil || p.State != abi.StateFailed || !strings.Contains(p.Error.Message, "cancelled") {
		t.Fatalf("poll after the cancel: %+v %v; want failed, cancelled", p, err)
	}
}

// TestAServerDownAtStartComesUp: a server that is down when the host
// starts lists no tools and its calls are executor_unavailable, without
// holding anything up; once it is up, it is connected in the background,
// its tools are listed (OnChange says so) and its calls work.
func TestAServerDownAtStartComesUp(t *testing.T) {
	srv := mcptest.New()
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	srv.Stop() // the address is the server's, but nothing listens
	changed := make(chan string, 16)
	mgr, logs := start(t, mcptool.Options{OnChange: func(s string) { changed <- s }}, httpServer("web", srv.URL()))
	s := mgr.Server("web")
	conformance.WaitUntil(t, 30*time.Second, "a failed connection logged", func() (bool, error) {
		return strings.Contains(logs.String(), "the server is not connected"), nil
	})
	if len(s.Tools()) != 0 || s.Connected() {
		t.Fatalf("a server never reached lists %v, connected %v", s.Tools(), s.Connected())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := s.Executor(mcptest.ToolAdd).Start(ctx, call("web__add", `{"a":1,"b":2}`, ""))
	var pe *runtime.PluginError
	if !errors.As(err, &pe) || pe.Class != abi.ClassExecutorUnavailable {
		t.Fatalf("a call while the server is down: %v; want executor_unavailable", err)
	}

	if _, err := srv.Start(""); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	select {
	case name := <-changed:
		if name != "web" {
			t.Fatalf("OnChange for %q", name)
		}
	case <-ctx.Done():
		t.Fatal("the server's tools were never listed once it was up")
	}
	waitTools(t, s, "web__add")
	r, err := s.Executor(mcptest.ToolAdd).Start(ctx, call("web__add", `{"a":1,"b":2}`, ""))
	if err != nil || r.State != abi.StateDone {
		t.Fatalf("a call once the server is up: %+v %v", r, err)
	}
}

// TestANameThatResolvesToLoopbackIsRefused: an HTTP server's URL whose
// host name resolves to 127.0.0.1 (where the server listens) is refused
// at the dial, as plugins' HTTP is, and the log says how to reach such an
// address; the server never hears from the host. The same server at its
// literal address is reached.
func TestANameThatResolvesToLoopbackIsRefused(t *testing.T) {
	srv := startHTTP(t)
	_, port, _ := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(srv.URL(), "http://"), "/mcp"))
	lookup := func(_ context.Context, _, host string) ([]netip.Addr, error) {
		if host == "tools.example.com" {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	mgr, logs := start(t, mcptool.Options{LookupIP: lookup}, httpServer("named", "http://tools.example.com:"+port+"/mcp"),
		httpServer("meta", "http://metadata.example.com/mcp"))
	conformance.WaitUntil(t, 30*time.Second, "the refusal logged", func() (bool, error) {
		return strings.Contains(logs.String(), "resolved to 127.0.0.1, which is loopback"), nil
	})
	if mgr.Server("named").Connected() || len(mgr.Server("named").Tools()) != 0 {
		t.Fatal("a name resolving to loopback was connected")
	}
	if !strings.Contains(logs.String(), "write the address itself in mcp_servers.named.url") {
		t.Errorf("the log does not say how to reach the address:\n%s", logs)
	}
	if srv.Runs(mcptest.ToolAdd) != 0 {
		t.Fatal("the server was called")
	}
}

// TestAnAddedToolIsListed: a tool the server adds while connected
// (notifications/tools/list_changed) is listed.
func TestAnAddedToolIsListed(t *testing.T) {
	srv := startHTTP(t)
	mgr, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, mgr.Server("web"), "web__add")
	srv.MCP().AddTool(&mcp.Tool{Name: "late.tool", Description: "Added later.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil
		})
	tl := waitTools(t, mgr.Server("web"), "web__late_tool")
	if tl.Original != "late.tool" {
		t.Fatalf("the added tool: %+v", tl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := mgr.Server("web").Executor(tl.Original).Start(ctx, call(tl.Name, `{}`, ""))
	if err != nil || r.State != abi.StateDone || !strings.Contains(string(r.Outcome), "late") {
		t.Fatalf("calling the added tool: %+v %v", r, err)
	}
}

// TestAStdioServerThatExitsIsRestarted: a stdio server whose process
// exits is started again, and its tools work again.
func TestAStdioServerThatExitsIsRestarted(t *testing.T) {
	mgr, logs := start(t, mcptool.Options{}, stdioServer("files"))
	s := mgr.Server("files")
	waitTools(t, s, "files__upper")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.Executor(mcptest.ToolExit).Start(ctx, call("files__exit", `{}`, "")); err == nil {
		t.Fatal("a call whose server exited answered")
	}
	conformance.WaitUntil(t, 30*time.Second, "the lost connection logged", func() (bool, error) {
		return strings.Contains(logs.String(), "connection lost"), nil
	})
	conformance.WaitUntil(t, 30*time.Second, "the server restarted", func() (bool, error) { return s.Connected(), nil })
	r, err := s.Executor(mcptest.ToolUpper).Start(ctx, call("files__upper", `{"text":"again"}`, ""))
	if err != nil || r.State != abi.StateDone || !strings.Contains(string(r.Outcome), "AGAIN") {
		t.Fatalf("a call after the restart: %+v %v", r, err)
	}
}

// TestAnHTTPToolCallCarriesTheRunsTrace: with tracing on (an SDK
// provider and the W3C propagator installed, as tracing.Start does), a Run
// submitted under a trace calls an HTTP MCP server's tool with a
// traceparent of that trace, from the Run's stored trace context.
func TestAnHTTPToolCallCarriesTheRunsTrace(t *testing.T) {
	tracingtest.Record(t)
	off := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(off) })
	srv := startHTTP(t)
	mgr, _ := start(t, mcptool.Options{}, httpServer("web", srv.URL()))
	waitTools(t, mgr.Server("web"), "web__add")
	rt := newRuntime(t, runtimeTools(mgr.Server("web")))

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	traced := trace.ContextWithRemoteSpanContext(ctx, runtime.ParseTraceParent("00-"+traceID+"-00f067aa0ba902b7-01"))
	res, err := rt.Execute(traced, runtime.Request{Tenant: "acme", Session: "s1", Input: `call:web__add({"a":2,"b":3})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Status != loop.StatusCompleted || !strings.HasPrefix(res.Run.TraceParent, "00-"+traceID+"-") {
		t.Fatalf("the Run ended %s with trace context %q, want completed in trace %s", res.Run.Status, res.Run.TraceParent, traceID)
	}
	got := srv.Traceparents()
	if len(got) != 1 || !strings.HasPrefix(got[0], "00-"+traceID+"-") || got[0] == res.Run.TraceParent {
		t.Fatalf("the MCP server's add was called with traceparents %q, want one of the tool call's span in trace %s", got, traceID)
	}
}

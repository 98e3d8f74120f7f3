package mcptasks_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/internal/mcptool/mcptest"
)

// connect opens a session to url over streamable HTTP through
// RoundTripper, at the revision of tasks.
func connect(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	if err := mcptasks.Register(c); err != nil {
		t.Fatal(err)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: mcptasks.RoundTripper(http.DefaultTransport)}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: mcptasks.ProtocolVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func content(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestATaskAugmentedCallThroughTheSDK: through RoundTripper, the SDK's
// client sees the server's tasks capability and the slow tool's
// taskSupport; a task-augmented call answers with a task, which tasks/get
// follows from working to completed, from another session too, and
// tasks/result gives the tool's result; the tool ran once. A plain call
// of a tool without tasks answers with its result.
func TestATaskAugmentedCallThroughTheSDK(t *testing.T) {
	srv := mcptest.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	cs := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if calls, cancels := mcptasks.ServerSupportsToolTasks(cs.InitializeResult()); !calls || !cancels {
		t.Fatalf("the server's tasks capability was not seen: tool calls %v, cancel %v", calls, cancels)
	}
	if v := cs.InitializeResult().ProtocolVersion; v != mcptasks.ProtocolVersion {
		t.Fatalf("negotiated %s, want %s", v, mcptasks.ProtocolVersion)
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	support := map[string]string{}
	for _, tl := range tools.Tools {
		support[tl.Name] = mcptasks.ToolTaskSupport(tl)
	}
	if support[mcptest.ToolSlow] != mcptasks.TaskOptional || support[mcptest.ToolAdd] != mcptasks.TaskForbidden {
		t.Fatalf("task support %v: want slow optional, add forbidden", support)
	}

	task, res, err := mcptasks.CallTool(ctx, cs, &mcp.CallToolParams{Name: mcptest.ToolSlow, Arguments: map[string]any{"label": "a"}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if task == nil || res != nil {
		t.Fatalf("a task-augmented call answered task %v, result %v; want a task", task, res)
	}
	if task.Status != mcptasks.StatusWorking || task.TTL == nil || *task.TTL != time.Hour.Milliseconds() {
		t.Fatalf("the task: %+v", task)
	}
	got, err := mcptasks.Get(ctx, cs, task.TaskID)
	if err != nil || got.Status != mcptasks.StatusWorking {
		t.Fatalf("tasks/get: %+v %v", got, err)
	}
	srv.Release("a")
	other := connect(t, url)
	for got.Status == mcptasks.StatusWorking {
		if got, err = mcptasks.Get(ctx, other, task.TaskID); err != nil {
			t.Fatal(err)
		}
	}
	if got.Status != mcptasks.StatusCompleted {
		t.Fatalf("the task ended %s", got.Status)
	}
	out, err := mcptasks.Result(ctx, other, task.TaskID)
	if err != nil || content(out) != "slow job a finished" {
		t.Fatalf("tasks/result: %v %v", out, err)
	}
	if n := srv.Runs("slow:a"); n != 1 {
		t.Fatalf("the slow job ran %d times", n)
	}
	if _, err := mcptasks.Get(ctx, cs, "nosuchtask"); !mcptasks.IsNotFound(err) {
		t.Fatalf("tasks/get of an unknown task: %v, want not found", err)
	}

	// A tool without tasks answers a task-augmented call with its result.
	task, res, err = mcptasks.CallTool(ctx, cs, &mcp.CallToolParams{Name: mcptest.ToolAdd, Arguments: map[string]any{"a": 2, "b": 3}}, time.Hour)
	if err != nil || task != nil || res == nil || content(res) != "2 + 3 = 5" {
		t.Fatalf("add: task %v result %v err %v", task, res, err)
	}
}

// TestATaskIsCancelled: tasks/cancel ends a working task as cancelled,
// and the job never finishes.
func TestATaskIsCancelled(t *testing.T) {
	srv := mcptest.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	cs := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task, _, err := mcptasks.CallTool(ctx, cs, &mcp.CallToolParams{Name: mcptest.ToolSlow, Arguments: map[string]any{"label": "c"}}, 0)
	if err != nil || task == nil {
		t.Fatalf("call: %v %v", task, err)
	}
	got, err := mcptasks.Cancel(ctx, cs, task.TaskID)
	if err != nil || got.Status != mcptasks.StatusCancelled {
		t.Fatalf("tasks/cancel: %+v %v", got, err)
	}
	if got, err = mcptasks.Get(ctx, cs, task.TaskID); err != nil || got.Status != mcptasks.StatusCancelled {
		t.Fatalf("tasks/get after the cancel: %+v %v", got, err)
	}
}

// TestTasksOverJSONAnswers: the same task, through a server that answers
// each request with one JSON body instead of a stream of events.
func TestTasksOverJSONAnswers(t *testing.T) {
	srv := mcptest.New()
	h := mcptasks.LiftHTTP(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() },
		&mcp.StreamableHTTPOptions{JSONResponse: true}))
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close) // after the session's close, which connect registers
	cs := connect(t, ts.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task, _, err := mcptasks.CallTool(ctx, cs, &mcp.CallToolParams{Name: mcptest.ToolSlow, Arguments: map[string]any{"label": "j"}}, time.Minute)
	if err != nil || task == nil {
		t.Fatalf("call: %v %v", task, err)
	}
	srv.Release("j")
	out, err := mcptasks.Result(ctx, cs, task.TaskID)
	if err != nil || content(out) != "slow job j finished" {
		t.Fatalf("tasks/result: %v %v", out, err)
	}
}

// TestAStreamsEventsAreRewrittenOneByOne: in a stream of events, the
// answer to a task-augmented call, its data split over several lines,
// becomes the SDK's shape; comments, IDs and other events pass as they
// are.
func TestAStreamsEventsAreRewrittenOneByOne(t *testing.T) {
	stream := ": a comment\n\nid: 1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n" +
		"id: 2\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\ndata: \"result\":{\"task\":{\"taskId\":\"t1\",\"status\":\"working\",\"createdAt\":\"x\",\"lastUpdatedAt\":\"x\",\"ttl\":null}}}\n\n"
	rt := mcptasks.RoundTripper(roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(strings.NewReader(stream)), Request: req}, nil
	}))
	req, _ := http.NewRequest("POST", "http://mcp.test/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","_meta":{"agenthost/request-task":{"ttl":1000}}}}`))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	got := string(b)
	for _, want := range []string{
		": a comment\n\n",
		"id: 1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"",
		"id: 2\nevent: message\ndata: {",
		`"content":[]`,
		`"agenthost/created-task":{"taskId":"t1"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the stream lacks %q:\n%s", want, got)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

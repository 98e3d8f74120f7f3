// Package mcptest is an MCP server on the official Go SDK for the tests of
// MCP tools: over streamable HTTP on 127.0.0.1, with a tool that a client
// may call as a task (MCP 2025-11-25, through internal/mcptasks) and one
// that it may not, each counting its executions; and over stdio, for a
// child process. For tests; not a stable API.
package mcptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
)

// The tools of the server.
const (
	// ToolAdd adds two numbers, {"a": 1, "b": 2}, answering "1 + 2 = 3".
	// It does not support tasks.
	ToolAdd = "add"
	// ToolSlow runs a job named by its label, {"label": "x"}, until the
	// test releases it (Release), answering "slow job x finished". Its
	// execution.taskSupport is optional: called as a task, it runs in
	// the background; called plainly, the call waits.
	ToolSlow = "slow"
	// ToolUpper upper-cases a text, {"text": "abc"}: the stdio server's.
	ToolUpper = "upper"
	// ToolFail answers isError with its text, {"text": "why"}.
	ToolFail = "fail"
	// ToolExit ends the stdio server's process without answering.
	ToolExit = "exit"
)

// Server is the MCP server of the tests. Its counts outlive a Stop, so
// that a test can tell how often a tool ran across restarts.
type Server struct {
	mcp *mcp.Server

	mu       sync.Mutex
	runs     map[string]int           // executions by tool, and "slow:LABEL" by label
	released map[string]chan struct{} // by slow job label
	tasks    map[string]*task
	http     *http.Server
	ln       net.Listener
	addr     string
	noTasks  bool
	// traceparents are the traceparent headers of add's calls, in order
	// ("" for a call without one, or over stdio).
	traceparents []string
}

type task struct {
	mu     sync.Mutex
	state  mcptasks.Task
	result *mcp.CallToolResult
	done   chan struct{}
	cancel context.CancelFunc
}

// New returns a server with the tools add, slow and fail; it serves
// nothing until Start.
func New() *Server {
	s := &Server{runs: map[string]int{}, released: map[string]chan struct{}{}, tasks: map[string]*task{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "agenthost-mcptest", Version: "1"}, nil)
	s.mcp.AddTool(&mcp.Tool{Name: ToolAdd, Description: "Adds two numbers.", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"],"additionalProperties":false}`)},
		s.add)
	s.mcp.AddTool(&mcp.Tool{Name: ToolSlow, Description: "Runs a slow job until the test releases it.", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"label":{"type":"string","minLength":1}},"required":["label"]}`)},
		s.slowPlain)
	s.mcp.AddTool(&mcp.Tool{Name: ToolFail, Description: "Fails with the text given.", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"text":{"type":"string"}}}`)},
		s.fail)
	s.mcp.AddReceivingMiddleware(s.taskMiddleware)
	must(mcp.AddReceivingCustomMethod(s.mcp, mcptasks.MethodGet, s.taskGet))
	must(mcp.AddReceivingCustomMethod(s.mcp, mcptasks.MethodResult, s.taskResult))
	must(mcp.AddReceivingCustomMethod(s.mcp, mcptasks.MethodCancel, s.taskCancel))
	return s
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// DisableTasks makes the server one without tasks: it advertises no tasks
// capability, and its slow tool no task support. Call it before Start.
func (s *Server) DisableTasks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noTasks = true
}

func (s *Server) tasksOff() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.noTasks
}

// MCP is the SDK's server, for a test that adds or removes tools.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Start serves streamable HTTP at addr ("127.0.0.1:0" picks a port) and
// returns the endpoint's URL. Started again after Stop, it listens at the
// same address.
func (s *Server) Start(addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addr != "" {
		addr = s.addr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	h := mcptasks.LiftHTTP(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, nil))
	s.ln, s.addr = ln, ln.Addr().String()
	s.http = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go s.http.Serve(ln)
	return s.URL(), nil
}

// Traceparents returns the traceparent headers add's calls came with, in
// order ("" for a call without one).
func (s *Server) Traceparents() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.traceparents...)
}

// URL is the endpoint's URL.
func (s *Server) URL() string { return "http://" + s.addr + "/mcp" }

// Stop closes the listener and every connection at once, as a server
// that went away would.
func (s *Server) Stop() {
	s.mu.Lock()
	h := s.http
	s.http = nil
	s.mu.Unlock()
	if h != nil {
		h.Close()
	}
}

// ServeStdio serves the tools upper, add and exit over stdin and stdout until
// the client closes stdin.
func ServeStdio(ctx context.Context) error {
	s := mcp.NewServer(&mcp.Implementation{Name: "agenthost-mcptest-stdio", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: ToolUpper, Description: "Upper-cases a text.", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct{ Text string }
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, err
			}
			return text(strings.ToUpper(args.Text)), nil
		})
	s.AddTool(&mcp.Tool{Name: ToolExit, Description: "Ends the server's process.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			os.Exit(3)
			return nil, nil
		})
	srv := New()
	s.AddTool(&mcp.Tool{Name: ToolAdd, Description: "Adds two numbers.", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`)}, srv.add)
	return s.Run(ctx, &mcp.StdioTransport{})
}

// Runs returns how often a tool ran (an execution of its handler, or the
// start of its task), or, for "slow:LABEL", the slow job of that label.
func (s *Server) Runs(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[name]
}

// Release lets the slow job of label finish, now or when it starts.
func (s *Server) Release(label string) {
	ch := s.releaseCh(label)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// Tasks returns the number of tasks the server created.
func (s *Server) Tasks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks)
}

func (s *Server) releaseCh(label string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.released[label]
	if !ok {
		ch = make(chan struct{})
		s.released[label] = ch
	}
	return ch
}

func (s *Server) count(name string) {
	s.mu.Lock()
	s.runs[name]++
	s.mu.Unlock()
}

func text(t string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: t}}}
}

func (s *Server) add(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	s.count(ToolAdd)
	tp := ""
	if req.Extra != nil && req.Extra.Header != nil {
		tp = req.Extra.Header.Get("traceparent")
	}
	s.mu.Lock()
	s.traceparents = append(s.traceparents, tp)
	s.mu.Unlock()
	var args struct{ A, B float64 }
	if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
		return nil, err
	}
	return text(fmt.Sprintf("%g + %g = %g", args.A, args.B, args.A+args.B)), nil
}

func (s *Server) fail(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	s.count(ToolFail)
	var args struct{ Text string }
	_ = json.Unmarshal(req.Params.Arguments, &args)
	r := text(args.Text)
	r.IsError = true
	return r, nil
}

// slowPlain is the slow tool called without a task.
func (s *Server) slowPlain(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	label, err := slowLabel(req.Params.Arguments)
	if err != nil {
		return nil, err
	}
	s.count(ToolSlow)
	s.count("slow:" + label)
	return s.slowJob(ctx, label)
}

func slowLabel(raw json.RawMessage) (string, error) {
	var args struct{ Label string }
	if err := json.Unmarshal(raw, &args); err != nil || args.Label == "" {
		return "", fmt.Errorf("want {\"label\": \"…\"}")
	}
	return args.Label, nil
}

func (s *Server) slowJob(ctx context.Context, label string) (*mcp.CallToolResult, error) {
	select {
	case <-s.releaseCh(label):
		return text("slow job " + label + " finished"), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// rawResult is a result the middleware marshals itself, with what the
// SDK's types have no field for.
type rawResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *rawResult) MarshalJSON() ([]byte, error) { return r.raw, nil }

// taskMiddleware adds tasks to the SDK's server: the tasks capability to
// initialize, execution.taskSupport to the slow tool in tools/list, and a
// task for a task-augmented call of it.
func (s *Server) taskMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if s.tasksOff() {
			return next(ctx, method, req)
		}
		switch method {
		case "tools/call":
			p, _ := req.GetParams().(*mcp.CallToolParamsRaw)
			if md, ok := mcptasks.RequestedTask(p); ok && p.Name == ToolSlow {
				return s.startTask(p, md)
			}
			return next(ctx, method, req)
		case "initialize":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			return patch(res, func(m map[string]any) {
				caps, _ := m["capabilities"].(map[string]any)
				if caps == nil {
					caps = map[string]any{}
					m["capabilities"] = caps
				}
				caps["tasks"] = map[string]any{"list": map[string]any{}, "cancel": map[string]any{},
					"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}
			})
		case "tools/list":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			return patch(res, func(m map[string]any) {
				tools, _ := m["tools"].([]any)
				for _, t := range tools {
					if tm, ok := t.(map[string]any); ok && tm["name"] == ToolSlow {
						tm["execution"] = map[string]any{"taskSupport": mcptasks.TaskOptional}
					}
				}
			})
		}
		return next(ctx, method, req)
	}
}

// patch returns res as JSON, changed by fn.
func patch(res mcp.Result, fn func(map[string]any)) (mcp.Result, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	fn(m)
	if b, err = json.Marshal(m); err != nil {
		return nil, err
	}
	return &rawResult{raw: b}, nil
}

// startTask starts a slow job as a task, and answers with the task.
func (s *Server) startTask(p *mcp.CallToolParamsRaw, md mcptasks.Metadata) (mcp.Result, error) {
	label, err := slowLabel(p.Arguments)
	if err != nil {
		return nil, err
	}
	s.count(ToolSlow)
	s.count("slow:" + label)
	var id [16]byte
	_, _ = rand.Read(id[:])
	now := time.Now().UTC().Format(time.RFC3339Nano)
	ctx, cancel := context.WithCancel(context.Background())
	t := &task{done: make(chan struct{}), cancel: cancel, state: mcptasks.Task{
		TaskID: hex.EncodeToString(id[:]), Status: mcptasks.StatusWorking, CreatedAt: now, LastUpdatedAt: now, PollInterval: 50,
	}}
	if md.TTL > 0 {
		ttl := md.TTL
		t.state.TTL = &ttl
	}
	s.mu.Lock()
	s.tasks[t.state.TaskID] = t
	s.mu.Unlock()
	go func() {
		res, err := s.slowJob(ctx, label)
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.state.Status.Terminal() {
			return // cancelled
		}
		t.state.LastUpdatedAt = time.Now().UTC().Format(time.RFC3339Nano)
		if err != nil {
			t.state.Status, t.state.StatusMessage = mcptasks.StatusFailed, err.Error()
			t.result = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}, IsError: true}
		} else {
			t.state.Status, t.result = mcptasks.StatusCompleted, res
		}
		close(t.done)
	}()
	return &mcptasks.CreateTaskResult{Task: t.state}, nil
}

// errNoTask is the answer for an unknown task ID: invalid params, as the
// revision says.
var errNoTask = &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no such task"}

func (s *Server) task(id string) (*task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return nil, errNoTask
	}
	return t, nil
}

func (s *Server) taskGet(_ context.Context, _ *mcp.ServerSession, p *mcptasks.TaskParams) (*mcptasks.TaskResult, error) {
	t, err := s.task(p.TaskID)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	state := t.state
	t.mu.Unlock()
	s.count(countGets) // after the state is read: a test that sees the count knows what was answered
	return &mcptasks.TaskResult{Task: state}, nil
}

// countGets counts the tasks/get answered (Runs).
const countGets = "tasks/get"

// Gets returns the number of tasks/get the server has answered.
func (s *Server) Gets() int { return s.Runs(countGets) }

func (s *Server) taskResult(ctx context.Context, _ *mcp.ServerSession, p *mcptasks.TaskParams) (*mcp.CallToolResult, error) {
	t, err := s.task(p.TaskID)
	if err != nil {
		return nil, err
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.result == nil {
		return nil, errors.New("the task was cancelled")
	}
	return t.result, nil
}

func (s *Server) taskCancel(_ context.Context, _ *mcp.ServerSession, p *mcptasks.TaskParams) (*mcptasks.TaskResult, error) {
	t, err := s.task(p.TaskID)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state.Status.Terminal() {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the task has ended: " + string(t.state.Status)}
	}
	t.cancel()
	t.state.Status, t.state.StatusMessage = mcptasks.StatusCancelled, "cancelled by the client"
	t.state.LastUpdatedAt = time.Now().UTC().Format(time.RFC3339Nano)
	close(t.done)
	return &mcptasks.TaskResult{Task: t.state}, nil
}

package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The tasks of MCP revision 2025-11-25
// (https://modelcontextprotocol.io/specification/2025-11-25/basic/utilities/tasks),
// for tools/call, on the SDK's hooks.

// tasksCapability is the server's capabilities.tasks: tools/call takes a
// task; tasks can be listed and cancelled.
var tasksCapability = json.RawMessage(`{"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}`)

// taskSupport is every tool's execution: a call may be a task, or not.
var taskSupport = json.RawMessage(`{"taskSupport": "optional"}`)

// jsonResult is a result sent as the JSON it holds: a result of the SDK
// with the fields of tasks its types lack.
type jsonResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *jsonResult) MarshalJSON() ([]byte, error) { return r.raw, nil }

// withField returns res's JSON with field set to value in the object at
// path (each element a key, "*" every element of an array).
func withField(res mcp.Result, value json.RawMessage, field string, path ...string) (mcp.Result, error) {
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	out, err := setField(raw, value, field, path)
	if err != nil {
		return nil, err
	}
	return &jsonResult{raw: out}, nil
}

func setField(raw, value json.RawMessage, field string, path []string) (json.RawMessage, error) {
	if len(path) > 0 && path[0] == "*" {
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return nil, err
		}
		for i := range arr {
			var err error
			if arr[i], err = setField(arr[i], value, field, path[1:]); err != nil {
				return nil, err
			}
		}
		return json.Marshal(arr)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	if len(path) == 0 {
		obj[field] = value
		return json.Marshal(obj)
	}
	inner, err := setField(obj[path[0]], value, field, path[1:])
	if err != nil {
		return nil, err
	}
	obj[path[0]] = inner
	return json.Marshal(obj)
}

// tasksMiddleware adds tasks to the SDK's methods: the capability to
// initialize, each tool's taskSupport to tools/list, and, to tools/call,
// the call as a task when it asks for one.
func (ts *tenantServer) tasksMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			return withField(res, tasksCapability, "tasks", "capabilities")
		case "tools/list":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			return withField(res, taskSupport, "execution", "tools", "*")
		case "tools/call":
			if call, ok := req.(*mcp.CallToolRequest); ok && call.Params != nil {
				if _, asked := mcptasks.RequestedTask(call.Params); asked {
					return ts.createTask(ctx, call)
				}
			}
		}
		return next(ctx, method, req)
	}
}

// taskListResult answers tasks/list.
type taskListResult struct {
	mcp.ResultBase
	Tasks      []mcptasks.Task `json:"tasks"`
	NextCursor string          `json:"nextCursor,omitempty"`
}

// listParams are the params of tasks/list.
type listParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

// tasksPage is how many tasks a page of tasks/list holds.
const tasksPage = 50

// createTask serves a tools/call made as a task: it submits the Run and
// answers its task at once.
func (ts *tenantServer) createTask(ctx context.Context, call *mcp.CallToolRequest) (mcp.Result, error) {
	sub, err := ts.submission(call.Params.Name, call.Params.Arguments)
	if err != nil {
		return nil, err
	}
	run, err := ts.h.cfg.Backend.Submit(ctx, ts.tenant, sub)
	if err != nil {
		return nil, ts.refusal("submit a Run", err)
	}
	return &mcptasks.CreateTaskResult{Task: ts.task(run)}, nil
}

// refusal is a Backend's error as a JSON-RPC error: a refusal says what
// the API says, with its status and code as data.
func (ts *tenantServer) refusal(what string, err error) error {
	var refused *Error
	if !errors.As(err, &refused) {
		return ts.internal(what, err)
	}
	code := int64(codeServerError)
	if refused.Status >= 400 && refused.Status < 500 && refused.Status != 429 {
		code = jsonrpc.CodeInvalidParams
	}
	data, _ := json.Marshal(map[string]any{"status": refused.Status, "code": refused.Code, "retry_after_seconds": int(refused.RetryAfter.Seconds())})
	return &jsonrpc.Error{Code: code, Message: refused.Message, Data: data}
}

// addTaskMethods registers tasks/get, tasks/result, tasks/cancel and
// tasks/list.
func (ts *tenantServer) addTaskMethods() {
	must := func(err error) {
		if err != nil {
			panic(err) // a name the SDK knows: a bug of this package
		}
	}
	must(mcp.AddReceivingCustomMethod(ts.server, mcptasks.MethodGet, func(ctx context.Context, _ *mcp.ServerSession, p *mcptasks.TaskParams) (*mcptasks.TaskResult, error) {
		run, err := ts.loadTask(ctx, p)
		if err != nil {
			return nil, err
		}
		return &mcptasks.TaskResult{Task: ts.task(run)}, nil
	}))
	must(mcp.AddReceivingCustomMethod(ts.server, mcptasks.MethodResult, func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.TaskParams) (*mcp.CallToolResult, error) {
		run, err := ts.loadTask(ctx, p)
		if err != nil {
			return nil, err
		}
		end, err := ts.awaitEnd(ctx, ss, run, nil, true)
		if err != nil {
			return nil, ts.waitError(run.ID, err)
		}
		res := ts.toolResult(end)
		res.Meta = mcp.Meta{relatedTaskKey: map[string]string{"taskId": end.ID}, runMetaKey: end.ID}
		return res, nil
	}))
	must(mcp.AddReceivingCustomMethod(ts.server, mcptasks.MethodCancel, func(ctx context.Context, _ *mcp.ServerSession, p *mcptasks.TaskParams) (*mcptasks.TaskResult, error) {
		run, err := ts.loadTask(ctx, p)
		if err != nil {
			return nil, err
		}
		if run.Status.Terminal() {
			return nil, invalidParams("task %s is %s already; only a task that has not ended can be cancelled", run.ID, ts.task(run).Status)
		}
		cur, err := ts.h.cfg.Backend.Cancel(ctx, ts.tenant, run.ID, "cancelled through MCP tasks/cancel")
		if errors.Is(err, loop.ErrNoChange) || errors.Is(err, loop.ErrTerminal) { // already ending
			cur, err = ts.h.cfg.Backend.LoadRun(ctx, ts.tenant, run.ID)
		}
		if err != nil {
			return nil, ts.refusal("cancel run "+run.ID, err)
		}
		return &mcptasks.TaskResult{Task: ts.task(cur)}, nil
	}))
	must(mcp.AddReceivingCustomMethod(ts.server, "tasks/list", func(ctx context.Context, _ *mcp.ServerSession, p *listParams) (*taskListResult, error) {
		cursor := ""
		if p != nil {
			cursor = p.Cursor
		}
		if cursor != "" && !loop.ValidID(cursor) {
			return nil, invalidParams("cursor %q is not one this server gave: send the nextCursor of the page before", cut(cursor, 80))
		}
		runs, next, err := ts.h.cfg.Backend.Runs(ctx, ts.tenant, cursor, tasksPage)
		if err != nil {
			return nil, ts.refusal("list tasks", err)
		}
		out := &taskListResult{Tasks: make([]mcptasks.Task, 0, len(runs)), NextCursor: next}
		for _, run := range runs {
			out.Tasks = append(out.Tasks, ts.task(run))
		}
		return out, nil
	}))
}

// loadTask reads the task's Run from the store. An unknown ID and
// another tenant's answer the same error.
func (ts *tenantServer) loadTask(ctx context.Context, p *mcptasks.TaskParams) (loop.Run, error) {
	if p == nil || p.TaskID == "" {
		return loop.Run{}, invalidParams("params need \"taskId\": the ID of a task (a Run's ID)")
	}
	notFound := invalidParams("task %q not found; check the taskId (the task's ID is its Run's) and that the token belongs to the tenant that created it", cut(p.TaskID, 80))
	if !loop.ValidID(p.TaskID) {
		return loop.Run{}, notFound
	}
	run, err := ts.h.cfg.Backend.LoadRun(ctx, ts.tenant, p.TaskID)
	if errors.Is(err, runtime.ErrRunNotFound) || errors.Is(err, loop.ErrInvalidID) {
		return loop.Run{}, notFound
	}
	if err != nil {
		return loop.Run{}, ts.refusal("read task "+p.TaskID, err)
	}
	return run, nil
}

// task is a Run as a task.
func (ts *tenantServer) task(run loop.Run) mcptasks.Task {
	return mcptasks.Task{TaskID: run.ID, Status: taskStatus(run), StatusMessage: statusMessage(run),
		CreatedAt: rfc3339(run.CreatedAt), LastUpdatedAt: rfc3339(run.UpdatedAt), PollInterval: ts.h.cfg.PollInterval.Milliseconds()}
}

// taskStatus is the task status of a Run's.
func taskStatus(run loop.Run) mcptasks.Status {
	switch run.Status {
	case loop.StatusCompleted:
		return mcptasks.StatusCompleted
	case loop.StatusFailed:
		return mcptasks.StatusFailed
	case loop.StatusCancelled:
		return mcptasks.StatusCancelled
	case loop.StatusWaiting:
		if w := runtime.WaitingFor(run); len(w.Approvals) > 0 || w.Input != nil {
			return mcptasks.StatusInputRequired
		}
	}
	return mcptasks.StatusWorking
}

// statusMessage says where the Run stands, and, while it waits for a
// person, what it waits for and how to answer.
func statusMessage(run loop.Run) string {
	switch run.Status {
	case loop.StatusCompleted:
		return "the run completed"
	case loop.StatusFailed, loop.StatusCancelled:
		if f := run.Failure; f != nil {
			return fmt.Sprintf("the run %s (%s): %s", run.Status, f.Class, cut(f.Message, 500))
		}
		return "the run " + string(run.Status)
	}
	w := runtime.WaitingFor(run)
	switch {
	case len(w.Approvals) > 0:
		calls := make([]string, 0, len(w.Approvals))
		for _, id := range w.Approvals {
			tool, _ := toolCall(run, id)
			calls = append(calls, fmt.Sprintf("%s (tool call %s)", tool, id))
		}
		return fmt.Sprintf("waiting for the approval of %s: approve through the elicitation tasks/result sends, or POST /v1/runs/%s/input {\"approvals\": [{\"tool_call_id\": ..., \"approved\": true}]}",
			strings.Join(calls, ", "), run.ID)
	case w.Input != nil:
		return fmt.Sprintf("waiting for an answer to the agent's question %q: answer through the elicitation tasks/result sends, or POST /v1/runs/%s/input {\"message\": ...}",
			cut(w.Input.Prompt, 500), run.ID)
	case w.Queued:
		return fmt.Sprintf("queued: an earlier Run of session %s has not ended", run.Session)
	case run.Status == loop.StatusPending:
		return "pending"
	}
	return fmt.Sprintf("running (step %d)", run.Step)
}

func rfc3339(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

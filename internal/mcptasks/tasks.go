// Package mcptasks is MCP's tasks, as the protocol revision 2025-11-25
// defines them, on top of the official Go SDK
// (github.com/modelcontextprotocol/go-sdk), which does not implement
// them: a task-augmented tools/call, whose answer is a task (a durable
// handle) rather than the tool's result, and tasks/get, tasks/result and
// tasks/cancel, which ask about it later, from any connection to the
// same server.
//
// The SDK's types have no field for what tasks add to its messages (the
// task of a request's params and of a result, the tasks capability of a
// server, a tool's execution.taskSupport), and its client decodes every
// result into its own types. So this package moves those fields through
// the SDK under private _meta keys, rewriting the JSON-RPC messages
// where they cross the transport (rewrite.go): a request's private
// marker becomes params.task on the way out, and on the way in a
// CreateTaskResult becomes a CallToolResult whose _meta holds the task,
// and the tasks capability and each tool's execution move into _meta.
// tasks/get, tasks/result and tasks/cancel are the SDK's custom methods
// (mcp.AddSendingCustomMethod). The server side's one rewrite is LiftHTTP
// (server.go).
package mcptasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ProtocolVersion is the revision of MCP whose tasks this package speaks;
// a client that uses them asks for it (mcp.ClientSessionOptions).
const ProtocolVersion = "2025-11-25"

// The methods of tasks.
const (
	MethodGet    = "tasks/get"
	MethodResult = "tasks/result"
	MethodCancel = "tasks/cancel"
)

// RelatedTaskKey is the _meta key by which a message names the task it
// belongs to.
const RelatedTaskKey = "io.modelcontextprotocol/related-task"

// The private _meta keys under which the fields the SDK has no room for
// cross it. They never reach the wire: the rewrites of rewrite.go and
// LiftHTTP put them in and take them out.
const (
	// metaRequestTask, in a tools/call's params, asks for a task: its
	// value is the request's task metadata (Metadata).
	metaRequestTask = "agenthost/request-task"
	// metaCreatedTask, in a tools/call's result, is the task the server
	// created instead of answering.
	metaCreatedTask = "agenthost/created-task"
	// metaServerTasks, in an initialize result, is the server's tasks
	// capability.
	metaServerTasks = "agenthost/server-tasks"
	// metaExecution, in a tool of tools/list, is the tool's execution.
	metaExecution = "agenthost/execution"
)

// Status is a task's status.
type Status string

// The statuses of a task; completed, failed and cancelled are terminal.
const (
	StatusWorking       Status = "working"
	StatusInputRequired Status = "input_required"
	StatusCompleted     Status = "completed"
	StatusFailed        Status = "failed"
	StatusCancelled     Status = "cancelled"
)

// Terminal reports whether the task has ended.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Task is a task's state as a server reports it.
type Task struct {
	TaskID        string `json:"taskId"`
	Status        Status `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTL is how long, in milliseconds from its creation, the server
	// keeps the task; nil is for ever.
	TTL *int64 `json:"ttl"`
	// PollInterval is the server's suggested time between polls, in
	// milliseconds; 0 when it suggests none.
	PollInterval int64 `json:"pollInterval,omitempty"`
}

// Metadata is what a task-augmented request asks of its task (params.task).
type Metadata struct {
	// TTL asks the server to keep the task this many milliseconds from
	// its creation; 0 leaves it to the server.
	TTL int64 `json:"ttl,omitempty"`
}

// CreateTaskResult answers a task-augmented request.
type CreateTaskResult struct {
	mcp.ResultBase
	Task Task `json:"task"`
}

// TaskParams are the params of tasks/get, tasks/result and tasks/cancel.
type TaskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
}

// TaskResult answers tasks/get and tasks/cancel: the task's state.
type TaskResult struct {
	mcp.ResultBase
	Task
}

// Register makes c able to send tasks/get, tasks/result and tasks/cancel.
func Register(c *mcp.Client) error {
	return errors.Join(
		mcp.AddSendingCustomMethod[*TaskParams, *TaskResult](c, MethodGet),
		mcp.AddSendingCustomMethod[*TaskParams, *mcp.CallToolResult](c, MethodResult),
		mcp.AddSendingCustomMethod[*TaskParams, *TaskResult](c, MethodCancel),
	)
}

// ServerSupportsToolTasks reports whether the server of an initialize
// result (through a transport of this package) accepts task-augmented
// tools/call, and whether it accepts tasks/cancel.
func ServerSupportsToolTasks(res *mcp.InitializeResult) (toolCalls, cancel bool) {
	if res == nil {
		return false, false
	}
	var caps struct {
		Cancel   *json.RawMessage `json:"cancel"`
		Requests struct {
			Tools struct {
				Call *json.RawMessage `json:"call"`
			} `json:"tools"`
		} `json:"requests"`
	}
	if !fromMeta(res.Meta, metaServerTasks, &caps) {
		return false, false
	}
	return caps.Requests.Tools.Call != nil, caps.Cancel != nil
}

// The values of a tool's execution.taskSupport.
const (
	TaskForbidden = "forbidden"
	TaskOptional  = "optional"
	TaskRequired  = "required"
)

// ToolTaskSupport returns a tool's execution.taskSupport (listed through a
// transport of this package): TaskOptional, TaskRequired, or
// TaskForbidden, its default.
func ToolTaskSupport(t *mcp.Tool) string {
	var exec struct {
		TaskSupport string `json:"taskSupport"`
	}
	if t == nil || !fromMeta(t.Meta, metaExecution, &exec) {
		return TaskForbidden
	}
	switch exec.TaskSupport {
	case TaskOptional, TaskRequired:
		return exec.TaskSupport
	}
	return TaskForbidden
}

// CallTool calls a tool as a task: a task-augmented tools/call asking the
// server to keep the task for ttl (0: as long as it likes). It returns
// the task the server created, or, when the server answered the call
// itself instead (which it may), its result. The session must run on a
// transport of this package (WrapTransport, RoundTripper); on another
// the call is a plain one, and answers with its result.
func CallTool(ctx context.Context, cs *mcp.ClientSession, params *mcp.CallToolParams, ttl time.Duration) (*Task, *mcp.CallToolResult, error) {
	p := *params
	p.Meta = maps.Clone(params.Meta)
	if p.Meta == nil {
		p.Meta = mcp.Meta{}
	}
	p.Meta[metaRequestTask] = Metadata{TTL: ttl.Milliseconds()}
	res, err := cs.CallTool(ctx, &p)
	if err != nil {
		return nil, nil, err
	}
	var t Task
	if fromMeta(res.Meta, metaCreatedTask, &t) {
		if t.TaskID == "" {
			return nil, nil, fmt.Errorf("mcptasks: the server created a task without an ID")
		}
		return &t, nil, nil
	}
	return nil, res, nil
}

// Get asks for a task's state (tasks/get).
func Get(ctx context.Context, cs *mcp.ClientSession, taskID string) (Task, error) {
	r, err := mcp.CallCustomMethod[*TaskParams, *TaskResult](ctx, cs, MethodGet, &TaskParams{TaskID: taskID})
	if err != nil {
		return Task{}, err
	}
	return r.Task, nil
}

// Result asks for the result of a task-augmented tools/call
// (tasks/result). The server answers once the task has ended; asked
// earlier, it holds the request until then.
func Result(ctx context.Context, cs *mcp.ClientSession, taskID string) (*mcp.CallToolResult, error) {
	return mcp.CallCustomMethod[*TaskParams, *mcp.CallToolResult](ctx, cs, MethodResult, &TaskParams{TaskID: taskID})
}

// Cancel asks the server to cancel a task (tasks/cancel), and returns its
// state after.
func Cancel(ctx context.Context, cs *mcp.ClientSession, taskID string) (Task, error) {
	r, err := mcp.CallCustomMethod[*TaskParams, *TaskResult](ctx, cs, MethodCancel, &TaskParams{TaskID: taskID})
	if err != nil {
		return Task{}, err
	}
	return r.Task, nil
}

// IsNotFound reports whether err is a server's answer that it has no such
// task (or no longer has it): a JSON-RPC error "invalid params", which is
// what the revision prescribes for an unknown task ID.
func IsNotFound(err error) bool {
	var we *jsonrpc.Error
	return errors.As(err, &we) && we.Code == jsonrpc.CodeInvalidParams
}

// fromMeta decodes meta[key] into v, reporting whether it was there and
// decoded.
func fromMeta(meta mcp.Meta, key string, v any) bool {
	raw, ok := meta[key]
	if !ok || raw == nil {
		return false
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return false
	}
	return json.Unmarshal(b, v) == nil
}

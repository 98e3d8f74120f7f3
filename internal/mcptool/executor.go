package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// IdempotencyKey is the _meta key under which every tool call carries its
// effect attempt's assignment key (tenant/session/effect#attempt): the
// same for every try of one attempt, so that a server that keeps such
// keys can tell a call it has seen.
const IdempotencyKey = "agenthost/idempotency-key"

// Poll intervals of a task, around the server's suggestion.
const (
	defaultPollInterval = time.Second
	minPollInterval     = 100 * time.Millisecond
	maxPollInterval     = 30 * time.Second
)

// Executor returns the executor of the server's tool of that name (the
// server's own): each effect one call of it.
//
//   - Start: with a server that accepts task-augmented tool calls and a
//     tool that supports tasks, a task-augmented tools/call, whose task's
//     ID is the pending handle; otherwise a plain call, done with its
//     result. The effect's assignment key goes with it (IdempotencyKey).
//     A server not connected is executor_unavailable (nothing was sent).
//   - Poll and Attach: tasks/get of the handle, then tasks/result once the
//     task has ended. Without a handle (a plain call, or a crash before
//     the task's ID was stored), or for a task the server does not know
//     (any more), unknown: the missing-effect policy decides.
//   - Cancel: tasks/cancel of the handle.
//
// A failure that leaves the call's fate unknown (the connection broke,
// the call timed out) is an error that is not a *runtime.PluginError: the
// runtime defers the attempt and attaches again, as for any executor it
// could not reach.
func (s *Server) Executor(tool string) runtime.Executor {
	return &toolExecutor{s: s, tool: tool}
}

type toolExecutor struct {
	s    *Server
	tool string // the server's own name
}

var _ runtime.EndpointNamer = (*toolExecutor)(nil)

// Endpoint names the server, for the runtime's logs: mcp/NAME.
func (x *toolExecutor) Endpoint() string { return "mcp/" + x.s.cfg.Name }

func (x *toolExecutor) who() string { return "mcp server " + x.s.cfg.Name }

// unavailable is the plugin error of a call made while the server is not
// connected.
func (x *toolExecutor) unavailable(export string) error {
	return &runtime.PluginError{Class: abi.ClassExecutorUnavailable, Plugin: x.who(), Export: export,
		Err: &runtime.PluginMessage{Text: x.s.unavailable()}}
}

func (x *toolExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	cs, taskCalls, _ := x.s.current()
	if cs == nil {
		return abi.EffectReply{}, x.unavailable(abi.ExportStart)
	}
	var req abi.ToolRequest
	if err := json.Unmarshal(c.Input.Effect.Request, &req); err != nil {
		return abi.EffectReply{}, &runtime.PluginError{Class: abi.ClassPluginProtocol, Plugin: x.who(), Export: abi.ExportStart, Err: err}
	}
	args := req.Arguments
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	params := &mcp.CallToolParams{Name: x.tool, Arguments: args, Meta: mcp.Meta{IdempotencyKey: c.Input.Effect.AssignmentKey}}
	ctx, cancel := context.WithTimeout(ctx, x.s.cfg.CallTimeout)
	defer cancel()
	if taskCalls && x.supportsTasks() {
		task, res, err := mcptasks.CallTool(ctx, cs, params, x.s.cfg.TaskTTL)
		switch {
		case err != nil:
			return x.callFailed(cs, err)
		case res != nil:
			return x.done(res), nil
		}
		if task.Status.Terminal() {
			return x.ended(ctx, cs, *task)
		}
		return x.pending(*task), nil
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return x.callFailed(cs, err)
	}
	return x.done(res), nil
}

// supportsTasks reports whether the tool, as last listed, supports tasks.
func (x *toolExecutor) supportsTasks() bool {
	for _, t := range x.s.Tools() {
		if t.Original == x.tool {
			return t.TaskSupport != mcptasks.TaskForbidden
		}
	}
	return false
}

func (x *toolExecutor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return x.look(ctx, c)
}

func (x *toolExecutor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return x.look(ctx, c)
}

// look answers for the task of the handle: pending while it works, its
// result once it has ended, unknown without a handle or for a task the
// server does not know.
func (x *toolExecutor) look(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	if c.Input.Handle == "" {
		return abi.EffectReply{State: abi.StateUnknown}, nil
	}
	cs, _, _ := x.s.current()
	if cs == nil {
		return abi.EffectReply{}, errors.New(x.s.unavailable())
	}
	ctx, cancel := context.WithTimeout(ctx, x.s.cfg.CallTimeout)
	defer cancel()
	task, err := mcptasks.Get(ctx, cs, c.Input.Handle)
	switch {
	case mcptasks.IsNotFound(err):
		return abi.EffectReply{State: abi.StateUnknown}, nil
	case err != nil:
		return x.callFailed(cs, err)
	case task.Status.Terminal():
		return x.ended(ctx, cs, task)
	case task.Status == mcptasks.StatusInputRequired:
		// agenthost gives an MCP tool no input: the task would wait for
		// ever. Stop it, and fail the call.
		if _, err := mcptasks.Cancel(ctx, cs, task.TaskID); err != nil {
			x.s.log.Info("mcp: cancelling a task that asked for input failed", "task", task.TaskID, "err", err)
		}
		return failed(fmt.Sprintf("the tool asked for input, which agenthost does not give to MCP tools (%s)", clip(task.StatusMessage, 512))), nil
	}
	return x.pending(task), nil
}

// ended answers for a task that has ended: its result (tasks/result) when
// it completed or failed, a failure when it was cancelled.
func (x *toolExecutor) ended(ctx context.Context, cs *mcp.ClientSession, task mcptasks.Task) (abi.EffectReply, error) {
	if task.Status == mcptasks.StatusCancelled {
		return failed("the MCP server cancelled the tool's task: " + clip(task.StatusMessage, 512)), nil
	}
	res, err := mcptasks.Result(ctx, cs, task.TaskID)
	if err != nil {
		if mcptasks.IsNotFound(err) {
			return abi.EffectReply{State: abi.StateUnknown}, nil
		}
		return x.callFailed(cs, err)
	}
	r := x.done(res)
	r.Handle = task.TaskID
	return r, nil
}

func (x *toolExecutor) pending(task mcptasks.Task) abi.EffectReply {
	poll := defaultPollInterval
	if task.PollInterval > 0 {
		poll = min(max(time.Duration(task.PollInterval)*time.Millisecond, minPollInterval), maxPollInterval)
	}
	return abi.EffectReply{State: abi.StatePending, Handle: task.TaskID, PollAfterMS: poll.Milliseconds()}
}

func (x *toolExecutor) done(res *mcp.CallToolResult) abi.EffectReply {
	out, _ := json.Marshal(Outcome(res, x.s.cfg.MaxResultBytes))
	return abi.EffectReply{State: abi.StateDone, Outcome: out}
}

// failed is a failed reply: the tool's failure in words, which the model
// reads as its error.
func failed(msg string) abi.EffectReply {
	return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: msg}}
}

// callFailed answers for a request that got no result: the server's
// error answer is the call's failure (it did not run, or failed, by the
// server's word); anything else (the connection, the time) leaves the
// call's fate unknown. A broken connection is looked at at once.
func (x *toolExecutor) callFailed(cs *mcp.ClientSession, err error) (abi.EffectReply, error) {
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		return failed("the MCP server answered the call with an error: " + clip(we.Message, 512)), nil
	}
	if errors.Is(err, mcp.ErrConnectionClosed) {
		x.s.checkConnection(cs)
	}
	return abi.EffectReply{}, fmt.Errorf("mcp server %s: %w", x.s.cfg.Name, err)
}

func (x *toolExecutor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	if c.Input.Handle == "" {
		// A plain call: its context ended with the attempt (the SDK tells
		// the server, notifications/cancelled).
		return abi.CancelReply{State: abi.StateCancelled}, nil
	}
	cs, _, taskCancel := x.s.current()
	if cs == nil {
		return abi.CancelReply{}, errors.New(x.s.unavailable())
	}
	if !taskCancel {
		return abi.CancelReply{State: abi.StateUnknown}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, x.s.cfg.CallTimeout)
	defer cancel()
	_, err := mcptasks.Cancel(ctx, cs, c.Input.Handle)
	var we *jsonrpc.Error
	switch {
	case err == nil:
		return abi.CancelReply{State: abi.StateCancelled}, nil
	case mcptasks.IsNotFound(err):
		// An unknown task, or one that has ended (the revision answers
		// both the same way): look.
	case !errors.As(err, &we):
		return abi.CancelReply{}, err
	}
	// The server refused: the task may have ended already.
	r, err := x.look(ctx, c)
	switch {
	case err != nil:
		return abi.CancelReply{}, err
	case r.State == abi.StateDone:
		return abi.CancelReply{State: abi.StateDone, Outcome: r.Outcome}, nil
	case r.State == abi.StateUnknown:
		return abi.CancelReply{State: abi.StateUnknown}, nil
	}
	return abi.CancelReply{State: abi.StateCancelled}, nil
}

// checkConnection pings the server when a call found its connection
// broken, and closes the session when the ping fails too, so that the
// server's goroutine reconnects now rather than at the next keep-alive.
func (s *Server) checkConnection(cs *mcp.ClientSession) {
	go func() {
		ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
		defer cancel()
		if err := cs.Ping(ctx, nil); err != nil {
			cs.Close()
		}
	}()
}

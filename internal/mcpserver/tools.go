package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// inputSchema is every agent tool's input: the question (the Run's input)
// and, optionally, the session the Run joins.
var inputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "question": {"type": "string", "minLength": 1, "description": "What to ask the agent: the Run's input."},
    "session": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$",
      "description": "The session the Run joins: its Runs run one at a time, and the agent sees the earlier ones' conversation. Absent: a session of its own."}
  },
  "required": ["question"],
  "additionalProperties": false
}`)

// maxDescription bounds a tool's description made from an agent's
// instructions.
const maxDescription = 300

// toolOf is an agent's tool: its name, a description, the input schema,
// and the agent's output schema when that describes a JSON object (MCP
// 2025-11-25 takes no other).
func toolOf(a Agent) *mcp.Tool {
	t := &mcp.Tool{Name: a.Name, Description: describe(a), InputSchema: inputSchema,
		Annotations: &mcp.ToolAnnotations{Title: a.Name, OpenWorldHint: ptr(true)}}
	if objectSchema(a.OutputSchema) {
		t.OutputSchema = a.OutputSchema
	}
	return t
}

func ptr[T any](v T) *T { return &v }

// describe is a tool's description: the agent's, or the start of its
// instructions, or a sentence naming it.
func describe(a Agent) string {
	if d := strings.TrimSpace(a.Description); d != "" {
		return d
	}
	if in := strings.TrimSpace(a.Instructions); in != "" {
		return "An agent instructed: " + cut(in, maxDescription)
	}
	return fmt.Sprintf("Runs the agent %q of this tenant on the question and answers its final answer.", a.Name)
}

// cut shortens s to at most n bytes, on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// objectSchema reports whether a JSON Schema is an object's: "type":
// "object" at its top.
func objectSchema(schema json.RawMessage) bool {
	var top struct {
		Type any `json:"type"`
	}
	return len(schema) > 0 && json.Unmarshal(schema, &top) == nil && top.Type == "object"
}

// toolArguments are a call's arguments (inputSchema).
type toolArguments struct {
	Question *string `json:"question"`
	Session  string  `json:"session"`
}

// submission checks a call's arguments and makes the Run's submission.
func (ts *tenantServer) submission(tool string, raw json.RawMessage) (Submission, error) {
	if _, ok := ts.agents[tool]; !ok {
		return Submission{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q; tools/list lists this tenant's agents", cut(tool, 80))}
	}
	var args toolArguments
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
		dec = json.NewDecoder(bytes.NewReader(raw))
	}
	if err := dec.Decode(&args); err != nil {
		return Submission{}, invalidParams("the arguments of %q must be {\"question\": string, \"session\": string (optional)}: %v", tool, err)
	}
	if args.Question == nil || *args.Question == "" {
		return Submission{}, invalidParams("the arguments of %q need \"question\": what to ask the agent", tool)
	}
	session := args.Session
	if session == "" {
		session = "mcp-" + rand.Text()
	} else if !loop.ValidID(session) {
		return Submission{}, invalidParams("\"session\" is %q: it must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'", cut(session, 80))
	}
	return Submission{Agent: tool, Session: session, Input: *args.Question}, nil
}

func invalidParams(format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// callTool serves a tools/call without a task: it submits the Run, waits
// for its end, and answers its result. A Run the Backend refuses (a
// quota, a rate) is a tool error that says why.
func (ts *tenantServer) callTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	sub, err := ts.submission(req.Params.Name, req.Params.Arguments)
	if err != nil {
		return nil, err
	}
	run, err := ts.h.cfg.Backend.Submit(ctx, ts.tenant, sub)
	var refused *Error
	if errors.As(err, &refused) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: refused.Message}}}, nil
	}
	if err != nil {
		return nil, ts.internal("submit a Run", err)
	}
	p := &progress{ss: req.Session, token: req.Params.GetProgressToken()}
	p.send(ctx, run.Seq, fmt.Sprintf("run %s of agent %q started in session %s; it is also task %s (tasks/get, tasks/result), and GET /v1/runs/%s",
		run.ID, sub.Agent, sub.Session, run.ID, run.ID))
	_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "agenthost",
		Data: map[string]string{"run": run.ID, "agent": sub.Agent, "session": sub.Session}})
	end, err := ts.awaitEnd(ctx, req.Session, run, p, false)
	if err != nil {
		return nil, ts.waitError(run.ID, err)
	}
	res := ts.toolResult(end)
	res.Meta = mcp.Meta{runMetaKey: end.ID}
	return res, nil
}

// runMetaKey names, in a tool result's _meta, the Run that answered.
const runMetaKey = "agenthost/run"

// toolResult is an ended Run's result as the tool's: the final answer
// (and, when the agent has an object output schema, the answer as
// structured content), or, for a Run that failed or was cancelled, a tool
// error saying why.
func (ts *tenantServer) toolResult(run loop.Run) *mcp.CallToolResult {
	if run.Status != loop.StatusCompleted {
		msg := fmt.Sprintf("run %s %s", run.ID, run.Status)
		if f := run.Failure; f != nil {
			msg += fmt.Sprintf(" (%s): %s", f.Class, f.Message)
		}
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: run.Result}}}
	if a, ok := ts.agents[runAgent(run)]; ok && objectSchema(a.OutputSchema) {
		var v map[string]any
		if json.Unmarshal([]byte(run.Result), &v) == nil {
			res.StructuredContent = v
		}
	}
	return res
}

// runAgent is the agent a Run runs as.
func runAgent(run loop.Run) string {
	if run.Agent != nil && run.Agent.Name != "" {
		return run.Agent.Name
	}
	return runtime.DefaultAgent
}

// progress sends a call's progress notifications, when the client asked
// for them with a progress token: the Run's seq is the progress, which
// only grows.
type progress struct {
	ss    *mcp.ServerSession
	token any
	last  int64
}

func (p *progress) send(ctx context.Context, seq int64, message string) {
	if p == nil || p.token == nil || seq <= p.last {
		return
	}
	p.last = seq
	_ = p.ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: float64(seq), Message: message})
}

// errDraining ends a wait: the server is stopping.
var errDraining = errors.New("mcpserver: the server is draining")

// awaitEnd follows the Run until it ends and returns it ended. On the
// way it sends p's progress, and, when the client takes elicitations,
// asks it for what the Run waits for (with related set, the elicitation
// names the task). It returns early with ctx's error, or errDraining.
func (ts *tenantServer) awaitEnd(ctx context.Context, ss *mcp.ServerSession, run loop.Run, p *progress, related bool) (loop.Run, error) {
	if run.Status.Terminal() {
		return run, nil
	}
	f, err := ts.h.cfg.Backend.Follow(ts.tenant, run.ID, run.Seq+1)
	if err != nil {
		return run, err
	}
	defer f.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(ts.h.cfg.Drain, func() { cancel(errDraining) })
	defer stop()
	asked := map[string]bool{}
	for {
		if run.Status == loop.StatusWaiting && takesElicitation(ss) {
			ts.askFor(ctx, ss, run, asked, related)
		}
		items, done, err := f.Next(ctx)
		if err != nil {
			return run, cause(ctx, err)
		}
		moved := done
		for _, it := range items {
			moved = moved || it.Event != nil
		}
		if moved {
			if run, err = ts.h.cfg.Backend.LoadRun(ctx, ts.tenant, run.ID); err != nil {
				return run, cause(ctx, err)
			}
			p.send(ctx, run.Seq, statusMessage(run))
			if run.Status.Terminal() {
				return run, nil
			}
			continue // what the Run waits for now may be asked for
		}
		select {
		case <-ctx.Done():
			return run, context.Cause(ctx)
		case <-f.Ready():
		}
	}
}

// cause is ctx's cause when ctx has ended, else err.
func cause(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// waitError is what a call answers when its wait for the Run ends early:
// the Run goes on, and its result is to be fetched by its ID.
func (ts *tenantServer) waitError(runID string, err error) error {
	var refused *Error
	switch {
	case errors.Is(err, errDraining):
		return &jsonrpc.Error{Code: codeServerError, Message: fmt.Sprintf(
			"this server is shutting down; run %s goes on: fetch its result from any node with tasks/result {\"taskId\": %q} or GET /v1/runs/%s", runID, runID, runID)}
	case errors.As(err, &refused):
		return &jsonrpc.Error{Code: codeServerError, Message: fmt.Sprintf(
			"run %s was started, but it cannot be followed now (%s); fetch its result with tasks/result {\"taskId\": %q} or GET /v1/runs/%s", runID, refused.Message, runID, runID)}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return ts.internal("follow run "+runID, err)
}

// codeServerError is the JSON-RPC code of a request the server could not
// serve now (JSON-RPC's range for implementation-defined server errors).
const codeServerError = -32000

// internal logs an unexpected failure and answers a JSON-RPC internal
// error that reveals nothing of it.
func (ts *tenantServer) internal(what string, err error) error {
	ts.h.log.Error("mcp: request failed", "tenant", ts.tenant, "what", what, "err", err)
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the server failed to " + what + "; it has been logged. Retry later"}
}

// takesElicitation reports whether the client declared it takes
// elicitations (forms).
func takesElicitation(ss *mcp.ServerSession) bool {
	ip := ss.InitializeParams()
	return ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil &&
		(ip.Capabilities.Elicitation.Form != nil || ip.Capabilities.Elicitation.URL == nil)
}

// The forms an elicitation asks for: an approval, and an answer.
var (
	approvalForm = json.RawMessage(`{"type": "object", "properties": {
  "approved": {"type": "boolean", "title": "Approve", "description": "true lets the tool call run; false refuses it (the model sees the refusal)"},
  "reason": {"type": "string", "title": "Reason", "description": "Why, for the Run's log (optional)"}},
  "required": ["approved"]}`)
	answerForm = json.RawMessage(`{"type": "object", "properties": {
  "answer": {"type": "string", "title": "Answer", "description": "Your answer to the agent's question"}},
  "required": ["answer"]}`)
)

// relatedTaskKey names, in a message's _meta, the task it belongs to.
const relatedTaskKey = mcptasks.RelatedTaskKey

// askFor asks the client, by elicitation, for what the waiting Run waits
// for (each thing once: asked remembers), and gives the Run the answers.
// A declined approval refuses the tool call; a cancelled form or a failed
// elicitation leaves the Run waiting, for the API to answer.
func (ts *tenantServer) askFor(ctx context.Context, ss *mcp.ServerSession, run loop.Run, asked map[string]bool, related bool) {
	var meta mcp.Meta
	if related {
		meta = mcp.Meta{relatedTaskKey: map[string]string{"taskId": run.ID}}
	}
	w := runtime.WaitingFor(run)
	for _, id := range w.Approvals {
		if asked["approval "+id] {
			continue
		}
		asked["approval "+id] = true
		tool, args := toolCall(run, id)
		res, err := ss.Elicit(ctx, &mcp.ElicitParams{Meta: meta, Mode: "form", RequestedSchema: approvalForm, Message: fmt.Sprintf(
			"Run %s of agent %q asks to call the tool %q with the arguments %s. Approve the call?", run.ID, runAgent(run), tool, cut(args, 2000))})
		if err != nil {
			ts.h.log.Debug("mcp: an elicitation failed; the Run waits for the API", "tenant", ts.tenant, "run", run.ID, "err", err)
			return
		}
		d := abi.ApprovalDecision{ToolCallID: id}
		switch res.Action {
		case "accept":
			d.Approved, _ = res.Content["approved"].(bool)
			d.Reason, _ = res.Content["reason"].(string)
		case "decline":
			d.Reason = "declined through an MCP elicitation"
		default:
			continue
		}
		if _, err := ts.h.cfg.Backend.Approve(ctx, ts.tenant, run.ID, []abi.ApprovalDecision{d}); err != nil {
			ts.h.log.Debug("mcp: an approval through elicitation was not taken", "tenant", ts.tenant, "run", run.ID, "err", err)
		}
	}
	if in := w.Input; in != nil {
		key := fmt.Sprintf("input %d %s", run.Step, in.Prompt)
		if asked[key] {
			return
		}
		asked[key] = true
		res, err := ss.Elicit(ctx, &mcp.ElicitParams{Meta: meta, Mode: "form", RequestedSchema: answerForm, Message: fmt.Sprintf(
			"Run %s of agent %q asks: %s", run.ID, runAgent(run), in.Prompt)})
		if err != nil || res.Action != "accept" {
			return
		}
		answer, _ := res.Content["answer"].(string)
		if _, err := ts.h.cfg.Backend.ProvideInput(ctx, ts.tenant, run.ID, answer); err != nil {
			ts.h.log.Debug("mcp: an answer through elicitation was not taken", "tenant", ts.tenant, "run", run.ID, "err", err)
		}
	}
}

// toolCall returns the tool and the arguments of a tool call of the Run.
func toolCall(run loop.Run, toolCallID string) (tool, args string) {
	for _, e := range run.Effects {
		if e.ToolCallID == toolCallID {
			return e.Tool, string(e.Arguments)
		}
	}
	return "?", "{}"
}

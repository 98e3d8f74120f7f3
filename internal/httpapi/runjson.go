package httpapi

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// RunJSON is a Run as the API shows it.
type RunJSON struct {
	ID       string          `json:"id"`
	Session  string          `json:"session"`
	Status   loop.Status     `json:"status"`
	Input    string          `json:"input"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// Agent is the agent the Run runs as ("default" for a Run created
	// before agents), and AgentVersion the version of it the Run was
	// created with and keeps ("" for a Run created before agents were
	// versioned, which runs as the agent is now).
	Agent        string    `json:"agent"`
	AgentVersion string    `json:"agent_version,omitempty"`
	Usage        abi.Usage `json:"usage"`
	// CreatedAt and UpdatedAt are RFC 3339 times, in UTC, to the
	// millisecond.
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
	// Step is the number of model steps planned so far.
	Step int `json:"step"`
	// Seq is the number of events in the Run's log: the ID of its last
	// event on the event stream.
	Seq     int64        `json:"seq"`
	Result  *ResultJSON  `json:"result,omitempty"`
	Failure *FailureJSON `json:"failure,omitempty"`
	Waiting *WaitingJSON `json:"waiting,omitempty"`
	// Parent is set on a child Run: the Run whose agent tool call started
	// it, and that call.
	Parent *ParentJSON `json:"parent,omitempty"`
	// Children are the child Runs the Run's agent tool calls started, in
	// the order they were started (one per attempt).
	Children []ChildJSON `json:"children,omitempty"`
	// TraceID is the ID of the Run's OpenTelemetry trace (32 hex digits),
	// when tracing was on at its creation (loop.Spec.TraceParent).
	TraceID string `json:"trace_id,omitempty"`
}

// ParentJSON names the call a child Run answers.
type ParentJSON struct {
	Run        string `json:"run"`
	Session    string `json:"session"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Depth is how deep the child is: 1 for the child of a Run submitted
	// from outside.
	Depth int `json:"depth"`
}

// ChildJSON names a child Run and the call that started it.
type ChildJSON struct {
	Run        string `json:"run"`
	Agent      string `json:"agent"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	Attempt    int    `json:"attempt"`
}

// ResultJSON is a completed Run's final answer.
type ResultJSON struct {
	Content string `json:"content"`
}

// FailureJSON says why a Run failed or was cancelled.
type FailureJSON struct {
	Class   abi.ErrorClass `json:"class"`
	Message string         `json:"message"`
}

// WaitingJSON says what a Run that is not terminal waits for.
type WaitingJSON struct {
	// Approvals are the tool calls that wait for a person: answer them
	// with POST /v1/runs/{id}/input {"approvals": [...]}.
	Approvals []ApprovalWaitJSON `json:"approvals"`
	// Input is set when the model asked the user a question: answer it
	// with POST /v1/runs/{id}/input {"message": "..."}.
	Input *abi.AwaitInput `json:"input,omitempty"`
	// Pending are the effects an executor is still working on.
	Pending []PendingJSON `json:"pending"`
	// WakeAt is the Run's next timer (RFC 3339), if it has one.
	WakeAt string `json:"wake_at,omitempty"`
	// Queued is true while an earlier Run of the session is unfinished.
	Queued bool `json:"queued"`
	// Since is when the Run began to wait for a person (RFC 3339): set
	// while its status is waiting, unless it has waited since before
	// this was recorded.
	Since string `json:"since,omitempty"`
	// Deadline is when the Run fails with deadline_exceeded if it still
	// waits for a person then (RFC 3339): the end of its wait_timeout.
	// Absent when nothing bounds the wait.
	Deadline string `json:"deadline,omitempty"`
	// ChildrenWaiting are the child Runs of the Run's executing agent-tool
	// calls that wait for a person, directly or through children of their
	// own (waiting.go).
	ChildrenWaiting []ChildWaitingJSON `json:"children_waiting,omitempty"`
}

// ApprovalWaitJSON is one tool call waiting for an approval.
type ApprovalWaitJSON struct {
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
}

// PendingJSON is one effect in flight.
type PendingJSON struct {
	Effect string         `json:"effect"`
	Kind   abi.EffectKind `json:"kind"`
	Tool   string         `json:"tool,omitempty"`
	// Budget is set while the model step waits, on the node that
	// answers, for its endpoint's shared budget before its call starts.
	Budget *BudgetWaitJSON `json:"budget,omitempty"`
	// Instance is set while the effect's call waits, on the node that
	// answers, for an instance of its executor's plugin: all of the
	// plugin's max_instances are busy (or the host's instance memory
	// is).
	Instance *InstanceWaitJSON `json:"instance,omitempty"`
}

// InstanceWaitJSON is an executor call waiting for an instance of its
// plugin: the plugin's ID, and since when it waits (RFC 3339).
type InstanceWaitJSON struct {
	Plugin string `json:"plugin"`
	Since  string `json:"since"`
}

// BudgetWaitJSON is a model call waiting for its endpoint's budget: the
// endpoint (the executor plugin's ID), and when the budget expects to
// admit it (RFC 3339; absent while it waits for a call in flight to end).
type BudgetWaitJSON struct {
	Endpoint string `json:"endpoint"`
	Until    string `json:"until,omitempty"`
}

// NewRunJSON renders a Run snapshot.
func NewRunJSON(run loop.Run) RunJSON {
	j := RunJSON{
		ID: run.ID, Session: run.Session, Status: run.Status, Input: run.Input, Metadata: validUTF8(run.Metadata),
		Agent: runAgent(run), Usage: run.Usage, CreatedAt: rfc3339(run.CreatedAt), UpdatedAt: rfc3339(run.UpdatedAt),
		Step: run.Step, Seq: run.Seq,
	}
	if run.Agent != nil {
		j.AgentVersion = run.Agent.Version
	}
	if p := run.Parent; p != nil {
		j.Parent = &ParentJSON{Run: p.Run, Session: p.Session, ToolCallID: p.ToolCallID, Depth: p.Depth}
	}
	for _, c := range run.Children {
		j.Children = append(j.Children, ChildJSON{Run: c.Run, Agent: c.Agent, ToolCallID: c.ToolCallID, Attempt: c.Attempt})
	}
	if sc := runtime.ParseTraceParent(run.TraceParent); sc.IsValid() {
		j.TraceID = sc.TraceID().String()
	}
	switch run.Status {
	case loop.StatusCompleted:
		j.Result = &ResultJSON{Content: run.Result}
	case loop.StatusFailed, loop.StatusCancelled:
		if run.Failure != nil {
			j.Failure = &FailureJSON{Class: run.Failure.Class, Message: run.Failure.Message}
		} else {
			j.Failure = &FailureJSON{Class: abi.ClassCancelled, Message: "the run was " + string(run.Status)}
		}
	default:
		j.Waiting = waitingJSON(run)
	}
	return j
}

func waitingJSON(run loop.Run) *WaitingJSON {
	w := runtime.WaitingFor(run)
	out := &WaitingJSON{Approvals: []ApprovalWaitJSON{}, Pending: []PendingJSON{}, Input: w.Input, Queued: w.Queued}
	for _, id := range w.Approvals {
		a := ApprovalWaitJSON{ToolCallID: id}
		for _, e := range run.Effects {
			if e.ToolCallID == id {
				a.Tool, a.Arguments = e.Tool, validUTF8(e.Arguments)
				break
			}
		}
		out.Approvals = append(out.Approvals, a)
	}
	for _, id := range w.Pending {
		p := PendingJSON{Effect: id}
		if e := run.Effect(id); e != nil {
			p.Kind, p.Tool = e.Kind, e.Tool
		}
		out.Pending = append(out.Pending, p)
	}
	if w.WakeAtMS > 0 {
		out.WakeAt = rfc3339(w.WakeAtMS)
	}
	if wait, ok := run.Waiting(); ok {
		if wait.Since > 0 {
			out.Since = rfc3339(wait.Since)
		}
		if wait.Deadline > 0 {
			out.Deadline = rfc3339(wait.Deadline)
		}
	}
	return out
}

// RunSummaryJSON is a Run as a page of GET /v1/sessions/{id}/runs shows
// it: where it stands, in about a kilobyte at most, without what can be
// large (its input past a preview, metadata, result, the failure's
// message, the approvals' arguments and the model's question), which
// GET /v1/runs/{id} gives.
type RunSummaryJSON struct {
	// Ordinal is the Run's place in its session, from 1.
	Ordinal int64       `json:"ordinal"`
	ID      string      `json:"id"`
	Session string      `json:"session"`
	Status  loop.Status `json:"status"`
	// Agent is the agent the Run runs as (RunJSON.Agent).
	Agent string `json:"agent"`
	// InputPreview is the input's first InputPreviewChars characters (all
	// of it when it is shorter).
	InputPreview string    `json:"input_preview"`
	Usage        abi.Usage `json:"usage"`
	CreatedAt    string    `json:"created_at"`
	UpdatedAt    string    `json:"updated_at"`
	Step         int       `json:"step"`
	Seq          int64     `json:"seq"`
	// FailureClass is failure.class of a failed or cancelled Run.
	FailureClass abi.ErrorClass `json:"failure_class,omitempty"`
	// WaitingSummary counts what a Run that is not terminal waits for.
	WaitingSummary *WaitingSummaryJSON `json:"waiting_summary,omitempty"`
	// ParentRun is set on a child Run: the Run whose agent tool call
	// started it.
	ParentRun string `json:"parent_run,omitempty"`
}

// WaitingSummaryJSON is WaitingJSON in numbers.
type WaitingSummaryJSON struct {
	// Approvals is how many tool calls wait for a person.
	Approvals int `json:"approvals"`
	// Input is true when the model asked the user a question.
	Input bool `json:"input"`
	// Pending is how many effects an executor is working on.
	Pending int `json:"pending"`
	// WakeAt is the Run's next timer (RFC 3339), if it has one.
	WakeAt string `json:"wake_at,omitempty"`
	// Queued is true while an earlier Run of the session is unfinished.
	Queued bool `json:"queued"`
}

// NewRunSummaryJSON renders the summary of a Run, the ordinal-th of its
// session.
func NewRunSummaryJSON(ordinal int64, run loop.Run) RunSummaryJSON {
	j := RunSummaryJSON{
		Ordinal: ordinal, ID: run.ID, Session: run.Session, Status: run.Status, Agent: runAgent(run),
		InputPreview: preview(run.Input, InputPreviewChars), Usage: run.Usage,
		CreatedAt: rfc3339(run.CreatedAt), UpdatedAt: rfc3339(run.UpdatedAt), Step: run.Step, Seq: run.Seq,
	}
	if run.Parent != nil {
		j.ParentRun = run.Parent.Run
	}
	switch run.Status {
	case loop.StatusCompleted: // its result is GET /v1/runs/{id}'s
	case loop.StatusFailed, loop.StatusCancelled:
		j.FailureClass = abi.ClassCancelled
		if run.Failure != nil {
			j.FailureClass = run.Failure.Class
		}
	default:
		w := runtime.WaitingFor(run)
		j.WaitingSummary = &WaitingSummaryJSON{Approvals: len(w.Approvals), Input: w.Input != nil, Pending: len(w.Pending), Queued: w.Queued}
		if w.WakeAtMS > 0 {
			j.WaitingSummary.WakeAt = rfc3339(w.WakeAtMS)
		}
	}
	return j
}

// runAgent is the name of the agent run runs as: its pin's, or the
// default agent for a Run created before Runs were pinned.
func runAgent(run loop.Run) string {
	if run.Agent != nil {
		return run.Agent.Name
	}
	return runtime.DefaultAgent
}

// agentOrDefault is the agent a submission names: the default agent when
// it names none.
func agentOrDefault(name string) string {
	if name == "" {
		return runtime.DefaultAgent
	}
	return name
}

// InputPreviewChars is how many characters of a Run's input its summary
// shows.
const InputPreviewChars = 100

// preview returns the first n characters of s.
func preview(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// validUTF8 returns raw JSON with any byte that is not UTF-8 replaced by
// U+FFFD, as encoding/json does in strings: such bytes can only sit
// inside strings of the JSON, and would make the answer invalid JSON.
// The API refuses them in request bodies; a Run stored before it did may
// still hold them.
func validUTF8(raw json.RawMessage) json.RawMessage {
	if utf8.Valid(raw) {
		return raw
	}
	return bytes.ToValidUTF8(raw, []byte("\uFFFD"))
}

const rfc3339Millis = "2006-01-02T15:04:05.000Z07:00"

func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(rfc3339Millis) }

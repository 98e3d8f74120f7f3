package httpapi

import (
	"encoding/json"
	"time"

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
	Usage    abi.Usage       `json:"usage"`
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
}

// NewRunJSON renders a Run snapshot.
func NewRunJSON(run loop.Run) RunJSON {
	j := RunJSON{
		ID: run.ID, Session: run.Session, Status: run.Status, Input: run.Input, Metadata: run.Metadata,
		Usage: run.Usage, CreatedAt: rfc3339(run.CreatedAt), UpdatedAt: rfc3339(run.UpdatedAt),
		Step: run.Step, Seq: run.Seq,
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
				a.Tool, a.Arguments = e.Tool, e.Arguments
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
	return out
}

const rfc3339Millis = "2006-01-02T15:04:05.000Z07:00"

func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(rfc3339Millis) }

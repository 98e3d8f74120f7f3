package httpapi

import (
	"context"
	"errors"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// What a Run waits for, as the API shows it beyond one snapshot: the
// child Runs of its agent tools that wait for a person (children_waiting,
// on the Run's JSON and in run_waiting), and the run_waiting event of the
// event streams (waitwatch.go).
//
// A parent Run whose agent tool's child waits for a person does not wait
// itself: its effect is executing, the child's status is waiting. So a
// parent's `waiting` lists, under children_waiting, each child of an
// executing agent-tool call that waits, directly or through children of
// its own (each listed with its own `waiting`). Children are read from
// the store, at most maxChildReads of them for one Run's JSON; a child's
// wait past that bound shows on the child's own JSON, GET
// /v1/runs/{child}.

// maxChildReads bounds the child Runs read for one Run's children_waiting,
// at every depth together: the Runs an event stream follows for it
// (maxWatchedChildren), and the store reads of one GET.
const maxChildReads = 8

// ChildWaitingJSON is a child Run, started by one of the Run's agent-tool
// calls, that waits for a person, or has a child that does.
type ChildWaitingJSON struct {
	// Run is the child Run's ID: answer what it waits for with POST
	// /v1/runs/{run}/input.
	Run string `json:"run"`
	// Agent is the agent the child runs as: the agent tool called.
	Agent string `json:"agent"`
	// ToolCallID is the tool call of the parent the child answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Waiting is what the child waits for, as its own JSON shows it.
	Waiting *WaitingJSON `json:"waiting"`
}

// RunWaitingJSON is the data of a "run_waiting" event: the Run the stream
// follows, its seq and status when the event was sent, and what it waits
// for (the Run's `waiting`, as GET /v1/runs/{id} shows it then). It is
// sent when the Run begins to wait for a person, and when a child of one
// of its agent tools does (waiting.children_waiting).
type RunWaitingJSON struct {
	Run     string       `json:"run"`
	Seq     int64        `json:"seq"`
	Status  loop.Status  `json:"status"`
	Waiting *WaitingJSON `json:"waiting"`
}

// childLoader returns a child Run by ID, and false when there is none to
// show (not started yet, not known, or not readable now).
type childLoader func(id string) (loop.Run, bool)

// agentChild is a child Run that an executing agent-tool call of a Run
// started.
type agentChild struct {
	id, toolCallID string
}

// agentChildren returns the child Runs of run's executing agent-tool
// calls, in the order of the calls. Their attempts are dispatched; a
// child is created by the attempt's start, so it may not exist yet.
func agentChildren(run loop.Run) []agentChild {
	if run.Status.Terminal() {
		return nil
	}
	var out []agentChild
	for _, e := range run.Effects {
		if e.State != loop.EffectExecuting || e.Tool == "" {
			continue
		}
		if spec, ok := run.ToolSpec(e.Tool); ok && spec.Agent != "" {
			out = append(out, agentChild{id: loop.ChildRunID(e.ID, e.Attempt), toolCallID: e.ToolCallID})
		}
	}
	return out
}

// waitingView is run's `waiting` with its children_waiting, each child
// got from load, at most *budget of them in all.
func waitingView(run loop.Run, load childLoader, budget *int) *WaitingJSON {
	w := waitingJSON(run)
	w.ChildrenWaiting = childrenWaiting(run, load, budget)
	return w
}

// childrenWaiting lists the children of run's executing agent-tool calls
// that wait for a person, directly or through children of their own.
func childrenWaiting(run loop.Run, load childLoader, budget *int) []ChildWaitingJSON {
	var out []ChildWaitingJSON
	for _, c := range agentChildren(run) {
		if *budget <= 0 {
			break
		}
		*budget--
		child, ok := load(c.id)
		if !ok || child.Status.Terminal() {
			continue
		}
		w := waitingView(child, load, budget)
		if child.Status == loop.StatusWaiting || len(w.ChildrenWaiting) > 0 {
			out = append(out, ChildWaitingJSON{Run: child.ID, Agent: runAgent(child), ToolCallID: c.toolCallID, Waiting: w})
		}
	}
	return out
}

// budgetWaits is a Runtime that knows which model calls wait for their
// endpoint's budget; *runtime.Runtime is one.
type budgetWaits interface {
	BudgetWait(run loop.Run, effectID string) (runtime.BudgetWait, bool)
}

var _ budgetWaits = (*runtime.Runtime)(nil)

// instanceWaits is a Runtime that knows which executor calls wait for a
// plugin instance; *runtime.Runtime is one.
type instanceWaits interface {
	InstanceWait(run loop.Run, effectID string) (runtime.InstanceWait, bool)
}

var _ instanceWaits = (*runtime.Runtime)(nil)

// runJSON is run as the API shows it, with the children of its agent
// tools that wait for a person read from the store.
func (s *Server) runJSON(ctx context.Context, tenant string, run loop.Run) RunJSON {
	j := NewRunJSON(run)
	if bw, ok := s.cfg.Runtime.(budgetWaits); ok && j.Waiting != nil {
		for i, p := range j.Waiting.Pending {
			if w, ok := bw.BudgetWait(run, p.Effect); ok {
				j.Waiting.Pending[i].Budget = &BudgetWaitJSON{Endpoint: w.Endpoint}
				if !w.Until.IsZero() {
					j.Waiting.Pending[i].Budget.Until = rfc3339(w.Until.UnixMilli())
				}
			}
		}
	}
	if iw, ok := s.cfg.Runtime.(instanceWaits); ok && j.Waiting != nil {
		for i, p := range j.Waiting.Pending {
			if w, ok := iw.InstanceWait(run, p.Effect); ok {
				j.Waiting.Pending[i].Instance = &InstanceWaitJSON{Plugin: w.Plugin, Since: rfc3339(w.Since.UnixMilli())}
			}
		}
	}
	if j.Waiting != nil && len(agentChildren(run)) > 0 {
		budget := maxChildReads
		j.Waiting.ChildrenWaiting = childrenWaiting(run, s.storeChildren(ctx, tenant), &budget)
	}
	return j
}

// storeChildren loads the tenant's child Runs from the store. A child
// that cannot be read is left out: the Run's own JSON is still answered,
// and the child's shows what it waits for.
func (s *Server) storeChildren(ctx context.Context, tenant string) childLoader {
	return func(id string) (loop.Run, bool) {
		run, err := s.cfg.Runtime.LoadRun(ctx, tenant, id)
		if err != nil && !errors.Is(err, runtime.ErrRunNotFound) {
			s.log.Debug("a child run could not be read for its parent's waiting", "tenant", tenant, "run", id, "err", err)
		}
		return run, err == nil
	}
}

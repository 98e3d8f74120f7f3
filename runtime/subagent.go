package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Agents as tools of other agents (docs/DESIGN.md §5.8).
//
// A tool whose pinned spec names an agent (loop.ToolSpec.Agent) is carried
// out by the runtime itself, through subAgentCall, an Executor like any
// plugin's: each attempt of such a call is a child Run of that agent, in a
// session of its own, whose ID (and session's) is loop.ChildRunID of the
// attempt. Whoever carries the attempt out, the node that dispatched it, a
// node that took its session over after a crash, or the same node after a
// restart, finds the same child: start and attach create it if it is not
// there yet and otherwise look at it, so a child is started once per
// attempt however often the attempt is started or attached again.
//
// The parent's effect stays pending while the child runs: start and attach
// answer pending with the child's ID as the handle, and the Watcher polls
// it, as it polls any pending attempt, every subAgentPollMax (a poll is
// one read of the child). A child that ends on this node hastens its
// parent's poll (hastenParent), so the parent learns of it at once; one
// that ends on another node is seen at the next poll. No goroutine waits
// for a child. The child's end settles the parent's effect: its result, or its
// failure and class in words, as the tool's content (is_error set), with
// its usage, which the Loop adds to the parent's. Cancelling the parent
// cancels its executing effects, and so its children.

// DefaultMaxAgentDepth bounds how deep child Runs may nest when a tenant
// sets no bound: a Run submitted from outside is at depth 0, its children
// at 1.
const DefaultMaxAgentDepth = 5

// subAgentPollMax is the poll interval of a child Run: how late its
// parent's node learns of its end when nothing tells it sooner (the feed
// was down, or the child ended on a node that does not share the feed).
const subAgentPollMax = 5 * time.Second

// subAgentCall is the Executor of one agent tool call of one Run: agent
// is the agent its attempts run as, depth the calling Run's depth, and
// toolCallID the model's ID of the call, which each child names.
type subAgentCall struct {
	rt         *Runtime
	agent      string
	depth      int
	toolCallID string
}

// executorFor returns the executor of effect e of run: the runtime's own
// for an agent tool, else the tenant's (Tenant.executorFor).
func (rt *Runtime) executorFor(t *Tenant, run *loop.Run, e *loop.Effect) Executor {
	if e.Kind == abi.KindTool {
		if spec, ok := run.ToolSpec(e.Tool); ok && spec.Agent != "" {
			depth := 0
			if run.Parent != nil {
				depth = run.Parent.Depth
			}
			return subAgentCall{rt: rt, agent: spec.Agent, depth: depth, toolCallID: e.ToolCallID}
		}
	}
	return t.executorFor(run, e.Kind, e.Tool)
}

// Start starts the attempt's child Run, or finds it started.
func (x subAgentCall) Start(ctx context.Context, c EffectCall) (abi.EffectReply, error) {
	return x.startOrLook(ctx, c, true)
}

// Attach finds the attempt's child Run, and starts it if the attempt was
// dispatched and its start never reached the store.
func (x subAgentCall) Attach(ctx context.Context, c EffectCall) (abi.EffectReply, error) {
	return x.startOrLook(ctx, c, true)
}

// Poll looks at the attempt's child Run.
func (x subAgentCall) Poll(ctx context.Context, c EffectCall) (abi.EffectReply, error) {
	return x.startOrLook(ctx, c, false)
}

// Cancel asks the attempt's child Run to be cancelled. A child that has
// ended answers with its outcome; one never started, cancelled.
func (x subAgentCall) Cancel(ctx context.Context, c EffectCall) (abi.CancelReply, error) {
	id := loop.ChildRunID(c.Input.Effect.ID, c.Input.Effect.Attempt)
	reason := fmt.Sprintf("its parent run %s was cancelled or ended", c.RunID)
	_, err := x.rt.Cancel(ctx, c.Tenant, id, reason)
	switch {
	case err == nil, errors.Is(err, ErrRunNotFound):
		return abi.CancelReply{State: abi.StateCancelled}, nil
	case errors.Is(err, loop.ErrTerminal), errors.Is(err, loop.ErrNoChange):
		child, lerr := x.rt.store.LoadRun(ctx, c.Tenant, id)
		if lerr != nil {
			return abi.CancelReply{}, lerr
		}
		if !child.Status.Terminal() {
			return abi.CancelReply{State: abi.StateCancelled}, nil // it is ending, as cancelled
		}
		out, _ := json.Marshal(childOutcome(child))
		return abi.CancelReply{State: abi.StateDone, Outcome: out}, nil
	}
	return abi.CancelReply{}, err
}

// startOrLook answers for the attempt's child Run: its outcome once it
// has ended, pending while it runs. A child not yet there is started when
// start is true, and otherwise answered unknown.
func (x subAgentCall) startOrLook(ctx context.Context, c EffectCall, start bool) (abi.EffectReply, error) {
	id := loop.ChildRunID(c.Input.Effect.ID, c.Input.Effect.Attempt)
	child, err := x.rt.store.LoadRun(ctx, c.Tenant, id)
	if errors.Is(err, ErrRunNotFound) && start {
		child, err = x.startChild(ctx, c, id)
		var refused *subAgentRefusal
		if errors.As(err, &refused) {
			return abi.EffectReply{}, &PluginError{Class: refused.class, Plugin: "agent " + x.agent, Export: "start", Err: &PluginMessage{Text: refused.msg}}
		}
	}
	switch {
	case errors.Is(err, ErrRunNotFound):
		return abi.EffectReply{State: abi.StateUnknown}, nil
	case err != nil:
		return abi.EffectReply{}, err
	case !child.Status.Terminal():
		return abi.EffectReply{State: abi.StatePending, Handle: id, PollAfterMS: subAgentPollMax.Milliseconds()}, nil
	}
	out, err := json.Marshal(childOutcome(child))
	if err != nil {
		return abi.EffectReply{}, err
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: out, Handle: id}, nil
}

// subAgentRefusal is a call of an agent tool that cannot start a child:
// too deep, no such agent, arguments without an input.
type subAgentRefusal struct {
	class abi.ErrorClass
	msg   string
}

func (e *subAgentRefusal) Error() string { return string(e.class) + ": " + e.msg }

// startChild creates the child Run of the attempt c, with ID id.
func (x subAgentCall) startChild(ctx context.Context, c EffectCall, id string) (loop.Run, error) {
	rt := x.rt
	t, ok := rt.opts.Tenants.Tenant(c.Tenant)
	if !ok {
		return loop.Run{}, fmt.Errorf("runtime: unknown tenant %q", c.Tenant)
	}
	max := t.MaxAgentDepth
	if max <= 0 {
		max = DefaultMaxAgentDepth
	}
	if x.depth+1 > max {
		return loop.Run{}, &subAgentRefusal{class: abi.ClassLimitExceeded, msg: fmt.Sprintf(
			"calling agent %q would start a child run at depth %d; the tenant's max_agent_depth is %d", x.agent, x.depth+1, max)}
	}
	agent, implicit, ok := t.Agent(x.agent)
	if !ok {
		return loop.Run{}, &subAgentRefusal{class: abi.ClassExecutorUnavailable, msg: fmt.Sprintf(
			"the tenant has no agent %q any more (its agents: %v)", x.agent, t.AgentNames())}
	}
	var req abi.ToolRequest
	var args struct {
		Input *string `json:"input"`
	}
	if err := json.Unmarshal(c.Input.Effect.Request, &req); err == nil {
		err = json.Unmarshal(req.Arguments, &args)
	}
	if args.Input == nil {
		return loop.Run{}, &subAgentRefusal{class: abi.ClassInvalidArguments, msg: fmt.Sprintf(
			"a call of agent %q needs {\"input\": \"the task\"}", x.agent)}
	}
	parent := &loop.ParentRef{Run: c.RunID, Session: c.Session, Effect: c.Input.Effect.ID,
		Attempt: c.Input.Effect.Attempt, Depth: x.depth + 1, ToolCallID: x.toolCallID}
	child, _, err := rt.submit(ctx, t, agent, implicit, Request{Tenant: c.Tenant, Session: id, RunID: id, Input: *args.Input}, parent)
	if errors.Is(err, ErrRunExists) {
		return rt.store.LoadRun(ctx, c.Tenant, id)
	}
	if err == nil {
		rt.log.Info("child run started", "tenant", c.Tenant, "run", id, "agent", x.agent, "parent", c.RunID, "effect", c.Input.Effect.ID, "attempt", c.Input.Effect.Attempt)
		x.cancelEarlierAttempts(ctx, c)
	}
	return child, err
}

// cancelEarlierAttempts cancels the children of the call's earlier
// attempts that still run: an attempt that failed (its effect timed out,
// say) is over for the parent, which will never read its child, so the
// child's work would be wasted. Best effort: a child that has ended, or
// was never created, is left as it is; an error is logged, and the
// child's own limits still bound it.
func (x subAgentCall) cancelEarlierAttempts(ctx context.Context, c EffectCall) {
	for a := 1; a < c.Input.Effect.Attempt; a++ {
		old := loop.ChildRunID(c.Input.Effect.ID, a)
		reason := fmt.Sprintf("attempt %d of its parent's call %s replaced it", c.Input.Effect.Attempt, c.Input.Effect.ID)
		_, err := x.rt.Cancel(ctx, c.Tenant, old, reason)
		if err != nil && !errors.Is(err, ErrRunNotFound) && !errors.Is(err, loop.ErrTerminal) && !errors.Is(err, loop.ErrNoChange) {
			x.rt.log.Warn("cancelling a replaced child run", "tenant", c.Tenant, "run", old, "error", err)
		}
	}
}

// childOutcome is the tool outcome an ended child Run settles its parent's
// effect with: its result, or its failure in words, and its usage.
func childOutcome(child loop.Run) abi.ToolOutcome {
	u := child.Usage
	o := abi.ToolOutcome{Content: child.Result, Usage: &u}
	if child.Status != loop.StatusCompleted {
		f := child.Failure
		if f == nil {
			f = &loop.Failure{Class: abi.ClassCancelled, Message: "no reason recorded"}
		}
		agent := DefaultAgent
		if child.Agent != nil {
			agent = child.Agent.Name
		}
		o.Content = fmt.Sprintf("agent %s (run %s) %s (%s): %s", agent, child.ID, child.Status, f.Class, f.Message)
		o.IsError = true
	}
	return o
}

// hastenParent makes the parent's poll of an ended child Run due now, if
// this node watches it.
func (rt *Runtime) hastenParent(child loop.Run) {
	p := child.Parent
	if p == nil || !child.Status.Terminal() {
		return
	}
	key := loop.AssignmentKey{Tenant: child.Tenant, Session: p.Session, EffectID: p.Effect, Attempt: p.Attempt}.String()
	rt.watcher.Hasten("poll/"+key, rt.clock.Now())
}

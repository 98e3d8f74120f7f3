package runtime_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/conformance/script"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// agentInputSchema is the input schema of an agent tool.
var agentInputSchema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)

// agentTool is an agent tool that runs agent name.
func agentTool(name string) runtime.Tool {
	return runtime.Tool{
		Descriptor: abi.Tool{Name: name, Description: "hand a task to " + name, InputSchema: agentInputSchema, Approval: abi.ApprovalNever},
		Spec:       loop.ToolSpec{Name: name, Policy: loop.Policy{Mode: loop.PolicyFail}, Agent: name},
	}
}

// newSubAgentEnv is the conformance env's tenant as two agents: research,
// with the scripted tools, and lead, with the scripted tools and research
// as a tool. maxDepth bounds nesting (0: the default).
func newSubAgentEnv(t *testing.T, maxDepth int) *conformance.RuntimeEnv {
	return conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}, func(tn *runtime.Tenant) {
		agent := func(name string, tools []runtime.Tool) *runtime.Agent {
			return &runtime.Agent{Name: name, Version: "v-" + name, Builder: tn.Builder, Model: tn.Model, Tools: tools,
				Limits: tn.Limits, ModelPolicy: tn.ModelPolicy}
		}
		lead := append(append([]runtime.Tool(nil), tn.Tools...), agentTool("research"), agentTool("lead"))
		tn.Agents = map[string]*runtime.Agent{"research": agent("research", tn.Tools), "lead": agent("lead", lead)}
		tn.MaxAgentDepth = maxDepth
	})
}

// childScript quotes a script as the JSON input of an agent tool's call:
// its '|' are written \u007c, so that the parent's script keeps them.
func childScript(s string) string {
	b, _ := json.Marshal(map[string]string{"input": s})
	return strings.ReplaceAll(string(b), "|", `\u007c`)
}

func submitAs(t *testing.T, e *conformance.RuntimeEnv, agent, session, input string) loop.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run, _, err := e.Runtime.Submit(ctx, runtime.Request{Tenant: "acme", Session: session, Agent: agent, Input: input})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func loadRun(t *testing.T, e *conformance.RuntimeEnv, id string) loop.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run, err := e.Store.LoadRun(ctx, "acme", id)
	if err != nil {
		t.Fatalf("load %s: %v", id, err)
	}
	return run
}

// TestAnAgentCallsAnotherAsATool: lead calls research, which calls a
// tool; the child Run is research's, in a session of its own, named by
// the attempt; its result is lead's tool result, its usage adds to
// lead's, and each Run names the other.
func TestAnAgentCallsAnotherAsATool(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`call:echo({"text":"found it"})|answer:research says $results`)+`)|answer:lead says $results`)
	run := e.UntilTerminal(e.Runtime, parent.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted || run.Result != "lead says research says found it" {
		t.Fatalf("parent: %s %q %+v", run.Status, run.Result, run.Failure)
	}
	childID := loop.ChildRunID(run.ID+".t1.0", 1)
	if len(run.Children) != 1 || run.Children[0].Run != childID || run.Children[0].Agent != "research" {
		t.Fatalf("the parent's children: %+v, want %s of research", run.Children, childID)
	}
	child := loadRun(t, e, childID)
	if child.Status != loop.StatusCompleted || child.Session != childID || child.Agent == nil || child.Agent.Name != "research" {
		t.Fatalf("child: %s in session %s as %+v", child.Status, child.Session, child.Agent)
	}
	if p := child.Parent; p == nil || p.Run != run.ID || p.Session != "s1" || p.Effect != run.ID+".t1.0" || p.Attempt != 1 || p.Depth != 1 || p.ToolCallID != "call_1_1" {
		t.Fatalf("the child's parent: %+v", child.Parent)
	}
	steps := int64(4) // two of the parent's, two of the child's
	want := abi.Usage{InputTokens: steps * script.StepUsage.InputTokens, OutputTokens: steps * script.StepUsage.OutputTokens}
	if run.Usage != want {
		t.Fatalf("the parent's usage %+v, want its own and its child's, %+v", run.Usage, want)
	}
	// A tenant's tokens count each Run's own usage once: the parent's two
	// steps and the child's two, not the child's again in its parent.
	two := abi.Usage{InputTokens: 2 * script.StepUsage.InputTokens, OutputTokens: 2 * script.StepUsage.OutputTokens}
	if run.OwnUsage() != two || child.OwnUsage() != two || run.ChildrenUsage != two {
		t.Fatalf("own usage: parent %+v (children %+v), child %+v; want %+v each", run.OwnUsage(), run.ChildrenUsage, child.OwnUsage(), two)
	}
	for _, r := range []loop.Run{run, child} {
		if v := loop.CheckEnded(ctxEvents(t, e, r.ID)); len(v) > 0 {
			t.Fatalf("run %s's log: %v", r.ID, v)
		}
	}
}

// ctxEvents reads a Run's whole log.
func ctxEvents(t *testing.T, e *conformance.RuntimeEnv, id string) []loop.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs, err := e.Store.Events(ctx, "acme", id, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestAChildWaitingForApprovalIsAnsweredOnTheChild: a child whose tool
// waits for approval leaves its parent running, with the effect pending;
// the approval is given on the child, and both complete.
func TestAChildWaitingForApprovalIsAnsweredOnTheChild(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`call:wire({"text":"sent"})|answer:$results`)+`)|answer:$results`)
	childID := loop.ChildRunID(parent.ID+".t1.0", 1)
	conformance.Eventually(t, "the child to wait for approval", func() bool {
		c, err := e.Store.LoadRun(context.Background(), "acme", childID)
		return err == nil && c.Status == loop.StatusWaiting
	})
	p := loadRun(t, e, parent.ID)
	if p.Status != loop.StatusRunning || len(p.Executing()) != 1 {
		t.Fatalf("the parent of a waiting child is %s with %d effects executing", p.Status, len(p.Executing()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	child := loadRun(t, e, childID)
	if _, err := e.Runtime.Approve(ctx, "acme", childID, []abi.ApprovalDecision{{ToolCallID: child.Effects[1].ToolCallID, Approved: true}}); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, parent.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted || run.Result != "sent" {
		t.Fatalf("parent: %s %q %+v", run.Status, run.Result, run.Failure)
	}
}

// TestCancellingTheParentCancelsItsChild: a parent cancelled while its
// child waits ends cancelled, and so does the child.
func TestCancellingTheParentCancelsItsChild(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`ask:which one?|answer:done`)+`)|answer:$results`)
	childID := loop.ChildRunID(parent.ID+".t1.0", 1)
	conformance.Eventually(t, "the child to wait for input", func() bool {
		c, err := e.Store.LoadRun(context.Background(), "acme", childID)
		return err == nil && c.Status == loop.StatusWaiting
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.Runtime.Cancel(ctx, "acme", parent.ID, "the user changed their mind"); err != nil {
		t.Fatal(err)
	}
	run := e.UntilTerminal(e.Runtime, parent.ID, 100*time.Millisecond)
	child := e.UntilTerminal(e.Runtime, childID, 100*time.Millisecond)
	if run.Status != loop.StatusCancelled || child.Status != loop.StatusCancelled {
		t.Fatalf("parent %s, child %s; want both cancelled", run.Status, child.Status)
	}
	if !strings.Contains(child.Failure.Message, parent.ID) {
		t.Fatalf("the child's cancel does not name its parent: %q", child.Failure.Message)
	}
}

// TestAChildFailureIsTheParentsToolError: a child that fails settles its
// parent's call as a tool error naming the agent, the child and the
// class; the parent's model goes on.
func TestAChildFailureIsTheParentsToolError(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`fail:on purpose`)+`)|answer:$results`)
	run := e.UntilTerminal(e.Runtime, parent.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted {
		t.Fatalf("parent: %s %+v", run.Status, run.Failure)
	}
	if !strings.Contains(run.Result, "agent research (run "+loop.ChildRunID(parent.ID+".t1.0", 1)+") failed (") || !strings.Contains(run.Result, `unknown verb "fail"`) {
		t.Fatalf("the parent saw %q", run.Result)
	}
}

// TestAgentDepthIsBounded: lead calling itself is stopped at the tenant's
// max_agent_depth: the deepest call settles as limit_exceeded, and every
// Run above it completes.
func TestAgentDepthIsBounded(t *testing.T) {
	e := newSubAgentEnv(t, 2)
	depth2 := `call:lead(` + childScript(`answer:too deep`) + `)|answer:$results`
	depth1 := `call:lead(` + childScript(depth2) + `)|answer:$results`
	parent := submitAs(t, e, "lead", "s1", `call:lead(`+childScript(depth1)+`)|answer:$results`)
	run := e.UntilTerminal(e.Runtime, parent.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted {
		t.Fatalf("parent: %s %+v", run.Status, run.Failure)
	}
	if !strings.Contains(run.Result, "limit_exceeded") || !strings.Contains(run.Result, "max_agent_depth is 2") {
		t.Fatalf("the top Run saw %q; want the depth-3 call refused", run.Result)
	}
	child := loadRun(t, e, loop.ChildRunID(parent.ID+".t1.0", 1))
	if child.Parent.Depth != 1 || len(child.Children) != 1 {
		t.Fatalf("the depth-1 child: parent %+v, children %+v", child.Parent, child.Children)
	}
	grandchild := loadRun(t, e, child.Children[0].Run)
	if grandchild.Parent.Depth != 2 || grandchild.Status != loop.StatusCompleted || len(grandchild.Children) != 1 {
		t.Fatalf("the depth-2 child: %s, parent %+v, children %+v", grandchild.Status, grandchild.Parent, grandchild.Children)
	}
	if _, err := e.Store.LoadRun(context.Background(), "acme", grandchild.Children[0].Run); err == nil {
		t.Fatal("a child beyond max_agent_depth was created")
	}
}

// TestARecoveredParentFindsItsChild: a node crashes while a child waits
// on a slow job; the node that takes over attaches to the same child
// (it exists once) and both complete, the slow job started once.
func TestARecoveredParentFindsItsChild(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`call:slow({"text":"x"})|answer:$results`)+`)|answer:$results`)
	childID := loop.ChildRunID(parent.ID+".t1.0", 1)
	conformance.Eventually(t, "the child's slow job to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
	e.Crash(e.Runtime)
	b := e.Recover("node-b")
	run := e.UntilTerminal(b, parent.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted || run.Result != "slow:x" {
		t.Fatalf("parent: %s %q %+v", run.Status, run.Result, run.Failure)
	}
	if len(run.Children) != 1 || run.Children[0].Run != childID {
		t.Fatalf("children %+v", run.Children)
	}
	if n := e.Tools.Calls(abi.ExportStart); n != 1 {
		t.Fatalf("the slow job started %d times", n)
	}
	for _, id := range []string{parent.ID, childID} {
		if v := loop.CheckEnded(ctxEvents(t, e, id)); len(v) > 0 {
			t.Fatalf("run %s's log: %v", id, v)
		}
	}
}

// TestAReplacedAttemptsChildIsCancelled: a call whose attempt times out
// (the child waits for a person past the parent's effect_timeout) is
// tried again as a new child, and the first child, which its parent will
// never read, is cancelled, naming the attempt that replaced it.
func TestAReplacedAttemptsChildIsCancelled(t *testing.T) {
	e := newSubAgentEnv(t, 0)
	lead := e.Tenant.Agents["lead"]
	lead.EffectTimeout = time.Minute
	for i, tl := range lead.Tools {
		if tl.Spec.Agent == "research" {
			lead.Tools[i].Spec.Policy = loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 10, MaxBackoffMS: 10}
		}
	}
	parent := submitAs(t, e, "lead", "s1", `call:research(`+childScript(`ask:which one?|answer:done`)+`)|answer:$results`)
	first, second := loop.ChildRunID(parent.ID+".t1.0", 1), loop.ChildRunID(parent.ID+".t1.0", 2)
	conformance.Eventually(t, "the first child to wait for input", func() bool {
		c, err := e.Store.LoadRun(context.Background(), "acme", first)
		return err == nil && c.Status == loop.StatusWaiting
	})
	// Past the parent's effect_timeout, in steps the lease renewal keeps
	// up with (a real clock does not jump).
	conformance.Eventually(t, "the second child to wait, and the first to be cancelled", func() bool {
		c2, err2 := e.Store.LoadRun(context.Background(), "acme", second)
		c1, err1 := e.Store.LoadRun(context.Background(), "acme", first)
		if err2 == nil && err1 == nil && c2.Status == loop.StatusWaiting && c1.Status == loop.StatusCancelled {
			return true
		}
		if e.Clock.Running() == 0 {
			e.Clock.Advance(5 * time.Second)
		}
		return false
	})
	c1 := loadRun(t, e, first)
	if !strings.Contains(c1.Failure.Message, "attempt 2 of its parent's call "+parent.ID+".t1.0 replaced it") {
		t.Fatalf("the first child's cancel says %q", c1.Failure.Message)
	}
	if p := loadRun(t, e, parent.ID); p.Status != loop.StatusRunning || len(p.Children) != 2 {
		t.Fatalf("the parent is %s with children %+v; want running, with both", p.Status, p.Children)
	}
}

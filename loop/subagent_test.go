package loop

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// agentToolRun is a Run with a plugin tool, calc, and an agent tool,
// research, whose first model step asked for one call of each.
func agentToolRun(t *testing.T) Run {
	t.Helper()
	s := baseSpec()
	s.Tools = append(s.Tools, ToolSpec{Name: "research", Policy: DefaultToolPolicy(false), Agent: "research"})
	calls := []abi.ToolCall{
		{ID: "c1", Name: "calc", Arguments: json.RawMessage(`{}`)},
		{ID: "c2", Name: "research", Arguments: json.RawMessage(`{"input":"find it"}`)},
	}
	return mustApply(t, Run{},
		RunCreated(s, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1},
		Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{
			Message: abi.Message{ToolCalls: calls}, Usage: abi.Usage{InputTokens: 10, OutputTokens: 1}}}, 5),
	)
}

// TestADispatchedAgentToolRecordsItsChild: each dispatched attempt of an
// agent tool names its child Run, derived from the effect and attempt; a
// plugin tool's dispatch names none.
func TestADispatchedAgentToolRecordsItsChild(t *testing.T) {
	r := mustApply(t, agentToolRun(t),
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.0", Attempt: 1},
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.1", Attempt: 1},
	)
	want := []ChildRef{{Run: ChildRunID("run_1.t1.1", 1), Agent: "research", Effect: "run_1.t1.1", Attempt: 1, ToolCallID: "c2"}}
	if len(r.Children) != 1 || r.Children[0] != want[0] {
		t.Fatalf("children %+v, want %+v", r.Children, want)
	}
	if ChildRunID("run_1.t1.1", 2) == want[0].Run || !ValidID(want[0].Run) {
		t.Fatalf("child ID %q: not an ID, or the same for two attempts", want[0].Run)
	}
	if ChildRunID("run_1.t1.1", 1) != want[0].Run {
		t.Fatal("ChildRunID is not a function of the attempt")
	}
}

// TestAnAgentToolsUsageAddsToTheRunsAndAPluginsCountsForNothing: the
// usage of an agent tool's outcome (its child's) adds to the Run's; a
// plugin tool claiming usage adds nothing and keeps none.
func TestAnAgentToolsUsageAddsToTheRunsAndAPluginsCountsForNothing(t *testing.T) {
	r := mustApply(t, agentToolRun(t),
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.0", Attempt: 1},
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.1", Attempt: 1},
		Settled("run_1.t1.0", 1, Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "4",
			Usage: &abi.Usage{InputTokens: 1000, OutputTokens: 1000}}}, 7),
	)
	if r.Usage != (abi.Usage{InputTokens: 10, OutputTokens: 1}) {
		t.Fatalf("a plugin tool's claimed usage counted: %+v", r.Usage)
	}
	if u := r.Effect("run_1.t1.0").Outcome.Tool.Usage; u != nil {
		t.Fatalf("a plugin tool's outcome keeps its claimed usage %+v", u)
	}
	r = mustApply(t, r, Settled("run_1.t1.1", 1, Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "found",
		Usage: &abi.Usage{InputTokens: 200, OutputTokens: 20}}}, 8))
	if r.Usage != (abi.Usage{InputTokens: 210, OutputTokens: 21}) {
		t.Fatalf("usage %+v, want the child's added", r.Usage)
	}
	if last := r.Transcript[len(r.Transcript)-1]; last.Content != "found" || last.ToolCallID != "c2" {
		t.Fatalf("the child's result is not the tool message: %+v", last)
	}
}

// TestAChildsParentIsChecked: a child Run's parent must name a Run, a
// session, an effect, an attempt and a depth.
func TestAChildsParentIsChecked(t *testing.T) {
	good := ParentRef{Run: "p1", Session: "s0", Effect: "p1.t1.0", Attempt: 1, Depth: 1}
	for name, p := range map[string]ParentRef{
		"bad run":    {Run: "a/b", Session: "s0", Effect: "e", Attempt: 1, Depth: 1},
		"no session": {Run: "p1", Effect: "e", Attempt: 1, Depth: 1},
		"no effect":  {Run: "p1", Session: "s0", Attempt: 1, Depth: 1},
		"attempt 0":  {Run: "p1", Session: "s0", Effect: "e", Depth: 1},
		"depth 0":    {Run: "p1", Session: "s0", Effect: "e", Attempt: 1},
	} {
		s := baseSpec()
		s.Parent = &p
		if _, err := Apply(Run{}, RunCreated(s, 1)); !errors.Is(err, ErrInvalidEvent) && !errors.Is(err, ErrInvalidID) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	s := baseSpec()
	s.Parent = &good
	r, err := Apply(Run{}, RunCreated(s, 1))
	if err != nil || r.Parent == nil || *r.Parent != good || r.Parent == s.Parent {
		t.Fatalf("a good parent: %+v, %v", r.Parent, err)
	}
}

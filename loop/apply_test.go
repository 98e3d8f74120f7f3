package loop

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

func baseSpec() Spec {
	return Spec{Tenant: "acme", Session: "s1", ID: "run_1", Input: "hi", Limits: DefaultLimits, ModelPolicy: DefaultModelPolicy,
		Tools: []ToolSpec{{Name: "calc", Policy: DefaultToolPolicy(false)}}}
}

// mustApply applies events in order and fails the test on any error.
func mustApply(t *testing.T, r Run, evs ...Event) Run {
	t.Helper()
	for _, ev := range evs {
		var err error
		if r, err = Apply(r, ev); err != nil {
			t.Fatalf("apply %s: %v", ev.Type, err)
		}
	}
	return r
}

// dispatchedModel returns a Run whose first model step is executing.
func dispatchedModel(t *testing.T) Run {
	return mustApply(t, Run{},
		RunCreated(baseSpec(), 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1, Epoch: 7},
	)
}

func TestRunCreatedRejectsBadSpecs(t *testing.T) {
	for name, mutate := range map[string]func(*Spec){
		"tenant id outside the grammar": func(s *Spec) { s.Tenant = "a/b" },
		"empty session id":              func(s *Spec) { s.Session = "" },
		"run id too long":               func(s *Spec) { s.ID = string(make([]byte, 65)) },
		"zero max steps":                func(s *Spec) { s.Limits.MaxSteps = 0 },
		"zero parallel window":          func(s *Spec) { s.Limits.MaxParallelToolCalls = 0 },
		"retry policy without attempts": func(s *Spec) { s.ModelPolicy = Policy{Mode: PolicyRetry} },
		"unknown policy mode":           func(s *Spec) { s.Tools[0].Policy.Mode = "sometimes" },
		"duplicate tool names":          func(s *Spec) { s.Tools = append(s.Tools, s.Tools[0]) },
		"negative backoff":              func(s *Spec) { s.ModelPolicy.BackoffMS = -1 },
		"tool without a name":           func(s *Spec) { s.Tools[0].Name = "" },
	} {
		t.Run(name, func(t *testing.T) {
			s := baseSpec()
			mutate(&s)
			_, err := Apply(Run{}, RunCreated(s, 1))
			if !errors.Is(err, ErrInvalidEvent) && !errors.Is(err, ErrInvalidID) {
				t.Fatalf("got %v, want a typed refusal", err)
			}
		})
	}
	if _, err := Apply(Run{}, Event{Type: EventRunCreated}); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("run_created without a spec: %v", err)
	}
}

func TestRunCreatedStartsPendingWithTheInputInTheTranscript(t *testing.T) {
	r := mustApply(t, Run{}, RunCreated(baseSpec(), 42))
	if r.Status != StatusPending || r.Seq != 1 || r.CreatedAt != 42 || len(r.Transcript) != 1 || r.Transcript[0].Content != "hi" {
		t.Fatalf("unexpected run: %+v", r)
	}
}

func TestUnknownEventTypeIsRefused(t *testing.T) {
	r := mustApply(t, Run{}, RunCreated(baseSpec(), 1))
	if _, err := Apply(r, Event{Type: "explode", At: 2}); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("got %v", err)
	}
}

func TestApplyDoesNotMutateItsArgument(t *testing.T) {
	r := dispatchedModel(t)
	// Give the transcript spare capacity, so that an append would alias.
	r.Transcript = append(make([]abi.Message, 0, 16), r.Transcript...)
	before := mustJSON(r)
	m := abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, ToolCalls: []abi.ToolCall{{ID: "c1", Name: "calc"}}}}
	next := mustApply(t, r, Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &m}, 5))
	if string(mustJSON(r)) != string(before) {
		t.Fatal("Apply changed the snapshot it was given")
	}
	if len(next.Transcript) != 2 || len(r.Transcript) != 1 {
		t.Fatalf("transcripts: next %d, old %d", len(next.Transcript), len(r.Transcript))
	}
}

func TestMalformedSettlementsAreRefused(t *testing.T) {
	r := dispatchedModel(t)
	for name, o := range map[string]*Outcome{
		"no outcome":                     nil,
		"done model step without model":  {State: OutcomeDone},
		"done model step with tool body": {State: OutcomeDone, Tool: &abi.ToolOutcome{}},
		"failed without an error":        {State: OutcomeFailed},
		"failed with an unknown class":   {State: OutcomeFailed, Error: &Failure{Class: "weird"}},
		"unknown outcome state":          {State: "maybe"},
	} {
		t.Run(name, func(t *testing.T) {
			ev := Event{Type: EventEffectSettled, At: 5, EffectID: "run_1.m1", Attempt: 1, Outcome: o}
			if _, err := Apply(r, ev); !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("got %v, want ErrInvalidEvent", err)
			}
		})
	}
}

func TestToolCallsWithoutIDsGetTheEffectID(t *testing.T) {
	r := dispatchedModel(t)
	m := abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{{Name: "calc"}, {Name: "calc"}}}}
	r = mustApply(t, r, Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &m}, 5))
	calls := r.Transcript[1].ToolCalls
	if calls[0].ID != "run_1.t1.0" || calls[1].ID != "run_1.t1.1" || r.Effects[2].ToolCallID != "run_1.t1.1" {
		t.Fatalf("tool call ids not filled: %+v", calls)
	}
	if r.Transcript[1].Role != abi.MessageAssistant {
		t.Fatalf("assistant role not enforced: %q", r.Transcript[1].Role)
	}
}

func TestDispatchRecordsEpochAndTime(t *testing.T) {
	r := dispatchedModel(t)
	e := r.Effect("run_1.m1")
	if e.State != EffectExecuting || e.Epoch != 7 || e.DispatchedAt != 4 || e.RequestSeq != 3 {
		t.Fatalf("effect after dispatch: %+v", e)
	}
	if !r.InFlight() || len(r.Executing()) != 1 {
		t.Fatal("dispatched effect not in flight")
	}
}

func TestRepeatedPendingWithTheSameHandleChangesNothing(t *testing.T) {
	r := dispatchedModel(t)
	r = mustApply(t, r, Event{Type: EventEffectPending, At: 5, EffectID: "run_1.m1", Attempt: 1, Handle: "h"})
	if _, err := Apply(r, Event{Type: EventEffectPending, At: 6, EffectID: "run_1.m1", Attempt: 1, Handle: "h"}); !errors.Is(err, ErrNoChange) {
		t.Fatalf("got %v", err)
	}
	r = mustApply(t, r, Event{Type: EventEffectPending, At: 6, EffectID: "run_1.m1", Attempt: 1, Handle: "h2"})
	if r.Effect("run_1.m1").Handle != "h2" {
		t.Fatal("new handle not recorded")
	}
}

// EffectDeferred records when an attempt was first deferred, once; an
// attach that succeeds (EffectPending with a handle) ends the deferral.
func TestADeferralIsRecordedOnceAndEndsWhenAttached(t *testing.T) {
	r := dispatchedModel(t)
	r = mustApply(t, r, Event{Type: EventEffectDeferred, At: 7, EffectID: "run_1.m1", Attempt: 1})
	if got := r.Effect("run_1.m1").DeferredSince; got != 7 {
		t.Fatalf("deferred since %d, want 7", got)
	}
	if _, err := Apply(r, Event{Type: EventEffectDeferred, At: 9, EffectID: "run_1.m1", Attempt: 1}); !errors.Is(err, ErrNoChange) {
		t.Fatalf("a second deferral: %v, want ErrNoChange (max_defer counts from the first)", err)
	}
	if _, err := Apply(r, Event{Type: EventEffectDeferred, At: 9, EffectID: "run_1.m1", Attempt: 2}); !errors.Is(err, ErrStaleAttempt) {
		t.Fatalf("a deferral of an attempt never dispatched: %v", err)
	}
	r = mustApply(t, r, Event{Type: EventEffectPending, At: 10, EffectID: "run_1.m1", Attempt: 1, Handle: "h"})
	if got := r.Effect("run_1.m1").DeferredSince; got != 0 {
		t.Fatalf("deferred since %d after the attempt was attached, want 0", got)
	}
}

// A deferral belongs to one attempt: the next attempt, once dispatched,
// has none, so that its own first deferral is recorded and max_defer
// counts from it (before, a retried attempt inherited the first
// attempt's deferral and met max_defer at once).
func TestADeferralEndsWithItsAttempt(t *testing.T) {
	r := dispatchedModel(t)
	r = mustApply(t, r,
		Event{Type: EventEffectDeferred, At: 7, EffectID: "run_1.m1", Attempt: 1},
		Event{Type: EventEffectSettled, At: 8, EffectID: "run_1.m1", Attempt: 1,
			Outcome: &Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassLost, Message: "gone", Retriable: true}}},
		Event{Type: EventTimerFired, At: 60_000},
		Event{Type: EventEffectDispatched, At: 60_001, EffectID: "run_1.m1", Attempt: 2, Epoch: 7},
	)
	if got := r.Effect("run_1.m1").DeferredSince; got != 0 {
		t.Fatalf("attempt 2 is deferred since %d, the first attempt's deferral; want 0", got)
	}
	r = mustApply(t, r, Event{Type: EventEffectDeferred, At: 60_005, EffectID: "run_1.m1", Attempt: 2})
	if got := r.Effect("run_1.m1").DeferredSince; got != 60_005 {
		t.Fatalf("attempt 2's own deferral is recorded as %d, want 60005", got)
	}
}

func TestApprovalEventsAreValidatedAsAWhole(t *testing.T) {
	spec := baseSpec()
	spec.Tools = append(spec.Tools, ToolSpec{Name: "wire", Approval: true, Policy: DefaultToolPolicy(false)})
	r := mustApply(t, Run{}, RunCreated(spec, 1), Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1})
	m := abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{{ID: "a", Name: "wire"}, {ID: "b", Name: "wire"}}}}
	r = mustApply(t, r, Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &m}, 5))
	for name, tc := range map[string]struct {
		approvals []abi.ApprovalDecision
		want      error
	}{
		"no approvals at all":         {nil, ErrInvalidEvent},
		"the same call twice":         {[]abi.ApprovalDecision{{ToolCallID: "a", Approved: true}, {ToolCallID: "a"}}, ErrInvalidEvent},
		"one good and one unknown id": {[]abi.ApprovalDecision{{ToolCallID: "a", Approved: true}, {ToolCallID: "zz"}}, ErrUnknownToolCall},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Apply(r, Event{Type: EventApprovalRecorded, At: 6, Approvals: tc.approvals}); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	both := mustApply(t, r, Event{Type: EventApprovalRecorded, At: 6, Approvals: []abi.ApprovalDecision{{ToolCallID: "a", Approved: true}, {ToolCallID: "b", Approved: true}}})
	if both.Effect("run_1.t1.0").State != EffectReady || both.Effect("run_1.t1.1").State != EffectReady || both.Status != StatusRunning {
		t.Fatalf("approvals not applied: %s", renderRun(both))
	}
}

func TestBackoffDoublesCapsAndJittersDeterministically(t *testing.T) {
	p := Policy{Mode: PolicyRetry, MaxAttempts: 10, BackoffMS: 1000, MaxBackoffMS: 5000}
	for attempt, base := range map[int]int64{1: 1000, 2: 2000, 3: 4000, 4: 5000, 9: 5000} {
		d := Backoff(p, "r.m1", attempt)
		if d < base || d > base+base/4 {
			t.Errorf("attempt %d: backoff %d outside [%d, %d]", attempt, d, base, base+base/4)
		}
		if d != Backoff(p, "r.m1", attempt) {
			t.Errorf("attempt %d: backoff not deterministic", attempt)
		}
	}
	if Backoff(Policy{Mode: PolicyRetry, MaxAttempts: 3}, "r.m1", 2) != 0 {
		t.Error("zero base backoff must give zero")
	}
	if Backoff(Policy{Mode: PolicyRetry, MaxAttempts: 99, BackoffMS: 1}, "r.m1", 90) <= 0 {
		t.Error("a long retry series must not overflow")
	}
}

func TestRunSurvivesAJSONRoundTrip(t *testing.T) {
	r := dispatchedModel(t)
	var back Run
	if err := json.Unmarshal(mustJSON(r), &back); err != nil {
		t.Fatal(err)
	}
	if string(mustJSON(back)) != string(mustJSON(r)) {
		t.Fatalf("round trip changed the run:\n%s\n%s", mustJSON(r), mustJSON(back))
	}
}

func TestDefaultToolPolicyRetriesOnlyIdempotentTools(t *testing.T) {
	if DefaultToolPolicy(false).Mode != PolicyFail || DefaultToolPolicy(true).Mode != PolicyRetry {
		t.Fatal("tools fail by default unless idempotent")
	}
	if DefaultModelPolicy.Mode != PolicyRetry {
		t.Fatal("model steps retry by default")
	}
}

func TestCancelBeforeStartEndsWithoutRunning(t *testing.T) {
	r := mustApply(t, Run{}, RunCreated(baseSpec(), 1), Event{Type: EventCancelRequested, At: 2})
	acts := Decide(r)
	if len(acts) != 1 || acts[0].Type != ActionFinishCancelled {
		t.Fatalf("actions %v", acts)
	}
	if _, err := Apply(r, Event{Type: EventRunStarted, At: 3}); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("start after cancel: %v", err)
	}
	r = mustApply(t, r, Event{Type: EventRunCancelled, At: 3})
	if r.Status != StatusCancelled || r.Failure.Class != abi.ClassCancelled || r.Failure.Message != "cancelled by request" {
		t.Fatalf("run %+v", r)
	}
}

func TestStepFailedEndsTheRunOnlyWhenAStepIsNeeded(t *testing.T) {
	r := mustApply(t, Run{}, RunCreated(baseSpec(), 1), Event{Type: EventRunStarted, At: 2})
	bad := Event{Type: EventStepFailed, At: 3}
	if _, err := Apply(r, bad); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("step_failed without a failure: %v", err)
	}
	ev := Event{Type: EventStepFailed, At: 3, Failure: &Failure{Class: abi.ClassPluginTrap, Message: "builder trapped"}}
	failed := mustApply(t, r, ev)
	acts := Decide(failed)
	if len(acts) != 1 || acts[0].Type != ActionFail || acts[0].Failure.Class != abi.ClassPluginTrap {
		t.Fatalf("actions %v", acts)
	}
	if _, err := Apply(dispatchedModel(t), ev); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("step_failed while a step is in flight: %v", err)
	}
}

// A timer that times out the last tool call still executing closes the
// step, which empties the Run's effects while applyTimer walks them: it
// must stop there, not index past the end (Apply panicked on this log,
// reachable in production with two tool calls, the first timing out after
// the second finished).
func TestATimerThatClosesTheStepStopsWalkingItsEffects(t *testing.T) {
	spec := baseSpec()
	spec.Limits.EffectTimeoutMS = 1000
	model := &abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, ToolCalls: []abi.ToolCall{
		{ID: "c1", Name: "calc", Arguments: json.RawMessage(`{}`)},
		{ID: "c2", Name: "calc", Arguments: json.RawMessage(`{}`)},
	}}}
	r := mustApply(t, Run{},
		RunCreated(spec, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1, Epoch: 7},
		Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: model}, 5),
		Event{Type: EventEffectDispatched, At: 10, EffectID: "run_1.t1.0", Attempt: 1, Epoch: 7},
		Event{Type: EventEffectDispatched, At: 10, EffectID: "run_1.t1.1", Attempt: 1, Epoch: 7},
		Settled("run_1.t1.1", 1, Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "2"}}, 20),
	)
	next, err := Apply(r, Event{Type: EventTimerFired, At: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if len(next.Effects) != 0 || len(next.Transcript) != len(r.Transcript)+2 {
		t.Fatalf("the step did not close: effects %+v", next.Effects)
	}
}

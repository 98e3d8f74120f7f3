package loop

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
)

// waitClock gives the tests' instants: t0 plus a duration, in Unix ms.
type waitClock struct{ t0 time.Time }

func (c waitClock) at(d time.Duration) int64 { return c.t0.Add(d).UnixMilli() }

var testT0 = waitClock{time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}

// waitSpec is a Run with a plain tool and one that waits for approval.
func waitSpec(lim func(*Limits)) Spec {
	s := Spec{Tenant: "acme", Session: "s1", ID: "run_1", Input: "pay", Limits: DefaultLimits, ModelPolicy: DefaultModelPolicy,
		Tools: []ToolSpec{{Name: "calc", Policy: DefaultToolPolicy(false)}, {Name: "wire", Approval: true, Policy: DefaultToolPolicy(false)}}}
	lim(&s.Limits)
	return s
}

// modelDoneEvent settles model step step of run_1, attempt 1, at at.
func modelDoneEvent(step int, m abi.ModelOutcome, at int64) Event {
	return Settled(ModelEffectID("run_1", step), 1, Outcome{State: OutcomeDone, Model: &m}, at)
}

// untilApproval takes a Run created at t0 to a wait for the approval of
// one wire call, made at t0+2m.
func untilApproval(t *testing.T, spec Spec) Run {
	t.Helper()
	c := testT0
	return mustApply(t, Run{},
		RunCreated(spec, c.at(0)),
		Event{Type: EventRunStarted, At: c.at(time.Second)},
		Event{Type: EventModelStepPlanned, At: c.at(time.Second), Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: c.at(time.Second), EffectID: ModelEffectID("run_1", 1), Attempt: 1},
		modelDoneEvent(1, abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{
			{ID: "call_1", Name: "wire", Arguments: json.RawMessage(`{"amount":5}`)}}}}, c.at(2*time.Minute)),
	)
}

// wakes returns the instants of the Run-wide wake-ups Decide asks for.
func wakes(r Run) []int64 {
	var out []int64
	for _, a := range Decide(r) {
		if a.Type == ActionWakeAt && a.EffectID == "" {
			out = append(out, a.At)
		}
	}
	return out
}

func wantFailure(t *testing.T, r Run, msg string) {
	t.Helper()
	if r.Verdict == nil || r.Verdict.Failure == nil || r.Verdict.Failure.Class != abi.ClassDeadlineExceeded {
		t.Fatalf("verdict %+v; want a deadline_exceeded failure", r.Verdict)
	}
	if got := r.Verdict.Failure.Message; got != msg {
		t.Fatalf("failure message:\n got %s\nwant %s", got, msg)
	}
}

// TestAWaitForApprovalDoesNotCountAgainstRunTimeout: a Run with a
// run_timeout of 1 h that waits 3 h for a person's approval, then works
// a few minutes, completes. While it waits, no timer is asked for its
// work time; once it goes on, the work deadline is 3 h later than it
// was.
func TestAWaitForApprovalDoesNotCountAgainstRunTimeout(t *testing.T) {
	c := testT0
	r := untilApproval(t, waitSpec(func(l *Limits) { l.RunTimeoutMS = time.Hour.Milliseconds() }))
	if r.Status != StatusWaiting || r.WaitingSince != c.at(2*time.Minute) {
		t.Fatalf("status %s, waiting since %d; want waiting since %d", r.Status, r.WaitingSince, c.at(2*time.Minute))
	}
	if got := wakes(r); len(got) != 0 {
		t.Fatalf("a Run waiting for a person with no wait_timeout asks for wake-ups %v; its work clock stands still", got)
	}
	// The instant the work time would have run out, had the wait counted.
	if _, err := Apply(r, Event{Type: EventTimerFired, At: c.at(time.Hour + time.Minute)}); !errors.Is(err, ErrNoChange) {
		t.Fatalf("a timer at creation + run_timeout while the Run waits: %v, want ErrNoChange", err)
	}
	r = mustApply(t, r, Event{Type: EventApprovalRecorded, At: c.at(3*time.Hour + 2*time.Minute),
		Approvals: []abi.ApprovalDecision{{ToolCallID: "call_1", Approved: true}}})
	if r.Verdict != nil || r.Status != StatusRunning {
		t.Fatalf("after an approval 3 h later: status %s, verdict %+v; want running", r.Status, r.Verdict)
	}
	if r.WaitedMS != (3*time.Hour).Milliseconds() || r.WaitingSince != 0 {
		t.Fatalf("waited %d ms, waiting since %d; want 3 h and 0", r.WaitedMS, r.WaitingSince)
	}
	if got, want := wakes(r), []int64{c.at(4 * time.Hour)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("wake-ups %v, want the work deadline creation + 1 h + 3 h waited %v", got, want)
	}
	if got := r.Deadline(); got != c.at(4*time.Hour) {
		t.Fatalf("Deadline() = %d, want %d", got, c.at(4*time.Hour))
	}
	r = mustApply(t, r,
		Event{Type: EventEffectDispatched, At: c.at(3*time.Hour + 3*time.Minute), EffectID: ToolEffectID("run_1", 1, 0), Attempt: 1},
		Settled(ToolEffectID("run_1", 1, 0), 1, Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "sent"}}, c.at(3*time.Hour+10*time.Minute)),
		Event{Type: EventModelStepPlanned, At: c.at(3*time.Hour + 10*time.Minute), Step: 2, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: c.at(3*time.Hour + 10*time.Minute), EffectID: ModelEffectID("run_1", 2), Attempt: 1},
		modelDoneEvent(2, abi.ModelOutcome{Message: abi.Message{Content: "paid"}}, c.at(3*time.Hour+12*time.Minute)),
		Event{Type: EventRunCompleted, At: c.at(3*time.Hour + 12*time.Minute)},
	)
	if r.Status != StatusCompleted || r.Result != "paid" {
		t.Fatalf("status %s, result %q, failure %+v; want completed", r.Status, r.Result, r.Failure)
	}
}

// TestTheWorkClockRunsOnOutsideAWait: time not spent waiting counts; the
// Run fails when its work time reaches run_timeout, and the message says
// the wait was not counted.
func TestTheWorkClockRunsOnOutsideAWait(t *testing.T) {
	c := testT0
	r := untilApproval(t, waitSpec(func(l *Limits) { l.RunTimeoutMS = time.Hour.Milliseconds() }))
	r = mustApply(t, r,
		Event{Type: EventApprovalRecorded, At: c.at(32 * time.Minute), Approvals: []abi.ApprovalDecision{{ToolCallID: "call_1", Approved: true}}},
		Event{Type: EventEffectDispatched, At: c.at(33 * time.Minute), EffectID: ToolEffectID("run_1", 1, 0), Attempt: 1},
	)
	if got, want := wakes(r), []int64{c.at(90 * time.Minute)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("wake-ups %v, want %v (1 h of work after 30 min waited)", got, want)
	}
	if _, err := Apply(r, Event{Type: EventTimerFired, At: c.at(89 * time.Minute)}); !errors.Is(err, ErrNoChange) {
		t.Fatalf("a timer before the work deadline: %v, want ErrNoChange", err)
	}
	r = mustApply(t, r, Event{Type: EventTimerFired, At: c.at(90 * time.Minute)})
	wantFailure(t, r, "run_timeout of 1h0m0s passed at 2026-12-03T13:30:00Z (the Run was created at 2026-12-03T12:00:00Z and waited 30m0s for a person, which run_timeout does not count)")
}

// TestARunThatNeverWaitsFailsAtRunTimeoutAsBefore: without a wait, the
// work deadline is creation + run_timeout, with the message of old.
func TestARunThatNeverWaitsFailsAtRunTimeoutAsBefore(t *testing.T) {
	c := testT0
	r := mustApply(t, Run{},
		RunCreated(waitSpec(func(l *Limits) { l.RunTimeoutMS = (10 * time.Minute).Milliseconds() }), c.at(0)),
		Event{Type: EventRunStarted, At: c.at(time.Second)},
	)
	if got, want := wakes(r), []int64{c.at(10 * time.Minute)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("wake-ups %v, want %v", got, want)
	}
	// Any event after the deadline brings the news.
	r = mustApply(t, r, Event{Type: EventModelStepPlanned, At: c.at(11 * time.Minute), Step: 1, Request: json.RawMessage(`{}`)})
	wantFailure(t, r, "run_timeout of 10m0s passed at 2026-12-03T12:10:00Z (the Run was created at 2026-12-03T12:00:00Z)")
}

// TestWaitTimeoutFailsARunThatWaitsTooLong: wait_timeout bounds a wait,
// for an approval or for input; the timer Decide asks for, or any later
// event, fails the Run with a message that names the wait.
func TestWaitTimeoutFailsARunThatWaitsTooLong(t *testing.T) {
	c := testT0
	spec := waitSpec(func(l *Limits) {
		l.RunTimeoutMS = time.Hour.Milliseconds()
		l.WaitTimeoutMS = (2 * time.Hour).Milliseconds()
	})
	approvalMsg := "wait_timeout of 2h0m0s passed at 2026-12-03T14:02:00Z: the Run had waited for a person's approval of tool call call_1 (tool wire) since 2026-12-03T12:02:00Z"

	t.Run("the timer finds it", func(t *testing.T) {
		r := untilApproval(t, spec)
		if got, want := wakes(r), []int64{c.at(2*time.Hour + 2*time.Minute)}; !reflect.DeepEqual(got, want) {
			t.Fatalf("wake-ups while waiting %v, want the wait deadline %v only", got, want)
		}
		if _, err := Apply(r, Event{Type: EventTimerFired, At: c.at(2*time.Hour + time.Minute)}); !errors.Is(err, ErrNoChange) {
			t.Fatalf("a timer before wait_timeout: %v, want ErrNoChange", err)
		}
		r = mustApply(t, r, Event{Type: EventTimerFired, At: c.at(2*time.Hour + 2*time.Minute)})
		wantFailure(t, r, approvalMsg)
		if acts := Decide(r); len(acts) != 1 || acts[0].Type != ActionFail {
			t.Fatalf("Decide after the wait timed out: %+v, want fail", acts)
		}
	})
	t.Run("a late approval finds it", func(t *testing.T) {
		r := untilApproval(t, spec)
		r = mustApply(t, r, Event{Type: EventApprovalRecorded, At: c.at(5 * time.Hour),
			Approvals: []abi.ApprovalDecision{{ToolCallID: "call_1", Approved: true}}})
		wantFailure(t, r, approvalMsg)
	})
	t.Run("a wait for input", func(t *testing.T) {
		r := mustApply(t, Run{},
			RunCreated(spec, c.at(0)),
			Event{Type: EventRunStarted, At: c.at(time.Second)},
			Event{Type: EventModelStepPlanned, At: c.at(time.Second), Step: 1, Request: json.RawMessage(`{}`)},
			Event{Type: EventEffectDispatched, At: c.at(time.Second), EffectID: ModelEffectID("run_1", 1), Attempt: 1},
			modelDoneEvent(1, abi.ModelOutcome{Message: abi.Message{Content: "?"}, AwaitInput: &abi.AwaitInput{Prompt: "Which account?"}}, c.at(time.Minute)),
		)
		w, ok := r.Waiting()
		if !ok || w.Input == nil || w.Input.Prompt != "Which account?" || w.Since != c.at(time.Minute) || w.Deadline != c.at(2*time.Hour+time.Minute) {
			t.Fatalf("Waiting() = %+v, %t", w, ok)
		}
		r = mustApply(t, r, Event{Type: EventTimerFired, At: c.at(2*time.Hour + time.Minute)})
		wantFailure(t, r, "wait_timeout of 2h0m0s passed at 2026-12-03T14:01:00Z: the Run had waited for the user's answer to its question since 2026-12-03T12:01:00Z")
	})
}

// TestWaitTimeoutBoundsEachWaitNotTheirSum: two waits of 90 min each,
// under a wait_timeout of 2 h, do not fail the Run; the second wait's
// deadline counts from its own start.
func TestWaitTimeoutBoundsEachWaitNotTheirSum(t *testing.T) {
	c := testT0
	r := mustApply(t, Run{},
		RunCreated(waitSpec(func(l *Limits) { l.WaitTimeoutMS = (2 * time.Hour).Milliseconds() }), c.at(0)),
		Event{Type: EventRunStarted, At: c.at(0)},
		Event{Type: EventModelStepPlanned, At: c.at(0), Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: c.at(0), EffectID: ModelEffectID("run_1", 1), Attempt: 1},
		modelDoneEvent(1, abi.ModelOutcome{AwaitInput: &abi.AwaitInput{Prompt: "first?"}}, c.at(0)),
		Event{Type: EventInputProvided, At: c.at(90 * time.Minute), Input: "one"},
		Event{Type: EventModelStepPlanned, At: c.at(90 * time.Minute), Step: 2, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: c.at(90 * time.Minute), EffectID: ModelEffectID("run_1", 2), Attempt: 1},
		modelDoneEvent(2, abi.ModelOutcome{AwaitInput: &abi.AwaitInput{Prompt: "second?"}}, c.at(91*time.Minute)),
	)
	if r.WaitedMS != (90*time.Minute).Milliseconds() || r.WaitingSince != c.at(91*time.Minute) {
		t.Fatalf("waited %d ms, waiting since %d", r.WaitedMS, r.WaitingSince)
	}
	if got, want := wakes(r), []int64{c.at(91*time.Minute + 2*time.Hour)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("wake-ups %v, want %v", got, want)
	}
	r = mustApply(t, r, Event{Type: EventInputProvided, At: c.at(181 * time.Minute), Input: "two"})
	if r.Verdict != nil || r.WaitedMS != (180*time.Minute).Milliseconds() {
		t.Fatalf("after a second wait of 90 min: verdict %+v, waited %d ms", r.Verdict, r.WaitedMS)
	}
}

// TestADeadlineMSRunKeepsItsAbsoluteDeadline: a Run created with
// Limits.DeadlineMS, as every Run was before run_timeout stopped counting
// waits, fails at that instant even while it waits for a person, with
// the message of old, and Decide asks for that wake-up while it waits.
func TestADeadlineMSRunKeepsItsAbsoluteDeadline(t *testing.T) {
	c := testT0
	r := untilApproval(t, waitSpec(func(l *Limits) { l.DeadlineMS = c.at(time.Hour) }))
	if got, want := wakes(r), []int64{c.at(time.Hour)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("wake-ups of a waiting DeadlineMS Run %v, want %v", got, want)
	}
	if got := r.Deadline(); got != c.at(time.Hour) {
		t.Fatalf("Deadline() = %d, want %d", got, c.at(time.Hour))
	}
	failed := mustApply(t, r, Event{Type: EventTimerFired, At: c.at(time.Hour)})
	wantFailure(t, failed, "run_timeout of 1h0m0s passed at 2026-12-03T13:00:00Z (the Run was created at 2026-12-03T12:00:00Z)")
	late := mustApply(t, r, Event{Type: EventApprovalRecorded, At: c.at(3 * time.Hour),
		Approvals: []abi.ApprovalDecision{{ToolCallID: "call_1", Approved: true}}})
	wantFailure(t, late, "run_timeout of 1h0m0s passed at 2026-12-03T13:00:00Z (the Run was created at 2026-12-03T12:00:00Z)")
}

// TestWaitingNamesWhatTheRunWaitsFor: Waiting lists the tool calls that
// wait for approval, with their tool, arguments and effect, and is false
// for a Run that does not wait (one whose other calls still run).
func TestWaitingNamesWhatTheRunWaitsFor(t *testing.T) {
	c := testT0
	r := mustApply(t, Run{},
		RunCreated(waitSpec(func(l *Limits) { l.WaitTimeoutMS = time.Hour.Milliseconds() }), c.at(0)),
		Event{Type: EventRunStarted, At: c.at(0)},
		Event{Type: EventModelStepPlanned, At: c.at(0), Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: c.at(0), EffectID: ModelEffectID("run_1", 1), Attempt: 1},
		modelDoneEvent(1, abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{
			{ID: "a", Name: "wire", Arguments: json.RawMessage(`{"n":1}`)},
			{ID: "b", Name: "calc"},
			{ID: "c", Name: "wire", Arguments: json.RawMessage(`{"n":2}`)}}}}, c.at(time.Minute)),
	)
	if _, ok := r.Waiting(); ok || r.Status != StatusRunning {
		t.Fatalf("a Run with a call to run waits (status %s)", r.Status)
	}
	r = mustApply(t, r,
		Event{Type: EventEffectDispatched, At: c.at(time.Minute), EffectID: ToolEffectID("run_1", 1, 1), Attempt: 1},
		Settled(ToolEffectID("run_1", 1, 1), 1, Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "4"}}, c.at(2*time.Minute)),
	)
	w, ok := r.Waiting()
	if !ok || w.Input != nil || w.Since != c.at(2*time.Minute) || w.Deadline != c.at(62*time.Minute) || len(w.Approvals) != 2 {
		t.Fatalf("Waiting() = %+v, %t", w, ok)
	}
	for i, want := range []struct{ call, effect, args string }{{"a", "run_1.t1.0", `{"n":1}`}, {"c", "run_1.t1.2", `{"n":2}`}} {
		e := w.Approvals[i]
		if e.ToolCallID != want.call || e.ID != want.effect || e.Tool != "wire" || string(e.Arguments) != want.args {
			t.Fatalf("approval %d: %+v, want call %s effect %s", i, e, want.call, want.effect)
		}
	}
	// A denial of one call leaves the Run waiting, in the same wait, for
	// the other.
	r = mustApply(t, r, Event{Type: EventApprovalRecorded, At: c.at(3 * time.Minute), Approvals: []abi.ApprovalDecision{{ToolCallID: "a"}}})
	w, ok = r.Waiting()
	if !ok || len(w.Approvals) != 1 || w.Approvals[0].ToolCallID != "c" || w.Since != c.at(2*time.Minute) {
		t.Fatalf("after a denial: Waiting() = %+v, %t", w, ok)
	}
	r = mustApply(t, r, Event{Type: EventTimerFired, At: c.at(62 * time.Minute)})
	if msg := r.Verdict.Failure.Message; !strings.Contains(msg, "approval of tool call c (tool wire) since 2026-12-03T12:02:00Z") {
		t.Fatalf("message %q does not name the call still waiting", msg)
	}
}

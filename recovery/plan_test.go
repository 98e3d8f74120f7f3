package recovery

import (
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

var (
	rec         = Record{Tenant: "acme", Session: "s1", RunID: "run_1", EffectID: "run_1.t1.0", Kind: abi.KindTool, Attempt: 1, Handle: "h1"}
	retry3      = Policy{Missing: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3}, MaxDeferMS: 60_000}
	failPolicy  = Policy{Missing: loop.Policy{Mode: loop.PolicyFail}, MaxDeferMS: 60_000}
	failRun     = Policy{Missing: loop.Policy{Mode: loop.PolicyFailRun}, MaxDeferMS: 60_000}
	doneOutcome = loop.Outcome{State: loop.OutcomeDone, Tool: &abi.ToolOutcome{Content: "42"}}
)

func TestPlan(t *testing.T) {
	at := func(r Record, attempt int) Record { r.Attempt = attempt; return r }
	deferred := func(n int, first int64) Record { r := rec; r.Deferrals, r.FirstDeferredMS = n, first; return r }
	limited := func(r Record, n int) Record { r.RateLimited = n; return r }
	for _, tc := range []struct {
		name      string
		rec       Record
		st        AttachState
		p         Policy
		want      Decision
		class     abi.ErrorClass
		retriable bool
	}{
		{"pending re-registers with the watcher", rec, AttachState{Kind: AttachPending, Handle: "h2"}, failPolicy, Reattach, "", false},
		{"done settles with the executor's outcome", rec, AttachState{Kind: AttachDone, Outcome: doneOutcome}, failPolicy, Settle, "", false},
		{"failed settles with the executor's failure", rec, AttachState{Kind: AttachFailed, Outcome: loop.Outcome{State: loop.OutcomeFailed,
			Error: &loop.Failure{Class: abi.ClassPluginFailed, Message: "no"}}}, retry3, Settle, abi.ClassPluginFailed, false},
		{"unknown under retry with attempts left retries", rec, AttachState{Kind: AttachUnknown}, retry3, Retry, abi.ClassLost, true},
		{"unknown under retry on the last attempt fails", at(rec, 3), AttachState{Kind: AttachUnknown}, retry3, Fail, abi.ClassLost, false},
		{"unknown after rate-limited attempts counts only the others", limited(at(rec, 5), 3), AttachState{Kind: AttachUnknown}, retry3, Retry, abi.ClassLost, true},
		{"unknown on the last attempt besides the rate-limited ones fails", limited(at(rec, 5), 2), AttachState{Kind: AttachUnknown}, retry3, Fail, abi.ClassLost, false},
		{"unknown under fail fails the effect", rec, AttachState{Kind: AttachUnknown}, failPolicy, Fail, abi.ClassLost, false},
		{"unknown under fail_run fails the run", rec, AttachState{Kind: AttachUnknown}, failRun, FailRun, abi.ClassLost, true},
		{"an unexpected answer counts as unknown", rec, AttachState{Kind: "cancelled"}, failPolicy, Fail, abi.ClassLost, false},
		{"unavailable the first time defers", rec, AttachState{Kind: AttachUnavailable, Reason: "plugin missing"}, failPolicy, Defer, "", false},
		{"unavailable within max_defer defers again", deferred(3, 50_000), AttachState{Kind: AttachUnavailable}, failPolicy, Defer, "", false},
		{"unavailable past max_defer applies the policy", deferred(4, 30_000), AttachState{Kind: AttachUnavailable}, retry3, Retry, abi.ClassExecutorUnavailable, true},
		{"unavailable past max_defer under fail", deferred(4, 30_000), AttachState{Kind: AttachUnavailable}, failPolicy, Fail, abi.ClassExecutorUnavailable, false},
		{"unavailable with max_defer 0 applies the policy at once", rec, AttachState{Kind: AttachUnavailable}, Policy{Missing: loop.Policy{Mode: loop.PolicyFail}}, Fail, abi.ClassExecutorUnavailable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Plan(tc.rec, tc.st, tc.p, 100_000)
			if c.Decision != tc.want {
				t.Fatalf("decision %s, want %s (%s)", c.Decision, tc.want, c.Reason)
			}
			switch c.Decision {
			case Reattach, Defer:
				if c.Settlement != nil {
					t.Fatal("a non-settling decision carries a settlement")
				}
				return
			}
			ev := c.Settlement
			if ev == nil || ev.Type != loop.EventEffectSettled || ev.EffectID != tc.rec.EffectID || ev.Attempt != tc.rec.Attempt {
				t.Fatalf("settlement %+v", ev)
			}
			if c.CommandID != loop.SettleCommandID(tc.rec.EffectID, tc.rec.Attempt) {
				t.Fatalf("a settlement must use the one settlement command id, got %q", c.CommandID)
			}
			if tc.class != "" && (ev.Outcome.Error == nil || ev.Outcome.Error.Class != tc.class || ev.Outcome.Error.Retriable != tc.retriable) {
				t.Fatalf("outcome error %+v, want class %s retriable %v", ev.Outcome.Error, tc.class, tc.retriable)
			}
		})
	}
}

func TestReattachKeepsTheRecordedHandleWhenAttachGivesNone(t *testing.T) {
	c := Plan(rec, AttachState{Kind: AttachPending}, failPolicy, 0)
	if c.Handle != "h1" {
		t.Fatalf("handle %q", c.Handle)
	}
}

func TestDeferBacksOffAndCaps(t *testing.T) {
	p := Policy{DeferBackoffMS: 1000, MaxDeferBackoffMS: 8000}
	for n, want := range map[int]int64{1: 1000, 2: 2000, 3: 4000, 4: 8000, 10: 8000} {
		if got := DeferBackoff(p, n); got != want {
			t.Errorf("try %d: %d, want %d", n, got, want)
		}
	}
	c := Plan(rec, AttachState{Kind: AttachUnavailable}, Policy{Missing: loop.Policy{Mode: loop.PolicyFail}, MaxDeferMS: 10_000}, 5_000)
	if c.RetryAtMS != 6_000 {
		t.Fatalf("retry at %d", c.RetryAtMS)
	}
}

// TestSettlementsAgreeWithTheLoop applies every settling command to a Run
// whose effect is executing, and checks that the Loop reaches the same
// decision: Retry leaves the effect in backoff, Fail closes it as an
// error, FailRun ends the Run.
func TestSettlementsAgreeWithTheLoop(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want func(loop.Run) bool
	}{
		{retry3, func(r loop.Run) bool { return r.Effect("run_1.t1.0").State == loop.EffectBackoff }},
		{failPolicy, func(r loop.Run) bool { return r.Verdict == nil && len(r.Effects) == 0 }},
		{failRun, func(r loop.Run) bool { return r.Verdict != nil && r.Verdict.Status == loop.StatusFailed }},
	} {
		spec := loop.Spec{Tenant: "acme", Session: "s1", ID: "run_1", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
			Tools: []loop.ToolSpec{{Name: "t", Policy: tc.p.Missing}}}
		r, _ := loop.Apply(loop.Run{}, loop.RunCreated(spec, 1))
		evs := []loop.Event{{Type: loop.EventRunStarted}, {Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{}`)},
			{Type: loop.EventEffectDispatched, EffectID: "run_1.m1", Attempt: 1},
			loop.Settled("run_1.m1", 1, loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{{ID: "c", Name: "t"}}}}}, 0),
			{Type: loop.EventEffectDispatched, EffectID: "run_1.t1.0", Attempt: 1}}
		for i, ev := range evs {
			ev.At = int64(i + 2)
			var err error
			if r, err = loop.Apply(r, ev); err != nil {
				t.Fatal(err)
			}
		}
		c := Plan(rec, AttachState{Kind: AttachUnknown}, tc.p, 100)
		next, err := loop.Apply(r, *c.Settlement)
		if err != nil || !tc.want(next) {
			t.Fatalf("policy %s: decision %s not what the loop did: %v", tc.p.Missing.Mode, c.Decision, err)
		}
	}
}

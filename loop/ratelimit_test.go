package loop

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// rateLimited is the failure of an attempt the provider refused for now,
// asking for a wait of retryAfterMS.
func rateLimited(retryAfterMS int64) Outcome {
	return Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassRateLimited, Message: "the server answered 429",
		Retriable: true, RetryAfterMS: retryAfterMS}}
}

// trapped is the failure of an attempt whose plugin crashed.
var trapped = Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassPluginTrap, Message: "crashed", Retriable: true}}

// modelRun returns a Run whose first model step is executing under policy p.
func modelRun(t *testing.T, p Policy) Run {
	t.Helper()
	s := baseSpec()
	s.ModelPolicy = p
	return mustApply(t, Run{},
		RunCreated(s, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1},
	)
}

// failAndRetry settles the model step's executing attempt with o at time
// at and, when the Loop backs off, fires the timer at NotBefore and
// dispatches the next attempt. It returns the Run and the backoff's
// NotBefore (0 when the Loop did not back off).
func failAndRetry(t *testing.T, r Run, o Outcome, at int64) (Run, int64) {
	t.Helper()
	e := r.Effect("run_1.m1")
	r = mustApply(t, r, Settled(e.ID, e.Attempt, o, at))
	e = r.Effect("run_1.m1")
	if e == nil || e.State != EffectBackoff {
		return r, 0
	}
	nb := e.NotBefore
	if _, err := Apply(r, Event{Type: EventTimerFired, At: nb - 1}); !errors.Is(err, ErrNoChange) {
		t.Fatalf("a timer 1 ms before NotBefore %d: %v, want nothing due", nb, err)
	}
	r = mustApply(t, r, Event{Type: EventTimerFired, At: nb},
		Event{Type: EventEffectDispatched, At: nb, EffectID: e.ID, Attempt: e.Attempt + 1})
	return r, nb
}

func TestTheNextAttemptWaitsAsLongAsTheProviderAsked(t *testing.T) {
	p := Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 4000}
	r := modelRun(t, p)
	// 20 s: more than the backoff (1 s) and its cap (4 s): max_backoff
	// does not cut what the provider asked for.
	r, nb := failAndRetry(t, r, rateLimited(20_000), 10_000)
	if nb != 10_000+20_000 {
		t.Fatalf("NotBefore %d, want %d (the provider's 20 s after the failure)", nb, 30_000)
	}
	e := r.Effect("run_1.m1")
	if e.Attempt != 2 || e.RateLimited != 1 || e.Failures != 1 {
		t.Fatalf("after one rate-limited attempt: attempt %d, rate limited %d, failures %d", e.Attempt, e.RateLimited, e.Failures)
	}
	// A wait shorter than the backoff leaves the backoff.
	r, nb = failAndRetry(t, r, rateLimited(10), 40_000)
	if want := 40_000 + Backoff(p, "run_1.m1", 2); nb != want || nb < 40_000+2000 {
		t.Fatalf("NotBefore %d, want the backoff's %d", nb, want)
	}
	// Any retriable failure may say when to come back.
	f := trapped
	f.Error = &Failure{Class: abi.ClassPluginFailed, Message: "503", Retriable: true, RetryAfterMS: 15_000}
	_, nb = failAndRetry(t, r, f, 50_000)
	if nb != 65_000 {
		t.Fatalf("NotBefore %d after a plugin_failed with retry_after 15 s, want 65000", nb)
	}
}

func TestARetryAfterBeyondItsCapWaitsTheCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		want int64
	}{
		{"the policy's cap", Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxRetryAfterMS: 60_000}, 60_000},
		{"the default cap", Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000}, DefaultMaxRetryAfterMS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := modelRun(t, tc.p)
			_, nb := failAndRetry(t, r, rateLimited(3_600_000), 10_000)
			if nb != 10_000+tc.want {
				t.Fatalf("NotBefore %d after an hour asked, want %d", nb, 10_000+tc.want)
			}
		})
	}
}

func TestRateLimitedAttemptsHaveABudgetOfTheirOwn(t *testing.T) {
	p := Policy{Mode: PolicyRetry, MaxAttempts: 2, BackoffMS: 10, MaxRateLimitedAttempts: 4}
	r := modelRun(t, p)
	now := int64(10)
	// Three rate-limited answers and a crash (the first of the two
	// failures max_attempts allows) are each followed by another attempt.
	for i, o := range []Outcome{rateLimited(100), rateLimited(0), trapped, rateLimited(100)} {
		var nb int64
		r, nb = failAndRetry(t, r, o, now)
		if nb == 0 {
			t.Fatalf("failure %d (%s) was not retried: %s", i+1, o.Error.Class, renderRun(r))
		}
		now = nb + 1
	}
	e := r.Effect("run_1.m1")
	if e.Attempt != 5 || e.RateLimited != 3 || e.Failures != 4 {
		t.Fatalf("attempt %d, rate limited %d, failures %d; want 5, 3, 4", e.Attempt, e.RateLimited, e.Failures)
	}
	// The fourth rate-limited answer is the budget's last.
	r, nb := failAndRetry(t, r, rateLimited(100), now)
	if nb != 0 || r.Verdict == nil || r.Verdict.Failure.Class != abi.ClassRateLimited {
		t.Fatalf("the 4th rate-limited answer of 4 allowed: NotBefore %d, verdict %+v", nb, r.Verdict)
	}
	if msg := r.Verdict.Failure.Message; !strings.Contains(msg, "after 5 attempt(s) (rate_limited)") {
		t.Fatalf("the Run's failure says %q", msg)
	}

	// The other budget: a second crash ends it, whatever the rate-limited
	// attempts before.
	r = modelRun(t, p)
	now = 10
	for _, o := range []Outcome{trapped, rateLimited(5), rateLimited(5)} {
		var nb int64
		if r, nb = failAndRetry(t, r, o, now); nb == 0 {
			t.Fatalf("%s was not retried", o.Error.Class)
		}
		now = nb + 1
	}
	r, nb = failAndRetry(t, r, trapped, now)
	if nb != 0 || r.Verdict == nil || r.Verdict.Failure.Class != abi.ClassPluginTrap {
		t.Fatalf("the second crash of max_attempts 2: NotBefore %d, verdict %+v", nb, r.Verdict)
	}
}

func TestARunOutlastsAFiveMinuteRateLimitWindowByDefault(t *testing.T) {
	// The default model policy, and a provider that says nothing of when
	// to come back: the backoff alone spans the window.
	r := modelRun(t, DefaultModelPolicy)
	start, now := int64(10_000), int64(10_000)
	for now < start+5*60*1000 {
		var nb int64
		r, nb = failAndRetry(t, r, rateLimited(0), now)
		if nb == 0 {
			t.Fatalf("the Run gave up %d s into the window: %+v", (now-start)/1000, r.Verdict)
		}
		now = nb
	}
	e := r.Effect("run_1.m1")
	if e.RateLimited >= DefaultMaxRateLimitedAttempts {
		t.Fatalf("%d rate-limited attempts", e.RateLimited)
	}
	done := Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Content: "at last"}}}
	r = mustApply(t, r, Settled(e.ID, e.Attempt, done, now+1), Event{Type: EventRunCompleted, At: now + 2, Result: "at last"})
	if r.Status != StatusCompleted {
		t.Fatalf("status %s", r.Status)
	}
}

func TestRateLimitedFailuresFollowTheOtherModes(t *testing.T) {
	// fail: a rate-limited tool call is a tool error at once.
	s := baseSpec()
	s.Tools = []ToolSpec{{Name: "calc", Policy: Policy{Mode: PolicyFail}}, {Name: "fatal", Policy: Policy{Mode: PolicyFailRun}}}
	r := mustApply(t, Run{}, RunCreated(s, 1), Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1},
		Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{
			ToolCalls: []abi.ToolCall{{ID: "c1", Name: "calc"}, {ID: "c2", Name: "fatal"}}}}}, 5),
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.0", Attempt: 1},
		Event{Type: EventEffectDispatched, At: 6, EffectID: "run_1.t1.1", Attempt: 1},
		Settled("run_1.t1.0", 1, rateLimited(1000), 7))
	if e := r.Effect("run_1.t1.0"); e.State != EffectSettled || e.RateLimited != 1 {
		t.Fatalf("calc under fail: %+v", e)
	}
	// fail_run: the Run fails.
	r = mustApply(t, r, Settled("run_1.t1.1", 1, rateLimited(1000), 8))
	if r.Verdict == nil || r.Verdict.Failure.Class != abi.ClassRateLimited {
		t.Fatalf("fatal under fail_run: verdict %+v", r.Verdict)
	}
}

func TestANegativeRetryAfterIsRefused(t *testing.T) {
	r := dispatchedModel(t)
	if _, err := Apply(r, Settled("run_1.m1", 1, rateLimited(-1), 5)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("got %v, want ErrInvalidEvent", err)
	}
	s := baseSpec()
	s.ModelPolicy.MaxRateLimitedAttempts = -1
	if _, err := Apply(Run{}, RunCreated(s, 1)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("a negative max_rate_limited_attempts: %v", err)
	}
	s = baseSpec()
	s.ModelPolicy.MaxRetryAfterMS = -1
	if _, err := Apply(Run{}, RunCreated(s, 1)); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("a negative max_retry_after_ms: %v", err)
	}
}

func TestRetryWait(t *testing.T) {
	p := Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 2000, MaxRetryAfterMS: 30_000}
	for _, tc := range []struct {
		f    *Failure
		want int64
	}{
		{nil, Backoff(p, "e", 1)},
		{&Failure{Class: abi.ClassLost, Retriable: true}, Backoff(p, "e", 1)},
		{&Failure{Class: abi.ClassRateLimited, Retriable: true, RetryAfterMS: 1}, Backoff(p, "e", 1)},
		{&Failure{Class: abi.ClassRateLimited, Retriable: true, RetryAfterMS: 20_000}, 20_000},
		{&Failure{Class: abi.ClassRateLimited, Retriable: true, RetryAfterMS: 30_001}, 30_000},
	} {
		if got := RetryWait(p, "e", 1, tc.f); got != tc.want {
			t.Errorf("RetryWait(%+v) = %d, want %d", tc.f, got, tc.want)
		}
	}
}

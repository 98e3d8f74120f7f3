package loop

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// fuzzSpec is the Run every fuzz sequence starts from: two plain tools, a
// gated one, an idempotent one with retries and a fail_run one, a small
// window, time limits of style limits (fuzzLimitStyles), and small
// budgets of rate-limited attempts.
func fuzzSpec(limits int) Spec {
	lim := Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 2, EffectTimeoutMS: 30_000}
	switch limits {
	case fuzzDeadline:
		lim.DeadlineMS = 400_000
	case fuzzRunAndWaitTimeouts:
		lim.RunTimeoutMS, lim.WaitTimeoutMS = 90_000, 30_000
	case fuzzAllLimits:
		lim.DeadlineMS, lim.RunTimeoutMS, lim.WaitTimeoutMS = 250_000, 60_000, 40_000
	}
	return Spec{
		Tenant: "t", Session: "s", ID: "r", Input: "go",
		Limits:      lim,
		ModelPolicy: Policy{Mode: PolicyRetry, MaxAttempts: 2, BackoffMS: 500, MaxBackoffMS: 2000, MaxRateLimitedAttempts: 3, MaxRetryAfterMS: 5000},
		Tools: []ToolSpec{
			{Name: "a", Policy: Policy{Mode: PolicyFail}, InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)},
			{Name: "b", Policy: Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 100, MaxRateLimitedAttempts: 2}},
			{Name: "gate", Approval: true, Policy: Policy{Mode: PolicyFail}},
			{Name: "fatal", Policy: Policy{Mode: PolicyFailRun}},
		},
	}
}

// The styles of time limits a fuzzed Run has: an absolute deadline (the
// Runs created before run_timeout stopped counting waits), a run_timeout
// and a wait_timeout (the Runs created since), and all three.
const (
	fuzzDeadline = iota
	fuzzRunAndWaitTimeouts
	fuzzAllLimits
	fuzzLimitStyles
)

var fuzzTools = []string{"a", "b", "gate", "fatal", "missing"}

// fuzzArguments are tool-call arguments; the second breaks tool a's
// input_schema.
var fuzzArguments = []json.RawMessage{nil, json.RawMessage(`{"n":"x"}`), json.RawMessage(`{"n":1}`), json.RawMessage(`{}`)}

// fuzzEvent turns a few bytes into the next event. Most choices follow what
// Decide asks for, so sequences reach deep states; the rest are arbitrary
// events, legal or not.
func fuzzEvent(r Run, now int64, b []byte) Event {
	at := func(i int) byte {
		if i < len(b) {
			return b[i]
		}
		return 0
	}
	acts := Decide(r)
	anyEffect := func() (string, int) {
		if len(r.Effects) == 0 {
			return ModelEffectID(r.ID, r.Step+int(at(2)%2)), int(at(3) % 3)
		}
		e := r.Effects[int(at(2))%len(r.Effects)]
		attempt := e.Attempt
		if at(3)%5 == 0 {
			attempt = int(at(3) % 3)
		}
		return e.ID, attempt
	}
	outcome := func(id string) Outcome {
		switch at(4) % 7 {
		case 0, 1:
			if ref, err := ParseEffectID(id); err == nil && ref.Kind == "model" {
				m := abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, Content: "answer"}, Usage: abi.Usage{InputTokens: 1, OutputTokens: 1}}
				for i := 0; i < int(at(5)%6); i++ {
					m.Message.ToolCalls = append(m.Message.ToolCalls, abi.ToolCall{ID: fmt.Sprintf("c%d", i), Name: fuzzTools[int(at(6+i))%len(fuzzTools)],
						Arguments: fuzzArguments[int(at(12+i))%len(fuzzArguments)]})
				}
				if at(5)%7 == 6 {
					m.AwaitInput = &abi.AwaitInput{Prompt: "?"}
				}
				return Outcome{State: OutcomeDone, Model: &m}
			}
			return Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "ok"}}
		case 2:
			return Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassLost, Message: "gone", Retriable: true}}
		case 3:
			return Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassPluginFailed, Message: "no"}}
		case 4:
			return Outcome{State: OutcomeCancelled}
		case 5:
			return Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassRateLimited, Message: "429", Retriable: true,
				RetryAfterMS: int64(at(5)%8) * 1000}}
		default:
			return Outcome{State: OutcomeDone} // malformed: no payload
		}
	}
	switch op := at(0) % 16; {
	case op < 8 && len(acts) > 0:
		a := acts[int(at(1))%len(acts)]
		switch a.Type {
		case ActionStart:
			return Event{Type: EventRunStarted, At: now}
		case ActionPlanModelStep:
			return Event{Type: EventModelStepPlanned, At: now, Step: a.Step, Request: json.RawMessage(`{}`)}
		case ActionDispatch:
			return Event{Type: EventEffectDispatched, At: now, EffectID: a.EffectID, Attempt: a.Attempt}
		case ActionCancelEffect:
			return Settled(a.EffectID, a.Attempt, outcome(a.EffectID), now)
		case ActionAwaitApproval:
			return Event{Type: EventApprovalRecorded, At: now, Approvals: []abi.ApprovalDecision{{ToolCallID: a.ToolCallIDs[0], Approved: at(2)%2 == 0}}}
		case ActionAwaitInput:
			return Event{Type: EventInputProvided, At: now, Input: "more"}
		case ActionWakeAt:
			return Event{Type: EventTimerFired, At: max(a.At, now)}
		case ActionComplete:
			return Event{Type: EventRunCompleted, At: now}
		case ActionFail:
			return Event{Type: EventRunFailed, At: now}
		case ActionFinishCancelled:
			return Event{Type: EventRunCancelled, At: now}
		}
	case op < 11:
		id, attempt := anyEffect()
		return Settled(id, attempt, outcome(id), now)
	case op == 11:
		id, attempt := anyEffect()
		return Event{Type: EventEffectPending, At: now, EffectID: id, Attempt: attempt, Handle: fmt.Sprint("h", at(4))}
	case op == 12:
		return Event{Type: EventCancelRequested, At: now}
	case op == 13:
		return Event{Type: EventTimerFired, At: now + int64(at(1))*1000}
	case op == 14:
		id, attempt := anyEffect()
		return Event{Type: EventEffectDispatched, At: now, EffectID: id, Attempt: attempt + 1}
	case op == 15:
		id, attempt := anyEffect()
		return Event{Type: EventEffectDeferred, At: now, EffectID: id, Attempt: attempt}
	}
	types := []EventType{EventRunStarted, EventInputProvided, EventApprovalRecorded, EventRunCompleted, EventRunFailed, EventRunCancelled, EventModelStepPlanned, EventStepFailed}
	ev := Event{Type: types[int(at(1))%len(types)], At: now, Step: r.Step + 1, Request: json.RawMessage(`{}`),
		Failure: &Failure{Class: abi.ClassPluginTrap, Message: "builder"}}
	if ev.Type == EventApprovalRecorded {
		ev.Approvals = []abi.ApprovalDecision{{ToolCallID: fmt.Sprint("c", at(2)%4), Approved: true}}
	}
	return ev
}

type attemptKey struct {
	id      string
	attempt int
}

// checkInvariants checks what must hold after every accepted event and
// returns the attempts this event settled.
func checkInvariants(t *testing.T, prev, next Run, ev Event, settled map[attemptKey]bool) {
	t.Helper()
	// No double settlement: an attempt leaves executing for an outcome
	// once only, and an effect closed without a dispatch is closed once.
	for _, e := range next.Effects {
		if e.State != EffectSettled && e.State != EffectBackoff {
			continue
		}
		old := prev.Effect(e.ID)
		if old != nil && (old.State == EffectSettled || old.State == EffectBackoff) && old.Attempt == e.Attempt {
			continue
		}
		k := attemptKey{e.ID, e.Attempt}
		if old == nil || old.State != EffectExecuting {
			// Closed without a dispatch in flight (cancelled while ready,
			// gated or in backoff, or denied): that closes the effect, once.
			k = attemptKey{e.ID, -1}
		}
		if settled[k] {
			t.Fatalf("attempt %s#%d settled twice (event %s)", e.ID, e.Attempt, ev.Type)
		}
		settled[k] = true
	}
	if prev.Status.Terminal() {
		t.Fatalf("event %s accepted after terminal status %s", ev.Type, prev.Status)
	}
	// Decide is deterministic, also across a JSON round trip of the
	// snapshot (the store persists it as JSON).
	a1, a2 := Decide(next), Decide(next)
	if !reflect.DeepEqual(a1, a2) {
		t.Fatalf("Decide not deterministic:\n%v\n%v", a1, a2)
	}
	raw, err := json.Marshal(next)
	if err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if a3 := Decide(back); !reflect.DeepEqual(a1, a3) {
		t.Fatalf("Decide differs after a JSON round trip:\n%v\n%v", a1, a3)
	}
	// Never stuck.
	if !next.Status.Terminal() && len(a1) == 0 && !next.InFlight() {
		t.Fatalf("run is stuck: status %s, no actions, nothing in flight: %s", next.Status, renderRun(next))
	}
	if next.Seq != prev.Seq+1 {
		t.Fatalf("seq %d after %d", next.Seq, prev.Seq)
	}
	// Retries keep to their policy: no attempt before the wait the
	// failure asked for (within the policy's cap), and each budget holds.
	for _, e := range next.Effects {
		p := next.policyOf(&e)
		if p.Mode == PolicyRetry && (e.Attempt-e.RateLimited > p.MaxAttempts || e.RateLimited > p.RateLimitedAttempts()) {
			t.Fatalf("effect %s: attempt %d with %d rate-limited, beyond policy %+v", e.ID, e.Attempt, e.RateLimited, p)
		}
		old := prev.Effect(e.ID)
		if e.State != EffectBackoff || old == nil || old.State != EffectExecuting {
			continue
		}
		f := e.Outcome.Error
		if want := ev.At + min(f.RetryAfterMS, p.RetryAfterCapMS()); e.NotBefore < want {
			t.Fatalf("effect %s backs off until %d after %s asked for %d ms at %d", e.ID, e.NotBefore, f.Class, f.RetryAfterMS, ev.At)
		}
	}
	checkWaitClocks(t, prev, next, ev, a1)
}

// checkWaitClocks checks the time limits' bookkeeping (wait.go) after an
// accepted event whose time is at or after every earlier one's: a wait
// has a start exactly while the Run waits; the time waited only grows,
// by the length of the wait that ended; a Run that goes on has work time
// and wait time left; and Decide asks to be woken when they run out.
func checkWaitClocks(t *testing.T, prev, next Run, ev Event, acts []Action) {
	t.Helper()
	waiting := next.Status == StatusWaiting
	if waiting != (next.WaitingSince > 0) {
		t.Fatalf("status %s with waiting_since %d after %s", next.Status, next.WaitingSince, ev.Type)
	}
	switch {
	case prev.Status == StatusWaiting && !waiting:
		if want := prev.WaitedMS + ev.At - prev.WaitingSince; next.WaitedMS != want {
			t.Fatalf("a wait from %d ended at %d: waited %d ms, want %d", prev.WaitingSince, ev.At, next.WaitedMS, want)
		}
	case next.WaitedMS != prev.WaitedMS:
		t.Fatalf("waited %d ms, then %d, with no wait ending (%s)", prev.WaitedMS, next.WaitedMS, ev.Type)
	case waiting && prev.Status == StatusWaiting && next.WaitingSince != prev.WaitingSince:
		t.Fatalf("a wait that goes on changed its start from %d to %d", prev.WaitingSince, next.WaitingSince)
	case waiting && prev.Status != StatusWaiting && next.WaitingSince != ev.At:
		t.Fatalf("a wait began at %d, recorded as %d", ev.At, next.WaitingSince)
	}
	if next.Verdict != nil || next.Status.Terminal() {
		return
	}
	wakeAt := func(at int64) bool {
		for _, a := range acts {
			if a.Type == ActionWakeAt && a.EffectID == "" && a.At == at {
				return true
			}
		}
		return false
	}
	if rt := next.Limits.RunTimeoutMS; rt > 0 {
		used := ev.At - next.CreatedAt - next.WaitedMS
		if waiting {
			used -= ev.At - next.WaitingSince
		}
		if used >= rt {
			t.Fatalf("the Run goes on after %d ms of work, run_timeout %d (%s)", used, rt, renderRun(next))
		}
		if !waiting && !wakeAt(next.CreatedAt+rt+next.WaitedMS) {
			t.Fatalf("no wake-up at the work deadline %d: %v", next.CreatedAt+rt+next.WaitedMS, acts)
		}
	}
	if wt := next.Limits.WaitTimeoutMS; wt > 0 && waiting {
		if ev.At-next.WaitingSince >= wt {
			t.Fatalf("the Run still waits %d ms after its wait began, wait_timeout %d", ev.At-next.WaitingSince, wt)
		}
		if !wakeAt(next.WaitingSince + wt) {
			t.Fatalf("no wake-up at the wait deadline %d: %v", next.WaitingSince+wt, acts)
		}
	}
}

// FuzzApply feeds random event sequences to Apply and checks, after each
// one: no double settlement, no event accepted after a terminal status,
// Decide deterministic, and never stuck.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte("follow the actions and finish the run please"))
	f.Add([]byte{1, 1, 1, 1, 1, 2, 2, 1, 0, 3, 1, 4, 4, 4, 0, 1, 2, 3, 4, 5, 6, 7, 12, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5})
	for i := 0; i < 24; i++ {
		seed := make([]byte, 160)
		for j := range seed {
			seed[j] = byte((i*31 + j*17 + i*j) % 251)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for limits := range fuzzLimitStyles {
			fuzzSequence(t, data, limits)
		}
	})
}

// fuzzSequence applies the events data makes to a Run with time limits
// of style limits, checking the invariants after each.
func fuzzSequence(t *testing.T, data []byte, limits int) {
	{
		run, err := Apply(Run{}, RunCreated(fuzzSpec(limits), 1000))
		if err != nil {
			t.Fatal(err)
		}
		settled := map[attemptKey]bool{}
		now := int64(1000)
		for i := 0; i+8 <= len(data) && i < 8*400; i += 8 {
			chunk := data[i : i+8]
			now += int64(chunk[7]%4) * 250
			ev := fuzzEvent(run, now, chunk)
			before, _ := json.Marshal(run)
			next, err := Apply(run, ev)
			if after, _ := json.Marshal(run); string(before) != string(after) {
				t.Fatalf("Apply mutated its argument on %s", ev.Type)
			}
			if err != nil {
				if string(mustJSON(next)) != string(before) {
					t.Fatalf("Apply changed the run on error %v", err)
				}
				if sentinelName(err) == "UNTYPED" {
					t.Fatalf("untyped error from %s: %v", ev.Type, err)
				}
				continue
			}
			checkInvariants(t, run, next, ev, settled)
			run = next
			if ev.At > now {
				now = ev.At
			}
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestDrivenRunsAlwaysEnd follows Decide with deterministic outcomes from
// many seeds and checks that each Run reaches a terminal status: the loop
// itself never keeps a Run alive forever.
func TestDrivenRunsAlwaysEnd(t *testing.T) {
	for seed := 0; seed < 300*fuzzLimitStyles; seed++ {
		run, err := Apply(Run{}, RunCreated(fuzzSpec(seed%fuzzLimitStyles), 0))
		if err != nil {
			t.Fatal(err)
		}
		now := int64(0)
		for i := 0; !run.Status.Terminal(); i++ {
			if i > 500 {
				t.Fatalf("seed %d: run not terminal after 500 events: %s", seed, renderRun(run))
			}
			now += 1000
			acts := Decide(run)
			if len(acts) == 0 {
				// Only effects in flight: the executor answers one.
				e := run.Executing()[0]
				acts = []Action{{Type: ActionCancelEffect, EffectID: e.ID, Attempt: e.Attempt}}
			}
			b := []byte{0, byte(seed + i), byte(i), 1, byte(seed*7 + i), byte(seed + 3*i), byte(i), byte(seed), 0, 0, 0, 0}
			ev := fuzzEvent(run, now, b)
			next, err := Apply(run, ev)
			if err != nil {
				// A timer that is not due yet: jump to the earliest wake-up.
				for _, a := range acts {
					if a.Type == ActionWakeAt {
						now = max(now, a.At)
					}
				}
				next, err = Apply(run, Event{Type: EventTimerFired, At: now})
				if err != nil {
					t.Fatalf("seed %d: %v after %v: %s", seed, err, ev.Type, renderRun(run))
				}
			}
			run = next
		}
	}
}

// FuzzToolArguments checks that compiling any schema and checking any
// arguments against it never panics, and that the verdict is the same
// every time.
func FuzzToolArguments(f *testing.F) {
	f.Add([]byte(`{"type":"object","properties":{"n":{"type":"integer","maximum":3}},"required":["n"]}`), []byte(`{"n":4}`))
	f.Add([]byte(`{"$defs":{"a":{"allOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`), []byte(`{}`))
	f.Add([]byte(`{"type":"object","patternProperties":{"^(a+)+$":{"type":"string"}}}`), []byte(`{"aaaaaaaaaaaaaaaaaaaaaaaa!":1}`))
	f.Add([]byte(`{"type":"object","additionalProperties":false}`), []byte(`{"a":1,"b":2,"a":3}`))
	f.Add([]byte(`{"$ref":"file:///etc/passwd"}`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, schema, args []byte) {
		s, err := compileToolSchema(schema)
		if err != nil {
			return
		}
		first := fmt.Sprint(s.Check(args))
		if again := fmt.Sprint(s.Check(args)); again != first {
			t.Fatalf("two checks disagree:\n%s\n%s", first, again)
		}
	})
}

package loop

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

// chkRun is the Run of the CheckLog tests.
const chkRun = "run_chk"

func chkSpec() *Spec {
	return &Spec{Tenant: "acme", Session: "s1", ID: chkRun, Input: "go", Limits: DefaultLimits,
		ModelPolicy: Policy{Mode: PolicyRetry, MaxAttempts: 2},
		Tools: []ToolSpec{
			{Name: "flaky", Policy: Policy{Mode: PolicyRetry, MaxAttempts: 3}},
			{Name: "echo", Policy: Policy{Mode: PolicyFail}},
			{Name: "wire", Approval: true, Policy: Policy{Mode: PolicyFail}},
		}}
}

var (
	chkM1, chkM2, chkM3  = ModelEffectID(chkRun, 1), ModelEffectID(chkRun, 2), ModelEffectID(chkRun, 3)
	chkFlaky, chkEcho    = ToolEffectID(chkRun, 1, 0), ToolEffectID(chkRun, 1, 1)
	chkWire, chkNotAsked = ToolEffectID(chkRun, 1, 2), ToolEffectID(chkRun, 1, 3)
)

func chkModel(m abi.ModelOutcome) *Outcome {
	m.Message.Role = abi.MessageAssistant
	return &Outcome{State: OutcomeDone, Model: &m}
}

func chkCalls(names ...string) *Outcome {
	var calls []abi.ToolCall
	for i, n := range names {
		calls = append(calls, abi.ToolCall{ID: fmt.Sprintf("c%d", i+1), Name: n})
	}
	return chkModel(abi.ModelOutcome{Message: abi.Message{ToolCalls: calls}})
}

var (
	chkDone    = &Outcome{State: OutcomeDone, Tool: &abi.ToolOutcome{Content: "ok"}}
	chkLost    = &Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassLost, Message: "gone", Retriable: true}}
	chkAsk     = chkModel(abi.ModelOutcome{Message: abi.Message{Content: "Which city?"}, AwaitInput: &abi.AwaitInput{Prompt: "Which city?"}})
	chkFinal   = chkModel(abi.ModelOutcome{Message: abi.Message{Content: "noted"}})
	chkRequest = json.RawMessage(`{"messages":[]}`)
)

func chkDispatch(effect string, attempt int, epoch uint64) Event {
	return Event{Type: EventEffectDispatched, EffectID: effect, Attempt: attempt, Epoch: epoch}
}

func chkSettle(effect string, attempt int, o *Outcome) Event {
	return Event{Type: EventEffectSettled, EffectID: effect, Attempt: attempt, Outcome: o}
}

func chkApprove(call string, yes bool) Event {
	return Event{Type: EventApprovalRecorded, Approvals: []abi.ApprovalDecision{{ToolCallID: call, Approved: yes}}}
}

func chkAnswer(question string) string { return "re: " + question }

// chkGood is a whole log that Apply accepts, event by event: a model step
// asks for three tools; the flaky one needs its three attempts, the second
// after a takeover (epoch 2) and pending first; the gated one is approved;
// the next step asks the user a question, answered; the last answers.
func chkGood(t *testing.T) []Event {
	t.Helper()
	evs := []Event{
		RunCreated(*chkSpec(), 0),
		{Type: EventRunStarted},
		{Type: EventModelStepPlanned, Step: 1, Request: chkRequest},
		chkDispatch(chkM1, 1, 1),
		chkSettle(chkM1, 1, chkCalls("flaky", "echo", "wire")),
		chkDispatch(chkFlaky, 1, 1),
		chkDispatch(chkEcho, 1, 1),
		chkSettle(chkEcho, 1, chkDone),
		chkApprove("c3", true),
		chkDispatch(chkWire, 1, 1),
		chkSettle(chkFlaky, 1, chkLost),
		{Type: EventTimerFired},
		chkDispatch(chkFlaky, 2, 2),
		{Type: EventEffectPending, EffectID: chkFlaky, Attempt: 2, Handle: "h2"},
		chkSettle(chkFlaky, 2, chkLost),
		{Type: EventTimerFired},
		chkDispatch(chkFlaky, 3, 2),
		chkSettle(chkFlaky, 3, chkDone),
		chkSettle(chkWire, 1, chkDone),
		{Type: EventModelStepPlanned, Step: 2, Request: chkRequest},
		chkDispatch(chkM2, 1, 2),
		chkSettle(chkM2, 1, chkAsk),
		{Type: EventInputProvided, Input: chkAnswer("Which city?")},
		{Type: EventModelStepPlanned, Step: 3, Request: chkRequest},
		chkDispatch(chkM3, 1, 2),
		chkSettle(chkM3, 1, chkFinal),
		{Type: EventRunCompleted, Result: "noted"},
	}
	// Apply must accept every event: the good log is one a runtime could
	// have written.
	return chkApplied(t, "the good log", evs)
}

// chkApplied stamps evs with their times and seqs as Apply takes them,
// one a second, failing the test unless Apply accepts every one and the
// Run completes; what names the log in messages.
func chkApplied(t *testing.T, what string, evs []Event) []Event {
	t.Helper()
	var run Run
	for i := range evs {
		evs[i].At = int64(1000 * (i + 1))
		next, err := Apply(run, evs[i])
		if err != nil {
			t.Fatalf("%s's event %d (%s) is refused: %v", what, i+1, evs[i].Type, err)
		}
		run = next
		evs[i].Seq = run.Seq
	}
	if run.Status != StatusCompleted {
		t.Fatalf("%s ends %s", what, run.Status)
	}
	return evs
}

// chkRateLimitedLog is a whole log that Apply accepts, event by event: a
// model step under max_attempts 2 and max_rate_limited_attempts 3 is
// rate-limited, lost, rate-limited again and then answers: four attempts,
// two of them counted against max_attempts.
func chkRateLimitedLog(t *testing.T) []Event {
	t.Helper()
	spec := *chkSpec()
	spec.ModelPolicy = Policy{Mode: PolicyRetry, MaxAttempts: 2, MaxRateLimitedAttempts: 3}
	limited := &Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassRateLimited, Message: "429", Retriable: true, RetryAfterMS: 500}}
	evs := []Event{
		RunCreated(spec, 0),
		{Type: EventRunStarted},
		{Type: EventModelStepPlanned, Step: 1, Request: chkRequest},
		chkDispatch(chkM1, 1, 1), chkSettle(chkM1, 1, limited), {Type: EventTimerFired},
		chkDispatch(chkM1, 2, 1), chkSettle(chkM1, 2, chkLost), {Type: EventTimerFired},
		chkDispatch(chkM1, 3, 1), chkSettle(chkM1, 3, limited), {Type: EventTimerFired},
		chkDispatch(chkM1, 4, 1), chkSettle(chkM1, 4, chkFinal),
		{Type: EventRunCompleted, Result: "noted"},
	}
	return chkApplied(t, "the rate-limited log", evs)
}

func TestCheckLogCountsRateLimitedAttemptsApart(t *testing.T) {
	good := chkRateLimitedLog(t)
	last := len(good) - 1
	limited := good[4].Outcome
	// beyond replaces the fourth attempt's answer with o and dispatches
	// a fifth attempt.
	beyond := func(o *Outcome) []Event {
		evs := append([]Event(nil), good[:last-1]...)
		return chkNumbered(append(evs, chkSettle(chkM1, 4, o), Event{Type: EventTimerFired}, chkDispatch(chkM1, 5, 1)))
	}
	for _, c := range []struct {
		name string
		evs  []Event
		want string
	}{
		{"rate-limited attempts do not count against max_attempts", good, ""},
		{"an attempt beyond max_attempts besides the rate-limited ones is caught", beyond(chkLost), "allows 2 besides its 2 rate-limited ones"},
		{"an attempt beyond max_rate_limited_attempts is caught", beyond(limited), "allows 3 (max_rate_limited_attempts)"},
		{"a rate-limited answer that is not retriable counts against max_attempts", chkNumbered(append(append([]Event(nil), good[:4]...),
			chkSettle(chkM1, 1, &Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassRateLimited, Message: "429"}}),
			Event{Type: EventTimerFired}, chkDispatch(chkM1, 2, 1), chkSettle(chkM1, 2, chkLost), Event{Type: EventTimerFired}, chkDispatch(chkM1, 3, 1))),
			"allows 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := CheckLog(c.evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q\n%s", got, c.want, chkRender(c.evs))
			}
		})
	}
}

// chkIndex is the index of the first event of evs that match accepts.
func chkIndex(t *testing.T, evs []Event, match func(Event) bool) int {
	t.Helper()
	for i, ev := range evs {
		if match(ev) {
			return i
		}
	}
	t.Fatal("no such event in the log")
	return -1
}

func chkIs(typ EventType, effect string, attempt int) func(Event) bool {
	return func(ev Event) bool { return ev.Type == typ && ev.EffectID == effect && ev.Attempt == attempt }
}

func chkOfType(typ EventType) func(Event) bool {
	return func(ev Event) bool { return ev.Type == typ }
}

// chkNumbered renumbers a copy of evs 1..n.
func chkNumbered(evs []Event) []Event {
	out := append([]Event(nil), evs...)
	for i := range out {
		out[i].Seq = int64(i + 1)
	}
	return out
}

func TestCheckLog(t *testing.T) {
	good := chkGood(t)
	at := func(match func(Event) bool) int { return chkIndex(t, good, match) }
	// insert puts extra before good[i], renumbered; remove drops good[i],
	// renumbered; change edits a copy of good[i], numbering kept.
	insert := func(i int, extra ...Event) []Event {
		return chkNumbered(append(append(append([]Event(nil), good[:i]...), extra...), good[i:]...))
	}
	after := func(match func(Event) bool, extra ...Event) []Event { return insert(at(match)+1, extra...) }
	remove := func(i int) []Event {
		return chkNumbered(append(append([]Event(nil), good[:i]...), good[i+1:]...))
	}
	change := func(i int, edit func(*Event)) []Event {
		out := append([]Event(nil), good...)
		edit(&out[i])
		return out
	}
	// stale has flaky's first attempt settled only after its second was
	// dispatched.
	stale := remove(at(chkIs(EventEffectSettled, chkFlaky, 1)))
	i := chkIndex(t, stale, chkIs(EventEffectDispatched, chkFlaky, 2)) + 1
	stale = chkNumbered(append(append(append([]Event(nil), stale[:i]...), chkSettle(chkFlaky, 1, chkLost)), stale[i:]...))
	answered := at(chkOfType(EventInputProvided))
	answer := func(text string) []Event { return change(answered, func(ev *Event) { ev.Input = text }) }
	last := len(good) - 1

	for _, c := range []struct {
		name  string
		check LogCheck
		evs   []Event
		want  string // a fragment of a violation; "" for none
	}{
		{"a log within its rules passes", LogCheck{Ended: true, Answer: chkAnswer}, good, ""},
		{"a Run still going passes CheckLog", LogCheck{}, good[:last], ""},
		{"every beginning of the log passes CheckLog", LogCheck{}, good[:at(chkIs(EventEffectSettled, chkFlaky, 2))], ""},

		// Numbering, the first and the terminal event.
		{"an empty log is caught", LogCheck{}, nil, "the log is empty"},
		{"a gap in the sequence is caught", LogCheck{}, append(append([]Event(nil), good[:4]...), good[5:]...), "has seq"},
		{"a repeated number is caught", LogCheck{}, change(6, func(ev *Event) { ev.Seq = 6 }), "has seq 6"},
		{"a log that does not start with run_created is caught", LogCheck{}, chkNumbered(good[1:]), "not run_created"},
		{"run_created without its spec is caught", LogCheck{}, change(0, func(ev *Event) { ev.Spec = nil }), "not run_created with the Run's spec"},
		{"a second run_created is caught", LogCheck{}, insert(3, RunCreated(*chkSpec(), 0)), "run_created again"},
		{"a log that does not end terminal is caught by CheckEnded", LogCheck{Ended: true}, good[:last], "not terminal"},
		{"an event after the terminal one is caught", LogCheck{}, chkNumbered(append(append([]Event(nil), good...), chkDispatch(chkEcho, 2, 2))), "is not the last"},
		{"a second terminal event is caught", LogCheck{}, chkNumbered(append(append([]Event(nil), good...), Event{Type: EventRunFailed})), "is not the last"},

		// Effect IDs.
		{"a malformed effect ID is caught", LogCheck{}, insert(6, chkDispatch("nonsense", 1, 1)), "malformed effect ID"},
		{"an effect of another Run is caught", LogCheck{}, insert(6, chkDispatch(ModelEffectID("run_other", 1), 1, 1)), "not an effect of run run_chk"},

		// Dispatches.
		{"an attempt skipped is caught", LogCheck{}, change(at(chkIs(EventEffectDispatched, chkFlaky, 2)), func(ev *Event) { ev.Attempt = 3 }), "in order"},
		{"an attempt dispatched twice is caught", LogCheck{}, after(chkIs(EventEffectDispatched, chkFlaky, 1), chkDispatch(chkFlaky, 1, 1)), "in order"},
		{"a dispatch under a lower epoch is caught", LogCheck{}, change(at(chkIs(EventEffectDispatched, chkFlaky, 3)), func(ev *Event) { ev.Epoch = 1 }), "a fenced owner committed"},
		{"a tool dispatched before its model step asked for it is caught", LogCheck{}, after(chkIs(EventEffectDispatched, chkM1, 1), chkDispatch(chkFlaky, 1, 1)), "no model step asked for it"},
		{"a call of a tool the model did not ask for is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkM1, 1), chkDispatch(chkNotAsked, 1, 1)), "no model step asked for it"},
		{"a tool the Run does not offer is caught", LogCheck{}, change(at(chkIs(EventEffectSettled, chkM1, 1)), func(ev *Event) { ev.Outcome = chkCalls("flaky", "nuke", "wire") }), `calls "nuke", a tool the Run does not offer`},
		{"a gated call dispatched without its approval is caught", LogCheck{}, remove(at(chkOfType(EventApprovalRecorded))), "before its call was approved"},
		{"a denied call dispatched is caught", LogCheck{}, change(at(chkOfType(EventApprovalRecorded)), func(ev *Event) { seq := ev.Seq; *ev = chkApprove("c3", false); ev.Seq = seq }), "after its call was denied"},

		// Settlements.
		{"an attempt settled twice is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkEcho, 1), chkSettle(chkEcho, 1, chkDone)), "settled twice"},
		{"an attempt settled twice, the second time as it ends, is caught", LogCheck{}, insert(last, chkSettle(chkM3, 1, chkFinal)), "settled twice"},
		{"a settlement without its dispatch is caught", LogCheck{}, remove(at(chkIs(EventEffectDispatched, chkEcho, 1))), "without its dispatch"},
		{"a settlement of an attempt never dispatched is caught", LogCheck{}, after(chkIs(EventEffectDispatched, chkFlaky, 1), chkSettle(chkFlaky, 2, chkDone)), "without its dispatch"},
		{"a stale outcome settling is caught", LogCheck{}, stale, "a stale outcome"},
		{"pending for a stale attempt is caught", LogCheck{}, after(chkIs(EventEffectDispatched, chkFlaky, 3), Event{Type: EventEffectPending, EffectID: chkFlaky, Attempt: 2, Handle: "h"}), "a stale attempt"},
		{"pending after the settlement is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkEcho, 1), Event{Type: EventEffectPending, EffectID: chkEcho, Attempt: 1, Handle: "h"}), "after its settlement"},
		{"pending for an attempt never dispatched is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkM1, 1), Event{Type: EventEffectPending, EffectID: chkEcho, Attempt: 1, Handle: "h"}), "never dispatched"},

		// Policies.
		{"a fail-policy tool dispatched twice is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkEcho, 1), chkDispatch(chkEcho, 2, 1)), "allows 1"},
		{"a retry beyond max_attempts is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkFlaky, 3), chkDispatch(chkFlaky, 4, 2)), "allows 3"},
		{"a model step beyond its policy is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkM1, 1), chkDispatch(chkM1, 2, 1), chkDispatch(chkM1, 3, 1)), "allows 2"},

		// Approvals.
		{"an approval given twice is caught", LogCheck{}, after(chkOfType(EventApprovalRecorded), chkApprove("c3", true)), "does not wait for an approval"},
		{"an approval of a call that needs none is caught", LogCheck{}, after(chkOfType(EventApprovalRecorded), chkApprove("c1", true)), "does not wait for an approval"},
		{"an approval of no call of the step is caught", LogCheck{}, after(chkOfType(EventApprovalRecorded), chkApprove("c9", true)), "not a tool call of the current model step"},
		{"an approval of a call of an earlier step is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkM2, 1), chkApprove("c3", true)), "not a tool call of the current model step"},
		{"an approval with no decision is caught", LogCheck{}, after(chkOfType(EventApprovalRecorded), Event{Type: EventApprovalRecorded}), "decides nothing"},

		// Inputs.
		{"an answer to the question passes", LogCheck{Answer: chkAnswer}, good, ""},
		{"an answer to another question is caught", LogCheck{Answer: chkAnswer}, answer(chkAnswer("Which day?")), "does not answer the open question"},
		{"without Answer the words of an answer are not checked", LogCheck{}, answer("anything"), ""},
		{"an answer given twice is caught", LogCheck{}, after(chkOfType(EventInputProvided), good[answered]), "answers no open question"},
		{"an input with no question is caught", LogCheck{}, after(chkIs(EventEffectSettled, chkM1, 1), good[answered]), "answers no open question"},
		{"a Run completed with its question open is caught", LogCheck{}, remove(answered), "unanswered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.check.Check(c.evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q", got, c.want)
			}
		})
	}
	if got := CheckLog(good[:last]); got != nil {
		t.Errorf("CheckLog of a Run still going: %q, want nil", got)
	}
	if got := CheckEnded(good[:last]); len(got) != 1 {
		t.Errorf("CheckEnded of a Run still going: %q, want one violation", got)
	}
}

func TestLogEffects(t *testing.T) {
	effects := LogEffects(chkGood(t))
	if len(effects) != 6 {
		t.Errorf("%d effects, want 6 (3 model steps, 3 tool calls): %v", len(effects), effects)
	}
	for _, w := range []struct {
		id, kind, tool     string
		dispatched, settle int
	}{
		{chkM1, "model", "", 1, 1}, {chkM3, "model", "", 1, 1},
		{chkFlaky, "tool", "flaky", 3, 3}, {chkEcho, "tool", "echo", 1, 1}, {chkWire, "tool", "wire", 1, 1},
	} {
		e := effects[w.id]
		if e == nil {
			t.Errorf("no effect %s", w.id)
			continue
		}
		if e.Kind != w.kind || e.Tool != w.tool || e.Dispatched != w.dispatched || len(e.Settled) != w.settle {
			t.Errorf("effect %s: kind %q tool %q dispatched %d settled %d, want %q %q %d %d", w.id, e.Kind, e.Tool, e.Dispatched, len(e.Settled), w.kind, w.tool, w.dispatched, w.settle)
		}
	}
	if o := effects[chkFlaky].Settled[3]; o == nil || o.State != OutcomeDone {
		t.Errorf("flaky's third attempt settled with %+v, want done", o)
	}
}

// TestCheckLogPassesEveryLogApplyBuilds holds CheckLog to the loop: every
// log built of the events Apply accepts passes it (as it goes, and
// CheckEnded once it has ended), from the fuzz test's random events and
// from Runs driven to their end; and settling one of its attempts again
// is caught. The rules are written apart from Apply, so this is what
// shows that they are not stricter than the loop.
func TestCheckLogPassesEveryLogApplyBuilds(t *testing.T) {
	ended, doubled := 0, 0
	var panics []string
	kinds := map[EventType]int{}
	for seed := uint64(0); seed < 600; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
		driven := seed%2 == 1 // follow Decide to the end, like TestDrivenRunsAlwaysEnd
		spec := fuzzSpec(int(seed/2) % fuzzLimitStyles)
		run, err := Apply(Run{}, RunCreated(spec, 1000))
		if err != nil {
			t.Fatal(err)
		}
		evs := []Event{RunCreated(spec, 1000)}
		evs[0].Seq = 1
		now, epoch := int64(1000), uint64(1)
		for i := 0; i < 400 && !run.Status.Terminal(); i++ {
			b := make([]byte, 12)
			for j := range b {
				b[j] = byte(rng.UintN(256))
			}
			if driven {
				b[0] = 0 // an action of Decide, one that is not a wake-up if there is one
				var moves []int
				for i, a := range Decide(run) {
					if a.Type != ActionWakeAt {
						moves = append(moves, i)
					}
				}
				if len(moves) > 0 {
					b[1] = byte(moves[int(b[1])%len(moves)])
				}
				if x := run.Executing(); len(x) > 0 && (len(moves) == 0 || b[8]%2 == 0) {
					// The executor answers an attempt in flight: mostly
					// done, else failed (retriable or not) or cancelled.
					e := x[int(b[9])%len(x)]
					b[0], b[2], b[3], b[4] = 9, byte(indexOf(run.Effects, e.ID)), 1, []byte{0, 1, 0, 1, 2, 3, 4, 5}[b[4]%8]
				}
			}
			now += int64(b[7]%4) * 250
			if rng.UintN(20) == 0 {
				epoch++ // a takeover
			}
			ev := fuzzEvent(run, now, b)
			if ev.Type == EventEffectDispatched {
				ev.Epoch = epoch
			}
			next, err := chkApply(run, ev, &panics)
			if err != nil && driven {
				// A timer that is not due yet: jump to the earliest wake-up.
				for _, a := range Decide(run) {
					if a.Type == ActionWakeAt {
						now = max(now, a.At)
					}
				}
				ev = Event{Type: EventTimerFired, At: now}
				next, err = chkApply(run, ev, &panics)
			}
			if err != nil {
				continue
			}
			run = next
			ev.Seq = run.Seq
			evs = append(evs, ev)
			now = max(now, ev.At)
		}
		for _, ev := range evs {
			kinds[ev.Type]++
		}
		if got := CheckLog(evs); got != nil {
			t.Fatalf("seed %d: a log Apply built breaks CheckLog: %q\n%s", seed, got, chkRender(evs))
		}
		if run.Status.Terminal() {
			ended++
			if got := CheckEnded(evs); got != nil {
				t.Fatalf("seed %d: an ended log Apply built breaks CheckEnded: %q\n%s", seed, got, chkRender(evs))
			}
		}
		// The same log with one settlement repeated later on.
		var settles []int
		for i, ev := range evs {
			if ev.Type == EventEffectSettled {
				settles = append(settles, i)
			}
		}
		if len(settles) == 0 {
			continue
		}
		i := settles[rng.IntN(len(settles))]
		j := i + 1 + rng.IntN(len(evs)-i)
		if j == len(evs) && run.Status.Terminal() {
			j-- // before the terminal event
		}
		broken := chkNumbered(append(append(append([]Event(nil), evs[:j]...), evs[i]), evs[j:]...))
		if got := CheckLog(broken); !strings.Contains(strings.Join(got, "\n"), "settled twice") {
			t.Fatalf("seed %d: %s#%d settled again at %d: violations %q, want one with \"settled twice\"", seed, evs[i].EffectID, evs[i].Attempt, j+1, got)
		}
		doubled++
	}
	if len(panics) > 0 {
		// Apply never panics (docs/DESIGN.md §11, invariant 1): these
		// sequences found one when a timed-out tool call closed its step.
		t.Errorf("Apply panicked on %d events; the first: %s", len(panics), panics[0])
	}
	t.Logf("%d logs ended, %d had a settlement to repeat; events of each type: %v", ended, doubled, kinds)
	if ended < 300 || doubled < 200 {
		t.Errorf("%d logs ended and %d had a settlement to repeat, of 600: the test exercised too little", ended, doubled)
	}
}

// chkApply is Apply, with a panic turned into an error and recorded.
func chkApply(run Run, ev Event, panics *[]string) (next Run, err error) {
	defer func() {
		if p := recover(); p != nil {
			*panics = append(*panics, fmt.Sprintf("%s at %d on %s: %v", ev.Type, ev.At, renderRun(run), p))
			next, err = run, fmt.Errorf("%w: Apply panicked: %v", ErrInvalidEvent, p)
		}
	}()
	return Apply(run, ev)
}

func indexOf(effects []Effect, id string) int {
	for i, e := range effects {
		if e.ID == id {
			return i
		}
	}
	return 0
}

func chkRender(evs []Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %d %s %s#%d epoch %d", ev.Seq, ev.Type, ev.EffectID, ev.Attempt, ev.Epoch)
		if ev.Outcome != nil {
			fmt.Fprintf(&b, " %s", ev.Outcome.State)
			if m := ev.Outcome.Model; m != nil {
				for _, c := range m.Message.ToolCalls {
					fmt.Fprintf(&b, " %s:%s", c.ID, c.Name)
				}
				if m.AwaitInput != nil {
					b.WriteString(" ask")
				}
			}
		}
		for _, a := range ev.Approvals {
			fmt.Fprintf(&b, " %s=%v", a.ToolCallID, a.Approved)
		}
		b.WriteString("\n")
	}
	return b.String()
}

package bench

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestChaosShort is the short chaos run of docs/DESIGN.md §9: `agenthost bench
// chaos` for 60 s of faults against the built binary, which it SIGKILLs
// and SIGSTOPs under load. The bench itself checks the invariants over
// every acknowledged Run and fails with the violations it found; the test
// also checks that the run showed something: a kill and a pause survived,
// and Runs of every kind acknowledged.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	t.Parallel()                 // it waits on a child process most of the time
	duration := 60 * time.Second // of faults; plus start, drain and checks
	if s := os.Getenv("AGENTHOST_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AGENTHOST_CHAOS_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	args := []string{"--agenthost-bin", buildBinary(t), "chaos", "--duration", duration.String(), "--json"}
	if s := os.Getenv("AGENTHOST_CHAOS_SEED"); s != "" {
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("AGENTHOST_CHAOS_SEED=%q: %v", s, err)
		}
		args = append(args, "--seed", s)
	}
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaosResult `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses, %d Runs acknowledged %v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.Acknowledged, r.ByStatus, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Kills < 1 || r.Pauses < 1 {
		t.Errorf("seed %d: %d kills and %d pauses; want at least one of each", r.Seed, r.Kills, r.Pauses)
	}
	for _, kind := range chaosKinds {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

// TestChaosChecks shows that the invariant checks the chaos bench (and
// TestServeSurvivesKill9) rely on see the faults they are for: a run of
// zero violations means something only if a broken log yields some.
func TestChaosChecks(t *testing.T) {
	const run = "run_chk"
	spec := &loop.Spec{ID: run, ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2},
		Tools: []loop.ToolSpec{{Name: "flaky", Policy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3}}, {Name: "echo", Policy: loop.Policy{Mode: loop.PolicyFail}}}}
	m1, t0, t1 := loop.ModelEffectID(run, 1), loop.ToolEffectID(run, 1, 0), loop.ToolEffectID(run, 1, 1)
	calls := &loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant,
		ToolCalls: []abi.ToolCall{{ID: "c1", Name: "flaky"}, {ID: "c2", Name: "echo"}}}}}
	done := &loop.Outcome{State: loop.OutcomeDone, Tool: &abi.ToolOutcome{Content: "ok"}}
	ev := func(typ loop.EventType, effect string, attempt int, o *loop.Outcome) loop.Event {
		return loop.Event{Type: typ, EffectID: effect, Attempt: attempt, Outcome: o}
	}
	// good is a Run whose flaky call needed its three attempts.
	good := []loop.Event{
		{Type: loop.EventRunCreated, Spec: spec},
		ev(loop.EventEffectDispatched, m1, 1, nil), ev(loop.EventEffectSettled, m1, 1, calls),
		ev(loop.EventEffectDispatched, t0, 1, nil), ev(loop.EventEffectDispatched, t1, 1, nil),
		ev(loop.EventEffectSettled, t1, 1, done),
		ev(loop.EventEffectDispatched, t0, 2, nil), ev(loop.EventEffectDispatched, t0, 3, nil),
		ev(loop.EventEffectSettled, t0, 3, done),
		{Type: loop.EventRunCompleted},
	}
	numbered := func(evs []loop.Event) []loop.Event {
		out := append([]loop.Event(nil), evs...)
		for i := range out {
			out[i].Seq = int64(i + 1)
		}
		return out
	}
	check := func(evs []loop.Event) []string {
		out := CheckEventLog(run, evs)
		out = append(out, checkInputs(run, evs)...)
		return append(out, checkPolicies(run, spec, EffectRecords(evs))...)
	}
	// asking is a Run whose model asked the user a question, which was
	// answered before the model's final answer.
	m2 := loop.ModelEffectID(run, 2)
	ask := &loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, Content: "Which city?"},
		AwaitInput: &abi.AwaitInput{Prompt: "Which city?"}}}
	final := &loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, Content: "noted"}}}
	input := func(text string) loop.Event { return loop.Event{Type: loop.EventInputProvided, Input: text} }
	asking := func(inputs ...loop.Event) []loop.Event {
		evs := []loop.Event{{Type: loop.EventRunCreated, Spec: spec}, ev(loop.EventEffectDispatched, m1, 1, nil), ev(loop.EventEffectSettled, m1, 1, ask)}
		evs = append(evs, inputs...)
		evs = append(evs, ev(loop.EventEffectDispatched, m2, 1, nil), ev(loop.EventEffectSettled, m2, 1, final), loop.Event{Type: loop.EventRunCompleted})
		return numbered(evs)
	}
	insert := func(at int, extra ...loop.Event) []loop.Event {
		out := append(append(append([]loop.Event(nil), good[:at]...), extra...), good[at:]...)
		return numbered(out)
	}
	for _, c := range []struct {
		name string
		evs  []loop.Event
		want string // a fragment of the one violation; "" for none
	}{
		{"a log within its policies passes", numbered(good), ""},
		{"an attempt settled twice is caught", insert(6, ev(loop.EventEffectSettled, t1, 1, done)), "settled twice"},
		{"a fail-policy tool dispatched twice is caught", insert(6, ev(loop.EventEffectDispatched, t1, 2, nil)), "allows 1"},
		{"a retry beyond max_attempts is caught", insert(9, ev(loop.EventEffectDispatched, t0, 4, nil)), "allows 3"},
		{"a model step beyond its policy is caught", insert(3, ev(loop.EventEffectDispatched, m1, 3, nil)), "allows 2"},
		{"a gap in the sequence is caught", append(numbered(good[:4]), numbered(good)[5:]...), "has seq"},
		{"a log that does not end terminal is caught", numbered(good[:len(good)-1]), "not terminal"},
		{"an event after the terminal one is caught", numbered(append(append([]loop.Event(nil), good...), ev(loop.EventEffectDispatched, t1, 1, nil))), "is not the last"},
		{"a question answered once passes", asking(input(chaosAnswer("Which city?"))), ""},
		{"an answer to another question is caught", asking(input(chaosAnswer("Which day?"))), "does not answer the open question"},
		{"an answer given twice is caught", asking(input(chaosAnswer("Which city?")), input(chaosAnswer("Which city?"))), "answers no open question"},
		{"a Run completed with its question open is caught", asking(), "unanswered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := check(c.evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q", got, c.want)
			}
		})
	}
}

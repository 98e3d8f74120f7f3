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
// chaos` for 60 s of faults against the built binary, which it SIGKILLs,
// SIGSTOPs and restarts with SIGTERM under load. The bench itself checks
// the invariants over every acknowledged Run and fails with the violations
// it found; the test also checks that the run showed something: a kill, a
// pause and a graceful restart survived (the first three faults are one
// of each), and Runs of every kind acknowledged.
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
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses, %d graceful restarts, %d Runs acknowledged %v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.Restarts, r.Acknowledged, r.ByStatus, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if len(r.UnusualEnds) > 0 {
		t.Logf("Runs that ended otherwise than their kind usually does: %q", r.UnusualEnds)
	}
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Kills < 1 || r.Pauses < 1 || r.Restarts < 1 {
		t.Errorf("seed %d: %d kills, %d pauses and %d graceful restarts; want at least one of each", r.Seed, r.Kills, r.Pauses, r.Restarts)
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

// TestChaosChecks shows that the chaos bench holds each Run's log to
// loop.LogCheck (whose own tests, TestCheckLog, show each rule catching a
// broken log) with the chaos clients' answers and the Run ended: a run of
// zero violations means something only if a broken log yields some.
func TestChaosChecks(t *testing.T) {
	spec := loop.Spec{Tenant: "alpha", Session: "w0-0", ID: "run_chk", Input: "ask:Which city?|answer:noted", Limits: loop.DefaultLimits,
		ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 8}}
	m1, m2 := loop.ModelEffectID(spec.ID, 1), loop.ModelEffectID(spec.ID, 2)
	model := func(m abi.ModelOutcome) *loop.Outcome {
		m.Message.Role = abi.MessageAssistant
		return &loop.Outcome{State: loop.OutcomeDone, Model: &m}
	}
	ask := model(abi.ModelOutcome{Message: abi.Message{Content: "Which city?"}, AwaitInput: &abi.AwaitInput{Prompt: "Which city?"}})
	input := loop.Event{Type: loop.EventInputProvided, Input: chaosAnswer("Which city?")}
	evs := []loop.Event{
		loop.RunCreated(spec, 1),
		{Type: loop.EventRunStarted},
		{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{}`)},
		{Type: loop.EventEffectDispatched, EffectID: m1, Attempt: 1, Epoch: 1},
		{Type: loop.EventEffectSettled, EffectID: m1, Attempt: 1, Outcome: ask},
		input,
		{Type: loop.EventModelStepPlanned, Step: 2, Request: []byte(`{}`)},
		{Type: loop.EventEffectDispatched, EffectID: m2, Attempt: 1, Epoch: 2},
		{Type: loop.EventEffectSettled, EffectID: m2, Attempt: 1, Outcome: model(abi.ModelOutcome{Message: abi.Message{Content: "noted"}})},
		{Type: loop.EventRunCompleted},
	}
	var run loop.Run
	for i := range evs {
		evs[i].At = int64(i + 1)
		next, err := loop.Apply(run, evs[i])
		if err != nil {
			t.Fatalf("the good log's event %d (%s) is refused: %v", i+1, evs[i].Type, err)
		}
		run = next
		evs[i].Seq = run.Seq
	}
	numbered := func(evs []loop.Event) []loop.Event {
		for i := range evs {
			evs[i].Seq = int64(i + 1)
		}
		return evs
	}
	with := func(i int, ev loop.Event) []loop.Event {
		out := append([]loop.Event(nil), evs...)
		out[i] = ev
		out[i].Seq = int64(i + 1)
		return out
	}
	for _, c := range []struct {
		name string
		evs  []loop.Event
		want string // a fragment of a violation; "" for none
	}{
		{"a Run that ended, its question answered, passes", evs, ""},
		{"an answer to another question is caught", with(5, loop.Event{Type: loop.EventInputProvided, Input: chaosAnswer("Which day?")}), "does not answer the open question"},
		{"a Run that has not ended is caught", evs[:len(evs)-1], "not terminal"},
		{"an attempt settled twice is caught", numbered(append(append(append([]loop.Event(nil), evs[:9]...), evs[8]), evs[9:]...)), "settled twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := chaosCheckLog(c.evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q", got, c.want)
			}
		})
	}
}

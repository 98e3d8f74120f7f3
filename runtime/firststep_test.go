package runtime_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// runEvents returns the types of a Run's events.
func runEvents(t *testing.T, s runtime.Store, runID string) []loop.EventType {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs, err := s.Events(ctx, "acme", runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []loop.EventType
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

// firstRequest returns the request of a Run's first model step.
func firstRequest(t *testing.T, s runtime.Store, runID string) abi.ModelRequest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs, err := s.Events(ctx, "acme", runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == loop.EventModelStepPlanned {
			var req abi.ModelRequest
			if err := json.Unmarshal(ev.Request, &req); err != nil {
				t.Fatal(err)
			}
			return req
		}
	}
	t.Fatalf("run %s planned no model step", runID)
	return abi.ModelRequest{}
}

// A new session's first Run, on a store that writes a creation's first
// step (runtime.FirstStepper), is created with the commit its driver would
// have made first: one commit fewer, the same events in the same order,
// the same builder calls, and Submit answers with the Run under way. On a
// store that does not, nothing is made ahead: no builder call is spent.
// The session's next Run is created alone, and so is a Run created in a
// session this runtime does not know but the store does: its builder is
// given the history of the Runs before it, not the empty one a first
// step is made with.
func TestANewSessionsFirstRunIsCreatedWithItsFirstStep(t *testing.T) {
	const script = `call:echo({"text":"a"})|answer:$results`
	var plain []loop.EventType // the events on a store that never steps
	for _, name := range []string{"memstore", "memstore-first-steps"} {
		t.Run(name, func(t *testing.T) {
			steps := name == "memstore-first-steps"
			e := conformance.NewRuntimeEnv(t, harnesses()[name], nil)
			builder := e.Plugins.Builder.(*conformance.EchoBuilder)
			res := e.Execute("s1", script)
			if res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusCompleted || res.Run.Result != "a" {
				t.Fatalf("result %s, run %s with %q", res.Kind, res.Run.Status, res.Run.Result)
			}
			st := e.Runtime.Stats()
			wantSteps, wantCommits := int64(0), int64(4)
			if steps {
				wantSteps, wantCommits = 1, 3
			}
			if st.FirstSteps != wantSteps || st.Commits != wantCommits {
				t.Fatalf("%d first steps and %d commits after the creation; want %d and %d", st.FirstSteps, st.Commits, wantSteps, wantCommits)
			}
			if n := builder.Calls(); n != 2 {
				t.Fatalf("the builder was called %d times for the Run's 2 model steps", n)
			}
			evs := runEvents(t, e.Store, res.Run.ID)
			if plain == nil {
				plain = evs
			} else if !slices.Equal(evs, plain) {
				t.Fatalf("the Run's events %v; on a store that never steps: %v", evs, plain)
			}

			// The session's second Run (which the scripted model, reading
			// the first's script in its history, ends in 2 commits): created
			// alone.
			second := e.Execute("s1", script)
			if second.Kind != runtime.ResultTerminal || second.Run.Status != loop.StatusCompleted {
				t.Fatalf("second result %s, run %s", second.Kind, second.Run.Status)
			}
			if st := e.Runtime.Stats(); st.FirstSteps != wantSteps || st.Commits != wantCommits+2 {
				t.Fatalf("after the session's second Run: %d first steps and %d commits; want %d and %d", st.FirstSteps, st.Commits, wantSteps, wantCommits+2)
			}

			// A session this runtime does not know, but the store does: a
			// runtime that starts after the first stopped. Its creation is
			// made with a first step the store does not write (the Run is
			// not the session's first); the driver builds its first model
			// step again, with the history of the session's two Runs.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := e.Runtime.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			rt := e.NewRuntime("node-b")
			calls := builder.Calls()
			third, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: script})
			if err != nil || third.Kind != runtime.ResultTerminal || third.Run.Status != loop.StatusCompleted {
				t.Fatalf("the third Run, on node-b: %v, %+v", err, third)
			}
			if st := rt.Stats(); st.FirstSteps != 0 || st.FirstStepsNotWritten != int64(wantSteps) {
				t.Fatalf("node-b wrote %d first steps for a session's third Run, and made %d it did not write; want 0 and %d",
					st.FirstSteps, st.FirstStepsNotWritten, wantSteps)
			}
			wantCalls := 1 // the scripted model answers at once, as for the second
			if steps {
				wantCalls = 2 // and the one made ahead, not written
			}
			if n := builder.Calls() - calls; n != wantCalls {
				t.Fatalf("the builder was called %d times for the third Run; want %d", n, wantCalls)
			}
			// EchoBuilder sends the history, then the transcript.
			want := len(res.Run.Transcript) + len(second.Run.Transcript) + 1
			if got := firstRequest(t, e.Store, third.Run.ID); len(got.Messages) != want {
				t.Fatalf("the third Run's first model request has %d messages; want the session's two Runs' %d and its input", len(got.Messages), want-1)
			}

			// A session another live node owns: node-c, which gives the
			// session up to node-b at its first Run's boundary, makes a
			// first step ahead of that Run only. Its second Run in the
			// session is not taken for the session's first: no builder
			// call is spent ahead of it, though node-c holds nothing of
			// the session by then. node-b drives both.
			rtc := e.NewRuntime("node-c")
			fourth, _, err := rtc.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: script})
			if err != nil {
				t.Fatal(err)
			}
			conformance.WaitUntil(t, 20*time.Second, "node-c to give s1 up to its owner", func() (bool, error) {
				return rtc.Stats().Boundaries > 0, nil
			})
			fifth, _, err := rtc.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: script})
			if err != nil {
				t.Fatal(err)
			}
			if st := rtc.Stats(); st.FirstSteps != 0 || st.FirstStepsNotWritten != int64(wantSteps) {
				t.Fatalf("node-c, for two Runs of a session node-b owns: %d first steps written, %d made in vain; want 0 and %d",
					st.FirstSteps, st.FirstStepsNotWritten, wantSteps)
			}
			for _, r := range []loop.Run{fourth, fifth} {
				if run := e.UntilTerminal(rt, r.ID, 100*time.Millisecond); run.Status != loop.StatusCompleted {
					t.Fatalf("run %s, submitted on node-c: %s", r.ID, run.Status)
				}
			}
		})
	}
}

package loop_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// This example drives one Run by hand, the way runtime.Runtime does with a
// store and plugins in between: it asks Decide what to do next, does it,
// and applies the event that records what it did. The model asks for one
// call of the "add" tool, reads its result and answers.
func Example() {
	spec := loop.Spec{
		Tenant: "acme", Session: "chat-1", ID: "run-1",
		Input:       "What is 2+3?",
		Limits:      loop.DefaultLimits,
		ModelPolicy: loop.DefaultModelPolicy,
		Tools:       []loop.ToolSpec{{Name: "add", Policy: loop.DefaultToolPolicy(true)}},
	}
	// Time is data: every event carries its own (Unix milliseconds).
	now := int64(1_700_000_000_000)
	run, err := loop.Apply(loop.Run{}, loop.RunCreated(spec, now))
	if err != nil {
		log.Fatal(err)
	}
	apply := func(ev loop.Event) {
		now += 10
		ev.At = now
		if run, err = loop.Apply(run, ev); err != nil {
			log.Fatal(err)
		}
	}
	// execute stands for the executor plugins: the model asks for the add
	// tool at its first step and answers with the tool's result at its
	// second; the tool adds.
	execute := func(a loop.Action) loop.Outcome {
		if a.Kind == abi.KindTool {
			var args struct{ A, B int }
			if err := json.Unmarshal(run.Effect(a.EffectID).Arguments, &args); err != nil {
				log.Fatal(err)
			}
			fmt.Println("  add returns", args.A+args.B)
			return loop.Outcome{State: loop.OutcomeDone, Tool: &abi.ToolOutcome{Content: fmt.Sprint(args.A + args.B)}}
		}
		msg := abi.Message{Role: abi.MessageAssistant}
		if run.Step == 1 {
			msg.ToolCalls = []abi.ToolCall{{ID: "call-1", Name: "add", Arguments: json.RawMessage(`{"a":2,"b":3}`)}}
			fmt.Println("  the model calls add", string(msg.ToolCalls[0].Arguments))
		} else {
			msg.Content = "2+3 is " + run.Transcript[len(run.Transcript)-1].Content + "."
			fmt.Printf("  the model answers %q\n", msg.Content)
		}
		return loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: msg}}
	}

	for acts := loop.Decide(run); len(acts) > 0; acts = loop.Decide(run) {
		// This driver does the first action and decides again; a real one
		// does every action Decide returns.
		switch a := acts[0]; a.Type {
		case loop.ActionStart:
			fmt.Println("start")
			apply(loop.Event{Type: loop.EventRunStarted})
		case loop.ActionPlanModelStep:
			// The builder plugin writes the model's request.
			fmt.Println("plan model step", a.Step)
			apply(loop.Event{Type: loop.EventModelStepPlanned, Step: a.Step, Request: json.RawMessage(`{"model":"m"}`)})
		case loop.ActionDispatch:
			// The dispatch is recorded (committed) before the executor is
			// called, and the attempt is settled with what it returns.
			fmt.Println("dispatch", a.EffectID, "attempt", a.Attempt)
			apply(loop.Event{Type: loop.EventEffectDispatched, EffectID: a.EffectID, Attempt: a.Attempt})
			apply(loop.Settled(a.EffectID, a.Attempt, execute(a), 0))
		case loop.ActionComplete:
			fmt.Println("complete")
			apply(loop.Event{Type: loop.EventRunCompleted, Result: a.Result})
		default:
			log.Fatalf("this example does not handle %s", a.Type)
		}
	}
	fmt.Printf("%s with %q after %d events\n", run.Status, run.Result, run.Seq)

	// Output:
	// start
	// plan model step 1
	// dispatch run-1.m1 attempt 1
	//   the model calls add {"a":2,"b":3}
	// dispatch run-1.t1.0 attempt 1
	//   add returns 5
	// plan model step 2
	// dispatch run-1.m2 attempt 1
	//   the model answers "2+3 is 5."
	// complete
	// completed with "2+3 is 5." after 11 events
}

// Apply refuses an event that is not legal in the Run's state with an
// error wrapping one of the sentinels of errors.go, and returns the
// snapshot unchanged. A driver drops a repeated or late outcome
// (ErrAlreadySettled, ErrStaleAttempt) and goes on.
func ExampleApply() {
	spec := loop.Spec{Tenant: "acme", Session: "chat-1", ID: "run-1", Input: "Hi!",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	run, err := loop.Apply(loop.Run{}, loop.RunCreated(spec, 1000))
	if err != nil {
		log.Fatal(err)
	}
	for _, ev := range []loop.Event{
		{Type: loop.EventRunStarted, At: 1001},
		{Type: loop.EventModelStepPlanned, At: 1002, Step: 1, Request: json.RawMessage(`{"model":"m"}`)},
		{Type: loop.EventEffectDispatched, At: 1003, EffectID: "run-1.m1", Attempt: 1},
	} {
		if run, err = loop.Apply(run, ev); err != nil {
			log.Fatal(err)
		}
	}
	hello := loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{
		Message: abi.Message{Role: abi.MessageAssistant, Content: "Hello!"}}}

	settled, err := loop.Apply(run, loop.Settled("run-1.m1", 1, hello, 1004))
	fmt.Println("settle attempt 1:", err, "- now at seq", settled.Seq)
	again, err := loop.Apply(settled, loop.Settled("run-1.m1", 1, hello, 1005))
	fmt.Println("settle it again:", errors.Is(err, loop.ErrAlreadySettled), err)
	fmt.Println("unchanged:", again.Seq == settled.Seq)
	_, err = loop.Apply(run, loop.Settled("run-1.m1", 2, hello, 1006))
	fmt.Println("settle attempt 2:", errors.Is(err, loop.ErrStaleAttempt), err)
	next := loop.Decide(settled)[0]
	fmt.Printf("next: %s %q\n", next.Type, next.Result)

	// Output:
	// settle attempt 1: <nil> - now at seq 5
	// settle it again: true loop: effect already settled: run-1.m1#1
	// unchanged: true
	// settle attempt 2: true loop: stale attempt: run-1.m1#2 was never dispatched (current attempt 1)
	// next: complete "Hello!"
}

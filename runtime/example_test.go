package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// This example runs one Run end to end on a Runtime over the in-memory
// store, with the scripted fakes of package conformance standing in for
// the plugins: a builder that passes the conversation through, a model
// that follows the script in the Run's input, and an "echo" tool. In
// production the store is badgerstore or pgstore and the plugins are
// loaded by package host.
func Example() {
	ctx := context.Background()
	store := conformance.NewMemStore(nil, conformance.KVLimits{})
	defer store.Close()

	tenant := &runtime.Tenant{
		ID:          "acme",
		Builder:     &conformance.EchoBuilder{},
		Model:       &conformance.ScriptedModel{},
		Limits:      loop.DefaultLimits,
		ModelPolicy: loop.DefaultModelPolicy,
		Tools: []runtime.Tool{{
			Descriptor: abi.Tool{Name: "echo", Description: "Returns its text.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
			Spec:     loop.ToolSpec{Name: "echo", Policy: loop.DefaultToolPolicy(true)},
			Executor: &conformance.ScriptedTools{},
		}},
	}
	rt, err := runtime.New(runtime.Options{
		Store:   store,
		Tenants: runtime.TenantMap{"acme": tenant},
		Clock:   runtime.SystemClock{},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := rt.Stop(stopCtx); err != nil {
			log.Fatal(err)
		}
	}()

	// Execute submits the Run and returns once it is terminal (or waits
	// for a person, or this node lost its session). The scripted model
	// calls echo at its first step and answers with the result at its
	// second.
	res, err := rt.Execute(ctx, runtime.Request{
		Tenant: "acme", Session: "chat-1", RunID: "run-1",
		Input: `call:echo({"text":"4"})|answer:2+2 is $results`,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Kind, res.Run.Status, fmt.Sprintf("%q", res.Run.Result))
	for _, m := range res.Run.Transcript {
		switch {
		case len(m.ToolCalls) > 0:
			fmt.Printf("%-9s calls %s %s\n", m.Role, m.ToolCalls[0].Name, m.ToolCalls[0].Arguments)
		default:
			fmt.Printf("%-9s %s\n", m.Role, m.Content)
		}
	}
	fmt.Printf("%d model steps, %d input and %d output tokens\n", res.Run.Step, res.Run.Usage.InputTokens, res.Run.Usage.OutputTokens)

	// Output:
	// terminal completed "2+2 is 4"
	// user      call:echo({"text":"4"})|answer:2+2 is $results
	// assistant calls echo {"text":"4"}
	// tool      4
	// assistant 2+2 is 4
	// 2 model steps, 20 input and 10 output tokens
}

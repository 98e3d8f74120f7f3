package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// This example loads the calculator example plugin (a Go program built
// for GOOS=wasip1 GOARCH=wasm) and calls its tool once, as the runtime
// does when a model asks for it.
func Example() {
	ctx := context.Background()
	// A program names a .wasm file it was given; this example builds
	// examples/plugins/calculator (the build is cached between runs).
	wasm, err := conformance.BuildExampleWasm("calculator")
	if err != nil {
		log.Fatal(err)
	}
	h, err := host.New(host.Config{
		// The compiled machine code is kept here, so that the next start
		// does not compile the plugin again.
		CacheDir: conformance.WazeroCacheDir(),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close(ctx)

	// Load checks the file, its ABI marker and imports, and asks the
	// plugin to describe itself, before any call is made.
	p, err := h.Load(ctx, host.PluginSpec{Name: "calculator", Path: wasm, Role: abi.RoleExecutor})
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range p.Describe().Tools {
		fmt.Printf("tool %s, idempotent: %v\n", t.Name, t.Idempotent)
	}

	// The plugin as a runtime.Executor: start one attempt of a tool call.
	x, err := p.Executor()
	if err != nil {
		log.Fatal(err)
	}
	request, err := json.Marshal(abi.ToolRequest{Arguments: json.RawMessage(`{"expression":"(2+3)*4"}`)})
	if err != nil {
		log.Fatal(err)
	}
	effect := loop.ToolEffectID("run-1", 1, 0)
	reply, err := x.Start(ctx, runtime.EffectCall{
		Tenant: "acme", Session: "chat-1", RunID: "run-1",
		Input: abi.EffectInput{Effect: abi.Effect{
			ID:            effect,
			AssignmentKey: loop.AssignmentKey{Tenant: "acme", Session: "chat-1", EffectID: effect, Attempt: 1}.String(),
			Attempt:       1,
			Kind:          abi.KindTool,
			Tool:          "calculate",
			Request:       request,
		}},
	})
	if err != nil {
		log.Fatal(err) // a *runtime.PluginError: the plugin trapped, timed out...
	}
	var out abi.ToolOutcome
	if err := json.Unmarshal(reply.Outcome, &out); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s\n", reply.State, out.Content)

	// Output:
	// tool calculate, idempotent: true
	// done: 20
}

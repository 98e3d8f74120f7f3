package host

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// TestARunRefusesToolArgumentsThatFailTheInputSchema runs a real Run
// through this host with Wasm plugins: the conformance builder, the
// scripted model (which calls what its input says) and the example
// calculator, whose calculate tool declares an input_schema that requires
// a string "expression". The model calls calculate twice in one step, once
// with a number for the expression: that call is settled as
// invalid_arguments, the model reads the error, naming the path and the
// rule, as the call's result, and the calculator is started once only,
// for the valid call.
func TestARunRefusesToolArgumentsThatFailTheInputSchema(t *testing.T) {
	calcPath, err := conformance.BuildPackage("examples/plugins/calculator")
	if err != nil {
		t.Fatal(err)
	}
	clock := conformance.NewFakeClock(time.Time{})
	store := conformance.NewMemStore(clock, conformance.KVLimits{})
	t.Cleanup(func() { _ = store.Close() })
	h, err := New(Config{CacheDir: conformance.WazeroCacheDir(), KV: store, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	ctx := t.Context()
	load := func(name, path string, role abi.Role) *Plugin {
		p, err := h.Load(ctx, PluginSpec{Name: name, Path: path, Role: role})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	b, err := load("builder", pluginPath(t, conformance.PluginBuilder), abi.RoleBuilder).Builder()
	if err != nil {
		t.Fatal(err)
	}
	model, err := load("scripted", pluginPath(t, conformance.PluginScripted), abi.RoleExecutor).Executor()
	if err != nil {
		t.Fatal(err)
	}
	cp := load("calculator", calcPath, abi.RoleExecutor)
	calc, err := cp.Executor()
	if err != nil {
		t.Fatal(err)
	}
	tools := &conformance.CountingExecutor{Next: calc}
	tenant := &runtime.Tenant{ID: "acme", Builder: b, Model: model,
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	for _, d := range cp.Describe().Tools {
		// As cmd wires it: the spec carries no schema of its own; the
		// runtime gives the Loop the descriptor's.
		tenant.Tools = append(tenant.Tools, runtime.Tool{Descriptor: d,
			Spec: loop.ToolSpec{Name: d.Name, Policy: loop.DefaultToolPolicy(d.Idempotent)}, Executor: tools})
	}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		NodeID: "args", LeaseTTL: time.Hour, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(sctx)
	})
	conformance.Eventually(t, "the runtime's first recovery pass", rt.Ready)

	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := rt.Execute(ectx, runtime.Request{Tenant: "acme", Session: "s1",
		Input: `call:calculate({"expression":7}),calculate({"expression":"2+3"})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	if run.Status != loop.StatusCompleted {
		t.Fatalf("the Run is %s (%+v): %v", run.Status, run.Failure, res.Err)
	}
	// The model's final answer is the tool results it read, joined by ",".
	bad, good, ok := strings.Cut(run.Result, ",5")
	if !ok || good != "" {
		t.Fatalf("the model read %q, want the error and then 5", run.Result)
	}
	for _, want := range []string{"error (invalid_arguments): ", "tool calculate was not called",
		"at /expression", "got number, want string", "(rule #/properties/expression/type)"} {
		if !strings.Contains(bad, want) {
			t.Errorf("the model read %q, which does not say %q", bad, want)
		}
	}
	if n := tools.Calls(abi.ExportStart); n != 1 {
		t.Fatalf("the calculator was started %d times (%v), want once: the invalid call must never reach it", n, tools.Keys())
	}
}

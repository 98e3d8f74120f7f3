package host

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// TestAFailingPluginShowsTheTenantTheRuntimesWords runs Runs through the
// runtime with real Wasm plugins that fail: the hostile executor's tools,
// and a builder whose input limit every Run passes. What the tenant reads
// of each failure (the Run, its events, the result the model wrote from
// the tool errors) is the class and the runtime's words, with the
// plugin's own words where it gave some; the host's error, with its
// plugin and export names and the guest's stderr, is in the runtime's
// log, on a line with the Run's ID.
func TestAFailingPluginShowsTheTenantTheRuntimesWords(t *testing.T) {
	e := newEnv(t, Config{})
	hostile := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) { s.Limits.CallTimeout = 5 * time.Second })
	tight, err := e.load(t, conformance.PluginBuilder, abi.RoleBuilder, func(s *PluginSpec) {
		s.Name = "tight-builder"
		s.Limits.MaxInputBytes = 64
	}).Builder()
	if err != nil {
		t.Fatal(err)
	}
	builder, err := e.load(t, conformance.PluginBuilder, abi.RoleBuilder, nil).Builder()
	if err != nil {
		t.Fatal(err)
	}
	acme := &runtime.Tenant{ID: "acme", Builder: builder, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}, ModelPolicy: loop.Policy{Mode: loop.PolicyFail}}
	for _, tl := range hostile.Plugin().Describe().Tools {
		acme.Tools = append(acme.Tools, runtime.Tool{Descriptor: tl, Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: hostile})
	}
	narrow := *acme
	narrow.ID, narrow.Builder = "narrow", tight

	store := conformance.NewMemStore(e.clock, conformance.KVLimits{})
	t.Cleanup(func() { _ = store.Close() })
	log := &conformance.LogBuffer{}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": acme, "narrow": &narrow}, Clock: e.clock,
		NodeID: "node-a", PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		MaxDefer: 30 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	conformance.Eventually(t, "the first recovery pass", rt.Ready)

	for i, tc := range []struct {
		name, tenant, input string
		status              loop.Status
		tenantReads         string   // the Run's result, or its failure's message
		logged              []string // fragments of the log line with the Run's ID
	}{
		{
			name: "a tool traps", tenant: "acme", input: `call:trap()|answer:$results`, status: loop.StatusCompleted,
			tenantReads: `error (plugin_trap): the executor of tool "trap" crashed`,
			logged:      []string{"host: plugin[hostile] export[start]: plugin_trap", "nil map"},
		},
		{
			name: "a tool refuses with error_set", tenant: "acme", input: `call:nonzero()|answer:$results`, status: loop.StatusCompleted,
			tenantReads: `error (plugin_protocol): the executor of tool "nonzero" returned an error: hostile: refusing on purpose`,
			logged:      []string{"host: plugin[hostile] export[start]: plugin_protocol: the plugin returned status 1"},
		},
		{
			name: "a tool's reply breaks the ABI", tenant: "acme", input: `call:bad_schema()|answer:$results`, status: loop.StatusCompleted,
			tenantReads: `error (plugin_protocol): the reply of the executor of tool "bad_schema" broke the plugin ABI`,
			logged:      []string{"host: plugin[hostile] export[start]: plugin_protocol: the reply breaks the ABI", "exploded"},
		},
		{
			name: "the builder's input is over its limit", tenant: "narrow", input: "answer:" + strings.Repeat("x", 100), status: loop.StatusFailed,
			tenantReads: "planning model step 1 failed (limit_exceeded): the input to the builder was over the plugin's input limit",
			logged:      []string{"host: plugin[tight-builder] export[build]: limit_exceeded", "max_input_bytes of 64"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := rt.Execute(ctx, runtime.Request{Tenant: tc.tenant, Session: fmt.Sprintf("s%d", i), Input: tc.input})
			if err != nil || res.Kind != runtime.ResultTerminal {
				t.Fatalf("execute: %v, result %s", err, res.Kind)
			}
			run := res.Run
			reads := run.Result
			if run.Failure != nil {
				reads = run.Failure.Message
			}
			if run.Status != tc.status || reads != tc.tenantReads {
				t.Errorf("run %s, the tenant reads %q\nwant %s, %q", run.Status, reads, tc.status, tc.tenantReads)
			}
			evs, err := store.Events(ctx, tc.tenant, run.ID, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			snap, _ := json.Marshal(run)
			all, _ := json.Marshal(evs)
			texts := string(snap) + string(all)
			for _, internal := range []string{"host:", "plugin[", "export[", "wasm", "stderr", "goroutine", ".go:", "max_input_bytes"} {
				if i := strings.Index(texts, internal); i >= 0 {
					t.Errorf("the tenant reads %q: …%s…", internal, texts[max(i-120, 0):min(i+80, len(texts))])
				}
			}
			if l := log.Lines(append([]string{`"run":"` + run.ID + `"`}, tc.logged...)...); len(l) == 0 {
				t.Errorf("no log line with the Run's ID holds %q; the log:\n%s", tc.logged, strings.Join(log.Lines(run.ID), "\n"))
			}
		})
	}
}

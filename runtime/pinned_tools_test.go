package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// A Run offers the model the tools it was created with, and the Loop
// accepts calls of those tools only: the builder must be given the Run's
// own tools, not the tenant's as they are at each step, which a config
// reload may change while the Run is in flight.

// swappableTenants holds tenant "acme" and lets a test replace it while
// Runs are in flight, as a config reload does.
type swappableTenants struct {
	mu sync.Mutex
	t  *runtime.Tenant
}

func (s *swappableTenants) Tenant(id string) (*runtime.Tenant, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != "acme" {
		return nil, false
	}
	return s.t, true
}

func (s *swappableTenants) set(t *runtime.Tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.t = t
}

// toolRecorder is a builder that records the tools each build of a Run
// was given, by Run ID and step, and leaves the building to next.
type toolRecorder struct {
	next runtime.Builder
	mu   sync.Mutex
	seen map[string][]abi.Tool
}

func (r *toolRecorder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[string][]abi.Tool{}
	}
	r.seen[fmt.Sprintf("%s step %d", in.Run.ID, in.Run.Step)] = slices.Clone(in.Tools)
	r.mu.Unlock()
	return r.next.Build(ctx, tenant, in)
}

// toolsOf returns the tools step of run was built with (false: no build).
func (r *toolRecorder) toolsOf(runID string, step int) ([]abi.Tool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tools, ok := r.seen[fmt.Sprintf("%s step %d", runID, step)]
	return tools, ok
}

func toolNames(tools []abi.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

// calculator answers the tool "calculate" with "4" and leaves every other
// tool to the executor it wraps.
type calculator struct{ runtime.Executor }

func (c calculator) Start(ctx context.Context, call runtime.EffectCall) (abi.EffectReply, error) {
	if call.Input.Effect.Tool != "calculate" {
		return c.Executor.Start(ctx, call)
	}
	raw, _ := json.Marshal(abi.ToolOutcome{Content: "4"})
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

// swapEnv is a RuntimeEnv whose runtime looks the tenant up in a
// swappableTenants, with a builder that records the tools it is given.
type swapEnv struct {
	*conformance.RuntimeEnv
	rt       *runtime.Runtime
	tenants  *swappableTenants
	recorder *toolRecorder
}

func newSwapEnv(t *testing.T) *swapEnv {
	t.Helper()
	recorder := &toolRecorder{}
	e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}, func(tn *runtime.Tenant) {
		recorder.next = tn.Builder
		tn.Builder = recorder
	})
	// The env's own runtime has a fixed TenantMap: this one, over the same
	// store, takes its place before any Run is made.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Runtime.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	tenants := &swappableTenants{t: e.Tenant}
	rt, err := runtime.New(runtime.Options{Store: e.Store, Tenants: tenants, Clock: e.Clock,
		NodeID: "node-swap", PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		MaxDefer: 30 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "node-swap's first recovery pass", rt.Ready)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	return &swapEnv{RuntimeEnv: e, rt: rt, tenants: tenants, recorder: recorder}
}

// submit creates a Run of session s1 and returns its ID without waiting.
func (e *swapEnv) submit(input string) string {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: input})
	if err != nil {
		e.T.Fatalf("submit %q: %v", input, err)
	}
	return run.ID
}

// whileBlocked runs a Run whose first step calls the "block" tool, calls
// change while that call is in flight (after the Run's first build, before
// its second), releases the call, and returns the Run once it has ended.
func (e *swapEnv) whileBlocked(input string, change func()) loop.Run {
	e.T.Helper()
	id := e.submit(input)
	conformance.Eventually(e.T, "the block tool's call", func() bool { return e.Tools.Calls(abi.ExportStart) >= 1 })
	change()
	e.Plugins.Release()
	return e.UntilTerminal(e.rt, id, time.Second)
}

func TestAToolAddedMidRunIsNotOfferedToThatRun(t *testing.T) {
	e := newSwapEnv(t)
	before := e.Tenant
	original := slices.Clone(before.Tools)

	// A reload adds the tool "calculate" and describes "echo" anew.
	after := *before
	after.Tools = slices.Clone(before.Tools)
	for i := range after.Tools {
		if after.Tools[i].Spec.Name == "echo" {
			after.Tools[i].Descriptor.Description = "echo, described anew"
		}
	}
	after.Tools = append(after.Tools, runtime.Tool{
		Descriptor: abi.Tool{Name: "calculate", Description: "Evaluate an arithmetic expression", InputSchema: json.RawMessage(`{"type":"object"}`)},
		Spec:       loop.ToolSpec{Name: "calculate", Policy: loop.Policy{Mode: loop.PolicyFail}},
		Executor:   calculator{e.Tools},
	})

	run := e.whileBlocked(`call:block()|answer:$results`, func() { e.tenants.set(&after) })
	if run.Status != loop.StatusCompleted || run.Result != "unblocked" {
		t.Fatalf("the Run in flight: %s, result %q, failure %+v", run.Status, run.Result, run.Failure)
	}
	var want []abi.Tool
	for _, tl := range original {
		want = append(want, tl.Descriptor)
	}
	for step := 1; step <= 2; step++ {
		got, ok := e.recorder.toolsOf(run.ID, step)
		if !ok {
			t.Fatalf("step %d of the Run in flight was never built", step)
		}
		if !equalTools(got, want) {
			t.Errorf("step %d of the Run in flight was built with tools %v, want the Run's own %v (as first described)\n got  %s\n want %s",
				step, toolNames(got), toolNames(want), toolsJSON(got), toolsJSON(want))
		}
	}

	// A Run created after the reload is offered the new tool, and the
	// Loop accepts its calls.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := e.rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s2", Input: `call:calculate({"expression":"2+2"})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	next := res.Run
	if res.Kind != runtime.ResultTerminal {
		next = e.UntilTerminal(e.rt, next.ID, time.Second)
	}
	if next.Status != loop.StatusCompleted || next.Result != "4" {
		t.Fatalf("the Run after the reload: %s, result %q, failure %+v", next.Status, next.Result, next.Failure)
	}
	got, _ := e.recorder.toolsOf(next.ID, 1)
	if !slices.Contains(toolNames(got), "calculate") {
		t.Errorf("the Run after the reload was built with tools %v, without calculate", toolNames(got))
	}
	for _, tl := range got {
		if tl.Name == "echo" && tl.Description != "echo, described anew" {
			t.Errorf("the Run after the reload sees echo described as %q", tl.Description)
		}
	}
}

func TestAToolRemovedMidRunIsStillOfferedToThatRunAndItsCallsFailClearly(t *testing.T) {
	e := newSwapEnv(t)
	before := e.Tenant
	var want []string
	for _, tl := range before.Tools {
		want = append(want, tl.Spec.Name)
	}

	// A reload removes the tool "echo".
	after := *before
	after.Tools = slices.DeleteFunc(slices.Clone(before.Tools), func(tl runtime.Tool) bool { return tl.Spec.Name == "echo" })

	run := e.whileBlocked(`call:block()|call:echo({"text":"hi"})|answer:$results`, func() { e.tenants.set(&after) })
	// The Run was created with echo: the Loop accepts its call, and the
	// builder offered it; with no executor for it, the call fails with a
	// class and a message that name the tool, and the Run goes on.
	const failed = `error (executor_unavailable): no executor is configured for tool "echo"`
	if run.Status != loop.StatusCompleted || run.Result != "unblocked,"+failed {
		t.Fatalf("the Run in flight: %s, result %q, failure %+v", run.Status, run.Result, run.Failure)
	}
	got, ok := e.recorder.toolsOf(run.ID, 2)
	if !ok || !slices.Equal(toolNames(got), want) {
		t.Errorf("step 2 of the Run in flight was built with tools %v, want the Run's own %v", toolNames(got), want)
	}
}

func equalTools(a, b []abi.Tool) bool {
	return toolsJSON(a) == toolsJSON(b)
}

func toolsJSON(tools []abi.Tool) string {
	raw, err := json.Marshal(tools)
	if err != nil {
		return "unmarshallable: " + err.Error()
	}
	return strings.TrimSpace(string(raw))
}

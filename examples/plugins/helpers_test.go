package examples_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The example plugins, by directory under examples/plugins, with the role
// each is loaded as.
var goExamples = []struct {
	dir  string
	role abi.Role
}{
	{"prompt-builder", abi.RoleBuilder},
	{"scripted-model", abi.RoleExecutor},
	{"calculator", abi.RoleExecutor},
	{"slow-job", abi.RoleExecutor},
	{"openai", abi.RoleExecutor},
	{"anthropic", abi.RoleExecutor},
}

const calculatorC = "calculator-c"

// env is one test's host with a fake clock, an in-memory KV and a
// recorder of the events plugins emit.
type env struct {
	h      *host.Host
	kv     *conformance.MemStore
	clock  *conformance.FakeClock
	events *emitted
}

func newEnv(t testing.TB) *env {
	t.Helper()
	clock := conformance.NewFakeClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	return restart(t, clock, conformance.NewMemStore(clock, conformance.KVLimits{}))
}

// restart starts a host on an existing clock and KV: what a process that
// restarts on the same store sees.
func restart(t testing.TB, clock *conformance.FakeClock, kv *conformance.MemStore) *env {
	t.Helper()
	e := &env{clock: clock, kv: kv, events: newEmitted()}
	h, err := host.New(host.Config{CacheDir: conformance.WazeroCacheDir(), KV: e.kv, Clock: e.clock, Events: e.events})
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	t.Cleanup(func() { h.Close(context.Background()) })
	return e
}

// wasmPath builds an example once per source hash and returns its file. A
// missing C toolchain fails the test, naming the packages to install: the C
// example is part of what make test checks.
func wasmPath(t testing.TB, dir string) string {
	t.Helper()
	p := conformance.ExampleWasm(t, dir)
	return p
}

func (e *env) load(t testing.TB, dir string, role abi.Role, mod func(*host.PluginSpec)) *host.Plugin {
	t.Helper()
	spec := host.PluginSpec{Name: dir, Path: wasmPath(t, dir), Role: role}
	if mod != nil {
		mod(&spec)
	}
	p, err := e.h.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) executor(t testing.TB, dir string, mod func(*host.PluginSpec)) *host.Executor {
	t.Helper()
	x, err := e.load(t, dir, abi.RoleExecutor, mod).Executor()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// emitted records the events plugins emit (a runtime.EventSink), and lets
// a test wait for them.
type emitted struct {
	mu      sync.Mutex
	events  []abi.EmitEvent
	changed chan struct{} // closed at the next event
}

func newEmitted() *emitted { return &emitted{changed: make(chan struct{})} }

func (e *emitted) Emit(_ context.Context, _ runtime.EmitScope, ev abi.EmitEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
	close(e.changed)
	e.changed = make(chan struct{})
	return nil
}

// all is every event so far.
func (e *emitted) all() []abi.EmitEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]abi.EmitEvent(nil), e.events...)
}

// deltas are the model_delta events' deltas so far, from the n-th event
// on.
func (e *emitted) deltas(from int) []abi.ModelDelta {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []abi.ModelDelta
	for _, ev := range e.events[min(from, len(e.events)):] {
		if ev.Type == abi.EmitModelDelta && ev.Delta != nil {
			out = append(out, *ev.Delta)
		}
	}
	return out
}

// count is the number of events so far.
func (e *emitted) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// waitFor waits, for at most a minute and until stop is closed, for the
// deltas of the events from the n-th on to satisfy ok; it says what it
// waited for when they do not.
func (e *emitted) waitFor(from int, what string, stop <-chan struct{}, ok func([]abi.ModelDelta) bool) error {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		if ok(e.deltas(from)) {
			return nil
		}
		select {
		case <-changed:
		case <-stop:
			if ok(e.deltas(from)) {
				return nil
			}
			return fmt.Errorf("the call ended before %s; deltas: %+v", what, e.deltas(from))
		case <-deadline.C:
			return fmt.Errorf("waited a minute for %s; deltas: %+v", what, e.deltas(from))
		}
	}
}

// startWhileHeld starts c on x while the fake holds the answer (hold):
// it waits for the deltas so far to satisfy ok, which they must before
// the answer can end, then releases the hold and returns the reply.
func (e *emitted) startWhileHeld(t *testing.T, x *host.Executor, c runtime.EffectCall, hold *conformance.StreamHold, what string, ok func([]abi.ModelDelta) bool) (abi.EffectReply, error) {
	t.Helper()
	type result struct {
		r   abi.EffectReply
		err error
	}
	done, ended := make(chan result, 1), make(chan struct{})
	from := e.count()
	go func() {
		defer close(ended)
		r, err := x.Start(context.Background(), c)
		done <- result{r, err}
	}()
	err := e.waitFor(from, what, ended, ok)
	hold.Release()
	if err != nil {
		t.Fatal(err)
	}
	res := <-done
	return res.r, res.err
}

// joined is deltas put together: the text, and each call's pieces.
func joined(deltas []abi.ModelDelta) abi.ModelDelta {
	var all abi.ModelDelta
	for _, d := range deltas {
		all.Text += d.Text
		for _, tc := range d.ToolCalls {
			for len(all.ToolCalls) <= tc.Index {
				all.ToolCalls = append(all.ToolCalls, abi.ToolCallDelta{Index: len(all.ToolCalls)})
			}
			c := &all.ToolCalls[tc.Index]
			c.ID += tc.ID
			c.Name += tc.Name
			c.Arguments += tc.Arguments
		}
	}
	return all
}

func withConfig(kv map[string]string) func(*host.PluginSpec) {
	return func(s *host.PluginSpec) { s.Sandbox.Config = kv }
}

func toolCall(effect string, attempt int, tool string, args any) runtime.EffectCall {
	a, _ := json.Marshal(args)
	req, _ := json.Marshal(abi.ToolRequest{Arguments: a})
	return runtime.EffectCall{Tenant: "acme", Session: "s1", RunID: "run_1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: effect, AssignmentKey: fmt.Sprintf("acme/s1/%s#%d", effect, attempt), Attempt: attempt, Kind: abi.KindTool, Tool: tool, Request: req},
	}}
}

func modelCall(effect string, req abi.ModelRequest) runtime.EffectCall {
	b, _ := json.Marshal(req)
	return runtime.EffectCall{Tenant: "acme", Session: "s1", RunID: "run_1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: effect, AssignmentKey: "acme/s1/" + effect + "#1", Attempt: 1, Kind: abi.KindModel, Request: b},
	}}
}

// tool returns a check that asserts a done reply and returns its tool
// outcome: tool(t)(x.Start(ctx, c)).
func tool(t testing.TB) func(abi.EffectReply, error) abi.ToolOutcome {
	return func(r abi.EffectReply, err error) abi.ToolOutcome {
		t.Helper()
		if err != nil {
			t.Fatalf("call failed: %v", err)
		}
		if r.State != abi.StateDone {
			t.Fatalf("state %q, want done (reply %+v)", r.State, r)
		}
		var o abi.ToolOutcome
		if err := json.Unmarshal(r.Outcome, &o); err != nil {
			t.Fatalf("outcome %s: %v", r.Outcome, err)
		}
		return o
	}
}

// model returns a check that asserts a done reply and returns its model
// outcome: model(t)(x.Start(ctx, c)).
func model(t testing.TB) func(abi.EffectReply, error) abi.ModelOutcome {
	return func(r abi.EffectReply, err error) abi.ModelOutcome {
		t.Helper()
		if err != nil {
			t.Fatalf("call failed: %v", err)
		}
		if r.State != abi.StateDone {
			t.Fatalf("state %q, want done (reply %+v)", r.State, r)
		}
		var o abi.ModelOutcome
		if err := json.Unmarshal(r.Outcome, &o); err != nil {
			t.Fatalf("outcome %s: %v", r.Outcome, err)
		}
		return o
	}
}

// classOf returns the error class of a plugin error.
func classOf(t testing.TB, err error) abi.ErrorClass {
	t.Helper()
	var pe *runtime.PluginError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *runtime.PluginError", err, err)
	}
	return pe.Class
}

// TestWarmExampleCache builds every example and loads it once, so the
// wazero cache holds its compiled code. `make warm-cache` runs it without
// -race before the race-enabled tests (docs/DESIGN.md §9). Under -race it skips:
// a load costs seconds there, and the other tests load every example.
func TestWarmExampleCache(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race the other tests load every example; make warm-cache runs this one without -race")
	}
	e := newEnv(t)
	for _, x := range goExamples {
		p := e.load(t, x.dir, x.role, nil)
		if p.ABIVersion() != abi.Version {
			t.Errorf("%s: ABI v%d", x.dir, p.ABIVersion())
		}
	}
	// The examples that are not Go, on both call paths: the differential
	// tests load them on each.
	others := []struct {
		dir  string
		role abi.Role
	}{
		{calculatorC, abi.RoleExecutor}, {promptBuilderC, abi.RoleBuilder}, {scriptedModelC, abi.RoleExecutor},
		{slowJobC, abi.RoleExecutor}, {calculatorAS, abi.RoleExecutor},
	}
	for _, x := range others {
		e.load(t, x.dir, x.role, nil)
	}
	// The reference call path compiles the modules as they are (the
	// native one adds interrupt checks): the differential tests load both.
	sdk, err := host.New(host.Config{CacheDir: conformance.WazeroCacheDir(), KV: e.kv, Clock: e.clock, CallPath: host.CallPathSDK})
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close(context.Background())
	for _, x := range append(goExamples, others...) {
		if _, err := sdk.Load(context.Background(), host.PluginSpec{Name: x.dir, Path: wasmPath(t, x.dir), Role: x.role}); err != nil {
			t.Fatal(err)
		}
	}
}

// streamFailure is a streamed answer a fake provider breaks off: setup
// arms it, and the attempt fails, retriable, with class, saying want.
type streamFailure struct {
	name  string
	setup func()
	class abi.ErrorClass
	want  string
}

// checkStreamedAnswers is the streaming test of a model plugin x (and
// whole, the same plugin with stream: false) against a fake provider
// whose holds and cuts are hold and cut, and whose answer to "hi" is
// answer. The deltas of the first two pieces reach the host while the
// provider holds the rest, and the pieces add up to the reply; a tool
// call's pieces add up to the reply's call, numbered 0; a connection
// dropped, a body ended early and each of failures fail the attempt,
// retriable, after the pieces that came; stream: false emits nothing and
// answers the same.
func checkStreamedAnswers(t *testing.T, e *env, x, whole *host.Executor, hold func(int) *conformance.StreamHold,
	cut func(int, conformance.StreamCut), answer string, failures []streamFailure) {
	t.Helper()
	ctx := context.Background()
	ask := func(text string) abi.ModelRequest {
		return abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}, Tools: []abi.Tool{calculateTool}}
	}

	from := e.events.count()
	out := model(t)(e.events.startWhileHeld(t, x, modelCall("run_1.m1", ask("hi")), hold(2), "the held answer's first pieces",
		func(ds []abi.ModelDelta) bool { return joined(ds).Text == answer[:8] }))
	deltas := e.events.deltas(from)
	if out.Message.Content != answer || joined(deltas).Text != out.Message.Content || len(deltas) < 2 {
		t.Fatalf("reply %+v, deltas %+v", out.Message, deltas)
	}

	from = e.events.count()
	out = model(t)(x.Start(ctx, modelCall("run_1.m2", ask("use calculate"))))
	got := joined(e.events.deltas(from))
	if len(out.Message.ToolCalls) != 1 || len(got.ToolCalls) != 1 || got.Text != out.Message.Content {
		t.Fatalf("reply %+v, deltas %+v", out.Message, got)
	}
	call := out.Message.ToolCalls[0]
	if d := got.ToolCalls[0]; d.Index != 0 || d.ID != call.ID || d.Name != call.Name || !jsonEqual(d.Arguments, string(call.Arguments)) {
		t.Errorf("the call's pieces add up to %+v; the reply's call is %+v", d, call)
	}

	cuts := []streamFailure{
		{"connection dropped", func() { cut(2, conformance.CutConnection) }, "", "the answer's stream broke after"},
		{"body ended early", func() { cut(2, conformance.CutBody) }, "", "the answer's stream ended after"},
	}
	for _, c := range append(cuts, failures...) {
		c.setup()
		from := e.events.count()
		r, err := x.Start(ctx, modelCall("run_1.m3", ask("hi")))
		if err != nil || r.State != abi.StateFailed || !r.Error.Retriable || r.Error.Class != c.class || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: %+v %+v %v, want failed, retriable, class %q, saying %q", c.name, r, r.Error, err, c.class, c.want)
		}
		if got := joined(e.events.deltas(from)).Text; len(got) < 8 {
			t.Errorf("%s: the pieces before the failure were not emitted: %q", c.name, got)
		}
	}

	from = e.events.count()
	if out := model(t)(whole.Start(ctx, modelCall("run_1.m4", ask("hi")))); out.Message.Content != answer || len(e.events.deltas(from)) != 0 {
		t.Errorf("stream: false: %+v, deltas %+v", out, e.events.deltas(from))
	}
}

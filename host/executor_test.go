package host

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

func TestExecutorTools(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, nil)
	ctx := context.Background()

	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.0", 1, "add", map[string]int{"a": 2, "b": 3}))); got != "5" {
		t.Errorf("add: %q", got)
	}
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.1", 1, "echo", map[string]string{"text": "héllo"}))); got != "héllo" {
		t.Errorf("echo: %q", got)
	}
	// Every input carries "abi": 1, whatever the caller put there.
	c := toolCall("acme", "r.t1.2", 1, "abi", nil)
	c.Input.ABI = 99
	if got := doneIn(t)(x.Start(ctx, c)); got != "1" {
		t.Errorf("abi in input: %q, want 1", got)
	}
	// The plugin's clock is the host clock: fake here.
	e.clock.Advance(90 * time.Minute)
	want := strconv.FormatInt(e.clock.Now().UnixMilli(), 10)
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.3", 1, "clock", nil))); got != want {
		t.Errorf("clock: %q, want %s", got, want)
	}
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.4", 1, "kv_roundtrip", map[string]string{"text": "v"}))); got != "v" {
		t.Errorf("kv_roundtrip: %q", got)
	}
	if ks := e.kv.keys(); len(ks) != 0 {
		t.Errorf("kv_roundtrip left keys: %v", ks)
	}
	// Emits reach the sink with the call's scope.
	evs := e.sink.all()
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5: %+v", len(evs), evs)
	}
	s := evs[4].scope
	if s.Tenant != "acme" || s.Session != "s1" || s.RunID != "run1" || s.EffectID != "r.t1.4" || s.Plugin != conformance.PluginExecutor {
		t.Errorf("emit scope %+v", s)
	}
	if evs[4].ev.Type != "progress" || evs[4].ev.Message != "start r.t1.4" {
		t.Errorf("emit event %+v", evs[4].ev)
	}
	// An unknown tool is the plugin's own verdict: a failed reply.
	r, err := x.Start(ctx, toolCall("acme", "r.t1.5", 1, "nope", nil))
	if err != nil || r.State != abi.StateFailed || !strings.Contains(r.Error.Message, "nope") {
		t.Errorf("unknown tool: %+v %v", r, err)
	}
}

func TestExecutorModelStep(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, nil)
	req, _ := json.Marshal(abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "please add 4 5"}}})
	c := runtime.EffectCall{Tenant: "acme", Input: abi.EffectInput{Effect: abi.Effect{ID: "r.m1", Attempt: 1, Kind: abi.KindModel, Request: req}}}
	r, err := x.Start(context.Background(), c)
	if err != nil || r.State != abi.StateDone {
		t.Fatalf("%+v %v", r, err)
	}
	var o abi.ModelOutcome
	if err := json.Unmarshal(r.Outcome, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Message.ToolCalls) != 1 || o.Message.ToolCalls[0].Name != "add" || string(o.Message.ToolCalls[0].Arguments) != `{"a":4,"b":5}` {
		t.Fatalf("outcome %+v", o)
	}
}

func TestBuilder(t *testing.T) {
	e := newEnv(t, Config{})
	b, err := e.load(t, conformance.PluginBuilder, abi.RoleBuilder, nil).Builder()
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Build(context.Background(), "acme", abi.BuildInput{
		Run:     abi.RunView{ID: "run1", Tenant: "acme", Session: "s1", Step: 2, Input: "hi"},
		History: []abi.Message{{Role: "user", Content: "before"}, {Role: "assistant", Content: "ok"}},
		Tools:   []abi.Tool{{Name: "add"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := out.Request.Messages
	if len(m) != 4 || m[0].Role != "system" || m[1].Content != "before" || m[3].Role != "user" || m[3].Content != "hi" {
		t.Fatalf("messages %+v", m)
	}
	if len(out.Request.Tools) != 1 || out.Request.Params["step"] != float64(2) {
		t.Fatalf("request %+v", out.Request)
	}
	// A build the plugin refuses (no run id) is a protocol error.
	_, err = b.Build(context.Background(), "acme", abi.BuildInput{})
	if classOf(t, err) != abi.ClassPluginProtocol || !strings.Contains(err.Error(), "run.id is missing") {
		t.Fatalf("bad build: %v", err)
	}
	if _, err := b.Plugin().Executor(); err == nil {
		t.Fatal("a builder became an executor")
	}
}

func TestSlowJobPendingPollAttach(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginSlowJob, nil)
	ctx := context.Background()
	c := toolCall("acme", "r.t1.0", 1, "slow", map[string]int{"duration_ms": 5000})

	r, err := x.Start(ctx, c)
	if err != nil || r.State != abi.StatePending || r.Handle == "" {
		t.Fatalf("start: %+v %v", r, err)
	}
	c.Input.Handle = r.Handle
	if r, err = x.Poll(ctx, c); err != nil || r.State != abi.StatePending {
		t.Fatalf("poll before the time: %+v %v", r, err)
	}
	// attach with an empty handle finds the record by (effect, attempt).
	c.Input.Handle = ""
	if r, err = x.Attach(ctx, c); err != nil || r.State != abi.StatePending {
		t.Fatalf("attach, empty handle: %+v %v", r, err)
	}
	e.clock.Advance(5 * time.Second)
	if got := doneIn(t)(x.Poll(ctx, c)); got != "slow:r.t1.0#1" {
		t.Fatalf("poll: %q", got)
	}
	// Another attempt of the same effect has no record: unknown.
	other := c
	other.Input.Effect.Attempt = 2
	if r, err = x.Attach(ctx, other); err != nil || r.State != abi.StateUnknown {
		t.Fatalf("attach of attempt 2: %+v %v", r, err)
	}
	// Another tenant's instance never sees acme's record.
	if r, err = x.Attach(ctx, toolCall("globex", "r.t1.0", 1, "slow", nil)); err != nil || r.State != abi.StateUnknown {
		t.Fatalf("attach from another tenant: %+v %v", r, err)
	}

	// After a restart (a new host, same KV), attach still answers.
	e2 := newEnv(t, Config{})
	e2.kv, e2.h.cfg.KV = e.kv, e.kv
	e2.clock.Set(e.clock.Now())
	x2 := e2.executor(t, conformance.PluginSlowJob, nil)
	if got := doneIn(t)(x2.Attach(ctx, c)); got != "slow:r.t1.0#1" {
		t.Fatalf("attach after restart: %q", got)
	}
	cr, err := x2.Cancel(ctx, c)
	if err != nil || cr.State != abi.StateCancelled {
		t.Fatalf("cancel: %+v %v", cr, err)
	}
	if r, err = x2.Attach(ctx, c); err != nil || r.State != abi.StateUnknown {
		t.Fatalf("attach after cancel: %+v %v", r, err)
	}
}

// When the store fails during kv_get, the call is aborted and the effect
// fails executor_unavailable: attach never answers "unknown" by mistake.
func TestKVGetStoreFailureAborts(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginSlowJob, nil)
	ctx := context.Background()
	c := toolCall("acme", "r.t1.0", 1, "slow", nil)
	if _, err := x.Start(ctx, c); err != nil {
		t.Fatal(err)
	}
	e.kv.setFailing(true)
	r, err := x.Attach(ctx, c)
	if classOf(t, err) != abi.ClassExecutorUnavailable {
		t.Fatalf("attach with a failing store: %+v %v", r, err)
	}
	if !errors.Is(err, runtime.ErrExecutorUnavailable) || !errors.Is(err, runtime.ErrStoreUnavailable) {
		t.Fatalf("error %v should wrap ErrExecutorUnavailable and the store's error", err)
	}
	if st := x.Plugin().Stats("acme"); st.Failed != 1 || st.Idle != 0 {
		t.Fatalf("the aborted instance was kept: %+v", st)
	}
	e.kv.setFailing(false)
	if r, err := x.Attach(ctx, c); err != nil || r.State != abi.StatePending {
		t.Fatalf("attach after the store is back: %+v %v", r, err)
	}
}

// The runtime's call timeout runs from when a call has an instance, not
// while it waits for one (runtime.CapacityWaiter): with one instance held
// by an attach blocked in kv_get past the timeout, a second attach waits,
// and once the first is done, answers. Before, the wait counted against
// the timeout, and the second call failed with "no instance: context
// deadline exceeded" (which the runtime takes for an unreachable executor,
// and defers). The timeout still bounds the call itself.
func TestTheCallTimeoutStartsOnceTheCallHasAnInstance(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginSlowJob, func(s *PluginSpec) { s.Limits.PoolSize, s.Limits.MaxInstances = 1, 1 })
	if _, ok := any(x).(runtime.CapacityWaiter); !ok {
		t.Fatal("host.Executor is not a runtime.CapacityWaiter")
	}
	c := toolCall("acme", "r.t1.0", 1, "slow", nil)
	if _, err := x.Start(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	const timeout = 250 * time.Millisecond
	release := e.kv.hold()
	first := make(chan error, 1)
	go func() {
		_, err := x.Attach(context.Background(), c)
		first <- err
	}()
	conformance.Eventually(t, "the first attach to hold the instance in kv_get", func() bool { return e.kv.gated.Load() == 1 })
	began := time.Now()
	second := make(chan error, 1)
	var reply abi.EffectReply
	go func() {
		var err error
		reply, err = x.Attach(runtime.WithCallTimeout(context.Background(), timeout), c)
		second <- err
	}()
	conformance.Eventually(t, "the second attach to wait for the instance past its call timeout", func() bool {
		return x.Plugin().Stats("acme").Waiting == 1 && time.Since(began) > 3*timeout
	})
	release()
	if err := <-first; err != nil {
		t.Fatalf("first attach: %v", err)
	}
	if err := <-second; err != nil || reply.State != abi.StatePending {
		t.Fatalf("the attach that waited for the instance: %+v, %v; want pending", reply, err)
	}

	// The timeout bounds the call once it runs: blocked in kv_get, it ends.
	release = e.kv.hold()
	defer release()
	_, err := x.Attach(runtime.WithCallTimeout(context.Background(), timeout), c)
	if err == nil {
		t.Fatal("a call blocked past its timeout returned no error")
	}
}

// A model call's model_delta emits reach the sink stamped with the
// effect's attempt and numbered from 1 within the call; a tool call may
// not send one.
func TestModelDeltasAreStampedWithAttemptAndSeq(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, nil)
	const text = "please stream  this answer"
	req, _ := json.Marshal(abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}})
	c := runtime.EffectCall{Tenant: "acme", Session: "s1", RunID: "run1",
		Input: abi.EffectInput{Effect: abi.Effect{ID: "r.m1", Attempt: 3, Kind: abi.KindModel, Request: req}}}
	if r, err := x.Start(context.Background(), c); err != nil || r.State != abi.StateDone {
		t.Fatalf("%+v %v", r, err)
	}
	var got strings.Builder
	var seqs []int64
	for _, em := range e.sink.all() {
		if em.ev.Type != abi.EmitModelDelta {
			if em.scope.DeltaSeq != 0 {
				t.Errorf("a %s emit has seq %d", em.ev.Type, em.scope.DeltaSeq)
			}
			continue
		}
		if em.scope.Attempt != 3 || em.scope.EffectID != "r.m1" || em.scope.RunID != "run1" {
			t.Errorf("delta scope %+v", em.scope)
		}
		got.WriteString(em.ev.Delta.Text)
		seqs = append(seqs, em.scope.DeltaSeq)
	}
	if got.String() != text {
		t.Errorf("the deltas make %q, want %q", got.String(), text)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("delta seqs %v, want 1, 2, …", seqs)
		}
	}
	if len(seqs) != 4 {
		t.Errorf("%d deltas, want 4 (one a word)", len(seqs))
	}
	// From a tool call, the host refuses it.
	if got := doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t1.0", 1, "model_delta", nil))); got != strconv.Itoa(int(abi.StatusRefused)) {
		t.Errorf("a tool's model_delta: status %s, want refused (%d)", got, abi.StatusRefused)
	}
}

func TestOnlyAModelDeltaCarriesADelta(t *testing.T) {
	model := &callScope{kind: abi.KindModel}
	tool := &callScope{kind: abi.KindTool}
	d := &abi.ModelDelta{Text: "x"}
	for _, c := range []struct {
		name string
		s    *callScope
		ev   abi.EmitEvent
		want bool
	}{
		{"progress", tool, abi.EmitEvent{Type: abi.EmitProgress, Message: "m"}, true},
		{"progress with a delta", model, abi.EmitEvent{Type: abi.EmitProgress, Delta: d}, false},
		{"delta from a model call", model, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: d}, true},
		{"delta from a tool call", tool, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: d}, false},
		{"delta from a build", &callScope{}, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: d}, false},
		{"delta without one", model, abi.EmitEvent{Type: abi.EmitModelDelta}, false},
		{"empty delta", model, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{}}, false},
		{"tool call piece", model, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: 1, Arguments: "{"}}}}, true},
		{"negative index", model, abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: -1}}}}, false},
	} {
		if got := c.s.mayEmit(c.ev); got != c.want {
			t.Errorf("%s: mayEmit %v, want %v", c.name, got, c.want)
		}
	}
}

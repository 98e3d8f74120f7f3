package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// agentRecorder is a builder that records the agent each build of a Run
// was given, by Run ID and step, and leaves the building to next.
type agentRecorder struct {
	next runtime.Builder
	mu   sync.Mutex
	seen map[string]*abi.AgentView
}

func (r *agentRecorder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[string]*abi.AgentView{}
	}
	var a *abi.AgentView
	if in.Agent != nil {
		c := *in.Agent
		a = &c
	}
	r.seen[fmt.Sprintf("%s step %d", in.Run.ID, in.Run.Step)] = a
	r.mu.Unlock()
	return r.next.Build(ctx, tenant, in)
}

// agentOf returns the agent step of run was built with (false: no build).
func (r *agentRecorder) agentOf(runID string, step int) (*abi.AgentView, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.seen[fmt.Sprintf("%s step %d", runID, step)]
	return a, ok
}

// agentTenant returns the swap env's tenant as one agent, "support", of
// the given version, instructions and settings, built by recorder over
// the env's own builder.
func agentTenant(e *swapEnv, recorder *agentRecorder, version, instructions, settings string) *runtime.Tenant {
	base := e.Tenant
	return &runtime.Tenant{ID: base.ID, Agents: map[string]*runtime.Agent{"support": {
		Name: "support", Version: version, Instructions: instructions, Settings: json.RawMessage(settings),
		Builder: recorder, Model: base.Model, Tools: base.Tools,
		Limits: base.Limits, ModelPolicy: base.ModelPolicy, HistoryRuns: base.HistoryRuns,
	}}}
}

// TestTheBuilderIsGivenTheRunsPinnedAgent: a Run records its agent's
// version, instructions and settings when it is created, and every step
// of it is built with those, after the agent has moved on to another
// version; a Run created after the change is built with the new one.
func TestTheBuilderIsGivenTheRunsPinnedAgent(t *testing.T) {
	e := newSwapEnv(t)
	recorder := &agentRecorder{next: e.Tenant.Builder}
	v1 := agentTenant(e, recorder, "v-1", "You are support, version 1.", `{"model":"m1","temperature":0.1}`)
	v2 := agentTenant(e, recorder, "v-2", "You are support, version 2.", `{"model":"m2","temperature":0.9}`)
	e.tenants.set(v1)
	want1 := &abi.AgentView{Name: "support", Version: "v-1", Instructions: "You are support, version 1.", Settings: json.RawMessage(`{"model":"m1","temperature":0.1}`)}
	want2 := &abi.AgentView{Name: "support", Version: "v-2", Instructions: "You are support, version 2.", Settings: json.RawMessage(`{"model":"m2","temperature":0.9}`)}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	created, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Agent: "support", Input: `call:block()|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if p := created.Agent; p == nil || p.Name != "support" || p.Version != "v-1" || p.Instructions != want1.Instructions {
		t.Fatalf("the Run was created with agent %+v, want support v-1 and its instructions", p)
	}
	e.waitBlocked()
	e.tenants.set(v2) // the config moves on while the Run is in flight
	e.Plugins.Release()
	run := e.UntilTerminal(e.rt, created.ID, time.Second)
	if run.Status != loop.StatusCompleted {
		t.Fatalf("the Run in flight: %s, failure %+v", run.Status, run.Failure)
	}
	for step := 1; step <= 2; step++ {
		got, ok := recorder.agentOf(run.ID, step)
		if !ok {
			t.Fatalf("step %d of the Run in flight was never built", step)
		}
		if !reflect.DeepEqual(got, want1) {
			t.Errorf("step %d of the Run in flight was built with agent %s, want its pinned %s", step, agentJSON(got), agentJSON(want1))
		}
	}

	res, err := e.rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s2", Agent: "support", Input: `answer:done`})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := recorder.agentOf(res.Run.ID, 1); !reflect.DeepEqual(got, want2) {
		t.Errorf("a Run created after the change was built with agent %s, want %s", agentJSON(got), agentJSON(want2))
	}
}

// TestSubmitRefusesAnUnknownAgent: a Request naming an agent its tenant
// does not have is refused with an error that names it and the agents
// there are, and stores nothing; a tenant without agents is its own
// "default" agent, whose Runs carry no pin.
func TestSubmitRefusesAnUnknownAgent(t *testing.T) {
	e := newSwapEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", RunID: "r-unknown", Agent: "support", Input: "answer:x"})
	var unknown *runtime.UnknownAgentError
	if !errors.Is(err, runtime.ErrUnknownAgent) || !errors.As(err, &unknown) || unknown.Agent != "support" || !reflect.DeepEqual(unknown.Known, []string{"default"}) {
		t.Fatalf("a tenant without agents took agent support: %v", err)
	}
	if _, err := e.rt.LoadRun(ctx, "acme", "r-unknown"); !errors.Is(err, runtime.ErrRunNotFound) {
		t.Fatalf("a refused submission stored a Run: %v", err)
	}
	for _, name := range []string{"", runtime.DefaultAgent} {
		run, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s-" + name + "x", Agent: name, Input: "answer:x"})
		if err != nil {
			t.Fatalf("agent %q of a tenant without agents: %v", name, err)
		}
		if run.Agent != nil {
			t.Errorf("a Run of a tenant without agents is pinned to %+v; it runs as the tenant's own fields, with no pin", run.Agent)
		}
	}

	recorder := &agentRecorder{next: e.Tenant.Builder}
	e.tenants.set(agentTenant(e, recorder, "v-1", "I", `{}`))
	for _, name := range []string{"", "default", "Support", "research"} {
		_, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s9", Agent: name, Input: "answer:x"})
		if !errors.As(err, &unknown) || !reflect.DeepEqual(unknown.Known, []string{"support"}) {
			t.Errorf("agent %q of a tenant whose only agent is support: %v", name, err)
		}
	}
	if _, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s9", Agent: "support", Input: "answer:x"}); err != nil {
		t.Fatalf("agent support: %v", err)
	}
}

// TestARunWhoseAgentIsGoneFailsAsExecutorUnavailable: a Run whose agent
// the config no longer has cannot be carried on; its next step fails with
// executor_unavailable, naming why, as a Run whose tool is gone does.
func TestARunWhoseAgentIsGoneFailsAsExecutorUnavailable(t *testing.T) {
	e := newSwapEnv(t)
	recorder := &agentRecorder{next: e.Tenant.Builder}
	e.tenants.set(agentTenant(e, recorder, "v-1", "I", `{}`))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	created, _, err := e.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s1", Agent: "support", Input: `call:block()|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	e.waitBlocked()
	other := agentTenant(e, recorder, "v-1", "I", `{}`)
	other.Agents["research"] = other.Agents["support"]
	delete(other.Agents, "support")
	e.tenants.set(other)
	e.Plugins.Release()
	run := e.UntilTerminal(e.rt, created.ID, time.Second)
	if run.Status != loop.StatusFailed || run.Failure == nil || run.Failure.Class != abi.ClassExecutorUnavailable {
		t.Fatalf("a Run whose agent is gone: %s, failure %+v; want failed as executor_unavailable", run.Status, run.Failure)
	}
}

// waitBlocked waits until the block tool's call is in flight.
func (e *swapEnv) waitBlocked() {
	e.T.Helper()
	conformance.Eventually(e.T, "the block tool's call", func() bool { return e.Tools.Calls(abi.ExportStart) >= 1 })
}

func agentJSON(a *abi.AgentView) string {
	raw, _ := json.Marshal(a)
	return string(raw)
}

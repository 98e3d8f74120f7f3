package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agenthost/agenthost/internal/budget"
	"sort"
	"strings"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Tenant is what the runtime needs to run a tenant's Runs: its agents
// (each a builder, a model executor, tools and the rules its Runs follow).
// cmd wires it from the operator's config and the plugins' describe
// replies.
//
// A Tenant without Agents is one agent, DefaultAgent, made of its own
// Builder, Model, Tools and rules, with no version, instructions or
// settings: its Runs are created with no agent pin, exactly as before
// agents existed. A Tenant with Agents runs each Run as the agent its
// Request names, and its own Builder, Model, Tools and rules are unused.
type Tenant struct {
	ID      string
	Builder Builder
	Model   Executor
	Tools   []Tool
	// Agents are the tenant's agents by name; nil makes the Tenant its
	// own DefaultAgent.
	Agents map[string]*Agent
	// Limits are the Run limits; their DeadlineMS, RunTimeoutMS and
	// WaitTimeoutMS are ignored and derived from RunTimeout and
	// WaitTimeout.
	Limits loop.Limits
	// RunTimeout bounds a Run's work time: the time since its creation
	// that it did not spend waiting for a person (loop.Limits.RunTimeoutMS);
	// 0 means none.
	RunTimeout time.Duration
	// WaitTimeout bounds each of a Run's waits for a person, for an
	// approval or an answer (loop.Limits.WaitTimeoutMS); 0 means none.
	// The config's default is config.DefaultWaitTimeout.
	WaitTimeout time.Duration
	// EffectTimeout bounds one executing attempt; 0 means none.
	EffectTimeout time.Duration
	ModelPolicy   loop.Policy
	// HistoryRuns is how many earlier Runs of the session the builder sees
	// (0 means DefaultHistoryRuns).
	HistoryRuns int
	// MaxAgentDepth bounds how deep child Runs nest (agents calling
	// agents); 0 means DefaultMaxAgentDepth.
	MaxAgentDepth int
	// ModelBudget is the shared budget of Model, or nil: see Agent.
	ModelBudget *budget.Budget
}

// DefaultHistoryRuns is the number of earlier Runs passed to a builder when
// a tenant sets none.
const DefaultHistoryRuns = 20

// DefaultAgent is the agent a Request that names none runs as, and the
// agent a Run created before agents were pinned runs as.
const DefaultAgent = "default"

// Agent is one agent of a tenant: a builder, a model executor, the tools
// its Runs may call, the rules they follow, and what its Runs are pinned
// to when they are created (its version, instructions, settings and
// output schema, and its tools' descriptors and rules). A Run keeps those
// for its whole life; its effects are carried out by the executors of the
// agent of its name as it is now, looked up by tool name.
type Agent struct {
	Name string
	// Version is the hash of the agent's resolved definition (cmd
	// computes it); Runs record it.
	Version string
	// Instructions are the system prompt the builder is given; Settings
	// a JSON object of model settings (model, temperature,
	// max_output_tokens...) the builder passes to the model as params.
	Instructions string
	Settings     json.RawMessage
	// OutputSchema is the JSON Schema (2020-12) the agent's final answers
	// must match, or nil (loop.AgentPin.OutputSchema); the config has
	// compiled it with loop.CompileOutputSchema.
	OutputSchema json.RawMessage
	Builder      Builder
	Model        Executor
	// ModelBudget is the shared budget of Model's endpoint, or nil for
	// none: every agent of every tenant that uses the same model plugin
	// shares one (callExecutor waits for it before it starts a model
	// call).
	ModelBudget *budget.Budget
	Tools       []Tool
	// Limits, RunTimeout, WaitTimeout, EffectTimeout, ModelPolicy and
	// HistoryRuns are as a Tenant's.
	Limits        loop.Limits
	RunTimeout    time.Duration
	WaitTimeout   time.Duration
	EffectTimeout time.Duration
	ModelPolicy   loop.Policy
	HistoryRuns   int
}

// ErrUnknownAgent: a Request names an agent its tenant does not have.
var ErrUnknownAgent = errors.New("runtime: unknown agent")

// UnknownAgentError is the ErrUnknownAgent of a Submit: it names the agent
// asked for and the tenant's agents, for a message that says what to do.
type UnknownAgentError struct {
	Tenant, Agent string
	Known         []string // sorted
}

func (e *UnknownAgentError) Error() string {
	return fmt.Sprintf("runtime: tenant %q has no agent %q (its agents: %s)", e.Tenant, e.Agent, strings.Join(e.Known, ", "))
}

// Unwrap makes errors.Is(err, ErrUnknownAgent) hold.
func (e *UnknownAgentError) Unwrap() error { return ErrUnknownAgent }

// AgentNames returns the names of the tenant's agents, sorted.
func (t *Tenant) AgentNames() []string {
	if len(t.Agents) == 0 {
		return []string{DefaultAgent}
	}
	names := make([]string, 0, len(t.Agents))
	for n := range t.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Agent returns the tenant's agent by name ("" is DefaultAgent), or false
// when it has none of that name. A Tenant without Agents answers for
// DefaultAgent with an Agent made of its own fields (implicit: true),
// whose Runs carry no pin.
func (t *Tenant) Agent(name string) (a *Agent, implicit, ok bool) {
	if name == "" {
		name = DefaultAgent
	}
	if len(t.Agents) == 0 {
		if name != DefaultAgent {
			return nil, false, false
		}
		return &Agent{
			Name: DefaultAgent, Builder: t.Builder, Model: t.Model, ModelBudget: t.ModelBudget, Tools: t.Tools,
			Limits: t.Limits, RunTimeout: t.RunTimeout, WaitTimeout: t.WaitTimeout, EffectTimeout: t.EffectTimeout,
			ModelPolicy: t.ModelPolicy, HistoryRuns: t.HistoryRuns,
		}, true, true
	}
	a, ok = t.Agents[name]
	return a, false, ok && a != nil
}

// Tool binds a tool's descriptor (what the model sees), its loop rules
// (approval, missing-effect policy) and the executor that carries it out.
// A Run pins the descriptor and the rules of each tool when it is created
// (spec); only the executor is looked up again, by name, at each call.
type Tool struct {
	Descriptor abi.Tool
	Spec       loop.ToolSpec
	Executor   Executor
}

// Tenants looks tenants up. It returns false for an unknown tenant.
type Tenants interface {
	Tenant(id string) (*Tenant, bool)
}

// TenantMap is a fixed set of tenants.
type TenantMap map[string]*Tenant

// Tenant implements Tenants.
func (m TenantMap) Tenant(id string) (*Tenant, bool) {
	t, ok := m[id]
	return t, ok
}

// agentOf returns the agent run runs as now: the agent of its pin's name,
// or DefaultAgent for a Run without a pin. It is nil when the tenant no
// longer has that agent: the callers then settle what needs one as
// executor_unavailable.
func (t *Tenant) agentOf(run *loop.Run) *Agent {
	name := DefaultAgent
	if run.Agent != nil {
		name = run.Agent.Name
	}
	a, _, ok := t.Agent(name)
	if !ok {
		return nil
	}
	return a
}

// executorFor returns the executor of an effect of run: its agent's model
// executor, or the executor of its agent's tool by that name today. It is
// nil when there is none, as for a tool a Run was created with that the
// agent no longer has (its tools changed while the Run was in flight), or
// for a Run whose agent is gone: the callers settle the attempt as
// executor_unavailable, naming the tool.
func (t *Tenant) executorFor(run *loop.Run, kind abi.EffectKind, tool string) Executor {
	a := t.agentOf(run)
	if a == nil {
		return nil
	}
	if kind == abi.KindModel {
		return a.Model
	}
	for _, tl := range a.Tools {
		if tl.Spec.Name == tool {
			return tl.Executor
		}
	}
	return nil
}

// spec builds the loop spec of a new Run of this tenant as its
// DefaultAgent (specAs).
func (t *Tenant) spec(session, runID, input string, metadata []byte) loop.Spec {
	a, implicit, ok := t.Agent(DefaultAgent)
	if !ok {
		a, implicit = &Agent{Name: DefaultAgent}, true
	}
	return t.specAs(a, implicit, session, runID, input, metadata)
}

// specAs builds the loop spec of a new Run of this tenant as agent a (from
// Agent): its limits, policies and tools, and, unless a is the implicit
// agent of a Tenant without Agents, its pin.
func (t *Tenant) specAs(a *Agent, implicit bool, session, runID, input string, metadata []byte) loop.Spec {
	lim := a.Limits
	if lim.MaxSteps == 0 {
		lim = loop.DefaultLimits
	}
	// A new Run's run_timeout counts its work time only, and its waits
	// for a person have a bound of their own (loop/wait.go); the absolute
	// DeadlineMS is what Runs created before got, and keep.
	lim.DeadlineMS = 0
	lim.RunTimeoutMS = max(a.RunTimeout.Milliseconds(), 0)
	lim.WaitTimeoutMS = max(a.WaitTimeout.Milliseconds(), 0)
	if a.EffectTimeout > 0 {
		lim.EffectTimeoutMS = a.EffectTimeout.Milliseconds()
	}
	mp := a.ModelPolicy
	if mp.Mode == "" {
		mp = loop.DefaultModelPolicy
	}
	s := loop.Spec{Tenant: t.ID, Session: session, ID: runID, Input: input, Metadata: metadata, Limits: lim, ModelPolicy: mp}
	if !implicit {
		s.Agent = &loop.AgentPin{Name: a.Name, Version: a.Version, Instructions: a.Instructions, Settings: a.Settings,
			OutputSchema: a.OutputSchema}
	}
	for _, tl := range a.Tools {
		ts := tl.Spec
		if len(ts.InputSchema) == 0 {
			// The Loop checks a call's arguments against the schema the
			// model was shown.
			ts.InputSchema = tl.Descriptor.InputSchema
		}
		// The builder shows the model the descriptor the Run was created
		// with (toolsOffered), never the tenant's current one: a tool
		// added or changed while the Run is in flight is not offered to
		// it, as the Loop would refuse its calls.
		d := tl.Descriptor
		d.Name = ts.Name
		ts.Descriptor = &d
		s.Tools = append(s.Tools, ts)
	}
	return s
}

// toolsOffered returns the tools the builder shows the model for a step of
// run: the Run's own tool set, each as its descriptor was when the Run was
// created. A Run created before descriptors were pinned (Descriptor nil)
// gets, for each tool of its own set, its agent's current descriptor of
// that name, or, when the agent no longer has it, one made of what the
// Run holds (name, input schema, approval); a tool the agent added since
// is never offered, since the Loop would refuse its calls.
func (t *Tenant) toolsOffered(run loop.Run) []abi.Tool {
	out := make([]abi.Tool, 0, len(run.Tools))
	var current []Tool
	if a := t.agentOf(&run); a != nil {
		current = a.Tools
	}
	for _, ts := range run.Tools {
		if ts.Descriptor != nil {
			out = append(out, *ts.Descriptor)
			continue
		}
		d, found := abi.Tool{}, false
		for _, tl := range current {
			if tl.Spec.Name == ts.Name {
				d, found = tl.Descriptor, true
				break
			}
		}
		if !found {
			d = abi.Tool{InputSchema: ts.InputSchema, Approval: abi.ApprovalNever}
			if ts.Approval {
				d.Approval = abi.ApprovalAlways
			}
		}
		d.Name = ts.Name
		out = append(out, d)
	}
	return out
}

package runtime

import (
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Tenant is what the runtime needs to run a tenant's Runs: its builder,
// its model executor, its tools and the rules its Runs follow. cmd wires
// it from the operator's config and the plugins' describe replies.
type Tenant struct {
	ID      string
	Builder Builder
	Model   Executor
	Tools   []Tool
	// Limits are the Run limits; Limits.DeadlineMS is ignored and derived
	// from RunTimeout.
	Limits loop.Limits
	// RunTimeout bounds a Run from its creation; 0 means no deadline.
	RunTimeout time.Duration
	// EffectTimeout bounds one executing attempt; 0 means none.
	EffectTimeout time.Duration
	ModelPolicy   loop.Policy
	// HistoryRuns is how many earlier Runs of the session the builder sees
	// (0 means DefaultHistoryRuns).
	HistoryRuns int
}

// DefaultHistoryRuns is the number of earlier Runs passed to a builder when
// a tenant sets none.
const DefaultHistoryRuns = 20

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

// executorFor returns the executor of an effect: the tenant's model
// executor, or the executor of its tool by that name today. It is nil when
// there is none, as for a tool a Run was created with that the tenant no
// longer has (its tools changed while the Run was in flight): the callers
// settle the attempt as executor_unavailable, naming the tool.
func (t *Tenant) executorFor(kind abi.EffectKind, tool string) Executor {
	if kind == abi.KindModel {
		return t.Model
	}
	for _, tl := range t.Tools {
		if tl.Spec.Name == tool {
			return tl.Executor
		}
	}
	return nil
}

// spec builds the loop spec of a new Run of this tenant.
func (t *Tenant) spec(session, runID, input string, metadata []byte, nowMS int64) loop.Spec {
	lim := t.Limits
	if lim.MaxSteps == 0 {
		lim = loop.DefaultLimits
	}
	lim.DeadlineMS = 0
	if t.RunTimeout > 0 {
		lim.DeadlineMS = nowMS + t.RunTimeout.Milliseconds()
	}
	if t.EffectTimeout > 0 {
		lim.EffectTimeoutMS = t.EffectTimeout.Milliseconds()
	}
	mp := t.ModelPolicy
	if mp.Mode == "" {
		mp = loop.DefaultModelPolicy
	}
	s := loop.Spec{Tenant: t.ID, Session: session, ID: runID, Input: input, Metadata: metadata, Limits: lim, ModelPolicy: mp}
	for _, tl := range t.Tools {
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
// gets, for each tool of its own set, the tenant's current descriptor of
// that name, or, when the tenant no longer has it, one made of what the
// Run holds (name, input schema, approval); a tool the tenant added since
// is never offered, since the Loop would refuse its calls.
func (t *Tenant) toolsOffered(run loop.Run) []abi.Tool {
	out := make([]abi.Tool, 0, len(run.Tools))
	for _, ts := range run.Tools {
		if ts.Descriptor != nil {
			out = append(out, *ts.Descriptor)
			continue
		}
		d, found := abi.Tool{}, false
		for _, tl := range t.Tools {
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

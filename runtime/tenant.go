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
		s.Tools = append(s.Tools, ts)
	}
	return s
}

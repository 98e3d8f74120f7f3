package runtime

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agenthost/agenthost/internal/budget"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// Model budgets: a model call waits for its endpoint's shared budget
// (Agent.ModelBudget) before it starts, in the Watcher, not in a
// goroutine, holding no call slot and no plugin instance, and with its
// call timeout not yet running (docs/DESIGN.md §5, "Model budgets").

// budgetRecheck is how long a call refused because the endpoint's calls
// in flight are at their maximum waits at most before it asks again; the
// end of a call in flight asks for the longest waiter at once
// (modelCallDone), so this only bounds a wait whose wake-up was lost.
const budgetRecheck = 30 * time.Second

// modelBudgetOf returns the budget of run's model endpoint, or nil.
func modelBudgetOf(t *Tenant, run *loop.Run) *budget.Budget {
	if a := t.agentOf(run); a != nil {
		return a.ModelBudget
	}
	return nil
}

// admitModelCall asks the budget of run's model endpoint, if it has one,
// for the start of a model call on an attempt the caller holds as being
// called, first closing the budget as long as another node's
// rate-limited answer closed the endpoint (readEndpointClosure).
// Admitted, it returns the budget (nil when there is none), which
// the caller gives back with modelCallDone once the executor answered.
// Refused, it gives the call's slot back and hands the attempt to the
// Watcher, to ask again at the time the budget expects to admit it, and
// reports false: the caller has nothing more to do.
func (rt *Runtime) admitModelCall(ctx context.Context, t *Tenant, run loop.Run, e loop.Effect, key string, slot *callSlot) (*budget.Budget, bool) {
	b := modelBudgetOf(t, &run)
	if b == nil {
		return nil, true
	}
	rt.readEndpointClosure(ctx, b)
	// The refusal and the Watcher's item are one step for the wake-ups
	// (wakeBudgetWaiter): a call in flight that ends between them would
	// find the waiter with no item to hasten, forget it, and leave it to
	// wait budgetRecheck for a place that is free.
	rt.budgetWaits.Lock()
	now := rt.clock.Now()
	ok, at := b.Admit(key, now)
	if ok {
		rt.budgetWaits.Unlock()
		return b, true
	}
	slot.free()
	if at.IsZero() {
		at = now.Add(budgetRecheck)
	}
	waits := rt.backToWatcher(key)
	if waits {
		waits = rt.watcher.Schedule(watcher.Item{
			Key: "budget/" + key, Kind: watcher.Budget, At: at,
			Tenant: run.Tenant, Session: run.Session, RunID: run.ID, EffectID: e.ID, Attempt: e.Attempt,
		})
		if !waits {
			rt.attempts.Forget(key)
		}
	}
	if !waits {
		b.Forget(key, now)
	}
	rt.budgetWaits.Unlock()
	if waits {
		rt.log.Debug("model call waits for its endpoint's budget", "endpoint", b.Endpoint, "tenant", run.Tenant, "run", run.ID, "assignment_key", key, "until", at)
		rt.notifyQuiescent(run)
	}
	return nil, false
}

// modelCallDone gives an admitted model call's share of budget b back,
// charging it the reply's tokens; a rate-limited reply that names a wait
// closes the endpoint to every Run until then, on this node and, through
// a Store that is an EndpointGate, on every node that shares it
// (shareEndpointClosure: written before the caller commits the reply).
// The call that has waited longest for a place is then asked for again at
// once.
func (rt *Runtime) modelCallDone(b *budget.Budget, reply abi.EffectReply, err error) {
	if b == nil {
		return
	}
	now := rt.clock.Now()
	var tokens int64
	if err == nil {
		switch reply.State {
		case abi.StateDone:
			var o struct {
				Usage abi.Usage `json:"usage"`
			}
			if json.Unmarshal(reply.Outcome, &o) == nil {
				tokens = max(o.Usage.InputTokens, 0) + max(o.Usage.OutputTokens, 0)
			}
		case abi.StateFailed:
			if re := reply.Error; re != nil && re.HostClass() == abi.ClassRateLimited && re.RetryAfterMS > 0 {
				wait := time.Duration(min(re.RetryAfterMS, loop.DefaultMaxRetryAfterMS)) * time.Millisecond
				until := now.Add(wait)
				b.CloseUntil(until)
				rt.shareEndpointClosure(b, wait)
				rt.log.Info("model endpoint rate-limited; its budget admits no call until then", "endpoint", b.Endpoint, "until", until)
			}
		}
	}
	b.Done(now, tokens)
	rt.wakeBudgetWaiter(b, now)
}

// shareEndpointClosure closes b's endpoint for wait on every node that
// shares a Store that is an EndpointGate, bounded by the commit timeout.
// A write that fails leaves the closure to this node, and the other nodes
// learn of the provider's limit from their own calls.
func (rt *Runtime) shareEndpointClosure(b *budget.Budget, wait time.Duration) {
	g, ok := rt.store.(EndpointGate)
	if !ok {
		return
	}
	ctx, cancel := rt.commitCtx()
	defer cancel()
	if err := g.CloseEndpoint(ctx, b.Endpoint, wait); err != nil && rt.life.Err() == nil {
		rt.log.Warn("closing the rate-limited model endpoint for the other nodes failed; it is closed on this node only", "endpoint", b.Endpoint, "wait", wait, "err", err)
	}
}

// readEndpointClosure closes b until the end of the closure that a
// Store that is an EndpointGate records for its endpoint, if any: another
// node's rate-limited answer closes the endpoint here too, from the
// moment that node wrote it. The time is read after the store answered,
// so the closure ends no earlier than the store's. A read that fails
// leaves b as it is: the call goes by what this node knows.
func (rt *Runtime) readEndpointClosure(ctx context.Context, b *budget.Budget) {
	g, ok := rt.store.(EndpointGate)
	if !ok {
		return
	}
	d, err := g.EndpointClosedFor(ctx, b.Endpoint)
	if err != nil {
		if rt.life.Err() == nil {
			rt.log.Warn("reading whether another node closed the model endpoint failed; the call goes by this node's budget", "endpoint", b.Endpoint, "err", err)
		}
		return
	}
	if d > 0 {
		b.CloseUntil(rt.clock.Now().Add(d))
	}
}

// wakeBudgetWaiter asks the Watcher to try the longest waiter for a place
// in b now, forgetting the waiters it no longer holds. A waiter whose
// refusal is not yet in the Watcher is not one of those: admitModelCall
// holds budgetWaits from the refusal to the item.
func (rt *Runtime) wakeBudgetWaiter(b *budget.Budget, now time.Time) {
	rt.budgetWaits.Lock()
	defer rt.budgetWaits.Unlock()
	for {
		k := b.LongestWaiter()
		if k == "" || rt.watcher.Hasten("budget/"+k, now) {
			return
		}
		b.Forget(k, now)
	}
}

// forgetBudgetWait drops the budget wait of an attempt of a Run of tenant
// that will not ask again (cancelled, or settled meanwhile): from every
// model budget the tenant's agents use.
func (rt *Runtime) forgetBudgetWait(tenant, key string) {
	t, ok := rt.opts.Tenants.Tenant(tenant)
	if !ok {
		return
	}
	now := rt.clock.Now()
	if t.ModelBudget != nil {
		t.ModelBudget.Forget(key, now)
	}
	for _, a := range t.Agents {
		if a != nil && a.ModelBudget != nil {
			a.ModelBudget.Forget(key, now)
		}
	}
}

// shareModelBudgets gives each model budget this node's share, from the
// live node count of a Store that is a NodeCounter; on the lease's
// cadence (Start, renewLease), holding no lock. A count that fails keeps
// the shares as they are.
func (rt *Runtime) shareModelBudgets(ctx context.Context) {
	nc, ok := rt.store.(NodeCounter)
	if !ok || len(rt.opts.ModelBudgets) == 0 {
		return
	}
	n, err := nc.LiveNodes(ctx)
	if err != nil {
		if rt.life.Err() == nil {
			rt.log.Warn("counting the live nodes for the model budgets failed; the shares stay as they were", "err", err)
		}
		return
	}
	for _, b := range rt.opts.ModelBudgets {
		before := b.Share()
		if b.SetNodes(n); b.Share() != before {
			rt.log.Info("model budget shared among the live nodes", "endpoint", b.Endpoint, "live_nodes", n, "share", b.Share())
		}
	}
}

// BudgetWait is a model call waiting in this process for its endpoint's
// budget.
type BudgetWait struct {
	// Endpoint names the endpoint: the model executor's plugin ID.
	Endpoint string
	// Since is when the call began to wait; Until when the budget expects
	// to admit it, or the zero time while it waits for a call in flight
	// to end.
	Since, Until time.Time
}

// BudgetWait reports whether the current attempt of run's effect
// effectID waits in this process for its model endpoint's budget. Only
// the node that drives the Run knows: another answers false.
func (rt *Runtime) BudgetWait(run loop.Run, effectID string) (BudgetWait, bool) {
	e := run.Effect(effectID)
	t, ok := rt.opts.Tenants.Tenant(run.Tenant)
	if e == nil || e.Kind != abi.KindModel || e.State != loop.EffectExecuting || !ok {
		return BudgetWait{}, false
	}
	b := modelBudgetOf(t, &run)
	if b == nil {
		return BudgetWait{}, false
	}
	w, ok := b.Waiting(assignment(run, e.ID, e.Attempt))
	return BudgetWait{Endpoint: b.Endpoint, Since: w.Since, Until: w.Until}, ok
}

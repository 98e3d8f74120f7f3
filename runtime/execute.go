package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Request submits a Run.
type Request struct {
	Tenant  string
	Session string
	// RunID is optional: a fresh one is made when empty.
	RunID    string
	Input    string
	Metadata json.RawMessage
	// IdempotencyKey, when set, makes the submission idempotent within the
	// tenant: a second submission with the same key returns the first Run.
	IdempotencyKey string
	// Agent is the agent of the tenant the Run runs as ("" is
	// DefaultAgent). A name the tenant has no agent of is refused with an
	// *UnknownAgentError (ErrUnknownAgent).
	Agent string
}

// ResultKind is how Execute came back.
type ResultKind string

// Execute's three results.
const (
	// ResultTerminal: the Run completed, failed or was cancelled.
	ResultTerminal ResultKind = "terminal"
	// ResultWaiting: a quiescent wait; the Run goes on by itself when what
	// it waits for arrives (see Waiting).
	ResultWaiting ResultKind = "waiting"
	// ResultBoundary: this runtime stopped driving the Run's session (its
	// ownership was lost, or the runtime is stopping); Err says why.
	ResultBoundary ResultKind = "boundary"
)

// Result is what Execute returns.
type Result struct {
	Kind    ResultKind
	Run     loop.Run
	Waiting *Waiting
	Err     error
}

// Waiting says what a quiescent Run waits for.
type Waiting struct {
	// Approvals lists the tool call IDs that wait for a person.
	Approvals []string
	// Input is set when the model asked the user a question.
	Input *abi.AwaitInput
	// Pending lists the effects an executor is still working on.
	Pending []string
	// WakeAtMS is the earliest timer of the Run (Unix ms), or 0.
	WakeAtMS int64
	// Queued is true while an earlier Run of the session is unfinished.
	Queued bool
}

// WaitingFor describes what a non-terminal Run waits for, from its
// snapshot alone.
func WaitingFor(run loop.Run) *Waiting {
	w := &Waiting{Queued: run.Status == loop.StatusPending && run.Verdict == nil}
	for _, a := range loop.Decide(run) {
		switch a.Type {
		case loop.ActionAwaitApproval:
			w.Approvals = append(w.Approvals, a.ToolCallIDs...)
		case loop.ActionAwaitInput:
			w.Input = &abi.AwaitInput{Prompt: a.Prompt}
		case loop.ActionWakeAt:
			if w.WakeAtMS == 0 || a.At < w.WakeAtMS {
				w.WakeAtMS = a.At
			}
		}
	}
	for _, e := range run.Executing() {
		w.Pending = append(w.Pending, e.ID)
	}
	return w
}

// Submit creates a Run and hands it to its session's driver; it does not
// wait. The returned bool is true when IdempotencyKey matched an earlier
// submission (the Run returned is that one).
func (rt *Runtime) Submit(ctx context.Context, req Request) (loop.Run, bool, error) {
	t, ok := rt.opts.Tenants.Tenant(req.Tenant)
	if !ok {
		return loop.Run{}, false, fmt.Errorf("runtime: unknown tenant %q", req.Tenant)
	}
	if req.RunID == "" {
		req.RunID = NewRunID(rt.clock.Now())
	}
	if err := checkIDs("tenant", req.Tenant, "session", req.Session, "run", req.RunID); err != nil {
		return loop.Run{}, false, err
	}
	agent, implicit, ok := t.Agent(req.Agent)
	if !ok {
		return loop.Run{}, false, &UnknownAgentError{Tenant: req.Tenant, Agent: req.Agent, Known: t.AgentNames()}
	}
	return rt.submit(ctx, t, agent, implicit, req, nil)
}

// submit creates a Run of tenant t as agent, the child of parent when that
// is set, and hands it to its session's driver (Submit).
func (rt *Runtime) submit(ctx context.Context, t *Tenant, agent *Agent, implicit bool, req Request, parent *loop.ParentRef) (loop.Run, bool, error) {
	// A submission is work Stop waits for: a claim the creation makes is
	// in the session table before Stop releases what the table holds.
	rt.mu.Lock()
	stopped, expired := rt.stopped, rt.expired
	if !stopped {
		rt.wg.Add(1)
	}
	rt.mu.Unlock()
	if stopped {
		return loop.Run{}, false, fmt.Errorf("runtime: submit: %w", ErrClosed)
	}
	defer rt.wg.Done()
	// The creation claims the session for this node when no one owns it
	// (Store.CreateRun), which spares the session's driver a claim of
	// its own; a node whose lease ran out claims nothing.
	claimant := rt.nodeID
	if expired {
		claimant = ""
	}
	now := rt.nowMS()
	spec := t.specAs(agent, implicit, req.Session, req.RunID, req.Input, req.Metadata)
	spec.Parent = parent
	ctx, span := startSubmitSpan(ctx, &spec)
	spec.TraceParent = FormatTraceParent(span.SpanContext())
	ev := loop.RunCreated(spec, now)
	ev.Seq = 1
	run, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		EndSpan(span, err)
		return loop.Run{}, false, err
	}
	// The creation is committed and reported under the Run's advance lock,
	// as every later commit is: no driver (nor the recovery pass, which may
	// find the Run the moment it is stored) can start it and report that
	// before its creation is reported.
	unlock := rt.lockRun(runKey(req.Tenant, req.RunID))
	cr := CreateRun{Run: run, Event: ev, CommandID: req.IdempotencyKey, Claimant: claimant}
	step := rt.firstStep(ctx, t, &cr)
	res, err := rt.store.CreateRun(ctx, cr)
	if step != nil && (err != nil || !res.Stepped) {
		rt.unreserveDispatches(cr.FirstStep.Run, step.fx)
		if err == nil {
			// The Run is not its session's first (or the session has an
			// owner): the next Run submitted in it makes no step ahead.
			rt.stats.FirstStepsNotWritten.Add(1)
			rt.sessions.markExisting(req.Tenant, req.Session)
		}
	}
	if err == nil && !res.Duplicate {
		rt.opts.Observer.RunStatus(req.Tenant, "", run.Status)
		if res.Epoch > 0 {
			// A stepped Run is under way: the driver's first pass, if the
			// session gets one, reads the session's active Runs.
			rt.sessions.setCreatedClaim(req.Tenant, req.Session, res.Epoch, res.Ordinal == 1 && !res.Stepped, res.Run.ID)
			rt.ownerCreated(req.Tenant, req.Session, res.Run, res.Epoch, res.Ordinal)
		}
		if res.Stepped {
			rt.stepped(t, run, res.Run, res.Epoch, step)
		}
	}
	unlock()
	EndSpan(span, err)
	if err != nil {
		if !errors.Is(err, ErrRunExists) {
			// The store may have written the Run and lost the reply: the
			// session is driven all the same, so such a Run does not wait
			// for the watchdog (a client that retries with its
			// IdempotencyKey gets it back), and what a first step written
			// with it dispatched is performed (perform adopts it).
			rt.kick(req.Tenant, req.Session)
		}
		return loop.Run{}, false, err
	}
	if !res.Stepped {
		rt.kick(req.Tenant, req.Session)
	}
	return res.Run, res.Duplicate, nil
}

// firstStepPlan is what a Run's first step, made ahead of its creation
// (firstStep), obliges once the creation wrote it.
type firstStepPlan struct {
	events []loop.Event
	fx     sideEffects
}

// firstStep makes, ahead of a Run's creation, the commit its session's
// driver would make first (start, plan the first model step with the
// builder, dispatch the model call), and puts it in c.FirstStep, with its
// dispatches reserved, when the Run looks like the first of a session
// new to this node: the creation then writes it too, in one transaction,
// if the Run is its session's first and the creation claims the session
// at the step's epoch (Store.CreateRun), which saves the Run a commit.
// Otherwise the creation writes the Run alone, and the driver makes that
// commit as it would have; the builder call made here is then wasted,
// which is harmless (docs/ABI.md: build must not have side effects that
// matter). It returns nil, and leaves c alone, when it makes no step: a
// store that never writes one (FirstStepper), no claimant, a session this
// node holds or knows the store holds Runs of (sessionTable.known: one
// where a step was not written before, say, because another node owns
// it), a halted runtime, or a first commit that would not leave the Run
// live with a call to make.
func (rt *Runtime) firstStep(ctx context.Context, t *Tenant, c *CreateRun) *firstStepPlan {
	run := c.Run
	if !rt.stepsFirst || c.Claimant == "" || rt.halted.Load() || rt.sessions.known(run.Tenant, run.Session) {
		return nil
	}
	// The claim a creation takes on a session new to the store: its first.
	const epoch = 1
	batch, next, fx, err := rt.foldActions(ctx, t, run, createdHead(run, epoch), epoch)
	if err != nil || len(batch) == 0 || next.Status.Terminal() || len(fx.dispatched) == 0 || len(fx.cancels) > 0 || len(fx.wakes) > 0 {
		return nil
	}
	if rt.reserveDispatches(next, fx) != nil {
		return nil
	}
	c.FirstStep = &FirstStep{Events: batch, Run: next, Epoch: epoch}
	return &firstStepPlan{events: batch, fx: fx}
}

// stepped follows a creation that wrote the Run's first step (firstStep),
// as advance follows a commit: the Run is reported as it moved from its
// creation, and what the step dispatched is performed. The session's
// driver is not kicked: the Run is under way, and its next commits drive
// the session on.
func (rt *Runtime) stepped(t *Tenant, created, next loop.Run, epoch uint64, step *firstStepPlan) {
	rt.stats.FirstSteps.Add(1)
	rt.observeCommit(created, next, step.events)
	rt.committed(next)
	rt.hub.Publish(Notice{Tenant: next.Tenant, RunID: next.ID, Seq: next.Seq})
	rt.perform(t, next, epoch, step.fx, nil)
}

// Execute submits a Run and drives it until it is terminal, in a quiescent
// wait, or at an ownership boundary, and says which. Cancelling ctx stops
// the waiting, not the Run: accepted effects are still settled, and the Run
// goes on in the background.
func (rt *Runtime) Execute(ctx context.Context, req Request) (Result, error) {
	if req.RunID == "" {
		req.RunID = NewRunID(rt.clock.Now())
	}
	w := rt.addWaiter(req.Tenant, req.Session, req.RunID)
	run, duplicate, err := rt.Submit(ctx, req)
	if err != nil {
		rt.removeWaiter(req.Tenant, req.RunID, w)
		return Result{}, err
	}
	if duplicate {
		// An idempotent resubmission answered with the first Run, which
		// may have ended long ago: no advance will notify the waiter, so
		// Wait reads where it stands.
		rt.removeWaiter(req.Tenant, req.RunID, w)
		return rt.Wait(ctx, req.Tenant, run.ID)
	}
	return rt.await(ctx, req.Tenant, run.ID, w)
}

// Wait waits until the Run is terminal, quiescent, or at a boundary.
func (rt *Runtime) Wait(ctx context.Context, tenant, runID string) (Result, error) {
	run, err := rt.store.LoadRun(ctx, tenant, runID)
	if err != nil {
		return Result{}, err
	}
	w := rt.addWaiter(tenant, run.Session, runID)
	if run, err = rt.store.LoadRun(ctx, tenant, runID); err != nil {
		rt.removeWaiter(tenant, runID, w)
		return Result{}, err
	}
	if run.Status.Terminal() {
		rt.removeWaiter(tenant, runID, w)
		// The advance that ended the Run may still be reporting it to the
		// Observer; it holds the Run's lock until it is done.
		rt.lockRun(runKey(tenant, runID))()
		return Result{Kind: ResultTerminal, Run: run}, nil
	}
	// A driver pass always ends with a notification, so kicking the session
	// guarantees one even if the Run is quiescent already.
	rt.kick(tenant, run.Session)
	return rt.await(ctx, tenant, runID, w)
}

func (rt *Runtime) await(ctx context.Context, tenant, runID string, w chan Result) (Result, error) {
	select {
	case r := <-w:
		return r, nil
	case <-ctx.Done():
		rt.removeWaiter(tenant, runID, w)
		return Result{}, ctx.Err()
	}
}

// An InputOption qualifies an input to a Run: Cancel, Approve or
// ProvideInput.
type InputOption func(*inputOptions)

type inputOptions struct {
	ifSeq    int64
	checkSeq bool
}

// IfSeq applies the input only while the Run's log ends at seq, the
// version the caller read (loop.Run.Seq; the API's "seq" and ETag).
// Otherwise nothing is written and the error wraps ErrRunChanged. An
// answer made this way cannot land on a question the caller never saw,
// however often it is retried.
func IfSeq(seq int64) InputOption {
	return func(o *inputOptions) { o.ifSeq, o.checkSeq = seq, true }
}

// Cancel asks for a Run to be cancelled. The effects in flight receive
// cancel; the Run ends cancelled when none is left.
func (rt *Runtime) Cancel(ctx context.Context, tenant, runID, reason string, opts ...InputOption) (loop.Run, error) {
	return rt.input(ctx, tenant, runID, loop.Event{Type: loop.EventCancelRequested, Reason: reason}, "cancel", opts)
}

// Approve records approvals and denials of gated tool calls, addressed by
// tool call ID.
func (rt *Runtime) Approve(ctx context.Context, tenant, runID string, approvals []abi.ApprovalDecision, opts ...InputOption) (loop.Run, error) {
	return rt.input(ctx, tenant, runID, loop.Event{Type: loop.EventApprovalRecorded, Approvals: approvals}, "approve", opts)
}

// ProvideInput answers a Run that waits for the user's input.
func (rt *Runtime) ProvideInput(ctx context.Context, tenant, runID, text string, opts ...InputOption) (loop.Run, error) {
	return rt.input(ctx, tenant, runID, loop.Event{Type: loop.EventInputProvided, Input: text}, "input", opts)
}

// input applies an event from outside (a person, an API client) to a Run.
// The Loop's refusals (ErrNotAwaiting, ErrUnknownToolCall, ErrTerminal …)
// come back unchanged and nothing is written; so does ErrRunChanged, for
// an input made with IfSeq.
func (rt *Runtime) input(ctx context.Context, tenant, runID string, ev loop.Event, what string, opts []InputOption) (loop.Run, error) {
	var o inputOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return loop.Run{}, err
	}
	if _, ok := rt.opts.Tenants.Tenant(tenant); !ok {
		return loop.Run{}, fmt.Errorf("runtime: unknown tenant %q", tenant)
	}
	run, err := rt.store.LoadRun(ctx, tenant, runID)
	if err != nil {
		return loop.Run{}, err
	}
	if err := o.check(run, what); err != nil {
		return run, err
	}
	if run.Status.Terminal() {
		return run, fmt.Errorf("%w: run %s is %s; %s refused", loop.ErrTerminal, runID, run.Status, what)
	}
	cur, err := rt.advance(ctx, outsideInput(run, ev, what, o))
	// On a store error the commit may be written all the same (a lost
	// reply): advance has then driven the session (afterUncertainCommit).
	// The caller, told of the failure, may send the input again (with
	// IfSeq, safely).
	if err != nil {
		return cur, err
	}
	rt.kick(tenant, run.Session)
	return cur, nil
}

// check returns ErrRunChanged if the input names a seq the Run is past.
func (o inputOptions) check(run loop.Run, what string) error {
	if o.checkSeq && run.Seq != o.ifSeq {
		return fmt.Errorf("%w: run %s is at seq %d, not %d; %s refused", ErrRunChanged, run.ID, run.Seq, o.ifSeq, what)
	}
	return nil
}

// LoadRun returns a Run's snapshot.
func (rt *Runtime) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	return rt.store.LoadRun(ctx, tenant, runID)
}

// InFlight returns the number of effect attempts of a tenant this runtime
// is calling, polling or waiting to attach again: the effects in flight,
// for quotas.
func (rt *Runtime) InFlight(tenant string) int {
	return rt.attempts.InFlight(tenant + "/")
}

package loop

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Apply folds one event into a Run snapshot and returns the new snapshot.
// It never mutates run and never panics. An illegal event returns run
// unchanged and an error wrapping one of the sentinels of errors.go.
//
// The zero Run accepts only RunCreated.
func Apply(run Run, ev Event) (Run, error) {
	if ev.Type == EventRunCreated {
		return applyCreated(run, ev)
	}
	if run.Seq == 0 {
		return run, fmt.Errorf("%w: %s before run_created", ErrInvalidEvent, ev.Type)
	}
	if run.Status.Terminal() {
		return run, fmt.Errorf("%w: run %s is %s; %s refused", ErrTerminal, run.ID, run.Status, ev.Type)
	}
	r := run.Clone()
	var err error
	switch ev.Type {
	case EventRunStarted:
		err = r.applyStarted()
	case EventModelStepPlanned:
		err = r.applyPlanned(ev)
	case EventEffectDispatched:
		err = r.applyDispatched(ev)
	case EventEffectPending:
		err = r.applyPending(ev)
	case EventEffectDeferred:
		err = r.applyDeferred(ev)
	case EventEffectSettled:
		err = r.applySettled(ev)
	case EventApprovalRecorded:
		err = r.applyApprovals(ev)
	case EventInputProvided:
		err = r.applyInput(ev)
	case EventCancelRequested:
		err = r.applyCancel(ev)
	case EventTimerFired:
		err = r.applyTimer(ev)
	case EventStepFailed:
		err = r.applyStepFailed(ev)
	case EventRunCompleted, EventRunFailed, EventRunCancelled:
		err = r.applyFinish(ev)
	default:
		err = fmt.Errorf("%w: unknown event type %q", ErrInvalidEvent, ev.Type)
	}
	if err != nil {
		return run, err
	}
	if ev.Type != EventTimerFired && !r.Status.Terminal() {
		// The deadline holds whatever event brings the news that it passed.
		r.checkDeadline(ev.At, &run)
	}
	r.Seq++
	if ev.At > r.UpdatedAt {
		r.UpdatedAt = ev.At
	}
	r.refreshStatus()
	// The wait clock compares the status before the event with the one
	// after it, whatever the event's handler set in between.
	r.accountWait(run.Status, ev.At)
	return r, nil
}

// checkDeadline ends the Run as deadline_exceeded once now is past one of
// its time limits (wait.go), and reports whether it did. before is the Run
// as it was before the event that brings now.
func (r *Run) checkDeadline(now int64, before *Run) bool {
	if r.Verdict != nil {
		return false
	}
	f := r.timeLimitPassed(now, before)
	if f == nil {
		return false
	}
	r.beginEnd(Verdict{Status: StatusFailed, Failure: f})
	return true
}

func applyCreated(run Run, ev Event) (Run, error) {
	if run.Seq != 0 {
		return run, fmt.Errorf("%w: run %s exists", ErrInvalidEvent, run.ID)
	}
	if ev.Spec == nil {
		return run, fmt.Errorf("%w: run_created without a spec", ErrInvalidEvent)
	}
	s := *ev.Spec
	for _, c := range [][2]string{{"tenant", s.Tenant}, {"session", s.Session}, {"run", s.ID}} {
		if err := CheckID(c[0], c[1]); err != nil {
			return run, err
		}
	}
	if s.Limits.MaxSteps < 1 || s.Limits.MaxToolCallsPerStep < 0 || s.Limits.MaxParallelToolCalls < 1 {
		return run, fmt.Errorf("%w: limits need max_steps >= 1 and max_parallel_tool_calls >= 1 (got %+v)", ErrInvalidEvent, s.Limits)
	}
	if err := s.ModelPolicy.check(); err != nil {
		return run, fmt.Errorf("%w: model policy: %v", ErrInvalidEvent, err)
	}
	seen := map[string]bool{}
	for _, t := range s.Tools {
		if t.Name == "" || seen[t.Name] {
			return run, fmt.Errorf("%w: tool names must be unique and non-empty (%q)", ErrInvalidEvent, t.Name)
		}
		seen[t.Name] = true
		if t.Descriptor != nil && t.Descriptor.Name != t.Name {
			// The builder offers the descriptor's name and the Loop
			// accepts calls by the spec's: they must be the same tool.
			return run, fmt.Errorf("%w: tool %s: its descriptor names %q", ErrInvalidEvent, t.Name, t.Descriptor.Name)
		}
		if err := t.Policy.check(); err != nil {
			return run, fmt.Errorf("%w: tool %s policy: %v", ErrInvalidEvent, t.Name, err)
		}
	}
	s.Tools = append([]ToolSpec(nil), s.Tools...)
	if s.Agent != nil {
		if err := CheckID("agent", s.Agent.Name); err != nil {
			return run, err
		}
		a := *s.Agent
		s.Agent = &a
	}
	if p := s.Parent; p != nil {
		if err := CheckID("parent run", p.Run); err != nil {
			return run, err
		}
		if err := CheckID("parent session", p.Session); err != nil {
			return run, err
		}
		if p.Depth < 1 || p.Attempt < 1 || p.Effect == "" {
			return run, fmt.Errorf("%w: a child run's parent needs an effect, attempt >= 1 and depth >= 1 (got %+v)", ErrInvalidEvent, *p)
		}
		pc := *p
		s.Parent = &pc
	}
	for _, t := range s.Tools {
		if t.Agent != "" {
			if err := CheckID("agent tool's agent", t.Agent); err != nil {
				return run, err
			}
		}
	}
	r := Run{
		Spec:       s,
		Status:     StatusPending,
		Seq:        1,
		CreatedAt:  ev.At,
		UpdatedAt:  ev.At,
		Transcript: []abi.Message{{Role: abi.MessageUser, Content: s.Input}},
	}
	return r, nil
}

func (r *Run) applyStarted() error {
	if r.Status != StatusPending {
		return fmt.Errorf("%w: run_started on a %s run", ErrInvalidEvent, r.Status)
	}
	if r.Verdict != nil {
		return fmt.Errorf("%w: run_started on a run that is ending (%s)", ErrInvalidEvent, r.Verdict.Status)
	}
	r.Status = StatusRunning
	return nil
}

func (r *Run) applyPlanned(ev Event) error {
	if !r.needsModelStep() {
		return fmt.Errorf("%w: model_step_planned while the run does not need a model step", ErrInvalidEvent)
	}
	if ev.Step != r.Step+1 {
		return fmt.Errorf("%w: model_step_planned for step %d, want %d", ErrInvalidEvent, ev.Step, r.Step+1)
	}
	if ev.Step > r.Limits.MaxSteps {
		return fmt.Errorf("%w: step %d is past max_steps %d", ErrLimit, ev.Step, r.Limits.MaxSteps)
	}
	if len(ev.Request) == 0 {
		return fmt.Errorf("%w: model_step_planned without a request", ErrInvalidEvent)
	}
	r.Step = ev.Step
	r.Effects = []Effect{{
		ID:         ModelEffectID(r.ID, r.Step),
		Kind:       abi.KindModel,
		Step:       r.Step,
		RequestSeq: r.Seq + 1,
		State:      EffectReady,
	}}
	return nil
}

// findEffect resolves the effect an Effect* event names, with the errors
// that tell a stale or repeated outcome apart from a bad one.
func (r *Run) findEffect(ev Event) (*Effect, error) {
	ref, err := ParseEffectID(ev.EffectID)
	if err != nil {
		return nil, err
	}
	if ref.Run != r.ID {
		return nil, fmt.Errorf("%w: %s is not an effect of run %s", ErrUnknownEffect, ev.EffectID, r.ID)
	}
	e := r.Effect(ev.EffectID)
	if e == nil {
		if ref.Step < r.Step || (ref.Step == r.Step && len(r.Effects) == 0) {
			// Every effect of a closed step was settled before the step closed.
			return nil, fmt.Errorf("%w: %s#%d (its step %d is closed)", ErrAlreadySettled, ev.EffectID, ev.Attempt, ref.Step)
		}
		return nil, fmt.Errorf("%w: %s", ErrUnknownEffect, ev.EffectID)
	}
	return e, nil
}

func (r *Run) applyDispatched(ev Event) error {
	if r.Verdict != nil {
		return fmt.Errorf("%w: dispatch while the run is ending (%s)", ErrInvalidEvent, r.Verdict.Status)
	}
	if r.Status == StatusPending {
		return fmt.Errorf("%w: dispatch before run_started", ErrInvalidEvent)
	}
	e, err := r.findEffect(ev)
	if err != nil {
		return err
	}
	if e.State != EffectReady {
		return fmt.Errorf("%w: dispatch of %s in state %s", ErrInvalidEvent, e.ID, e.State)
	}
	if ev.Attempt != e.Attempt+1 {
		return fmt.Errorf("%w: dispatch of %s#%d, want attempt %d", ErrStaleAttempt, e.ID, ev.Attempt, e.Attempt+1)
	}
	if e.Kind == abi.KindTool && r.countState(abi.KindTool, EffectExecuting) >= r.Limits.MaxParallelToolCalls {
		return fmt.Errorf("%w: dispatch of %s would exceed max_parallel_tool_calls %d", ErrLimit, e.ID, r.Limits.MaxParallelToolCalls)
	}
	if e.Kind == abi.KindTool {
		if spec, _ := r.ToolSpec(e.Tool); spec.Agent != "" {
			r.Children = append(r.Children, ChildRef{Run: ChildRunID(e.ID, ev.Attempt), Agent: spec.Agent,
				Effect: e.ID, Attempt: ev.Attempt, ToolCallID: e.ToolCallID})
		}
	}
	e.State = EffectExecuting
	e.Attempt = ev.Attempt
	e.Epoch = ev.Epoch
	e.Handle = ""
	e.DispatchedAt = ev.At
	e.NotBefore = 0
	e.DeferredSince = 0 // a deferral is the attempt's: the new one has none yet
	e.Plugin = ev.Plugin
	return nil
}

// currentAttempt checks that ev names the executing attempt of an effect.
func (r *Run) currentAttempt(ev Event) (*Effect, error) {
	e, err := r.findEffect(ev)
	if err != nil {
		return nil, err
	}
	switch {
	case ev.Attempt < 1 || ev.Attempt > e.Attempt:
		return nil, fmt.Errorf("%w: %s#%d was never dispatched (current attempt %d)", ErrStaleAttempt, e.ID, ev.Attempt, e.Attempt)
	case ev.Attempt < e.Attempt:
		return nil, fmt.Errorf("%w: %s#%d (current attempt %d)", ErrStaleAttempt, e.ID, ev.Attempt, e.Attempt)
	case e.State == EffectSettled, e.State == EffectBackoff:
		return nil, fmt.Errorf("%w: %s#%d", ErrAlreadySettled, e.ID, ev.Attempt)
	case e.State != EffectExecuting:
		return nil, fmt.Errorf("%w: %s#%d is %s, not executing", ErrStaleAttempt, e.ID, ev.Attempt, e.State)
	}
	return e, nil
}

func (r *Run) applyPending(ev Event) error {
	e, err := r.currentAttempt(ev)
	if err != nil {
		return err
	}
	if e.Handle == ev.Handle && (ev.Plugin == nil || reflect.DeepEqual(ev.Plugin, e.Plugin)) {
		return fmt.Errorf("%w: %s#%d already pending with that handle", ErrNoChange, e.ID, ev.Attempt)
	}
	e.Handle = ev.Handle
	if ev.Plugin != nil {
		e.Plugin = ev.Plugin // another version took the attempt over
	}
	e.DeferredSince = 0 // attached: a deferral, if any, is over
	return nil
}

func (r *Run) applyDeferred(ev Event) error {
	e, err := r.currentAttempt(ev)
	if err != nil {
		return err
	}
	if e.DeferredSince != 0 {
		return fmt.Errorf("%w: %s#%d deferred since %d already", ErrNoChange, e.ID, ev.Attempt, e.DeferredSince)
	}
	e.DeferredSince = ev.At
	return nil
}

func (r *Run) applySettled(ev Event) error {
	e, err := r.currentAttempt(ev)
	if err != nil {
		return err
	}
	if err := checkOutcome(e, ev.Outcome); err != nil {
		return err
	}
	r.settle(e, *ev.Outcome, ev.At)
	return nil
}

func checkOutcome(e *Effect, o *Outcome) error {
	if o == nil {
		return fmt.Errorf("%w: settlement of %s without an outcome", ErrInvalidEvent, e.ID)
	}
	switch o.State {
	case OutcomeDone:
		if e.Kind == abi.KindModel && o.Model == nil {
			return fmt.Errorf("%w: done settlement of model effect %s without a model outcome", ErrInvalidEvent, e.ID)
		}
		if e.Kind == abi.KindTool && o.Tool == nil {
			return fmt.Errorf("%w: done settlement of tool effect %s without a tool outcome", ErrInvalidEvent, e.ID)
		}
	case OutcomeFailed:
		if o.Error == nil || !o.Error.Class.Valid() {
			return fmt.Errorf("%w: failed settlement of %s needs an error with a known class", ErrInvalidEvent, e.ID)
		}
		if o.Error.RetryAfterMS < 0 {
			return fmt.Errorf("%w: failed settlement of %s has a negative retry_after_ms %d", ErrInvalidEvent, e.ID, o.Error.RetryAfterMS)
		}
	case OutcomeCancelled:
	default:
		return fmt.Errorf("%w: settlement of %s with state %q", ErrInvalidEvent, e.ID, o.State)
	}
	return nil
}

// settle records the outcome of e's current attempt and what follows from
// it: the policy for a retriable failure, the next phase of the Run for a
// final one.
func (r *Run) settle(e *Effect, o Outcome, at int64) {
	e.Handle = ""
	o = r.childUsage(e, o)
	if r.Verdict != nil {
		// The Run is ending: record whatever came back and add nothing.
		if o.State == OutcomeDone && o.Model != nil {
			r.Usage = r.Usage.Add(o.Model.Usage)
		}
		r.closeEffect(e, o)
		return
	}
	switch o.State {
	case OutcomeDone:
		if e.Kind == abi.KindModel {
			r.closeEffect(e, o)
			r.modelDone(e, *o.Model)
			return
		}
		r.closeEffect(e, o)
	case OutcomeCancelled:
		// An effect cancelled while the Run goes on (by its executor) is a
		// final failure of class cancelled.
		r.fail(e, o, &Failure{Class: abi.ClassCancelled, Message: "the executor cancelled the effect"})
		return
	case OutcomeFailed:
		f := o.Error
		if f.Retriable {
			p := r.policyOf(e)
			e.Failures++
			if f.RateLimited() {
				e.RateLimited++
			}
			switch {
			case retryAllowed(p, e, f):
				e.State = EffectBackoff
				e.NotBefore = at + RetryWait(p, e.ID, e.Attempt, f)
				e.Outcome = &o
				return
			case p.Mode == PolicyFailRun:
				r.closeEffect(e, o)
				r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: f.Class,
					Message: fmt.Sprintf("%s %s failed (%s) and its policy is fail_run: %s", e.Kind, e.label(), f.Class, f.Message)}})
				return
			}
		}
		r.fail(e, o, f)
		return
	}
	r.maybeCloseStep()
}

// childUsage adds the usage of an agent tool's outcome (its child Run's)
// to the Run's, and returns o without the usage a plugin tool's outcome
// claims, which counts for nothing.
func (r *Run) childUsage(e *Effect, o Outcome) Outcome {
	if o.Tool == nil || o.Tool.Usage == nil {
		return o
	}
	if spec, _ := r.ToolSpec(e.Tool); spec.Agent != "" && e.Kind == abi.KindTool {
		r.Usage = r.Usage.Add(*o.Tool.Usage)
		r.ChildrenUsage = r.ChildrenUsage.Add(*o.Tool.Usage)
		return o
	}
	t := *o.Tool
	t.Usage = nil
	o.Tool = &t
	return o
}

// fail settles e as finally failed: a tool error the model sees, or, for a
// model step, the end of the Run.
func (r *Run) fail(e *Effect, o Outcome, f *Failure) {
	o.State = OutcomeFailed
	o.Error = f
	r.closeEffect(e, o)
	if e.Kind == abi.KindModel {
		msg := fmt.Sprintf("model step %d failed after %d attempt(s) (%s): %s", e.Step, e.Attempt, f.Class, f.Message)
		r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: f.Class, Message: msg}})
		return
	}
	r.maybeCloseStep()
}

func (r *Run) closeEffect(e *Effect, o Outcome) {
	e.State = EffectSettled
	e.NotBefore = 0
	e.Outcome = &o
}

func (e *Effect) label() string {
	if e.Kind == abi.KindTool {
		return fmt.Sprintf("%s (tool %s, call %s)", e.ID, e.Tool, e.ToolCallID)
	}
	return e.ID
}

func (r *Run) policyOf(e *Effect) Policy {
	if e.Kind == abi.KindModel {
		return r.ModelPolicy
	}
	t, _ := r.ToolSpec(e.Tool)
	return t.Policy
}

// modelDone acts on a model step's answer: tool calls, a question for the
// user, or the final answer (checked against the Run's output schema, if
// its agent has one: output.go).
func (r *Run) modelDone(e *Effect, m abi.ModelOutcome) {
	r.Usage = r.Usage.Add(m.Usage)
	msg := m.Message
	msg.Role = abi.MessageAssistant
	msg.ToolCallID = ""
	msg.IsError = false
	if n := len(msg.ToolCalls); n > 0 {
		msg.ToolCalls = append([]abi.ToolCall(nil), msg.ToolCalls...)
		for i := range msg.ToolCalls {
			if msg.ToolCalls[i].ID == "" {
				msg.ToolCalls[i].ID = ToolEffectID(r.ID, e.Step, i)
			}
		}
	}
	r.Transcript = append(r.Transcript, msg)
	if m.AwaitInput != nil {
		a := *m.AwaitInput
		r.Awaiting = &a
	}
	if n := len(msg.ToolCalls); n > 0 {
		if n > r.Limits.MaxToolCallsPerStep {
			r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: abi.ClassLimitExceeded,
				Message: fmt.Sprintf("model step %d asked for %d tool calls; max_tool_calls_per_step is %d", e.Step, n, r.Limits.MaxToolCallsPerStep)}})
			return
		}
		for i, c := range msg.ToolCalls {
			te := Effect{ID: ToolEffectID(r.ID, e.Step, i), Kind: abi.KindTool, Step: e.Step, Index: i,
				ToolCallID: c.ID, Tool: c.Name, Arguments: c.Arguments, State: EffectReady}
			spec, ok := r.ToolSpec(c.Name)
			var invalid *Failure
			if ok {
				invalid = checkArguments(spec, c.Arguments)
			}
			switch {
			case !ok:
				te.State = EffectSettled
				te.Outcome = &Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassPluginDenied,
					Message: fmt.Sprintf("unknown tool %q: this run offers %s", c.Name, r.toolNames())}}
			case invalid != nil:
				te.State = EffectSettled
				te.Outcome = &Outcome{State: OutcomeFailed, Error: invalid}
			case spec.Approval:
				te.State = EffectAwaitingApproval
			}
			r.Effects = append(r.Effects, te)
		}
		r.maybeCloseStep()
		return
	}
	if r.Awaiting != nil {
		r.Effects = nil
		return
	}
	r.finalAnswer(e.Step, msg.Content)
}

func (r *Run) toolNames() string {
	if len(r.Tools) == 0 {
		return "no tools"
	}
	names := make([]string, len(r.Tools))
	for i, t := range r.Tools {
		names[i] = t.Name
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// maybeCloseStep appends the tool results of the current step, in the order
// the model asked for them, once every tool call of the step has settled.
func (r *Run) maybeCloseStep() {
	if r.Verdict != nil || len(r.Effects) == 0 {
		return
	}
	for _, e := range r.Effects {
		if e.State != EffectSettled {
			return
		}
	}
	for _, e := range r.Effects[1:] {
		r.Transcript = append(r.Transcript, toolMessage(e))
	}
	r.Effects = nil
	r.checkStepBudget()
}

// checkStepBudget ends the Run when it needs another model step and has
// none left.
func (r *Run) checkStepBudget() {
	if r.Verdict == nil && r.Awaiting == nil && r.Step >= r.Limits.MaxSteps {
		r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: abi.ClassLimitExceeded,
			Message: fmt.Sprintf("max_steps %d reached before a final answer", r.Limits.MaxSteps)}})
	}
}

func toolMessage(e Effect) abi.Message {
	m := abi.Message{Role: abi.MessageTool, ToolCallID: e.ToolCallID}
	o := e.Outcome
	switch {
	case o.State == OutcomeDone:
		m.Content, m.IsError = o.Tool.Content, o.Tool.IsError
	case o.Error != nil:
		m.Content, m.IsError = fmt.Sprintf("error (%s): %s", o.Error.Class, o.Error.Message), true
	default:
		m.Content, m.IsError = "error (cancelled)", true
	}
	return m
}

func (r *Run) applyApprovals(ev Event) error {
	if len(ev.Approvals) == 0 {
		return fmt.Errorf("%w: approval_recorded with no approvals", ErrInvalidEvent)
	}
	seen := map[string]bool{}
	for _, a := range ev.Approvals {
		if seen[a.ToolCallID] {
			return fmt.Errorf("%w: tool call %q approved or denied twice in one event", ErrInvalidEvent, a.ToolCallID)
		}
		seen[a.ToolCallID] = true
		found, waiting := false, false
		for _, e := range r.Effects {
			if e.Kind == abi.KindTool && e.ToolCallID == a.ToolCallID {
				found = true
				waiting = waiting || e.State == EffectAwaitingApproval
			}
		}
		if !found {
			return fmt.Errorf("%w: %q is not a tool call of step %d of run %s", ErrUnknownToolCall, a.ToolCallID, r.Step, r.ID)
		}
		if !waiting {
			return fmt.Errorf("%w: tool call %q does not wait for an approval", ErrNotAwaiting, a.ToolCallID)
		}
	}
	for _, a := range ev.Approvals {
		for i := range r.Effects {
			e := &r.Effects[i]
			if e.ToolCallID != a.ToolCallID || e.State != EffectAwaitingApproval {
				continue
			}
			if a.Approved {
				e.State = EffectReady
				continue
			}
			reason := a.Reason
			if reason == "" {
				reason = "no reason given"
			}
			r.closeEffect(e, Outcome{State: OutcomeFailed, Error: &Failure{Class: abi.ClassApprovalDenied,
				Message: "the call was denied: " + reason}})
		}
	}
	r.maybeCloseStep()
	return nil
}

func (r *Run) applyInput(ev Event) error {
	if r.Awaiting == nil || len(r.Effects) != 0 || r.Verdict != nil {
		return fmt.Errorf("%w: run %s is not waiting for input", ErrNotAwaiting, r.ID)
	}
	r.Transcript = append(r.Transcript, abi.Message{Role: abi.MessageUser, Content: ev.Input})
	r.Awaiting = nil
	r.checkStepBudget()
	return nil
}

func (r *Run) applyCancel(ev Event) error {
	if r.Verdict != nil {
		return fmt.Errorf("%w: run %s is already ending (%s)", ErrNoChange, r.ID, r.Verdict.Status)
	}
	reason := ev.Reason
	if reason == "" {
		reason = "cancelled by request"
	}
	r.beginEnd(Verdict{Status: StatusCancelled, Failure: &Failure{Class: abi.ClassCancelled, Message: reason}})
	return nil
}

// beginEnd sets the Run's verdict and settles, as cancelled, every effect
// that is not executing. Executing effects are cancelled through
// CancelEffect actions; the Run ends when none is left.
func (r *Run) beginEnd(v Verdict) {
	r.Verdict = &v
	r.Awaiting = nil
	for i := range r.Effects {
		e := &r.Effects[i]
		if e.State != EffectExecuting && e.State != EffectSettled {
			r.closeEffect(e, Outcome{State: OutcomeCancelled, Error: &Failure{Class: abi.ClassCancelled, Message: "the run ended first"}})
		}
	}
}

func (r *Run) applyTimer(ev Event) error {
	now := ev.At
	changed := r.checkDeadline(now, r)
	// Settling a timed-out effect can close the step, which empties
	// r.Effects: the bound is read at each turn, not once.
	for i := 0; i < len(r.Effects); i++ {
		e := &r.Effects[i]
		switch {
		case e.State == EffectBackoff && now >= e.NotBefore:
			e.State, e.NotBefore, e.Outcome = EffectReady, 0, nil
			changed = true
		case e.State == EffectExecuting && r.Limits.EffectTimeoutMS > 0 && now >= e.DispatchedAt+r.Limits.EffectTimeoutMS:
			f := &Failure{Class: abi.ClassPluginTimeout, Retriable: true,
				Message: fmt.Sprintf("attempt %d had no outcome within effect_timeout %d ms", e.Attempt, r.Limits.EffectTimeoutMS)}
			if r.Verdict != nil {
				r.closeEffect(e, Outcome{State: OutcomeCancelled, Error: f})
			} else {
				r.settle(e, Outcome{State: OutcomeFailed, Error: f}, now)
			}
			changed = true
		}
	}
	if !changed {
		return fmt.Errorf("%w: nothing due at %d", ErrNoChange, now)
	}
	return nil
}

func (r *Run) applyStepFailed(ev Event) error {
	if !r.needsModelStep() {
		return fmt.Errorf("%w: step_failed while the run does not need a model step", ErrInvalidEvent)
	}
	if ev.Failure == nil || !ev.Failure.Class.Valid() {
		return fmt.Errorf("%w: step_failed needs a failure with a known class", ErrInvalidEvent)
	}
	f := *ev.Failure
	f.Message = fmt.Sprintf("planning model step %d failed (%s): %s", r.Step+1, f.Class, f.Message)
	r.beginEnd(Verdict{Status: StatusFailed, Failure: &f})
	return nil
}

func (r *Run) applyFinish(ev Event) error {
	v := r.Verdict
	want := map[EventType]Status{EventRunCompleted: StatusCompleted, EventRunFailed: StatusFailed, EventRunCancelled: StatusCancelled}[ev.Type]
	if v == nil || v.Status != want {
		return fmt.Errorf("%w: %s but the run is not ending as %s", ErrInvalidEvent, ev.Type, want)
	}
	if len(r.Executing()) > 0 {
		return fmt.Errorf("%w: %s while effects are in flight", ErrInvalidEvent, ev.Type)
	}
	r.Status = v.Status
	r.Result = v.Result
	r.Failure = v.Failure
	r.Awaiting = nil
	return nil
}

// refreshStatus derives running or waiting: a Run waits when nothing but a
// person can move it (an input, or approvals with nothing else to run).
func (r *Run) refreshStatus() {
	if r.Status.Terminal() || r.Status == StatusPending {
		return
	}
	r.Status = StatusRunning
	if r.Verdict != nil {
		return
	}
	if r.Awaiting != nil && len(r.Effects) == 0 {
		r.Status = StatusWaiting
		return
	}
	approvals, other := 0, 0
	for _, e := range r.Effects {
		switch e.State {
		case EffectAwaitingApproval:
			approvals++
		case EffectReady, EffectExecuting, EffectBackoff:
			other++
		}
	}
	if approvals > 0 && other == 0 {
		r.Status = StatusWaiting
	}
}

// needsModelStep reports whether the next thing the Run needs is a new
// model step.
func (r *Run) needsModelStep() bool {
	return r.Status == StatusRunning && r.Verdict == nil && r.Awaiting == nil && len(r.Effects) == 0
}

func (r *Run) countState(kind abi.EffectKind, s EffectState) int {
	n := 0
	for _, e := range r.Effects {
		if e.Kind == kind && e.State == s {
			n++
		}
	}
	return n
}

package loop

import (
	"fmt"
	"strings"
)

// The checks of a Run's whole event log, from the log alone: what any log
// that Apply built must look like, whoever wrote it and however often its
// writer crashed. The chaos bench, the kill -9 tests and the metamorphic
// test read the logs a store holds and hold them to these rules, so the
// rules are written once, here, independently of Apply: a checker that
// replayed the log through Apply would share its bugs.

// LogCheck is a check of one Run's event log, as a store returns it
// (Store.Events from Seq 1). Its zero value is CheckLog's check.
type LogCheck struct {
	// Ended requires the log to end with its terminal event, for a Run
	// that must have ended. Without it, a log that has not ended yet (a
	// Run still going) passes as long as what it holds is right.
	Ended bool
	// Answer, when set, is the input a caller gives in answer to a
	// question; an input that differs from Answer(the question the Run was
	// waiting on) is a violation. It shows that each input answers the
	// question of its moment, not an earlier one that arrived late.
	Answer func(question string) string
}

// CheckLog checks one Run's event log and returns the violations it
// finds, one sentence each (none: nil). A log that has not ended passes if
// it is a correct beginning. See LogCheck.Check for the rules.
func CheckLog(evs []Event) []string { return LogCheck{}.Check(evs) }

// CheckEnded is CheckLog for a Run that must have ended: its log must also
// end with its terminal event.
func CheckEnded(evs []Event) []string { return LogCheck{Ended: true}.Check(evs) }

// Check returns the violations of the log's rules, one sentence each, in
// the order of the events that break them (nil when there is none):
//
//   - the first event is RunCreated with the Run's spec, and no other is;
//   - Seq numbers the events 1..n with no gap;
//   - a terminal event (completed, failed, cancelled) is the last event,
//     so there is at most one; with Ended, the last event is terminal;
//   - every effect ID is well formed and names an effect of this Run;
//   - an effect's attempts are dispatched in order, 1, 2, …, and each
//     dispatch carries an owner epoch no lower than any before it in the
//     log (a lower one is a fenced owner's commit);
//   - a tool effect is dispatched only after the model step that asked
//     for it settled, only for a tool the Run offers, and, when the tool
//     needs an approval, only once its call was approved;
//   - no settlement without its dispatch, no attempt settled twice, no
//     settlement of an attempt after a later one was dispatched (a stale
//     outcome); another event about an attempt (pending, deferred) names
//     the last attempt dispatched, before it settled;
//   - no effect is dispatched more attempts than its policy allows (retry:
//     max_attempts, not counting the attempts settled as rate_limited,
//     which have max_rate_limited_attempts of their own; fail and
//     fail_run: one), with the model policy and the tool policies of the
//     spec;
//   - every approval decides a call of the current model step that waits
//     for one, once;
//   - every input answers the question the Run was waiting on (the last
//     model step's await_input), once (and, with Answer, is its answer);
//     a Run that completed had every question answered.
//
// A settlement that Apply makes without an EffectSettled event (an effect
// timeout, a denied approval, the cancellation of what has not started) is
// not in the log, so an attempt need not have a settlement.
func (c LogCheck) Check(evs []Event) []string {
	s := c.scan(evs)
	return s.out
}

// EffectHistory is what a Run's log tells of one of its effects.
type EffectHistory struct {
	ID   string
	Kind string // "model" or "tool", as ParseEffectID says; "" for a malformed ID
	// Tool is the tool a tool effect calls, as the model step that asked
	// for it named it ("" if no step did).
	Tool string
	// Dispatched is the highest attempt dispatched (0: none).
	Dispatched int
	// Settled holds the outcome of each attempt settled by an
	// EffectSettled event.
	Settled map[int]*Outcome
}

// LogEffects reads every effect a Run's log names: its kind, the tool it
// calls, its attempts dispatched and its settlements, by effect ID.
func LogEffects(evs []Event) map[string]*EffectHistory {
	s := LogCheck{}.scan(evs)
	out := make(map[string]*EffectHistory, len(s.effects))
	for id, e := range s.effects {
		out[id] = &e.EffectHistory
	}
	return out
}

// approval is where a gated tool call stands.
type approval int

const (
	notGated approval = iota
	awaitingApproval
	approved
	denied
)

// effectLog is an effect as the scan has seen it so far.
type effectLog struct {
	EffectHistory
	named    bool // a tool effect whose model step settled and named it
	approval approval
}

// logScan is one pass over a log: the violations and the effects.
type logScan struct {
	check   LogCheck
	run     string // the Run's ID, from its spec
	spec    *Spec
	out     []string
	effects map[string]*effectLog
	order   []string // effect IDs in the order the log first names them
	calls   map[string][]*effectLog
}

func (s *logScan) bad(format string, args ...any) {
	s.out = append(s.out, fmt.Sprintf(format, args...))
}

func (c LogCheck) scan(evs []Event) *logScan {
	s := &logScan{check: c, effects: map[string]*effectLog{}}
	if len(evs) == 0 {
		s.bad("the log is empty")
		return s
	}
	if first := evs[0]; first.Type == EventRunCreated && first.Spec != nil {
		s.spec, s.run = first.Spec, first.Spec.ID
	} else {
		s.bad("the first event is %s, not run_created with the Run's spec", first.Type)
	}
	var (
		asked     string // the open question, "" when none
		epoch     uint64 // the highest dispatch epoch so far
		epochSeq  int64  // and where it was
		lastIndex = len(evs) - 1
	)
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			s.bad("event %d (%s) has seq %d", i+1, ev.Type, ev.Seq)
		}
		if ev.Terminal() && i != lastIndex {
			s.bad("terminal event %s at seq %d is not the last (%d events)", ev.Type, ev.Seq, len(evs))
		}
		switch ev.Type {
		case EventRunCreated:
			if i > 0 {
				s.bad("run_created again at seq %d", ev.Seq)
			}
		case EventEffectDispatched:
			e := s.effect(ev)
			if e == nil {
				continue
			}
			if ev.Attempt != e.Dispatched+1 {
				s.bad("effect %s: attempt %d dispatched at seq %d, after attempt %d (attempts go 1, 2, … in order)", e.ID, ev.Attempt, ev.Seq, e.Dispatched)
			}
			if ev.Epoch < epoch {
				s.bad("effect %s#%d dispatched at seq %d under owner epoch %d, after a dispatch under epoch %d at seq %d: a fenced owner committed", e.ID, ev.Attempt, ev.Seq, ev.Epoch, epoch, epochSeq)
			} else if ev.Epoch > epoch {
				epoch, epochSeq = ev.Epoch, ev.Seq
			}
			if e.Kind == "tool" {
				s.checkToolDispatch(e, ev)
			}
			e.Dispatched = max(e.Dispatched, ev.Attempt)
		case EventEffectSettled:
			e := s.effect(ev)
			if e == nil {
				continue
			}
			switch {
			case hasKey(e.Settled, ev.Attempt):
				s.bad("effect %s#%d settled twice (again at seq %d)", e.ID, ev.Attempt, ev.Seq)
			case ev.Attempt < 1 || ev.Attempt > e.Dispatched:
				s.bad("effect %s#%d settled at seq %d without its dispatch (last attempt dispatched: %d)", e.ID, ev.Attempt, ev.Seq, e.Dispatched)
			case ev.Attempt < e.Dispatched:
				s.bad("effect %s#%d settled at seq %d after attempt %d was dispatched: a stale outcome settled", e.ID, ev.Attempt, ev.Seq, e.Dispatched)
			}
			e.Settled[ev.Attempt] = ev.Outcome
			if e.Kind == "model" && ev.Outcome != nil && ev.Outcome.State == OutcomeDone && ev.Outcome.Model != nil {
				m := ev.Outcome.Model
				if m.AwaitInput != nil {
					asked = m.AwaitInput.Prompt
				}
				s.stepCalls(e, ev)
			}
		case EventApprovalRecorded:
			s.checkApprovals(ev)
		case EventInputProvided:
			switch {
			case asked == "":
				s.bad("input %q at seq %d answers no open question", ev.Input, ev.Seq)
			case c.Answer != nil && ev.Input != c.Answer(asked):
				s.bad("input %q at seq %d does not answer the open question %q", ev.Input, ev.Seq, asked)
			}
			asked = ""
		case EventRunCompleted:
			if asked != "" {
				s.bad("the Run completed at seq %d with the question %q unanswered", ev.Seq, asked)
			}
		default:
			// Any other event about an attempt (pending, deferred) is about
			// the one in flight: the last dispatched, not settled yet.
			if ev.EffectID == "" {
				continue
			}
			e := s.effect(ev)
			if e == nil {
				continue
			}
			switch {
			case ev.Attempt < 1 || ev.Attempt > e.Dispatched:
				s.bad("%s of %s#%d at seq %d, an attempt never dispatched (last attempt dispatched: %d)", ev.Type, e.ID, ev.Attempt, ev.Seq, e.Dispatched)
			case ev.Attempt < e.Dispatched:
				s.bad("%s of %s#%d at seq %d after attempt %d was dispatched: a stale attempt", ev.Type, e.ID, ev.Attempt, ev.Seq, e.Dispatched)
			case hasKey(e.Settled, ev.Attempt):
				s.bad("%s of %s#%d at seq %d after its settlement", ev.Type, e.ID, ev.Attempt, ev.Seq)
			}
		}
	}
	if last := evs[lastIndex]; c.Ended && !last.Terminal() {
		s.bad("the last event is %s at seq %d, not terminal: the Run has not ended", last.Type, last.Seq)
	}
	s.checkPolicies()
	return s
}

func hasKey(m map[int]*Outcome, k int) bool {
	_, ok := m[k]
	return ok
}

// effect returns the effect an event names, or nil (and a violation) when
// its ID is malformed or of another Run.
func (s *logScan) effect(ev Event) *effectLog {
	if e := s.effects[ev.EffectID]; e != nil {
		return e
	}
	ref, err := ParseEffectID(ev.EffectID)
	if err != nil {
		s.bad("%s at seq %d names a malformed effect ID %q", ev.Type, ev.Seq, ev.EffectID)
		return nil
	}
	if s.spec != nil && ref.Run != s.run {
		s.bad("%s at seq %d names effect %s, which is not an effect of run %s", ev.Type, ev.Seq, ev.EffectID, s.run)
		return nil
	}
	e := &effectLog{EffectHistory: EffectHistory{ID: ev.EffectID, Kind: ref.Kind, Settled: map[int]*Outcome{}}}
	s.effects[e.ID] = e
	s.order = append(s.order, e.ID)
	return e
}

// stepCalls records the tool calls a model step's answer asks for: call
// i of step n is effect <run>.t<n>.<i>, under the call's ID (or the
// effect's, when the model gave none, as Apply does). They are the calls
// the approvals that follow decide.
func (s *logScan) stepCalls(model *effectLog, ev Event) {
	ref, err := ParseEffectID(model.ID)
	if err != nil {
		return
	}
	s.calls = map[string][]*effectLog{}
	for i, call := range ev.Outcome.Model.Message.ToolCalls {
		id := ToolEffectID(ref.Run, ref.Step, i)
		e := s.effects[id]
		if e == nil {
			e = &effectLog{EffectHistory: EffectHistory{ID: id, Kind: "tool", Settled: map[int]*Outcome{}}}
			s.effects[id] = e
			s.order = append(s.order, id)
		}
		e.Tool, e.named = call.Name, true
		if s.spec != nil {
			for _, t := range s.spec.Tools {
				if t.Name == call.Name && t.Approval {
					e.approval = awaitingApproval
				}
			}
		}
		callID := call.ID
		if callID == "" {
			callID = id
		}
		s.calls[callID] = append(s.calls[callID], e)
	}
}

// checkToolDispatch checks that a tool effect's dispatch follows what it
// depends on: the model step that named its tool, a tool the Run offers,
// and its approval.
func (s *logScan) checkToolDispatch(e *effectLog, ev Event) {
	if !e.named {
		s.bad("tool effect %s dispatched at seq %d, but no model step asked for it before", e.ID, ev.Seq)
		return
	}
	if s.spec != nil && !s.offers(e.Tool) {
		s.bad("tool effect %s dispatched at seq %d calls %q, a tool the Run does not offer", e.ID, ev.Seq, e.Tool)
	}
	switch e.approval {
	case awaitingApproval:
		s.bad("tool effect %s (%s) dispatched at seq %d before its call was approved", e.ID, e.Tool, ev.Seq)
	case denied:
		s.bad("tool effect %s (%s) dispatched at seq %d after its call was denied", e.ID, e.Tool, ev.Seq)
	}
}

func (s *logScan) offers(tool string) bool {
	for _, t := range s.spec.Tools {
		if t.Name == tool {
			return true
		}
	}
	return false
}

// checkApprovals checks that each decision decides a call of the current
// step that waits for an approval, and records it.
func (s *logScan) checkApprovals(ev Event) {
	if len(ev.Approvals) == 0 {
		s.bad("approval_recorded at seq %d decides nothing", ev.Seq)
	}
	for _, d := range ev.Approvals {
		effects := s.calls[d.ToolCallID]
		if len(effects) == 0 {
			s.bad("approval at seq %d decides %q, not a tool call of the current model step", ev.Seq, d.ToolCallID)
			continue
		}
		waiting := false
		for _, e := range effects {
			if e.approval == awaitingApproval {
				waiting = true
				e.approval = denied
				if d.Approved {
					e.approval = approved
				}
			}
		}
		if !waiting {
			var tools []string
			for _, e := range effects {
				tools = append(tools, e.Tool)
			}
			s.bad("approval at seq %d decides call %q (%s), which does not wait for an approval: it needs none, or was decided before", ev.Seq, d.ToolCallID, strings.Join(tools, ", "))
		}
	}
}

// checkPolicies checks the attempts of each effect against its policy.
func (s *logScan) checkPolicies() {
	if s.spec == nil {
		return
	}
	for _, id := range s.order {
		e := s.effects[id]
		var p Policy
		switch {
		case e.Kind == "model":
			p = s.spec.ModelPolicy
		case e.Kind == "tool" && e.named && s.offers(e.Tool):
			for _, t := range s.spec.Tools {
				if t.Name == e.Tool {
					p = t.Policy
				}
			}
		default:
			continue // reported at its dispatch
		}
		s.checkAttempts(e, p)
	}
}

// checkAttempts checks that each attempt of e after the first was
// dispatched while e's policy p allowed one more: after a rate-limited
// settlement, while fewer of e's attempts were rate-limited than its
// max_rate_limited_attempts; after any other (or none in the log: an
// effect timeout), while fewer of them were not than its max_attempts.
// It reports the first attempt too many, once.
func (s *logScan) checkAttempts(e *effectLog, p Policy) {
	what := fmt.Sprintf("effect %s (%s%s)", e.ID, e.Kind, strings.TrimSuffix(" "+e.Tool, " "))
	limited := 0 // the rate-limited attempts among 1..n
	for n := 1; n < e.Dispatched; n++ {
		if p.Mode == PolicyRetry && e.Settled[n] != nil && e.Settled[n].State == OutcomeFailed && e.Settled[n].Error.RateLimited() {
			limited++
			if limited >= p.RateLimitedAttempts() {
				s.bad("%s dispatched attempt %d after its attempt %d was its %d-th rate-limited one; its policy (%s) allows %d (max_rate_limited_attempts)",
					what, n+1, n, limited, p.Mode, p.RateLimitedAttempts())
				return
			}
			continue
		}
		if limit := maxAttempts(p); n-limited >= limit {
			if limited > 0 {
				s.bad("%s dispatched %d attempts; its policy (%s) allows %d besides its %d rate-limited ones", what, e.Dispatched, p.Mode, limit, limited)
			} else {
				s.bad("%s dispatched %d attempts; its policy (%s) allows %d", what, e.Dispatched, p.Mode, limit)
			}
			return
		}
	}
}

// maxAttempts is how many attempts a missing-effect policy allows: retry
// its max_attempts, fail and fail_run one.
func maxAttempts(p Policy) int {
	if p.Mode == PolicyRetry && p.MaxAttempts > 0 {
		return p.MaxAttempts
	}
	return 1
}

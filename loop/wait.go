package loop

import (
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// A Run's time limits, and the time it spends waiting for a person.
//
// A Run waits for a person while its Status is waiting (refreshStatus): it
// waits for an answer to the model's question, or for approvals with
// nothing else to run. Apply notes when each wait begins (WaitingSince,
// the time of the event that made the Run wait) and adds its length to
// WaitedMS when it ends (the time of the event that ended it).
//
// A Run created with Limits.RunTimeoutMS has two clocks:
//
//   - Its work clock runs from its creation, but not while it waits: the
//     Run fails with deadline_exceeded once CreatedAt + RunTimeoutMS +
//     WaitedMS passes while it does not wait. A wait for a person is not
//     the Run's work time.
//   - Its wait clock bounds each wait on its own, not their sum: the Run
//     fails with deadline_exceeded once WaitingSince + WaitTimeoutMS
//     passes while it still waits.
//
// A Run created with Limits.DeadlineMS (before run_timeout stopped
// counting waits) keeps that absolute deadline, checked exactly as
// before, whatever else it has.
//
// As for every deadline, the Run fails on whatever event brings the news
// that a limit passed (checkDeadline): the TimerFired that Decide asks
// for, or any other event, such as an approval that comes after
// wait_timeout passed but before the timer did.

// accountWait starts the wait clock when the event at `at` made the Run
// wait (prev is its status before), and stops it, adding the wait to
// WaitedMS, when the event ended a wait.
func (r *Run) accountWait(prev Status, at int64) {
	switch {
	case prev != StatusWaiting && r.Status == StatusWaiting:
		r.WaitingSince = max(at, 0)
	case prev == StatusWaiting && r.Status != StatusWaiting:
		if r.WaitingSince > 0 && at > r.WaitingSince {
			r.WaitedMS += at - r.WaitingSince
		}
		r.WaitingSince = 0
	}
}

// workDeadline is when the work clock reaches Limits.RunTimeoutMS, if the
// Run does not wait again: its creation, plus run_timeout, plus the waits
// that are over. It is 0 when the Run has no run_timeout.
func (r *Run) workDeadline() int64 {
	if r.Limits.RunTimeoutMS <= 0 {
		return 0
	}
	return r.CreatedAt + r.Limits.RunTimeoutMS + r.WaitedMS
}

// waitDeadline is when the current wait reaches Limits.WaitTimeoutMS. It
// is 0 when the Run does not wait, has no wait_timeout, or waits since
// before WaitingSince was recorded.
func (r *Run) waitDeadline() int64 {
	if r.Status != StatusWaiting || r.Limits.WaitTimeoutMS <= 0 || r.WaitingSince <= 0 {
		return 0
	}
	return r.WaitingSince + r.Limits.WaitTimeoutMS
}

// timeLimitPassed returns the failure of a Run one of whose time limits
// passed by now, or nil. r.Status is the status the Run had until now:
// while it waited, the work clock stood still and the wait clock ran.
// before is the Run as it was until now, whose wait a failure names.
func (r *Run) timeLimitPassed(now int64, before *Run) *Failure {
	if d := r.Limits.DeadlineMS; d > 0 && now >= d {
		return &Failure{Class: abi.ClassDeadlineExceeded, Message: deadlineMessage(r.CreatedAt, d)}
	}
	if r.Status == StatusWaiting {
		if d := r.waitDeadline(); d > 0 && now >= d {
			return &Failure{Class: abi.ClassDeadlineExceeded,
				Message: waitTimeoutMessage(r.WaitingSince, r.Limits.WaitTimeoutMS, before.waitingForText())}
		}
		return nil
	}
	if d := r.workDeadline(); d > 0 && now >= d {
		return &Failure{Class: abi.ClassDeadlineExceeded,
			Message: runTimeoutMessage(r.CreatedAt, r.Limits.RunTimeoutMS, r.WaitedMS)}
	}
	return nil
}

// deadlineWakes asks to be woken when a time limit of the Run passes:
// DeadlineMS, then the end of the current wait (wait_timeout) while the
// Run waits, or of its work time (run_timeout) while it does not.
func (r *Run) deadlineWakes() []Action {
	var acts []Action
	if d := r.Limits.DeadlineMS; d > 0 {
		acts = append(acts, Action{Type: ActionWakeAt, At: d})
	}
	d := r.workDeadline()
	if r.Status == StatusWaiting {
		d = r.waitDeadline()
	}
	if d > 0 {
		acts = append(acts, Action{Type: ActionWakeAt, At: d})
	}
	return acts
}

// Deadline returns when the Run will fail with deadline_exceeded if it
// works on without waiting for a person from now on: the earlier of
// Limits.DeadlineMS and the end of its run_timeout given its waits so far.
// It is 0 when it has neither. The runtime gives it to executors as
// effect.deadline_ms: an effect executes only while the Run does not
// wait, so the work deadline does not move while it does.
func (r Run) Deadline() int64 {
	d, w := r.Limits.DeadlineMS, r.workDeadline()
	switch {
	case d <= 0:
		return w
	case w <= 0:
		return d
	}
	return min(d, w)
}

// Wait is what a Run that waits for a person waits for.
type Wait struct {
	// Since is when the wait began (Run.WaitingSince): the time of the
	// event that made the Run wait. 0 when it is not known (a Run that has
	// waited since before it was recorded).
	Since int64
	// Deadline is when wait_timeout fails the Run if it still waits; 0
	// when nothing bounds the wait.
	Deadline int64
	// Approvals are the tool calls that wait for a person's approval, in
	// the order the model asked for them.
	Approvals []Effect
	// Input is the model's question, when the Run waits for the user's
	// answer to it.
	Input *abi.AwaitInput
}

// Waiting returns what r waits for, and false when r does not wait for a
// person (its Status is not waiting). It reads the snapshot alone, so the
// same Run always gives the same Wait.
func (r Run) Waiting() (Wait, bool) {
	if r.Status != StatusWaiting {
		return Wait{}, false
	}
	w := Wait{Since: r.WaitingSince, Deadline: r.waitDeadline()}
	if r.Awaiting != nil && len(r.Effects) == 0 {
		a := *r.Awaiting
		w.Input = &a
		return w, true
	}
	for _, e := range r.Effects {
		if e.State == EffectAwaitingApproval {
			w.Approvals = append(w.Approvals, e)
		}
	}
	return w, true
}

// waitingForText says, for a failure's message, what the Run waits for.
func (r *Run) waitingForText() string {
	w, ok := r.Waiting()
	switch {
	case !ok:
		return "a person"
	case w.Input != nil:
		return "the user's answer to its question"
	}
	calls := make([]string, 0, len(w.Approvals))
	for i, e := range w.Approvals {
		if i == 3 {
			calls = append(calls, fmt.Sprintf("and %d more", len(w.Approvals)-i))
			break
		}
		calls = append(calls, fmt.Sprintf("%s (tool %s)", e.ToolCallID, e.Tool))
	}
	what := "tool call"
	if len(w.Approvals) > 1 {
		what = "tool calls"
	}
	return fmt.Sprintf("a person's approval of %s %s", what, strings.Join(calls, ", "))
}

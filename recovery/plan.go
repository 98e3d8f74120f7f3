package recovery

import (
	"fmt"
	"strconv"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Record is an orphaned effect attempt: executing on record, with no live
// process driving it.
type Record struct {
	Tenant   string
	Session  string
	RunID    string
	EffectID string
	Kind     abi.EffectKind
	Attempt  int
	// RateLimited counts the attempts of the effect that failed as
	// rate_limited (loop.Effect.RateLimited): they count against the
	// policy's max_rate_limited_attempts, not its max_attempts.
	RateLimited int
	// Handle is the handle recorded by an earlier pending reply; it may be
	// empty (the crash can come before the pending record was committed).
	Handle string
	// Deferrals counts the attach calls deferred so far because the
	// executor was unavailable, and FirstDeferredMS is when the first one
	// was (Unix ms); both are zero before any deferral.
	Deferrals       int
	FirstDeferredMS int64
}

// AttachKind is what the executor said when asked to attach.
type AttachKind string

// What attach can answer, plus the executor being unavailable.
const (
	AttachPending     AttachKind = "pending"
	AttachDone        AttachKind = "done"
	AttachFailed      AttachKind = "failed"
	AttachUnknown     AttachKind = "unknown"
	AttachUnavailable AttachKind = "unavailable" // plugin missing or failing to load or to answer
	// AttachVersionGone: the plugin version that started the attempt is
	// no longer loaded, and the version in force does not declare it can
	// take over its attempts (abi.Describe.AttachesFrom).
	AttachVersionGone AttachKind = "version_gone"
)

// AttachState is the executor's answer to attach.
type AttachState struct {
	Kind AttachKind
	// Outcome is the outcome of a done or failed attempt.
	Outcome loop.Outcome
	// Handle and PollAfterMS come with pending.
	Handle      string
	PollAfterMS int64
	// Reason says why the executor was unavailable: the executor's error,
	// for the Command's Reason and so the server's log, never for the
	// settlement's message, which a tenant reads.
	Reason string
}

// Policy is what Plan needs to know of the effect's rules.
type Policy struct {
	// Missing is the effect's missing-effect policy.
	Missing loop.Policy
	// MaxDeferMS is how long an unavailable executor is waited for before
	// the missing-effect policy applies with class executor_unavailable.
	MaxDeferMS int64
	// DeferBackoffMS and MaxDeferBackoffMS shape the wait between attach
	// tries (defaults 1s and 30s).
	DeferBackoffMS, MaxDeferBackoffMS int64
}

// Decision is what recovery does with a record.
type Decision string

// Decisions. Retry, Fail and FailRun are the missing-effect policy's.
const (
	Reattach Decision = "reattach" // the executor still runs it: register with the Watcher again
	Settle   Decision = "settle"   // the executor finished it: settle with its outcome
	Retry    Decision = "retry"    // settle as lost; the Loop dispatches the next attempt after a backoff
	Fail     Decision = "fail"     // settle as failed; the model sees a tool error (a model step fails the Run)
	FailRun  Decision = "fail_run" // settle as failed and fail the Run
	Defer    Decision = "defer"    // the executor is unavailable: ask again later
)

// Command is the outcome of Plan.
type Command struct {
	Decision Decision
	// CommandID is a function of (EffectID, attempt, decision). Every
	// decision that settles uses the one settlement ID of docs/DESIGN.md §5
	// (loop.SettleCommandID), so two processes that recover the same
	// record produce the same commit, and the store applies it once.
	CommandID string
	// Settlement is the EffectSettled event to commit (settling decisions).
	Settlement *loop.Event
	// Handle and PollAfterMS are for Reattach.
	Handle      string
	PollAfterMS int64
	// RetryAtMS is when to attach again (Defer).
	RetryAtMS int64
	// Reason explains the decision, for logs: the settlement's message and
	// what the executor's error said.
	Reason string
}

// CommandIDFor derives the command ID of a decision about an attempt.
func CommandIDFor(effectID string, attempt int, d Decision) string {
	switch d {
	case Settle, Retry, Fail, FailRun:
		return loop.SettleCommandID(effectID, attempt)
	}
	return "recovery/" + string(d) + "/" + effectID + "#" + strconv.Itoa(attempt)
}

// Plan decides what to do with an orphaned record given the executor's
// answer to attach, the effect's policy and the time. It is pure: the same
// arguments always give the same Command.
func Plan(rec Record, st AttachState, p Policy, nowMS int64) Command {
	cmd := func(d Decision, reason string) Command {
		return Command{Decision: d, CommandID: CommandIDFor(rec.EffectID, rec.Attempt, d), Reason: reason}
	}
	settle := func(d Decision, o loop.Outcome, reason string) Command {
		c := cmd(d, reason)
		ev := loop.Settled(rec.EffectID, rec.Attempt, o, nowMS)
		c.Settlement = &ev
		return c
	}
	switch st.Kind {
	case AttachPending:
		c := cmd(Reattach, "the executor still runs the attempt")
		c.Handle, c.PollAfterMS = st.Handle, st.PollAfterMS
		if c.Handle == "" {
			c.Handle = rec.Handle
		}
		return c
	case AttachDone, AttachFailed:
		return settle(Settle, st.Outcome, "the executor finished the attempt while no one watched")
	case AttachUnavailable:
		if p.MaxDeferMS > 0 && rec.Deferrals > 0 && nowMS-rec.FirstDeferredMS >= p.MaxDeferMS {
			return missing(rec, p, abi.ClassExecutorUnavailable,
				fmt.Sprintf("the executor stayed unavailable for %d ms (max_defer)", nowMS-rec.FirstDeferredMS), st.Reason, settle)
		}
		if p.MaxDeferMS <= 0 {
			return missing(rec, p, abi.ClassExecutorUnavailable, "the executor is unavailable and max_defer is 0", st.Reason, settle)
		}
		c := cmd(Defer, "the executor is unavailable: "+st.Reason)
		c.RetryAtMS = nowMS + DeferBackoff(p, rec.Deferrals+1)
		return c
	case AttachVersionGone:
		return missing(rec, p, abi.ClassLost, "the plugin version that started the attempt is no longer loaded, and the version in force does not declare it can take over its attempts (attaches_from)", st.Reason, settle)
	default: // AttachUnknown, or anything the executor should not have said
		return missing(rec, p, abi.ClassLost, "the executor holds no record of the attempt", "", settle)
	}
}

// missing applies the missing-effect policy: the settlement is the same
// for every decision (failed, with the class), and its retriable flag tells
// the Loop, which holds the same policy, which way to go.
//
// The settlement's message is msg, in recovery's own words, which the
// tenant reads; why (AttachState.Reason: an executor's error, which may
// name hosts, addresses, plugins and exports) goes only into the
// Command's Reason, for the server's log.
func missing(rec Record, p Policy, class abi.ErrorClass, msg, why string, settle func(Decision, loop.Outcome, string) Command) Command {
	f := &loop.Failure{Class: class, Message: msg}
	reason := msg
	if why != "" {
		reason += ": " + why
	}
	switch {
	case p.Missing.Mode == loop.PolicyRetry && rec.Attempt-rec.RateLimited < p.Missing.MaxAttempts:
		f.Retriable = true
		return settle(Retry, loop.Outcome{State: loop.OutcomeFailed, Error: f},
			fmt.Sprintf("%s; retry policy: attempt %d of %d", reason, rec.Attempt-rec.RateLimited+1, p.Missing.MaxAttempts))
	case p.Missing.Mode == loop.PolicyFailRun:
		f.Retriable = true
		return settle(FailRun, loop.Outcome{State: loop.OutcomeFailed, Error: f}, reason+"; policy fail_run")
	default:
		return settle(Fail, loop.Outcome{State: loop.OutcomeFailed, Error: f}, reason+"; policy fail")
	}
}

// DeferBackoff is the wait before attach try n+1 of an unavailable
// executor: DeferBackoffMS doubled per try, capped at MaxDeferBackoffMS.
func DeferBackoff(p Policy, n int) int64 {
	base, capMS := p.DeferBackoffMS, p.MaxDeferBackoffMS
	if base <= 0 {
		base = 1000
	}
	if capMS <= 0 {
		capMS = 30_000
	}
	d := base
	for i := 1; i < n && d < capMS; i++ {
		d *= 2
	}
	return min(d, capMS)
}

// Package loop is the pure Run model of agenthost: the Run snapshot, the
// events that change it, Apply, which folds one event into a snapshot, and
// Decide, which says what the caller must do next.
//
// The package does no I/O, starts no goroutine and reads no clock. Time
// reaches it only inside events (Event.At, and TimerFired's At), and the
// only randomness it uses (the jitter of retry backoff) is derived from
// the effect ID, so the same snapshot always yields the same Actions. This
// is the shape of etcd raft's RawNode: the algorithm is here, the driving
// is in runtime/. See RATIONALE.md, "Why is the loop pure?".
//
// When a model's outcome opens tool calls, Apply checks each call's
// arguments against its tool's input_schema (ToolSpec.InputSchema, JSON
// Schema 2020-12; arguments.go): a call whose arguments fail settles at
// once as invalid_arguments and is never dispatched. The check is a
// function of the schema and the arguments alone, and bounded. When the
// Run's agent has an output schema (AgentPin.OutputSchema), its final
// answer is checked the same way (output.go): one that fails is kept,
// and a user message that says why asks the model again, within
// max_steps.
//
// Apply never panics and never mutates its argument. An illegal event
// returns the snapshot unchanged and a typed error, checked with
// errors.Is: ErrStaleAttempt, ErrAlreadySettled, ErrTerminal,
// ErrUnknownEffect and the others in errors.go.
//
// # The caller's duties
//
// A driver of the loop (runtime.Runtime is the one in this module) must:
//
//  1. Persist an event before acting on it. In particular, commit
//     EffectDispatched(attempt) before calling the executor's start
//     (write-ahead dispatch), so that a crash after the call leaves a
//     record for recovery to attach to.
//  2. Settle an effect attempt under the command ID derived from
//     (EffectID, attempt) and nothing else, whoever settles it and with
//     whatever outcome, so that the store applies the first settlement and
//     turns every later one into a no-op.
//  3. Treat ErrStaleAttempt and ErrAlreadySettled from Apply as "drop and
//     log": a late or duplicated outcome never settles anything.
//  4. Decide again after every commit, on the authoritative snapshot:
//     read back from the store, or the one the driver's own accepted
//     commit wrote (the stored one) provided the next commit expects its
//     Seq; never act on Actions computed from an older snapshot.
//  5. Honour WakeAt: deliver TimerFired with the current time at or after
//     the requested instant. Nothing in a Run waits forever only because
//     the driver keeps that promise.
//  6. Fetch a model request from the ModelStepPlanned event (at
//     Effect.RequestSeq) when it dispatches a model effect: the request is
//     stored once, in the event log, and not copied into snapshots.
package loop

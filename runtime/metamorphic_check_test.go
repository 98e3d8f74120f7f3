package runtime_test

import (
	"encoding/json"
	"fmt"

	"github.com/agenthost/agenthost/loop"
)

// metaAnswer is the test's answer to a Run's question: derived from the
// question, so that the log shows which question each input answered.
func metaAnswer(question string) string { return "re: " + question }

// checkRunLog checks one Run's event log, as the store holds it, and its
// stored snapshot, and returns the violations, one sentence each.
//
// The log is held to loop.LogCheck (numbered 1..n from run_created, one
// terminal event and it last, no settlement without its dispatch, none
// twice or stale, attempts in order under epochs that never go down and
// within the policy, tools dispatched once asked for and approved,
// approvals and inputs answering what the Run waited on, once, each input
// the test's answer to its question); with ended, the log must end with
// its terminal event. LogCheck reads the log alone; this adds what it
// cannot see: the snapshot is at the log's last Seq, is terminal exactly
// when the log is, and (with replay) is what folding the log with
// loop.Apply from the zero Run gives.
func checkRunLog(run loop.Run, evs []loop.Event, ended, replay bool) []string {
	out := loop.LogCheck{Ended: ended, Answer: metaAnswer}.Check(evs)
	bad := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("run %s: ", run.ID)+fmt.Sprintf(format, args...))
	}
	if len(evs) == 0 {
		return out
	}
	if int64(len(evs)) != run.Seq {
		bad("the snapshot is at seq %d but the log holds %d events", run.Seq, len(evs))
	}
	if last := evs[len(evs)-1]; run.Status.Terminal() != last.Terminal() {
		bad("the snapshot is %s but the last event is %s", run.Status, last.Type)
	}
	if !replay {
		return out
	}
	var folded loop.Run
	for _, ev := range evs {
		next, err := loop.Apply(folded, ev)
		if err != nil {
			bad("event %d (%s) does not replay: %v", ev.Seq, ev.Type, err)
			return out
		}
		folded = next
	}
	if a, b := mustJSON(folded), mustJSON(run); a != b {
		bad("the stored snapshot is not its log folded:\n  folded %s\n  stored %s", a, b)
	}
	return out
}

func mustJSON(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(raw)
}

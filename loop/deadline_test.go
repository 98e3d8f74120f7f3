package loop

import (
	"testing"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
)

// TestDeadlineExceededMessageGivesATimeAndADuration: the failure of a Run
// whose deadline passed says the run_timeout as a Go duration and when it
// passed and when the Run was created as RFC 3339 times in UTC, not as
// Unix milliseconds, whichever event finds the deadline passed.
func TestDeadlineExceededMessageGivesATimeAndADuration(t *testing.T) {
	at := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	for _, tc := range []struct {
		name              string
		created, deadline int64
		found             Event
		want              string
	}{{
		name:     "a timer finds it",
		created:  at("2026-12-03T13:55:00Z"),
		deadline: at("2026-12-03T14:05:00Z"),
		found:    Event{Type: EventTimerFired, At: at("2026-12-03T14:05:00.250Z")},
		want:     "run_timeout of 10m0s passed at 2026-12-03T14:05:00Z (the Run was created at 2026-12-03T13:55:00Z)",
	}, {
		name:     "a later event finds it, to the millisecond",
		created:  at("2026-12-03T13:55:00.125Z"),
		deadline: at("2026-12-03T13:56:30.625Z"),
		found:    Event{Type: EventRunStarted, At: at("2026-12-03T15:00:00Z")},
		want:     "run_timeout of 1m30.5s passed at 2026-12-03T13:56:30.625Z (the Run was created at 2026-12-03T13:55:00.125Z)",
	}, {
		name:     "a deadline not after the creation",
		created:  at("2026-12-03T13:55:00Z"),
		deadline: at("2026-12-03T13:50:00Z"),
		found:    Event{Type: EventRunStarted, At: at("2026-12-03T13:55:01Z")},
		want:     "the Run's deadline, 2026-12-03T13:50:00Z, was not after its creation at 2026-12-03T13:55:00Z",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := baseSpec()
			spec.Limits.DeadlineMS = tc.deadline
			r := mustApply(t, Run{}, RunCreated(spec, tc.created), tc.found)
			if r.Verdict == nil || r.Verdict.Failure == nil || r.Verdict.Failure.Class != abi.ClassDeadlineExceeded {
				t.Fatalf("verdict after the deadline: %+v; want a deadline_exceeded failure", r.Verdict)
			}
			if got := r.Verdict.Failure.Message; got != tc.want {
				t.Fatalf("deadline_exceeded message:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

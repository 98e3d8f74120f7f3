package loop

import (
	"fmt"
	"time"
)

// rfc3339MS is RFC 3339 to the millisecond, the precision of the Loop's
// times, without trailing zeros.
const rfc3339MS = "2006-01-02T15:04:05.999Z07:00"

// deadlineMessage is the failure message of a Run whose deadline passed.
// It gives the run_timeout as a duration and the instants as RFC 3339
// times in UTC, so that whoever reads it need not convert Unix
// milliseconds. The runtime sets the deadline run_timeout after the
// Run's creation; a deadline set otherwise, not after the creation, is
// said as it is.
func deadlineMessage(createdMS, deadlineMS int64) string {
	created, deadline := time.UnixMilli(createdMS).UTC(), time.UnixMilli(deadlineMS).UTC()
	if timeout := deadline.Sub(created); timeout > 0 {
		return fmt.Sprintf("run_timeout of %s passed at %s (the Run was created at %s)",
			timeout, deadline.Format(rfc3339MS), created.Format(rfc3339MS))
	}
	return fmt.Sprintf("the Run's deadline, %s, was not after its creation at %s",
		deadline.Format(rfc3339MS), created.Format(rfc3339MS))
}

// runTimeoutMessage is the failure message of a Run whose work time
// reached its run_timeout (Limits.RunTimeoutMS). It gives the instant the
// work time ran out, which is later than creation + run_timeout by the
// time the Run spent waiting for a person (waitedMS), and says so.
func runTimeoutMessage(createdMS, timeoutMS, waitedMS int64) string {
	created := time.UnixMilli(createdMS).UTC()
	passed := time.UnixMilli(createdMS + timeoutMS + waitedMS).UTC()
	timeout := time.Duration(timeoutMS) * time.Millisecond
	if waitedMS <= 0 {
		return fmt.Sprintf("run_timeout of %s passed at %s (the Run was created at %s)",
			timeout, passed.Format(rfc3339MS), created.Format(rfc3339MS))
	}
	return fmt.Sprintf("run_timeout of %s passed at %s (the Run was created at %s and waited %s for a person, which run_timeout does not count)",
		timeout, passed.Format(rfc3339MS), created.Format(rfc3339MS), time.Duration(waitedMS)*time.Millisecond)
}

// waitTimeoutMessage is the failure message of a Run that waited for a
// person (what) for its whole wait_timeout, from sinceMS.
func waitTimeoutMessage(sinceMS, timeoutMS int64, what string) string {
	since := time.UnixMilli(sinceMS).UTC()
	passed := time.UnixMilli(sinceMS + timeoutMS).UTC()
	return fmt.Sprintf("wait_timeout of %s passed at %s: the Run had waited for %s since %s",
		time.Duration(timeoutMS)*time.Millisecond, passed.Format(rfc3339MS), what, since.Format(rfc3339MS))
}

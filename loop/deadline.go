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

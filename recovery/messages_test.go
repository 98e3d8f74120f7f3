package recovery

import (
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
)

// The settlement of an unavailable executor says so in recovery's words,
// which the tenant reads; the executor's error (an address, a plugin and
// an export) is the Command's Reason, for the server's log, and the
// decision is the same as without it.
func TestASettlementCarriesNoneOfTheExecutorsError(t *testing.T) {
	const why = "start: host: plugin[model] export[start]: dial tcp 127.0.0.1:8080: connect: connection refused"
	deferred := rec
	deferred.Deferrals, deferred.FirstDeferredMS = 4, 30_000
	for _, tc := range []struct {
		name string
		rec  Record
		p    Policy
		want Decision
		msg  string
	}{
		{"past max_defer, under retry", deferred, retry3, Retry, "the executor stayed unavailable for 60000 ms (max_defer)"},
		{"past max_defer, under fail", deferred, failPolicy, Fail, "the executor stayed unavailable for 60000 ms (max_defer)"},
		{"past max_defer, under fail_run", deferred, failRun, FailRun, "the executor stayed unavailable for 60000 ms (max_defer)"},
		{"max_defer 0", rec, Policy{Missing: loop.Policy{Mode: loop.PolicyFail}}, Fail, "the executor is unavailable and max_defer is 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Plan(tc.rec, AttachState{Kind: AttachUnavailable, Reason: why}, tc.p, 90_000)
			without := Plan(tc.rec, AttachState{Kind: AttachUnavailable}, tc.p, 90_000)
			if c.Decision != tc.want || without.Decision != tc.want {
				t.Fatalf("decisions %s and %s (without a reason), want %s", c.Decision, without.Decision, tc.want)
			}
			if c.Settlement == nil || c.Settlement.Outcome == nil || c.Settlement.Outcome.Error == nil {
				t.Fatalf("no failed settlement: %+v", c)
			}
			if got := c.Settlement.Outcome.Error.Message; got != tc.msg {
				t.Errorf("settlement message %q, want %q", got, tc.msg)
			}
			if *c.Settlement.Outcome.Error != *without.Settlement.Outcome.Error {
				t.Errorf("the reason changed the settlement: %+v, without it %+v", *c.Settlement.Outcome.Error, *without.Settlement.Outcome.Error)
			}
			if !strings.Contains(c.Reason, tc.msg+": "+why) {
				t.Errorf("reason %q lacks the executor's error %q", c.Reason, why)
			}
		})
	}
}

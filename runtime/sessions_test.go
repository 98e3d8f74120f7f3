package runtime_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The runtime holds state for the sessions with recent work, not for every
// session it ever drove (a platform's sessions are unbounded): the watchdog
// drops a session it finds idle in two scans in a row.
func TestIdleSessionsAreForgottenByTheWatchdog(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	for i := range 20 {
		if res := e.Execute(fmt.Sprintf("s%d", i), `answer:done`); res.Run.Status != loop.StatusCompleted {
			t.Fatalf("run %d: %s %s", i, res.Kind, res.Run.Status)
		}
	}
	waiting := e.Execute("asks", `ask:Which city?|answer:ok`)
	if waiting.Kind != runtime.ResultWaiting {
		t.Fatalf("want a wait for input, got %s", waiting.Kind)
	}
	conformance.Eventually(t, "the drivers to finish", func() bool { return e.Runtime.Idle() })
	ctx := context.Background()
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 21 {
		t.Fatalf("%d sessions held after one scan, want 21: a session is forgotten only when found idle twice", n)
	}
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 1 {
		t.Fatalf("%d sessions held after two scans, want 1 (the one whose Run waits)", n)
	}
	// A forgotten session is driven again as before, under the same claim.
	if res := e.Execute("s3", `answer:again`); res.Run.Status != loop.StatusCompleted {
		t.Fatalf("a Run of a forgotten session: %s %s", res.Kind, res.Run.Status)
	}
	if _, err := e.Runtime.ProvideInput(ctx, "acme", waiting.Run.ID, "Paris"); err != nil {
		t.Fatal(err)
	}
	e.UntilTerminal(e.Runtime, waiting.Run.ID, 100*time.Millisecond)
	conformance.Eventually(t, "the drivers to finish", func() bool { return e.Runtime.Idle() })
	e.Runtime.WatchdogScan(ctx)
	e.Runtime.WatchdogScan(ctx)
	if n := runtime.SessionsHeld(e.Runtime); n != 0 {
		t.Fatalf("%d sessions held once every Run ended and two scans passed, want 0", n)
	}
	if n := e.Runtime.Stats().Boundaries; n != 0 {
		t.Fatalf("%d ownership boundaries: a session's claim was lost on the way", n)
	}
	if n := e.Runtime.Recovery().WatchdogReports; n != 0 {
		t.Fatalf("the watchdog reported %d Runs", n)
	}
}

package runtime_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// An advance reports the Run it left to the Run's waiters after it lets
// go of the Run's lock, so its report can come after a later advance's
// commit: here every report of a Run not yet ended is held back until the
// Run has ended, and then made, before the end's own report. Execute
// answered the first of them: a quiescent wait of a Run at an old step,
// still running, with nothing left to wait for, since its last answer had
// been committed. (The examples' C model answers fast enough for this to
// happen in `agenthost bench runs` at 16 clients.) Execute must answer
// the Run's end.
func TestALateReportOfAnOlderSnapshotIsNotAWait(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e := conformance.NewRuntimeEnv(t, h, nil)
			var (
				mu   sync.Mutex
				held []func() // the reports of the Run before it ended
				late int      // how many were made after its end
			)
			runtime.SetReportHook(e.Runtime, func(run loop.Run, report func()) {
				mu.Lock()
				if !run.Status.Terminal() {
					held = append(held, report)
					mu.Unlock()
					return
				}
				earlier := held
				held, late = nil, late+len(held)
				mu.Unlock()
				for _, r := range earlier {
					r()
				}
				report()
			})
			defer runtime.SetReportHook(e.Runtime, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := e.Runtime.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: `call:echo({"text":"a"})|answer:$results`})
			if err != nil {
				t.Fatal(err)
			}
			if res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusCompleted || res.Run.Result != "a" {
				t.Fatalf("Execute answered %s: the Run %s at step %d, result %q; want its end, completed with a",
					res.Kind, res.Run.Status, res.Run.Step, res.Run.Result)
			}
			mu.Lock()
			defer mu.Unlock()
			if late == 0 {
				t.Fatal("no report was held back until the Run ended: the test tested nothing")
			}
		})
	}
}

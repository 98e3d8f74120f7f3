package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/recovery"
	"github.com/agenthost/agenthost/runtime"
)

// harnesses are the stores the runtime's own tests run over.
func harnesses() map[string]conformance.RuntimeHarness {
	return map[string]conformance.RuntimeHarness{
		"memstore": {NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s := conformance.NewMemStore(clock, conformance.KVLimits{})
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		// A store that writes a new session's first Run with its first
		// step, as pgstore does (conformance.MemStore.StepFirstRuns).
		"memstore-first-steps": {NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s := conformance.NewMemStore(clock, conformance.KVLimits{})
			s.StepFirstRuns(true)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		"badger": {NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s, err := badgerstore.Open(t.TempDir(), badgerstore.Options{Clock: clock, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
}

// TestTwoTakeoversCommitTheSameCommandOnce: node-b recovers an orphaned
// record and settles it; node-c, taking the session over after node-b
// dies, plans the same record as it stood before node-b acted (a slow
// reader, a lost acknowledgement) and gets the same command, which the
// store recognises as applied.
func TestTwoTakeoversCommitTheSameCommandOnce(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) { sameCommandOnce(t, conformance.NewRuntimeEnv(t, h, nil)) })
	}
}

func sameCommandOnce(t *testing.T, e *conformance.RuntimeEnv) {
	res := e.Execute("s1", `call:lost()|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	e.Crash(e.Runtime)
	orphan, err := e.Store.LoadRun(context.Background(), "acme", res.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	b := e.Recover("node-b")
	run := e.UntilTerminal(b, res.Run.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted {
		t.Fatalf("run %s", run.Status)
	}
	// node-b dies too; node-c takes the session over and, reading the same
	// record as it stood before node-b acted (a slow reader, a lost
	// acknowledgement), plans the same command for it.
	e.Crash(b)
	e.Recover("node-c")
	epoch, err := e.Store.ClaimSession(context.Background(), "acme", "s1", "node-c", e.Clock.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	eff := orphan.Effect(orphan.ID + ".t1.0")
	cmd := recovery.Plan(recovery.Record{Tenant: "acme", Session: "s1", RunID: orphan.ID, EffectID: eff.ID, Kind: eff.Kind,
		Attempt: eff.Attempt, Handle: eff.Handle}, recovery.AttachState{Kind: recovery.AttachUnknown},
		recovery.Policy{Missing: loop.Policy{Mode: loop.PolicyFail}}, e.Clock.Now().UnixMilli())
	ev := *cmd.Settlement
	ev.Seq = orphan.Seq + 1
	next, err := loop.Apply(orphan, ev)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := e.Store.Commit(context.Background(), runtime.Commit{Tenant: "acme", Session: "s1", RunID: orphan.ID,
		CommandID: cmd.CommandID, ExpectedSeq: orphan.Seq, Epoch: epoch, Events: []loop.Event{ev}, Run: next})
	if err != nil || !cr.Duplicate {
		t.Fatalf("the second takeover's command was not recognised as applied: %+v %v", cr, err)
	}
	evs, _ := e.Store.Events(context.Background(), "acme", orphan.ID, 1, 0)
	n := 0
	for _, ev := range evs {
		if ev.Type == loop.EventEffectSettled && ev.EffectID == eff.ID {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s settled %d times", eff.ID, n)
	}
}

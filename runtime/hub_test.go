package runtime_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// TestFollowStreamsEveryEventInOrderUntilTheEnd follows a Run from its
// first event, while it runs, and checks the stream has every event once,
// in order, ending with the terminal one; an emit published meanwhile is
// delivered too.
func TestFollowStreamsEveryEventInOrderUntilTheEnd(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
	var mu sync.Mutex
	var seqs []int64
	var emits []string
	done := make(chan error, 1)
	go func() {
		done <- e.Runtime.Follow(context.Background(), "acme", res.Run.ID, 1, func(it runtime.StreamItem) error {
			mu.Lock()
			defer mu.Unlock()
			if it.Event != nil {
				seqs = append(seqs, it.Event.Seq)
			} else {
				emits = append(emits, it.Emit.Message)
			}
			return nil
		})
	}()
	conformance.Eventually(t, "the backlog to be streamed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seqs) >= int(res.Run.Seq)
	})
	if err := e.Runtime.Hub().Emit(context.Background(), runtime.EmitScope{Tenant: "acme", RunID: res.Run.ID}, abi.EmitEvent{Type: "progress", Message: "half way"}); err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "the emit", func() bool { mu.Lock(); defer mu.Unlock(); return len(emits) == 1 })
	run := e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return after the terminal event")
	}
	mu.Lock()
	defer mu.Unlock()
	if int64(len(seqs)) != run.Seq {
		t.Fatalf("streamed %d events, the run has %d", len(seqs), run.Seq)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("event %d has seq %d: %v", i, s, seqs)
		}
	}
	if strings.Join(emits, ",") != "half way" {
		t.Fatalf("emits %v", emits)
	}
	if run.Status != loop.StatusCompleted {
		t.Fatalf("run %s", run.Status)
	}
}

func TestFollowOfAFinishedRunReturnsAfterItsLog(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", "answer:hi")
	n := 0
	if err := e.Runtime.Follow(context.Background(), "acme", res.Run.ID, 0, func(runtime.StreamItem) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if int64(n) != res.Run.Seq {
		t.Fatalf("%d events, want %d", n, res.Run.Seq)
	}
	// From the middle: only what follows.
	n = 0
	_ = e.Runtime.Follow(context.Background(), "acme", res.Run.ID, res.Run.Seq-1, func(runtime.StreamItem) error { n++; return nil })
	if n != 2 {
		t.Fatalf("from seq %d: %d events, want 2", res.Run.Seq-1, n)
	}
}

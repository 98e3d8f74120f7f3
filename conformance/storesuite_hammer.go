package conformance

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite cases here race a store from many goroutines at once:
// committers on shared Runs under compare-and-set, and concurrent
// creators in one session.

// testHammer runs committers in parallel: each drives its own Run, and all
// of them race on shared Runs with compare-and-set. Every commit appends an
// EffectPending with a handle unique to the committer and attempt, so the
// shared Runs' logs must hold exactly the winners' handles, in Seq order.
func testHammer(t *testing.T, h *harness) {
	const (
		workers = 8
		shared  = 2
		rounds  = 25
	)
	prep := func(id, session string) {
		h.toExecuting(h.create("t", session, id, ""), 0)
	}
	for i := range shared {
		prep(fmt.Sprintf("shared%d", i), "hot")
	}
	for w := range workers {
		prep(fmt.Sprintf("own%d", w), fmt.Sprintf("w%d", w))
	}
	type win struct {
		run    string
		seq    int64
		handle string
	}
	var (
		mu   sync.Mutex
		wins []win
	)
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	// The tenant's stored bytes are first asked for while the committers
	// race (a store that keeps a running figure seeds it then), and must
	// come out exact once they stop.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 5 {
			if _, err := h.s.TenantStoredBytes(h.ctx, "t"); err != nil {
				errs <- fmt.Errorf("TenantStoredBytes while committers race: %w", err)
				return
			}
		}
		errs <- nil
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- hammerWorker(h, w, shared, rounds, func(run string, seq int64, handle string) {
				mu.Lock()
				wins = append(wins, win{run, seq, handle})
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]map[int64]string{}
	for _, w := range wins {
		if want[w.run] == nil {
			want[w.run] = map[int64]string{}
		}
		if prev, dup := want[w.run][w.seq]; dup {
			t.Fatalf("two commits won Seq %d of %s: %s and %s", w.seq, w.run, prev, w.handle)
		}
		want[w.run][w.seq] = w.handle
	}
	for run, bySeq := range want {
		r := h.load("t", run)
		evs := h.events("t", run, 0, 0)
		if int64(len(evs)) != r.Seq || r.Seq != 4+int64(len(bySeq)) {
			t.Fatalf("%s: %d events, Seq %d, %d winners: lost or phantom commits", run, len(evs), r.Seq, len(bySeq))
		}
		for _, ev := range evs[4:] {
			if ev.Handle != bySeq[ev.Seq] {
				t.Fatalf("%s Seq %d holds handle %q, the winner was %q", run, ev.Seq, ev.Handle, bySeq[ev.Seq])
			}
		}
		if exec := runtime.ExecutingRecords(r); len(exec) != 1 || exec[0].Handle != evs[len(evs)-1].Handle {
			t.Fatalf("%s: snapshot handle %+v, last event %q", run, exec, evs[len(evs)-1].Handle)
		}
	}
	for w := range workers {
		if got := len(want[fmt.Sprintf("own%d", w)]); got != rounds {
			t.Fatalf("own%d has %d commits, want %d", w, got, rounds)
		}
	}
	var stored int64
	for run, bySeq := range want {
		var cmds []string
		for _, handle := range bySeq {
			cmds = append(cmds, "cmd-"+handle)
		}
		stored += h.held("t", run, cmds...)
	}
	h.wantStored("t", stored, "after the committers stopped")
	sessions := []string{"hot"}
	for w := range workers {
		sessions = append(sessions, fmt.Sprintf("w%d", w))
	}
	h.checkIndexes("t", sessions...)
}

// hammerWorker commits rounds times to its own Run and rounds times to the
// shared Runs, retrying a lost compare-and-set after reloading. It does not
// call t.Fatal: it runs off the test goroutine.
func hammerWorker(h *harness, w, shared, rounds int, won func(run string, seq int64, handle string)) error {
	commitOnce := func(run, handle string) (bool, error) {
		r, err := h.s.LoadRun(h.ctx, "t", run)
		if err != nil {
			return false, err
		}
		ev := pending(loop.ModelEffectID(run, 1), 1, handle)
		next, err := loop.Apply(r, ev)
		if err != nil {
			return false, fmt.Errorf("apply to %s: %w", run, err)
		}
		ev.Seq = next.Seq
		c := runtime.Commit{Tenant: "t", Session: r.Session, RunID: run, CommandID: "cmd-" + handle,
			ExpectedSeq: r.Seq, Events: []loop.Event{ev}, Run: next}
		res, err := h.s.Commit(h.ctx, c)
		switch {
		case errors.Is(err, runtime.ErrVersionConflict):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("commit %s to %s: %w", handle, run, err)
		case res.Duplicate || res.Seq != next.Seq:
			return false, fmt.Errorf("commit %s to %s: %+v, want Seq %d", handle, run, res, next.Seq)
		}
		won(run, next.Seq, handle)
		return true, nil
	}
	for i := range rounds {
		for _, run := range []string{fmt.Sprintf("own%d", w), fmt.Sprintf("shared%d", i%shared)} {
			handle := fmt.Sprintf("w%d-%d", w, i)
			for {
				ok, err := commitOnce(run, handle)
				if err != nil {
					return err
				}
				if ok {
					break
				}
			}
		}
	}
	return nil
}

func testConcurrentCreate(t *testing.T, h *harness) {
	const n = 16
	ordinals := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.s.CreateRun(h.ctx, h.createReq("t", "s", fmt.Sprintf("r%02d", i), ""))
			ordinals[i], errs[i] = res.Ordinal, err
		}()
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("CreateRun r%02d: %v", i, errs[i])
		}
		if seen[ordinals[i]] || ordinals[i] < 1 || ordinals[i] > n {
			t.Fatalf("ordinal %d given twice or out of 1..%d: %v", ordinals[i], n, ordinals)
		}
		seen[ordinals[i]] = true
	}
	h.checkIndexes("t", "s")
}

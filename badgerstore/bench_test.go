package badgerstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// BenchmarkCommit measures durable Run commits (SyncWrites on) against a
// bare Badger Update of the same payload size, in the same run, at 1 and
// 32 concurrent committers. Each store commit appends one EffectPending
// event to a Run with an executing effect, under a command ID, with its
// snapshot and index updates. Figures and ratios: docs/BENCHMARKS.md.
func BenchmarkCommit(b *testing.B) {
	for _, committers := range []int{1, 32} {
		b.Run(fmt.Sprintf("store/committers=%d", committers), func(b *testing.B) { benchStore(b, committers) })
		b.Run(fmt.Sprintf("bare/committers=%d", committers), func(b *testing.B) { benchBare(b, committers) })
	}
}

// benchRun returns a Run with an executing model effect, and the first
// commit that moves it on.
func benchRun(session string) (loop.Run, loop.Event) {
	spec := loop.Spec{Tenant: "bench", Session: session, ID: session + "-run", Input: "benchmark input of a typical size",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	r, _ := loop.Apply(loop.Run{}, loop.RunCreated(spec, 1))
	r, _ = loop.Apply(r, loop.Event{Type: loop.EventRunStarted, At: 2})
	r, _ = loop.Apply(r, loop.Event{Type: loop.EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"model":"m"}`)})
	r, _ = loop.Apply(r, loop.Event{Type: loop.EventEffectDispatched, At: 4, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1})
	return r, loop.Event{Type: loop.EventEffectPending, At: 5, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1}
}

// benchPayload is the number of bytes one store commit writes as values
// and keys: the event, the run record, the command ID and the executing
// index entry.
func benchPayload() int {
	r, ev := benchRun("s00")
	ev.Handle = "handle-000000001"
	next, _ := loop.Apply(r, ev)
	ev.Seq = next.Seq
	evb, _ := json.Marshal(ev)
	snap, _ := json.Marshal(next)
	rec, _ := encodeRecord(headerOf(next, 1, "", int64(len(snap))), snap)
	exec, _ := json.Marshal(runtime.ExecutingRecords(next)[0])
	return len(evb) + len(rec) + len(exec) + 8 + 4*40
}

// runOps runs n ops spread over committers goroutines and returns how long
// they took. op gets the worker number and that worker's op count so far.
func runOps(committers, n int, counts []int, op func(worker, i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, committers)
	start := time.Now()
	for w := range committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				counts[w]++
				if err := op(w, counts[w]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	return elapsed, <-errs
}

func runCommitters(b *testing.B, committers int, op func(worker, i int) error) {
	b.ResetTimer()
	_, err := runOps(committers, b.N, make([]int, committers), op)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}

// BenchmarkCommitInterleaved runs the store commit and the bare Update in
// alternating chunks on the same machine state, so that disk noise hits
// both alike, and reports each one's ns per commit and their ratio
// (store/bare: 1.0 means our commit path costs nothing over Badger).
func BenchmarkCommitInterleaved(b *testing.B) {
	for _, committers := range []int{1, 32} {
		b.Run(fmt.Sprintf("committers=%d", committers), func(b *testing.B) {
			storeOp, closeStore := storeCommitter(b, committers)
			defer closeStore()
			bareOp, closeBare := bareCommitter(b, committers)
			defer closeBare()
			storeCounts, bareCounts := make([]int, committers), make([]int, committers)
			chunk := 50 * committers
			var tStore, tBare time.Duration
			b.ResetTimer()
			for done := 0; done < b.N; done += chunk {
				n := min(chunk, b.N-done)
				d, err := runOps(committers, n, storeCounts, storeOp)
				if err != nil {
					b.Fatal(err)
				}
				tStore += d
				if d, err = runOps(committers, n, bareCounts, bareOp); err != nil {
					b.Fatal(err)
				}
				tBare += d
			}
			b.StopTimer()
			b.ReportMetric(float64(tStore.Nanoseconds())/float64(b.N), "store-ns/commit")
			b.ReportMetric(float64(tBare.Nanoseconds())/float64(b.N), "bare-ns/commit")
			b.ReportMetric(float64(tStore)/float64(tBare), "store/bare")
			b.ReportMetric(float64(benchPayload()), "payload-B")
		})
	}
}

func benchStore(b *testing.B, committers int) {
	op, closeFn := storeCommitter(b, committers)
	defer closeFn()
	runCommitters(b, committers, op)
}

func benchBare(b *testing.B, committers int) {
	op, closeFn := bareCommitter(b, committers)
	defer closeFn()
	runCommitters(b, committers, op)
}

// storeCommitter opens a Store with one Run per committer, each with an
// executing model effect, and returns the op that commits one
// EffectPending to a worker's Run.
func storeCommitter(b *testing.B, committers int) (func(w, i int) error, func()) {
	s, err := Open(b.TempDir(), Options{Logger: quietLogger(), GCInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	runs := make([]loop.Run, committers)
	for w := range committers {
		r, _ := benchRun(fmt.Sprintf("s%02d", w))
		ev := loop.RunCreated(r.Spec, 1)
		first, _ := loop.Apply(loop.Run{}, ev)
		if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: first, Event: ev}); err != nil {
			b.Fatal(err)
		}
		var evs []loop.Event
		cur := first
		for _, e := range []loop.Event{{Type: loop.EventRunStarted, At: 2},
			{Type: loop.EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"model":"m"}`)},
			{Type: loop.EventEffectDispatched, At: 4, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1}} {
			cur, _ = loop.Apply(cur, e)
			e.Seq = cur.Seq
			evs = append(evs, e)
		}
		if _, err := s.Commit(ctx, runtime.Commit{Tenant: "bench", Session: r.Session, RunID: r.ID,
			ExpectedSeq: 1, Events: evs, Run: cur}); err != nil {
			b.Fatal(err)
		}
		runs[w] = cur
	}
	op := func(w, i int) error {
		r := runs[w]
		ev := loop.Event{Type: loop.EventEffectPending, At: 5, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1,
			Handle: fmt.Sprintf("handle-%09d", i)}
		next, err := loop.Apply(r, ev)
		if err != nil {
			return err
		}
		ev.Seq = next.Seq
		_, err = s.Commit(ctx, runtime.Commit{Tenant: "bench", Session: r.Session, RunID: r.ID,
			CommandID: fmt.Sprintf("pending-%09d", i), ExpectedSeq: r.Seq, Events: []loop.Event{ev}, Run: next})
		runs[w] = next
		return err
	}
	return op, func() { _ = s.Close() }
}

// bareCommitter opens a bare Badger database with SyncWrites and returns
// the op that writes one value of the store commit's payload size.
func bareCommitter(b *testing.B, committers int) (func(w, i int) error, func()) {
	db, err := badger.Open(badger.DefaultOptions(b.TempDir()).WithSyncWrites(true).WithLogger(nil).WithNumVersionsToKeep(1))
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, benchPayload())
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	op := func(w, i int) error {
		return db.Update(func(txn *badger.Txn) error {
			return txn.Set([]byte(fmt.Sprintf("w%02d/%09d", w, i)), value)
		})
	}
	return op, func() { _ = db.Close() }
}

// BenchmarkSessionHistory measures what a builder's history costs at each
// model step, in a session that already holds n completed Runs: the
// runtime's read of it (CompletedRunsBefore, the last 20 completed Runs
// before the current one) against the baseline of reading the whole
// session (SessionRuns) and keeping the same 20, which is what the
// runtime did before. Figures: docs/BENCHMARKS.md.
func BenchmarkSessionHistory(b *testing.B) {
	const window = runtime.DefaultHistoryRuns
	for _, n := range []int{10, 100, 1000} {
		s, err := Open(b.TempDir(), Options{Logger: quietLogger(), GCInterval: -1, NoSyncWrites: true})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for i := range n {
			completeBenchRun(b, s, "long", fmt.Sprintf("done%04d", i))
		}
		now := createBenchRun(b, s, "long", "now")
		check := func(b *testing.B, runs []loop.Run) {
			if len(runs) != min(n, window) || runs[len(runs)-1].ID != fmt.Sprintf("done%04d", n-1) {
				b.Fatalf("history of %d Runs, the last %s", len(runs), runs[len(runs)-1].ID)
			}
		}
		b.Run(fmt.Sprintf("runs=%d/completed-runs-before", n), func(b *testing.B) {
			for b.Loop() {
				runs, err := s.CompletedRunsBefore(ctx, "bench", "long", now.ID, window)
				if err != nil {
					b.Fatal(err)
				}
				check(b, runs)
			}
		})
		b.Run(fmt.Sprintf("runs=%d/baseline-whole-session", n), func(b *testing.B) {
			for b.Loop() {
				all, err := s.SessionRuns(ctx, "bench", "long", 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				var runs []loop.Run
				for _, sr := range all {
					if sr.Run.ID == now.ID {
						break
					}
					if sr.Run.Status == loop.StatusCompleted {
						runs = append(runs, sr.Run)
					}
				}
				check(b, runs[max(0, len(runs)-window):])
			}
		})
		_ = s.Close()
	}
}

// createBenchRun creates a Run in session and returns its snapshot.
func createBenchRun(b *testing.B, s *Store, session, id string) loop.Run {
	spec := loop.Spec{Tenant: "bench", Session: session, ID: id, Input: "benchmark input of a typical size",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	r, _ := loop.Apply(loop.Run{}, ev)
	ev.Seq = 1
	if _, err := s.CreateRun(context.Background(), runtime.CreateRun{Run: r, Event: ev}); err != nil {
		b.Fatal(err)
	}
	return r
}

// completeBenchRun creates a Run that asks the model once and completes
// with its answer: a transcript of a question and an answer.
func completeBenchRun(b *testing.B, s *Store, session, id string) {
	r := createBenchRun(b, s, session, id)
	effect := loop.ModelEffectID(id, 1)
	cur, evs := r, []loop.Event(nil)
	for _, e := range []loop.Event{{Type: loop.EventRunStarted, At: 2},
		{Type: loop.EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"model":"m"}`)},
		{Type: loop.EventEffectDispatched, At: 4, EffectID: effect, Attempt: 1},
		loop.Settled(effect, 1, loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Content: "an answer of a typical size, a sentence or two long"}}}, 5),
		{Type: loop.EventRunCompleted, At: 6}} {
		next, err := loop.Apply(cur, e)
		if err != nil {
			b.Fatal(err)
		}
		e.Seq = next.Seq
		evs, cur = append(evs, e), next
	}
	if _, err := s.Commit(context.Background(), runtime.Commit{Tenant: "bench", Session: session, RunID: id,
		ExpectedSeq: r.Seq, Events: evs, Run: cur}); err != nil {
		b.Fatal(err)
	}
}

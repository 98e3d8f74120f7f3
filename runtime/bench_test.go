package runtime_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// benchScript is a Run of 2 model steps and 2 tool calls.
const benchScript = `call:echo({"text":"5"}),echo({"text":"20"})|answer:$results`

var benchConcurrency = []int{1, 16, 256}

// BenchmarkDurableRuns measures end-to-end durable Runs per second with
// instant fake executors on badgerstore with SyncWrites on. Each Run has 2
// model steps and 2 tool calls and its own session. Compare with
// BenchmarkBareBadgerCommit at the same concurrency:
//
//	go test -run '^$' -bench 'DurableRuns|BareBadgerCommit' -benchtime 400x ./runtime
func BenchmarkDurableRuns(b *testing.B) {
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			clock := runtime.SystemClock{}
			store, err := badgerstore.Open(b.TempDir(), badgerstore.Options{Clock: clock, Logger: quiet, GCInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			tenant := benchTenant(&conformance.ScriptedTools{})
			commits := &commitTimer{}
			rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quiet,
				MaxConcurrentCalls: 512, Observer: commits})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := rt.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer rt.Stop(ctx)
			var failed atomic.Int64
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			start := time.Now()
			benchkit.Parallel(c, b.N, func(i int) {
				t0 := time.Now()
				res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: benchScript})
				lat[i] = time.Since(t0)
				if err != nil || res.Run.Status != loop.StatusCompleted {
					failed.Add(1)
				}
			})
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d runs did not complete", n)
			}
			perRun := float64(rt.Stats().Commits+int64(b.N)) / float64(b.N) // + CreateRun
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
			b.ReportMetric(perRun, "commits/run")
			// The time a Run spent in Store.Commit (its creation's
			// CreateRun is not in it), against its latency.
			b.ReportMetric(float64(commits.total.Load())/float64(b.N)/1e6, "commit-ms/run")
			b.ReportMetric(float64(benchkit.Percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(benchkit.Percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		})
	}
}

// commitTimer sums the time the store's commits took.
type commitTimer struct {
	runtime.NopObserver
	total atomic.Int64 // ns
}

func (c *commitTimer) Committed(d time.Duration, _ error) { c.total.Add(int64(d)) }

// BenchmarkBareBadgerCommit is the baseline: a bare Badger Update with
// SyncWrites on, writing one 1.5 KB value (about a Run snapshot), from c
// concurrent writers.
func BenchmarkBareBadgerCommit(b *testing.B) {
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			bare, err := benchkit.OpenBareBadger(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer bare.Close()
			b.ResetTimer()
			d, err := bare.Round(c, b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/d.Seconds(), "commits/s")
		})
	}
}

// BenchmarkRecovery measures recovery of N Runs in flight on badgerstore
// (SyncWrites on): N Runs with one pending slow job each, a crash (Halt,
// then the directory reopened), and a new runtime. It reports the time
// until every effect is re-attached or settled and the time until every
// Run is terminal. The executor is the in-process fake (its job records
// survive the "crash" as a plugin's KV records would), so plugin call cost
// is not in these figures:
//
//	go test -run '^$' -bench Recovery -benchtime 1x ./runtime
func BenchmarkRecovery(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ready, reattach, terminal := recoverOnce(b, n)
				b.StartTimer()
				b.ReportMetric(ready.Seconds(), "ready-s")
				b.ReportMetric(reattach.Seconds(), "reattach-s")
				b.ReportMetric(terminal.Seconds(), "terminal-s")
			}
		})
	}
}

func recoverOnce(b *testing.B, n int) (ready, reattach, terminal time.Duration) {
	dir := b.TempDir()
	ctx := context.Background()
	tenant := benchTenant(&conformance.ScriptedTools{SlowPolls: 1})
	open := func(clock runtime.Clock) (*badgerstore.Store, *runtime.Runtime) {
		s, err := badgerstore.Open(dir, badgerstore.Options{Clock: clock, Logger: quiet, GCInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		rt, err := runtime.New(runtime.Options{Store: s, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quiet,
			PollMin: 20 * time.Millisecond, MaxConcurrentCalls: 512})
		if err != nil {
			b.Fatal(err)
		}
		return s, rt
	}
	// The first incarnation's clock stands still: its jobs stay pending.
	frozen := conformance.NewFakeClock(time.Time{})
	s1, rt1 := open(frozen)
	if err := rt1.Start(ctx); err != nil {
		b.Fatal(err)
	}
	benchkit.Parallel(64, n, func(i int) {
		res, err := rt1.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: `call:slow()|answer:$results`})
		if err != nil || res.Kind != runtime.ResultWaiting {
			b.Errorf("setup run %d: %v %s", i, err, res.Kind)
		}
	})
	if b.Failed() {
		b.FailNow()
	}
	rt1.Halt()
	for !rt1.Idle() {
		time.Sleep(time.Millisecond)
	}
	_ = s1.Close()

	start := time.Now()
	s2, rt2 := open(runtime.SystemClock{})
	defer s2.Close()
	if err := rt2.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer rt2.Stop(ctx)
	deadline := start.Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if ready == 0 && rt2.Ready() {
			ready = time.Since(start)
		}
		r := rt2.Recovery()
		if reattach == 0 && r.Decided() >= int64(n) {
			reattach = time.Since(start)
		}
		if rt2.Stats().RunsCompleted >= int64(n) {
			return ready, reattach, time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("recovery of %d runs did not finish in 5 minutes: completed %d, boundaries %d", n, rt2.Stats().RunsCompleted, rt2.Stats().Boundaries)
	return 0, 0, 0
}

// BenchmarkDurableRunsVsBare interleaves rounds of end-to-end Runs (as in
// BenchmarkDurableRuns) with rounds of bare Badger commits at the same
// concurrency, so that a noisy machine's drift hits both alike, and
// reports the goal's ratio: Runs/s divided by (bare commits/s ÷ commits per
// Run). The goal is a ratio of at least 0.5.
//
//	go test -run '^$' -bench DurableRunsVsBare -benchtime 1x ./runtime
func BenchmarkDurableRunsVsBare(b *testing.B) {
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			ctx := context.Background()
			store, err := badgerstore.Open(b.TempDir(), badgerstore.Options{Logger: quiet, GCInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			tenant := benchTenant(&conformance.ScriptedTools{})
			rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: runtime.SystemClock{}, Logger: quiet, MaxConcurrentCalls: 512})
			if err != nil {
				b.Fatal(err)
			}
			if err := rt.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer rt.Stop(ctx)
			bare, err := benchkit.OpenBareBadger(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer bare.Close()
			runsPerRound := max(c, 48)
			var runTime, bareTime time.Duration
			var runs, bareCommits int64
			var session atomic.Int64
			for range 5 * b.N {
				t0 := time.Now()
				benchkit.Parallel(c, runsPerRound, func(int) {
					res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", session.Add(1)), Input: benchScript})
					if err != nil || res.Run.Status != loop.StatusCompleted {
						b.Errorf("run: %v %s", err, res.Run.Status)
					}
				})
				runTime += time.Since(t0)
				runs += int64(runsPerRound)
				d, err := bare.Round(c, runsPerRound*6)
				if err != nil {
					b.Fatal(err)
				}
				bareTime += d
				bareCommits += int64(runsPerRound * 6)
			}
			commitsPerRun := float64(rt.Stats().Commits+runs) / float64(runs)
			runsPerSec := float64(runs) / runTime.Seconds()
			barePerSec := float64(bareCommits) / bareTime.Seconds()
			b.ReportMetric(runsPerSec, "runs/s")
			b.ReportMetric(barePerSec, "bare-commits/s")
			b.ReportMetric(commitsPerRun, "commits/run")
			b.ReportMetric(runsPerSec/(barePerSec/commitsPerRun), "ratio")
		})
	}
}

// benchTenant is the benchmarks' tenant: the echo builder, the scripted
// model and tools, every tool under the fail policy.
func benchTenant(tools *conformance.ScriptedTools) *runtime.Tenant {
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	for _, tl := range tools.Tools() {
		tenant.Tools = append(tenant.Tools, runtime.Tool{Descriptor: tl, Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: tools})
	}
	return tenant
}

package runtime_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
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
			tools := &conformance.ScriptedTools{}
			tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
				Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
			for _, tl := range tools.Tools() {
				tenant.Tools = append(tenant.Tools, runtime.Tool{Descriptor: tl, Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: tools})
			}
			rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quiet,
				MaxConcurrentCalls: 512})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := rt.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer rt.Stop(ctx)
			var next atomic.Int64
			var failed atomic.Int64
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < c; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						t0 := time.Now()
						res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: benchScript})
						lat[i] = time.Since(t0)
						if err != nil || res.Run.Status != loop.StatusCompleted {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d runs did not complete", n)
			}
			commits := float64(rt.Stats().Commits.Load()+int64(b.N)) / float64(b.N) // + CreateRun
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
			b.ReportMetric(commits, "commits/run")
			b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		})
	}
}

// BenchmarkBareBadgerCommit is the baseline: a bare Badger Update with
// SyncWrites on, writing one 1.5 KB value (about a Run snapshot), from c
// concurrent writers.
func BenchmarkBareBadgerCommit(b *testing.B) {
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			db, err := badger.Open(badger.DefaultOptions(b.TempDir()).WithSyncWrites(true).WithLogger(nil))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			val := make([]byte, 1500)
			_, _ = rand.Read(val)
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < c; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						if err := db.Update(func(txn *badger.Txn) error {
							return txn.Set([]byte(fmt.Sprintf("k%d", i)), val)
						}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
		})
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

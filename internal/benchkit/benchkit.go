// Package benchkit holds what the go test benchmarks and `agenthost bench`
// share: a worker pool, latency percentiles, and the bare Badger baseline
// every store figure is a ratio against.
package benchkit

import (
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Parallel runs f(0..n-1) on c goroutines and returns when all are done.
func Parallel(c, n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < max(c, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				f(int(i))
			}
		}()
	}
	wg.Wait()
}

// A level of a bench starts with untimed Runs, DefaultWarmupPerClient
// per client unless a flag says otherwise, at most MaxWarmupRuns.
const (
	DefaultWarmupPerClient = 8
	MaxWarmupRuns          = 1000
)

// WarmupRuns is the untimed Runs that start a level of c clients:
// perClient each, at most MaxWarmupRuns (0 when perClient is).
func WarmupRuns(c, perClient int) int {
	return min(max(c, 1)*max(perClient, 0), MaxWarmupRuns)
}

// WarmUp makes the untimed Runs that start a level of c clients
// (WarmupRuns) with run, on c goroutines, and returns the first error
// one of them met, once all are done.
func WarmUp(c, perClient int, run func() error) error {
	var first atomic.Pointer[error]
	Parallel(c, WarmupRuns(c, perClient), func(int) {
		if err := run(); err != nil {
			first.CompareAndSwap(nil, &err)
		}
	})
	if e := first.Load(); e != nil {
		return *e
	}
	return nil
}

// Percentile is the p-quantile (0 ≤ p ≤ 1) of d by the nearest-rank
// method; 0 for no samples. d is not modified.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

// Latency is a latency distribution's summary.
type Latency struct {
	P50, P95, P99, Max time.Duration
}

// Summarize returns the percentiles of d.
func Summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(int(p*float64(len(s))), len(s)-1)] }
	return Latency{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: s[len(s)-1]}
}

// BareBadger is the store baseline: a bare Badger database with
// SyncWrites on, committing one 1.5 KB value (about a Run snapshot) per
// transaction. Concurrent committers share fsyncs (Badger's group
// commit), so its rate at a concurrency is the most commits per second
// the disk gives any store built on Badger.
type BareBadger struct {
	db    *badger.DB
	val   []byte
	round atomic.Int64
}

// OpenBareBadger opens a fresh database in dir (which should be empty).
func OpenBareBadger(dir string) (*BareBadger, error) {
	db, err := badger.Open(badger.DefaultOptions(dir).WithSyncWrites(true).WithLogger(nil))
	if err != nil {
		return nil, fmt.Errorf("bare badger baseline in %s: %w", dir, err)
	}
	val := make([]byte, 1500)
	_, _ = rand.Read(val)
	return &BareBadger{db: db, val: val}, nil
}

// Round commits n transactions from c concurrent committers and returns
// the time it took.
func (b *BareBadger) Round(c, n int) (time.Duration, error) {
	r := b.round.Add(1)
	var failed atomic.Pointer[error]
	start := time.Now()
	Parallel(c, n, func(i int) {
		if err := b.db.Update(func(txn *badger.Txn) error {
			return txn.Set(fmt.Appendf(nil, "k%d-%d", r, i), b.val)
		}); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	})
	elapsed := time.Since(start)
	if p := failed.Load(); p != nil {
		return elapsed, fmt.Errorf("bare badger commit: %w", *p)
	}
	return elapsed, nil
}

// Close closes the database.
func (b *BareBadger) Close() error { return b.db.Close() }

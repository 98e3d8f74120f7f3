package pgstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// benchDSN is a fresh database for a benchmark: on the shared test server
// (fsync off), or with AGENTHOST_BENCH_FSYNC=1 on a server of its own with
// fsync on, where commits pay for durability as in production.
func benchDSN(b *testing.B) string {
	if os.Getenv("AGENTHOST_BENCH_FSYNC") != "1" {
		return pgserver.NewDatabase(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Stop() })
	return srv.DSN("postgres")
}

// BenchmarkCommit measures Commit: parallel committers, each appending an
// event to a Run of its own (a snapshot rewrite, an event, a command ID).
// Each Run takes b.N/GOMAXPROCS commits, so a commit whose cost grows with
// its Run's length shows at a larger -benchtime (2000x against 40000x):
// the commit's lookup of its command IDs once read every command of the
// Run.
func BenchmarkCommit(b *testing.B) {
	dsn := benchDSN(b)
	s := open(b, dsn, freshSchema(b, dsn), nil)
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := fmt.Sprintf("r%d", next.Add(1))
		r := toExecuting(b, s, newRun(b, s, "t", "s-"+id, id, 1), 0)
		for i := 0; pb.Next(); i++ {
			c := step(b, r, 0, fmt.Sprintf("c%d", i), pendingEvent(r, fmt.Sprintf("h%d", i)))
			if _, err := s.Commit(ctx, c); err != nil {
				b.Fatal(err)
			}
			r = c.Run
		}
	})
}

// BenchmarkBareInsert is the baseline of BenchmarkCommit on the same
// server: parallel one-row INSERT transactions of an event-sized row,
// through a pool of the same size.
func BenchmarkBareInsert(b *testing.B) {
	bare := openBare(b, benchDSN(b))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bare.pool.Exec(ctx, sqlBareInsert, bare.body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRun measures whole Runs at the store: CreateRun, then
// start+plan, dispatch, settle and complete (five transactions; the
// runtime folds start, plan and dispatch into one commit, RATIONALE.md
// "Why does one advance fold start, plan, dispatch and finish into one
// commit?").
func BenchmarkRun(b *testing.B) {
	dsn := benchDSN(b)
	s := open(b, dsn, freshSchema(b, dsn), nil)
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("r%d", next.Add(1))
			r := toExecuting(b, s, newRun(b, s, "t", "s-"+id, id, 1), 0)
			eff := loop.ModelEffectID(id, 1)
			c := step(b, r, 0, loop.SettleCommandID(eff, 1), loop.Settled(eff, 1, loop.Outcome{State: loop.OutcomeDone,
				Model: &abi.ModelOutcome{Message: abi.Message{Content: "4"}}}, 0))
			if _, err := s.Commit(ctx, c); err != nil {
				b.Fatal(err)
			}
			c = step(b, c.Run, 0, "", loop.Event{Type: loop.EventRunCompleted})
			if _, err := s.Commit(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

var _ runtime.Store = (*Store)(nil)

// BenchmarkSubmit measures putting Runs in flight through the runtime on
// pgstore, as `agenthost bench recovery` does before its kill, against
// bare one-row INSERT commits on the same server, in alternating rounds at
// the same concurrency so that a noisy machine's drift hits both alike.
// Each Run has a session of its own and calls one slow job that stays
// pending (the runtime's clock stands still). It reports the submissions'
// acknowledgements (Runtime.Submit's return: the Run is durable) per
// second and their p50 and p99, Runs put in flight (Execute until the Run
// waits on its pending job) per second and their p50, the write
// transactions per Run put in flight (the transaction IDs the server
// assigned: each is a synced commit), and both rates over the bare commit
// rate. A first round, not measured, fills the pools and prepares the
// statements:
//
//	AGENTHOST_BENCH_FSYNC=1 go test -run '^$' -bench Submit -benchtime 4x ./pgstore
func BenchmarkSubmit(b *testing.B) {
	for _, c := range []int{16, 128} {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			benchSubmit(b, c)
		})
	}
}

func benchSubmit(b *testing.B, c int) {
	ctx := context.Background()
	dsn := benchDSN(b)
	clock := conformance.NewFakeClock(time.Time{})
	s, err := Open(ctx, Options{DSN: dsn, Schema: freshSchema(b, dsn), Clock: clock, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tools := &conformance.ScriptedTools{SlowPolls: 1 << 30}
	tenant := &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	for _, tl := range tools.Tools() {
		tenant.Tools = append(tenant.Tools, runtime.Tool{Descriptor: tl, Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: tools})
	}
	rt, err := runtime.New(runtime.Options{Store: s, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quietLogger(), MaxConcurrentCalls: 512})
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer rt.Halt()
	bare := openBare(b, dsn)
	// nextXID is the next transaction ID the server will assign; reading
	// it assigns none.
	nextXID := func() int64 {
		var n int64
		query(b, dsn, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`, &n)
		return n
	}
	idle := func() {
		for !rt.Idle() {
			time.Sleep(time.Millisecond)
		}
	}
	perRound := max(2*c, 64)
	var (
		session                         atomic.Int64
		acks, inflight                  []time.Duration
		ackTime, inflightTime, bareTime time.Duration
		writes                          int64
	)
	const input = `call:slow()|answer:$results`
	for round := range 1 + 3*b.N {
		measured := round > 0
		ack := make([]time.Duration, perRound)
		t0 := time.Now()
		benchkit.Parallel(c, perRound, func(i int) {
			t := time.Now()
			_, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", session.Add(1)), Input: input})
			ack[i] = time.Since(t)
			if err != nil {
				b.Errorf("submit: %v", err)
			}
		})
		d := time.Since(t0)
		idle() // the submitted Runs' drivers are done before the next round
		if measured {
			ackTime += d
			acks = append(acks, ack...)
		}

		fly := make([]time.Duration, perRound)
		x0 := nextXID()
		t0 = time.Now()
		benchkit.Parallel(c, perRound, func(i int) {
			t := time.Now()
			res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", session.Add(1)), Input: input})
			fly[i] = time.Since(t)
			if err == nil && (res.Kind != runtime.ResultWaiting || res.Waiting == nil || len(res.Waiting.Pending) != 1) {
				err = fmt.Errorf("run %s came back %s (status %s), not waiting on its slow job", res.Run.ID, res.Kind, res.Run.Status)
			}
			if err != nil {
				b.Errorf("execute: %v", err)
			}
		})
		d = time.Since(t0)
		idle()
		if measured {
			inflightTime += d
			writes += nextXID() - x0
			inflight = append(inflight, fly...)
		}

		d, err = bare.round(ctx, c, perRound)
		if err != nil {
			b.Fatal(err)
		}
		if measured {
			bareTime += d
		}
		if b.Failed() {
			b.FailNow()
		}
	}
	n := float64(3 * b.N * perRound)
	barePerSec := n / bareTime.Seconds()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(n/ackTime.Seconds(), "acks/s")
	b.ReportMetric(ms(benchkit.Percentile(acks, 0.50)), "ack-p50-ms")
	b.ReportMetric(ms(benchkit.Percentile(acks, 0.99)), "ack-p99-ms")
	b.ReportMetric(n/inflightTime.Seconds(), "inflight/s")
	b.ReportMetric(ms(benchkit.Percentile(inflight, 0.50)), "inflight-p50-ms")
	b.ReportMetric(float64(writes)/n, "writes/run")
	b.ReportMetric(barePerSec, "bare-commits/s")
	b.ReportMetric(n/ackTime.Seconds()/barePerSec, "ack-ratio")
	b.ReportMetric(n/inflightTime.Seconds()/barePerSec, "inflight-ratio")
}

// bareInserts is the baseline of the benchmarks: one-row INSERT
// transactions of an event-sized row through a pool of the store's size.
type bareInserts struct {
	pool *pgxpool.Pool
	body []byte
}

func openBare(b *testing.B, dsn string) *bareInserts {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = DefaultMaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bare (id bigserial PRIMARY KEY, body bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"seq":7,"type":"effect_pending","at":1764590000000,"effect_id":"r1.m1","attempt":1,"handle":"` + strings.Repeat("h", 32) + `"}`)
	return &bareInserts{pool: pool, body: body}
}

const sqlBareInsert = `INSERT INTO bare (body) VALUES ($1)`

// round commits n INSERTs from c goroutines and returns the time taken.
func (bi *bareInserts) round(ctx context.Context, c, n int) (time.Duration, error) {
	var failed atomic.Pointer[error]
	start := time.Now()
	benchkit.Parallel(c, n, func(int) {
		if _, err := bi.pool.Exec(ctx, sqlBareInsert, bi.body); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	})
	d := time.Since(start)
	if p := failed.Load(); p != nil {
		return d, *p
	}
	return d, nil
}

// BenchmarkOneCommitter compares, for one committer on one connection, a
// Run's commit through the store with the bare one-row INSERT that
// `agenthost bench runs` takes as its baseline, each sent back to back
// (as the baseline sends its own) and each after work of the committer's
// own (a busy loop of AGENTHOST_BENCH_WORK, 200µs unless set: about
// what a Run's driver spends at one client between two commits, decoding
// a reply and deciding and encoding the next). The commit appends one
// event (an effect's pending handle) and a command ID to a Run and
// rewrites its snapshot, a lighter commit than most of a Run's; a Run
// takes eight of them (its creation is not timed). The bare INSERT writes
// the baseline's row, 1.5 KB. In alternating rounds of each kind, it
// reports each one's time per call, the WAL each writes per commit, and
// their ratios to the bare INSERT sent back to back: commit/bare is how
// many of those the store's commit costs, work-penalty how many a bare
// INSERT costs after the work. Meaningful with fsync on:
//
//	AGENTHOST_BENCH_FSYNC=1 go test -run '^$' -bench OneCommitter -benchtime 10x ./pgstore
func BenchmarkOneCommitter(b *testing.B) {
	work := 200 * time.Microsecond
	if v := os.Getenv("AGENTHOST_BENCH_WORK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			b.Fatalf("AGENTHOST_BENCH_WORK=%q: want a duration such as 200us", v)
		}
		work = d
	}
	dsn := benchDSN(b)
	s := open(b, dsn, freshSchema(b, dsn), nil)
	bare := openBare(b, dsn)
	ctx := context.Background()
	const perRound, commitsPerRun = 200, 8
	val := make([]byte, 1500) // the row `agenthost bench runs` commits
	_, _ = rand.Read(val)
	var (
		runs []loop.Run
		made int // Runs made so far, for their IDs
	)
	// newRuns makes, untimed, the Runs a round of commits appends to.
	newRuns := func() {
		runs = runs[:0]
		for range perRound / commitsPerRun {
			made++
			id := fmt.Sprintf("r%d", made)
			runs = append(runs, toExecuting(b, s, newRun(b, s, "t", "s-"+id, id, 1), 0))
		}
	}
	commit := func(i int) {
		r := &runs[i/commitsPerRun]
		c := step(b, *r, 0, fmt.Sprintf("c%d", i), pendingEvent(*r, fmt.Sprintf("h%d", i)))
		if _, err := s.Commit(ctx, c); err != nil {
			b.Fatal(err)
		}
		*r = c.Run
	}
	insert := func(int) {
		if _, err := bare.pool.Exec(ctx, sqlBareInsert, val); err != nil {
			b.Fatal(err)
		}
	}
	walAt := func() (lsn int64) {
		if err := bare.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&lsn); err != nil {
			b.Fatal(err)
		}
		return lsn
	}
	kinds := []struct {
		call       func(i int)
		work, runs bool // work before each call; Runs to commit to
	}{{insert, false, false}, {insert, true, false}, {commit, false, true}, {commit, true, true}}
	// Each kind's time in its calls, and the WAL they wrote.
	var (
		spent [4]time.Duration
		wal   [4]int64
	)
	b.ResetTimer()
	for round := range 1 + b.N { // the first round prepares the statements
		for k, kind := range kinds {
			if kind.runs {
				newRuns()
			}
			var d time.Duration
			w0 := walAt()
			for i := range perRound {
				if kind.work {
					for t := time.Now(); time.Since(t) < work; {
					}
				}
				t := time.Now()
				kind.call(i)
				d += time.Since(t)
			}
			if round > 0 {
				spent[k] += d
				wal[k] += walAt() - w0
			}
		}
	}
	n := float64(b.N * perRound)
	us := func(k int) float64 { return float64(spent[k].Microseconds()) / n }
	b.ReportMetric(us(0), "bare-us")
	b.ReportMetric(us(1), "bare-after-work-us")
	b.ReportMetric(us(2), "commit-us")
	b.ReportMetric(us(3), "commit-after-work-us")
	b.ReportMetric(float64(wal[0]+wal[1])/(2*n), "bare-wal-bytes")
	b.ReportMetric(float64(wal[2]+wal[3])/(2*n), "commit-wal-bytes")
	b.ReportMetric(us(2)/us(0), "commit/bare")
	b.ReportMetric(us(1)/us(0), "work-penalty")
	b.ReportMetric(us(3)/us(0), "commit-after-work/bare")
}

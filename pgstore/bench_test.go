package pgstore

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	dsn := benchDSN(b)
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
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bare (id bigserial PRIMARY KEY, body bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"seq":7,"type":"effect_pending","at":1764590000000,"effect_id":"r1.m1","attempt":1,"handle":"` + strings.Repeat("h", 32) + `"}`)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := pool.Exec(ctx, `INSERT INTO bare (body) VALUES ($1)`, body); err != nil {
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

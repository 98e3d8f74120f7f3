package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/pgstore"
)

// storeFlags are the flags of the benches that run on either store.
type storeFlags struct {
	store string // config.DriverBadger or config.DriverPostgres
	dsn   string
}

func (s *storeFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.store, "store", config.DriverBadger, "the store: badger (a fresh directory) or postgres (a throwaway server this bench starts, fsync on, or --dsn)")
	f.StringVar(&s.dsn, "dsn", "", "with --store postgres: the PostgreSQL server to use instead of a throwaway one (a schema of its own, dropped at the end)")
}

func (s *storeFlags) check() error {
	switch s.store {
	case config.DriverBadger:
		if s.dsn != "" {
			return fmt.Errorf("bench: --dsn is for --store postgres")
		}
	case config.DriverPostgres:
	default:
		return fmt.Errorf("bench: --store %q: want badger or postgres", s.store)
	}
	return nil
}

// benchPostgres is the PostgreSQL a bench runs on: a throwaway server
// this process starts with fsync on (pgserver) and stops, or the server
// --dsn names, in a schema of the bench's own that it drops at the end.
type benchPostgres struct {
	dsn     string // the bench's database
	schema  string // the store's schema; the bare baseline's is schema+"_bare"
	version string // the server's version
	own     bool   // this process started the server
	stop    func()
}

// startBenchPostgres gets the bench its PostgreSQL; maxConns is the most
// connections the bench will open at once, for a server it starts.
func startBenchPostgres(ctx context.Context, cmd *cobra.Command, bf *benchFlags, dsn string, maxConns int) (*benchPostgres, error) {
	b := &benchPostgres{schema: pgstore.DefaultSchema}
	if dsn == "" {
		bf.progressf(cmd, "starting a throwaway PostgreSQL server (fsync on)")
		srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true, MaxConnections: maxConns + 20, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, fmt.Errorf("bench: starting PostgreSQL: %w", err)
		}
		if err := srv.CreateDatabase(ctx, "bench"); err != nil {
			_ = srv.Stop()
			return nil, fmt.Errorf("bench: %w", err)
		}
		b.dsn, b.own, b.stop = srv.DSN("bench"), true, func() { _ = srv.Stop() }
	} else {
		var suffix [4]byte
		_, _ = rand.Read(suffix[:])
		b.dsn, b.schema = dsn, "agenthost_bench_"+hex.EncodeToString(suffix[:])
		b.stop = func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgx.Connect(cctx, dsn)
			if err != nil {
				return
			}
			defer conn.Close(cctx)
			for _, s := range []string{b.schema, b.schema + "_bare"} {
				_, _ = conn.Exec(cctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE")
			}
		}
	}
	v, err := PostgresVersion(ctx, b.dsn)
	if err != nil {
		b.stop()
		if !b.own {
			return nil, fmt.Errorf("bench: --dsn: %w", err)
		}
		return nil, err
	}
	b.version = v
	return b, nil
}

// PostgresVersion is the version number of the server dsn names: "15.18"
// of "15.18 (Debian 15.18-0+deb12u1)".
func PostgresVersion(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("bench: PostgreSQL %s: %s", pgstore.RedactDSN(dsn), pgstore.RedactError(err, dsn))
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", fmt.Errorf("bench: PostgreSQL: %w", err)
	}
	if f := strings.Fields(v); len(f) > 0 {
		v = f[0]
	}
	return v, nil
}

// where names the server for the bench's notes.
func (b *benchPostgres) where() string {
	if b.own {
		return "PostgreSQL " + b.version + " (a throwaway server on a Unix socket, fsync on)"
	}
	return "PostgreSQL " + b.version + " at " + pgstore.RedactDSN(b.dsn)
}

// storeYAML is the store section of a bench config on this server.
func (b *benchPostgres) storeYAML() string {
	return "store: {driver: postgres, dsn: " + strconv.Quote(b.dsn) + ", postgres: {schema: " + b.schema + "}}\n"
}

// bareRounds is the baseline of `bench runs` and `bench http`: rounds of
// bare commits at a concurrency.
type bareRounds interface {
	Round(c, n int) (time.Duration, error)
	Close() error
}

var _ bareRounds = (*benchkit.BareBadger)(nil)

// barePostgres is the baseline on PostgreSQL: one-row INSERT transactions
// (synchronous_commit on, a 1.5 KB value, as the bare Badger baseline
// writes) from c concurrent connections. Concurrent committers share WAL
// flushes, so its rate at a concurrency is the most commits per second
// this server gives any store built on it.
type barePostgres struct {
	pool  *pgxpool.Pool
	table string
	val   []byte
}

var _ bareRounds = (*barePostgres)(nil)

// openBarePostgres makes the baseline's table in schema and opens
// maxConns connections to it.
func openBarePostgres(ctx context.Context, dsn, schema string, maxConns int) (*barePostgres, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bare PostgreSQL baseline: %s", pgstore.RedactError(err, dsn))
	}
	cfg.MaxConns, cfg.MinConns = int32(maxConns), 0
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	cfg.ConnConfig.RuntimeParams["application_name"] = "agenthost-bench-bare"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bare PostgreSQL baseline: %s", pgstore.RedactError(err, dsn))
	}
	b := &barePostgres{pool: pool, table: schema + ".bare", val: make([]byte, 1500)}
	_, _ = rand.Read(b.val)
	for _, q := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + schema,
		"CREATE TABLE IF NOT EXISTS " + b.table + " (id bigserial PRIMARY KEY, v bytea NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("bare PostgreSQL baseline: %w", err)
		}
	}
	// Open every connection now, so that no round pays for the dials.
	if _, err := b.Round(maxConns, maxConns); err != nil {
		pool.Close()
		return nil, err
	}
	return b, nil
}

// Round commits n one-row INSERT transactions from c concurrent
// connections and returns the time it took.
func (b *barePostgres) Round(c, n int) (time.Duration, error) {
	var failed atomic.Pointer[error]
	q := "INSERT INTO " + b.table + " (v) VALUES ($1)"
	start := time.Now()
	benchkit.Parallel(c, n, func(int) {
		if _, err := b.pool.Exec(context.Background(), q, b.val); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	})
	elapsed := time.Since(start)
	if p := failed.Load(); p != nil {
		return elapsed, fmt.Errorf("bare PostgreSQL commit: %w", *p)
	}
	return elapsed, nil
}

// Close closes the connections.
func (b *barePostgres) Close() error {
	b.pool.Close()
	return nil
}

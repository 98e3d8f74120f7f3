package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
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
	// srv is the server this process started (nil for --dsn): the bench
	// reads its CPU time.
	srv *pgserver.Server
	// stmts reads pg_stat_statements, where the server has it (nil
	// otherwise).
	stmts *pgx.Conn
}

// startBenchPostgres gets the bench its PostgreSQL; maxConns is the most
// connections the bench will open at once, for a server it starts.
func startBenchPostgres(ctx context.Context, cmd *cobra.Command, bf *benchFlags, dsn string, maxConns int) (*benchPostgres, error) {
	b := &benchPostgres{schema: pgstore.DefaultSchema}
	if dsn == "" {
		bf.progressf(cmd, "starting a throwaway PostgreSQL server (fsync on)")
		srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true, MaxConnections: maxConns + 20, TrackStatements: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, fmt.Errorf("bench: starting PostgreSQL: %w", err)
		}
		if err := srv.CreateDatabase(ctx, "bench"); err != nil {
			_ = srv.Stop()
			return nil, fmt.Errorf("bench: %w", err)
		}
		b.dsn, b.own, b.srv, b.stop = srv.DSN("bench"), true, srv, func() { _ = srv.Stop() }
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
	b.openStatements(ctx)
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

// openStatements opens the connection that reads pg_stat_statements, if
// the server has it: the server the bench starts loads it, and the bench
// creates the extension there; on the server --dsn names, the bench uses
// it if the database has it already, and creates nothing. Without it the
// bench reports no statement counts.
func (b *benchPostgres) openStatements(ctx context.Context) {
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return
	}
	if b.own {
		_, err = conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	}
	if err == nil {
		_, err = b.readStatements(ctx, conn)
	}
	if err != nil {
		_ = conn.Close(ctx)
		return
	}
	b.stmts = conn
	stop := b.stop
	b.stop = func() { _ = conn.Close(context.Background()); stop() }
}

// serverCounts is what the server has done so far: the statements it
// executed, by normalized statement text (pg_stat_statements; nil where
// there is none), and its CPU time (-1 where it is not known).
type serverCounts struct {
	stmts map[string]int64
	cpu   time.Duration
}

// counts reads the server's counts now.
func (b *benchPostgres) counts(ctx context.Context) (serverCounts, error) {
	c := serverCounts{cpu: -1}
	if b.srv != nil {
		var err error
		if c.cpu, err = b.srv.CPUTime(); err != nil {
			return c, fmt.Errorf("bench: PostgreSQL's CPU time: %w", err)
		}
	}
	if b.stmts != nil {
		var err error
		if c.stmts, err = b.readStatements(ctx, b.stmts); err != nil {
			return c, fmt.Errorf("bench: reading pg_stat_statements: %w", err)
		}
	}
	return c, nil
}

// readStatements reads the calls of each statement of the bench's
// database, but for the reads of pg_stat_statements itself.
func (b *benchPostgres) readStatements(ctx context.Context, conn *pgx.Conn) (map[string]int64, error) {
	rows, err := conn.Query(ctx, `SELECT query, sum(calls)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND query NOT LIKE '%pg_stat_statements%'
		GROUP BY query`)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var (
			q string
			n int64
		)
		if err := rows.Scan(&q, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[q] += n
	}
	return out, rows.Err()
}

// serverSpent is what the server did between pairs of counts: its
// statements by text (nil: not known) and its CPU time.
type serverSpent struct {
	stmts    map[string]int64
	cpu      time.Duration
	cpuKnown bool
}

// add adds the difference between counts c0 and c1 to sp.
func (sp *serverSpent) add(c0, c1 serverCounts) {
	if c0.cpu >= 0 && c1.cpu >= 0 {
		sp.cpu += c1.cpu - c0.cpu
		sp.cpuKnown = true
	}
	if c0.stmts == nil || c1.stmts == nil {
		return
	}
	if sp.stmts == nil {
		sp.stmts = map[string]int64{}
	}
	for q, n := range c1.stmts {
		if d := n - c0.stmts[q]; d > 0 {
			sp.stmts[q] += d
		}
	}
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

// measure runs work between two counts of the server, added to sp; with
// pg nil (the store is Badger) it just runs work.
func (b *benchPostgres) measure(ctx context.Context, sp *serverSpent, work func() error) error {
	if b == nil {
		return work()
	}
	c0, err := b.counts(ctx)
	if err != nil {
		return err
	}
	if err := work(); err != nil {
		return err
	}
	c1, err := b.counts(ctx)
	if err != nil {
		return err
	}
	sp.add(c0, c1)
	return nil
}

// statementCount is how many times a statement ran, per Run.
type statementCount struct {
	Statement string  `json:"statement"`
	PerRun    float64 `json:"per_run"`
}

// maxStatementText bounds a statement's text in the bench's output.
const maxStatementText = 160

// perRun sets the level's server figures from what the server spent on
// its Runs (sp) and on its bare commits (bare).
func (sp *serverSpent) perRun(lvl *runsLevel, bare serverSpent, bareCommits int) {
	lvl.StatementsPerRun, lvl.Statements, lvl.ServerCPUMsPerRun = sp.perRunFigures(float64(lvl.Runs))
	if bare.cpuKnown && bareCommits > 0 {
		lvl.BareServerCPUMsPerCommit = float64(bare.cpu) / float64(time.Millisecond) / float64(bareCommits)
	}
}

// perRunFigures returns what the server spent per Run: the statements it
// executed, in all and by statement, most first, and its CPU time in ms;
// 0 (and nil) for what is not known.
func (sp *serverSpent) perRunFigures(runs float64) (stmtsPerRun float64, stmts []statementCount, cpuMsPerRun float64) {
	if runs <= 0 {
		return 0, nil, 0
	}
	if sp.cpuKnown {
		cpuMsPerRun = float64(sp.cpu) / float64(time.Millisecond) / runs
	}
	if sp.stmts == nil {
		return 0, nil, cpuMsPerRun
	}
	var (
		total int64
		out   []statementCount
	)
	for q, n := range sp.stmts {
		total += n
		text := strings.Join(strings.Fields(q), " ")
		if len(text) > maxStatementText {
			text = text[:maxStatementText] + "…"
		}
		out = append(out, statementCount{Statement: text, PerRun: float64(n) / runs})
	}
	slices.SortFunc(out, func(a, b statementCount) int {
		if c := cmp.Compare(b.PerRun, a.PerRun); c != 0 {
			return c
		}
		return strings.Compare(a.Statement, b.Statement)
	})
	return float64(total) / runs, out, cpuMsPerRun
}

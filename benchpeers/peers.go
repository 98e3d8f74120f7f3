package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/internal/bench"
	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/pgserver"
)

// The systems compared, by their --systems names.
const (
	sysInProcess = "in-process" // agenthost, the Go twins of the plugins
	sysWasm      = "wasm"       // agenthost, the default Wasm plugins
	sysDBOS      = "dbos"       // DBOS Transact
)

var allSystems = []string{sysInProcess, sysWasm, sysDBOS}

// systemTitles name the systems in the tables.
var systemTitles = map[string]string{
	sysInProcess: "agenthost in-process",
	sysWasm:      "agenthost Wasm",
	sysDBOS:      "DBOS",
}

// params are the comparison's parameters, as --json reports them.
type params struct {
	Runs        int   `json:"runs"`
	Concurrency []int `json:"concurrency"`
	Rounds      int   `json:"rounds"`
	// Warmup is the untimed Runs per client each system runs at the
	// start of a level (benchkit.WarmupRuns).
	Warmup   int      `json:"warmup_per_client"`
	Systems  []string `json:"systems"`
	PoolSize int      `json:"pool_size"`
	// Guests is the build of agenthost's Wasm plugins: c (the C builds
	// where there are, from make plugins-c; the default) or go (make
	// plugins).
	Guests string `json:"guests"`
	// MaxConns is each system's working connections: pgstore's pool (its
	// change feed holds 2 more) and DBOS's pool less the one its
	// notification listener holds.
	MaxConns   int    `json:"max_conns"`
	PostgreSQL string `json:"postgresql"`
	DBOS       string `json:"dbos"`

	plugins, cacheDir, workDir string
	quiet, json                bool
}

// level is one system's figures at one concurrency, over all its rounds.
type level struct {
	System      string  `json:"system"`
	Concurrency int     `json:"concurrency"`
	Runs        int     `json:"runs"`
	Seconds     float64 `json:"seconds"`
	RunsPerSec  float64 `json:"runs_per_sec"`
	// RoundRunsPerSec is the Runs/s of each of its rounds, in order.
	RoundRunsPerSec []float64 `json:"round_runs_per_sec"`
	P50ms           float64   `json:"p50_ms"`
	P95ms           float64   `json:"p95_ms"`
	P99ms           float64   `json:"p99_ms"`
	// ServerCPUMsPerRun is the PostgreSQL server's CPU (all its processes,
	// user and system) during the system's rounds, per Run;
	// BenchCPUMsPerRun is this process's, where the system runs.
	ServerCPUMsPerRun float64 `json:"server_cpu_ms_per_run"`
	BenchCPUMsPerRun  float64 `json:"bench_cpu_ms_per_run"`
	// WriteTxPerRun is the transactions that wrote (took a transaction
	// ID) per Run, and WALKBPerRun the WAL they wrote, in kB.
	WriteTxPerRun float64 `json:"write_tx_per_run"`
	WALKBPerRun   float64 `json:"wal_kb_per_run"`
}

// ratio is an agenthost level over DBOS's at the same concurrency,
// measured in the same rounds.
type ratio struct {
	System      string `json:"system"`
	Concurrency int    `json:"concurrency"`
	// RunsPerSec > 1: agenthost is faster; P50 and ServerCPUPerRun < 1:
	// agenthost is quicker, and costs PostgreSQL less. 0: DBOS's figure
	// was 0, too small to measure (over), and there is no ratio.
	RunsPerSec      float64 `json:"runs_per_sec"`
	P50             float64 `json:"p50"`
	ServerCPUPerRun float64 `json:"server_cpu_per_run"`
	// RoundRunsPerSecMin and Max are the least and the greatest Runs/s
	// ratio of one round of agenthost to DBOS's round of the same index,
	// next to it in time: how much the machine's noise moves a ratio that
	// RunsPerSec gives over all the rounds. 0 when a round gives none.
	RoundRunsPerSecMin float64 `json:"round_runs_per_sec_min"`
	RoundRunsPerSecMax float64 `json:"round_runs_per_sec_max"`
}

type result struct {
	Levels []level `json:"levels"`
	Ratios []ratio `json:"ratios,omitempty"`
}

// system is one system under measure: run runs one Run and returns its
// latency.
type system struct {
	name  string
	run   func() (time.Duration, error)
	close func()
}

// startServer starts the throwaway PostgreSQL server (fsync on) that
// allows maxConnections, and creates the database the systems share; it
// returns the server and that database's DSN.
func startServer(ctx context.Context, maxConnections int) (*pgserver.Server, string, error) {
	srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true, MaxConnections: maxConnections,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, "", fmt.Errorf("benchpeers: starting PostgreSQL: %w", err)
	}
	if err := srv.CreateDatabase(ctx, "bench"); err != nil {
		_ = srv.Stop()
		return nil, "", fmt.Errorf("benchpeers: %w", err)
	}
	return srv, srv.DSN("bench"), nil
}

// compare starts the throwaway PostgreSQL server, opens the systems on it
// and measures them in alternating rounds at every concurrency; it
// prints the result on w, and its progress on log.
func compare(ctx context.Context, w, log io.Writer, p *params) error {
	started := time.Now()
	progress := func(format string, args ...any) {
		if !p.quiet {
			fmt.Fprintf(log, "benchpeers: "+format+"\n", args...)
		}
	}
	maxConc := slices.Max(p.Concurrency)
	progress("starting a throwaway PostgreSQL server (fsync on)")
	srv, dsn, err := startServer(ctx, len(p.Systems)*(p.MaxConns+2)+maxConc+20)
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop() }()
	if p.PostgreSQL, err = bench.PostgresVersion(ctx, dsn); err != nil {
		return err
	}
	p.DBOS = moduleVersion("github.com/dbos-inc/dbos-transact-golang")

	var systems []system
	defer func() {
		for _, s := range systems {
			s.close()
		}
	}()
	for _, name := range p.Systems {
		progress("opening %s", systemTitles[name])
		s, err := openSystem(ctx, name, dsn, p)
		if err != nil {
			return err
		}
		systems = append(systems, s)
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("benchpeers: PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	meter := &serverMeter{srv: srv, conn: conn}
	var res result
	for _, c := range p.Concurrency {
		progress("concurrency %d: %d Runs a system in %d rounds, the systems in turn", c, p.Runs, p.Rounds)
		lvls, err := measureLevel(ctx, meter, p, c, systems)
		if err != nil {
			return err
		}
		res.Levels = append(res.Levels, lvls...)
	}
	res.Ratios = ratios(res.Levels)
	tables := []bench.Table{levelsTable(p, res.Levels)}
	if len(res.Ratios) > 0 { // DBOS ran, and agenthost
		tables = append(tables, ratiosTable(res.Ratios))
	}
	return bench.Emit(w, p.json, "(this checkout)", "peers", started, p, res, tables...)
}

// openSystem opens one system on the database dsn names.
func openSystem(ctx context.Context, name, dsn string, p *params) (system, error) {
	switch name {
	case sysInProcess, sysWasm:
		t, err := bench.OpenRunsTarget(ctx, bench.RunsTargetOptions{DSN: dsn, Schema: "agenthost_" + strings.ReplaceAll(name, "-", "_"),
			InProcess: name == sysInProcess, Plugins: p.plugins, CacheDir: p.cacheDir, WorkDir: p.workDir, PoolSize: p.PoolSize, MaxConns: p.MaxConns,
			Guests: p.Guests})
		if err != nil {
			return system{}, err
		}
		return system{name: name, run: t.Run, close: t.Close}, nil
	case sysDBOS:
		d, err := openDBOS(ctx, dsn, p.MaxConns+1)
		if err != nil {
			return system{}, err
		}
		return system{name: name, run: d.Run, close: d.Close}, nil
	}
	return system{}, fmt.Errorf("benchpeers: no system %q", name)
}

// acc is what one system's rounds of a level have summed so far.
type acc struct {
	lat                         []time.Duration
	runTime, serverCPU, selfCPU time.Duration
	writeTx, walBytes           int64
	roundRate                   []float64 // Runs/s of each round
}

// serverMeter reads what the server has done so far: its CPU time, the
// transaction IDs it has handed out (one for each transaction that
// wrote) and the WAL it has written.
type serverMeter struct {
	srv  *pgserver.Server
	conn *pgx.Conn
}

type serverSample struct {
	cpu          time.Duration
	nextXID, wal int64
}

func (m *serverMeter) read(ctx context.Context) (serverSample, error) {
	var s serverSample
	// Neither function takes a transaction ID, nor writes WAL.
	err := m.conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").
		Scan(&s.nextXID, &s.wal)
	if err != nil {
		return s, fmt.Errorf("benchpeers: reading the server's counters: %w", err)
	}
	s.cpu, err = m.srv.CPUTime()
	return s, err
}

// measureLevel runs every system's Runs at concurrency c in p.Rounds
// rounds; each round runs the systems one after the other, in an order
// that rotates with the round, so that a noisy machine's drift hits them
// alike. Around each system's part of a round it reads the server's CPU
// time and counters and this process's CPU time.
func measureLevel(ctx context.Context, meter *serverMeter, p *params, c int, systems []system) ([]level, error) {
	if err := warmUp(c, p.Warmup, systems); err != nil {
		return nil, err
	}
	accs := make([]acc, len(systems))
	for r := 0; r < p.Rounds; r++ {
		n := p.Runs / p.Rounds
		if r < p.Runs%p.Rounds {
			n++
		}
		for i := range systems {
			k := (i + r) % len(systems)
			s, a := systems[k], &accs[k]
			lat := make([]time.Duration, n)
			var failed atomic.Pointer[error]
			server0, err := meter.read(ctx)
			if err != nil {
				return nil, err
			}
			self0 := selfCPUTime()
			t0 := time.Now()
			benchkit.Parallel(c, n, func(i int) {
				d, err := s.run()
				lat[i] = d
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			})
			took := time.Since(t0)
			a.runTime += took
			a.roundRate = append(a.roundRate, float64(n)/took.Seconds())
			a.selfCPU += selfCPUTime() - self0
			server1, err := meter.read(ctx)
			if err != nil {
				return nil, err
			}
			a.serverCPU += server1.cpu - server0.cpu
			a.writeTx += server1.nextXID - server0.nextXID
			a.walBytes += server1.wal - server0.wal
			if e := failed.Load(); e != nil {
				return nil, fmt.Errorf("benchpeers: %s, concurrency %d: %w", systemTitles[s.name], c, *e)
			}
			a.lat = append(a.lat, lat...)
		}
	}
	out := make([]level, len(systems))
	for k, a := range accs {
		runs := float64(len(a.lat))
		l := benchkit.Summarize(a.lat)
		out[k] = level{System: systems[k].name, Concurrency: c, Runs: len(a.lat), Seconds: a.runTime.Seconds(),
			RunsPerSec: runs / a.runTime.Seconds(), RoundRunsPerSec: a.roundRate, P50ms: ms(l.P50), P95ms: ms(l.P95), P99ms: ms(l.P99),
			ServerCPUMsPerRun: ms(a.serverCPU) / runs, BenchCPUMsPerRun: ms(a.selfCPU) / runs,
			WriteTxPerRun: float64(a.writeTx) / runs, WALKBPerRun: float64(a.walBytes) / 1000 / runs}
	}
	return out, nil
}

// warmUp runs the untimed start of a level at concurrency c: each system
// runs benchkit.WarmupRuns Runs, so that what a level with more clients
// than the one before costs at first (connections opened, statements
// prepared and planned on each, plugin instances made) falls outside
// the timed rounds, for every system alike.
func warmUp(c, perClient int, systems []system) error {
	for _, s := range systems {
		if err := benchkit.WarmUp(c, perClient, func() error { _, err := s.run(); return err }); err != nil {
			return fmt.Errorf("benchpeers: %s, concurrency %d, warming up: %w", systemTitles[s.name], c, err)
		}
	}
	return nil
}

// over is a ÷ d, or 0 when d is 0: a figure too small to be measured (the
// server's CPU, read in clock ticks of 10 ms, over a few Runs) gives no
// ratio, rather than an infinite one, which JSON cannot carry.
func over(a, d float64) float64 {
	if d == 0 {
		return 0
	}
	return a / d
}

// ratios are the agenthost levels over DBOS's at the same concurrency.
func ratios(levels []level) []ratio {
	var out []ratio
	for _, d := range levels {
		if d.System != sysDBOS {
			continue
		}
		for _, a := range levels {
			if a.System == sysDBOS || a.Concurrency != d.Concurrency {
				continue
			}
			r := ratio{System: a.System, Concurrency: a.Concurrency, RunsPerSec: over(a.RunsPerSec, d.RunsPerSec),
				P50: over(a.P50ms, d.P50ms), ServerCPUPerRun: over(a.ServerCPUMsPerRun, d.ServerCPUMsPerRun)}
			for i := range min(len(a.RoundRunsPerSec), len(d.RoundRunsPerSec)) {
				x := over(a.RoundRunsPerSec[i], d.RoundRunsPerSec[i])
				if x == 0 {
					r.RoundRunsPerSecMin, r.RoundRunsPerSecMax = 0, 0
					break
				}
				if r.RoundRunsPerSecMin == 0 || x < r.RoundRunsPerSecMin {
					r.RoundRunsPerSecMin = x
				}
				r.RoundRunsPerSecMax = max(r.RoundRunsPerSecMax, x)
			}
			out = append(out, r)
		}
	}
	return out
}

func levelsTable(p *params, levels []level) bench.Table {
	t := bench.Table{
		Title: fmt.Sprintf("Durable Runs, agenthost and DBOS %s in alternating rounds (PostgreSQL %s, a throwaway server on a Unix socket, fsync on)",
			p.DBOS, p.PostgreSQL),
		Header: []string{"clients", "system", "Runs", "Runs/s", "p50 ms", "p95 ms", "p99 ms", "PG CPU ms/Run", "bench CPU ms/Run", "write tx/Run", "WAL kB/Run"},
	}
	for _, l := range levels {
		t.Rows = append(t.Rows, []string{strconv.Itoa(l.Concurrency), systemTitles[l.System], strconv.Itoa(l.Runs),
			fmt.Sprintf("%.0f", l.RunsPerSec), fmt.Sprintf("%.1f", l.P50ms), fmt.Sprintf("%.1f", l.P95ms), fmt.Sprintf("%.1f", l.P99ms),
			fmt.Sprintf("%.2f", l.ServerCPUMsPerRun), fmt.Sprintf("%.2f", l.BenchCPUMsPerRun),
			fmt.Sprintf("%.2f", l.WriteTxPerRun), fmt.Sprintf("%.1f", l.WALKBPerRun)})
	}
	t.Notes = []string{
		"A Run: a model step, two tool steps in parallel, a model step, each result committed before the next step acts (agenthost: CreateRun, which writes a new session's first step with its Run, and 3 or 4 commits, the two tool results sharing one when they arrive together; DBOS: the workflow's status, 4 steps, its result).",
		"agenthost Wasm: prompt-builder, scripted-model and calculator, " + bench.GuestsTitle(p.Guests) + " (--guests); in-process: their Go twins, in this process.",
		fmt.Sprintf("Each level starts untimed: every system runs %d Runs per client (--warmup; at most %d), so that what more clients cost at first (connections opened, statements prepared and planned on each, plugin instances) is not timed.", p.Warmup, benchkit.MaxWarmupRuns),
		"PG CPU: the server's processes (backends, WAL writer, checkpointer…), user and system, during the system's rounds; bench CPU: this process's, where the system runs.",
		"write tx: transaction IDs the server handed out (transactions that wrote); WAL: the bytes of WAL written. Idle systems' background work (leases, pollers) falls into the others' rounds.",
		fmt.Sprintf("Each system has %d working connections (pgstore's pool; DBOS's pool less its listener's); agenthost's plugins have pool_size %d.", p.MaxConns, p.PoolSize),
	}
	return t
}

func ratiosTable(rs []ratio) bench.Table {
	t := bench.Table{Title: "agenthost ÷ DBOS (same rounds)", Header: []string{"clients", "agenthost", "Runs/s", "p50", "PG CPU/Run", "Runs/s, round by round"}}
	for _, r := range rs {
		byRound := "n/a"
		if r.RoundRunsPerSecMin > 0 {
			byRound = fmt.Sprintf("%.2f–%.2f", r.RoundRunsPerSecMin, r.RoundRunsPerSecMax)
		}
		t.Rows = append(t.Rows, []string{strconv.Itoa(r.Concurrency), systemTitles[r.System],
			ratioCell(r.RunsPerSec), ratioCell(r.P50), ratioCell(r.ServerCPUPerRun), byRound})
	}
	t.Notes = []string{
		"Runs/s > 1: agenthost is faster; p50 and PG CPU/Run < 1: agenthost is quicker, and costs PostgreSQL less; n/a: DBOS's figure was too small to measure (the server's CPU is read in 10 ms ticks).",
		"Runs/s, round by round: the least and the greatest ratio of one agenthost round to the DBOS round of the same index, next to it in time; the spread is the machine's noise, which the ratio over all rounds averages (more --runs and --rounds narrow it).",
	}
	return t
}

// ratioCell formats a ratio, n/a for none (over).
func ratioCell(r float64) string {
	if r == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", r)
}

// selfCPUTime is this process's CPU time so far, user and system.
func selfCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// moduleVersion is the version of module path this binary was built
// with.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}

// ms is a duration in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

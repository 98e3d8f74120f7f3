package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/plugincatalog"
)

// What the peer bench (benchpeers, a module of its own so that no peer
// system is ever a dependency of agenthost) takes from this package: the
// runtime `bench runs --store postgres` drives, opened and driven the
// same way, so that the agenthost side of the comparison is measured
// exactly as `bench runs` measures it, and the way the benches print.

// BenchQuestion is the question every Run of `bench runs` answers, and
// BenchAnswer its answer: 2 model steps, 2 calculate calls between them.
const (
	BenchQuestion = benchQuestion
	BenchAnswer   = benchAnswer
)

// RunsTargetOptions say how OpenRunsTarget wires its runtime.
type RunsTargetOptions struct {
	// DSN names the PostgreSQL database pgstore commits to, in Schema.
	DSN    string
	Schema string
	// InProcess runs the Go twins of the three plugins (`bench runs
	// --in-process`); otherwise the Wasm plugins (Guests' build) under
	// Plugins, on the default plugin_call_path, compiled through CacheDir
	// ("" compiles them afresh).
	InProcess bool
	Plugins   string
	CacheDir  string
	// Guests is the build of the Wasm plugins, as `bench runs --guests`:
	// c ("" too: the C builds where there are, from make plugins-c) or
	// go; see CheckGuests.
	Guests string
	// WorkDir is where the runtime's config goes (a fresh directory in
	// it, removed by Close); "" is the system's temporary directory.
	WorkDir string
	// MaxConns is store.postgres.max_conns, pgstore's pool (its change
	// feed holds 2 more connections); 0 takes pgstore's default.
	MaxConns int
	// PoolSize is each plugin's pool_size (`bench runs --pool-size`); 0
	// takes the bench's default, 4.
	PoolSize int
}

// RunsTarget is a runtime as `bench runs --store postgres` opens it, one
// tenant of the three plugins on pgstore, ready for Runs.
type RunsTarget struct {
	target  levelTarget
	closeRT func()
	cleanup func()
}

// OpenRunsTarget opens a runtime with the config `bench runs` writes and
// runs one Run on it, which checks the plugins and warms their pools.
func OpenRunsTarget(ctx context.Context, o RunsTargetOptions) (*RunsTarget, error) {
	if o.PoolSize == 0 {
		o.PoolSize = 4
	}
	if o.Guests == "" {
		o.Guests = string(plugincatalog.DefaultGuests)
	}
	if err := CheckGuests(o.Guests); err != nil {
		return nil, err
	}
	bf := &benchFlags{quiet: true, plugins: o.Plugins, cacheDir: o.CacheDir, workDir: o.WorkDir}
	p := &runsParams{Runs: 1, Rounds: 1, PoolSize: o.PoolSize, Question: benchQuestion, SyncWrites: true,
		Store: config.DriverPostgres, InProcess: o.InProcess, Guests: o.Guests}
	dir, cleanup, err := bf.tempDir("peers")
	if err != nil {
		return nil, err
	}
	store := "store: {driver: postgres, dsn: " + strconv.Quote(o.DSN) + ", postgres: {schema: " + o.Schema
	if o.MaxConns > 0 {
		store += ", max_conns: " + strconv.Itoa(o.MaxConns)
	}
	store += "}}\n"
	var session atomic.Int64
	// Progress is off (quiet), so the command only stands in.
	t, closeRT, err := openRunsTarget(ctx, &cobra.Command{}, bf, p, dir, store, config.PluginCallNative, &session)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("agenthost (in-process %t): %w", o.InProcess, err)
	}
	return &RunsTarget{target: t, closeRT: closeRT, cleanup: cleanup}, nil
}

// Run runs one Run to its end and checks it answered as the bench
// expects; it returns the Run's latency, submit to completion.
func (t *RunsTarget) Run() (time.Duration, error) { return t.target.one() }

// Close stops the runtime and removes its directory.
func (t *RunsTarget) Close() {
	t.closeRT()
	t.cleanup()
}

// Table is a bench's human-readable result: a title, a header, rows and
// notes under it.
type Table = table

// Emit prints a bench's result as `agenthost bench` prints its own: as
// JSON (asJSON), bench, started, the machine, params and result; or
// else a heading and the tables. version is the agenthost version the
// result names.
func Emit(w io.Writer, asJSON bool, version, bench string, started time.Time, params, result any, tables ...Table) error {
	bf := &benchFlags{version: version, json: asJSON}
	return bf.emit(w, benchOutput{Bench: bench, Started: started, Machine: bf.thisMachine(), Params: params, Result: result}, tables...)
}

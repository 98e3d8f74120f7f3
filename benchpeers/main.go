// Command benchpeers measures agenthost against a peer durable-execution
// system, DBOS Transact, on the Run of `agenthost bench runs`: a model
// step, two tool steps in parallel, a model step, each result committed
// before the next step acts. It starts one throwaway PostgreSQL server
// (fsync on, as `bench runs --store postgres` starts it), opens agenthost
// with its in-process plugins, agenthost with its Wasm plugins and DBOS
// on it, each in a schema of its own, runs them in alternating rounds at
// each concurrency, and prints Runs/s, latency, the server's CPU per Run
// and agenthost's ratios to DBOS.
//
// Its recovery command (recovery.go) compares the two on a restart after
// kill -9 with Runs in flight on slow jobs: agenthost's `bench recovery
// --store postgres` against DBOS's recovery of its pending workflows at
// Launch, on one throwaway server, in alternating rounds.
//
// It is a module of its own (go.mod here) so that DBOS is never a
// dependency of agenthost; `make bench-peers` runs it. The agenthost side
// is opened and driven by internal/bench, as `bench runs` drives it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agenthost/agenthost/internal/bench"
	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/pgstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := newCommand().ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	p := &params{}
	var conc, systems string
	cmd := &cobra.Command{
		Use:   "benchpeers",
		Short: "agenthost against DBOS Transact, same Runs, same PostgreSQL, alternating rounds",
		Long: `benchpeers runs the Run of agenthost bench runs (a model step, two tool steps in
parallel, a model step, each result committed before the next acts) on
agenthost with its in-process plugins, on agenthost with its Wasm plugins
and on DBOS Transact, all on one throwaway PostgreSQL server it starts
(fsync, full_page_writes and synchronous_commit on, shared_buffers 64 MB,
a Unix socket) and stops. At each concurrency it runs --runs Runs a system
in --rounds rounds, the systems in turn in an order that rotates with the
round, and reports each system's Runs/s, latency, and the server's CPU
(all its processes) per Run, and agenthost's ratios to DBOS.

The Wasm plugins are make plugins-c's C builds, which make run loads, or
with --guests go make plugins' Go builds (--plugins); docs/BENCHMARKS.md
gives the figures and what each system does per Run that the other does
not.`,
		Example: `  make bench-peers
  go run . --runs 300 --rounds 3 --concurrency 1,16
  go run . --systems in-process,dbos --concurrency 16 --json
  go run . --systems wasm,dbos --guests go    # the Go builds of the plugins
  go run . recovery --runs 200 --job-seconds 5    # kill -9 and recovery: benchpeers recovery --help`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(conc, systems); err != nil {
				return err
			}
			return compare(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), p)
		},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.AddCommand(newRecoveryCommand(), newDBOSChildCommand())
	f := cmd.Flags()
	f.IntVarP(&p.Runs, "runs", "n", 300, "Runs a system per concurrency level")
	f.IntVar(&p.Rounds, "rounds", 3, "rounds per level, each running Runs/rounds Runs on every system in turn")
	f.IntVar(&p.Warmup, "warmup", benchkit.DefaultWarmupPerClient, "untimed Runs per client (at most "+strconv.Itoa(benchkit.MaxWarmupRuns)+" a level) that each system runs at the start of each level: fresh connections, their prepared statements and plans, and plugin instances are made there, not in the first timed round; 0 for none")
	f.StringVar(&conc, "concurrency", "1,16", "comma-separated numbers of concurrent clients, one level each (also --clients)")
	f.StringVar(&systems, "systems", strings.Join(allSystems, ","), "the systems to run, comma-separated: in-process (agenthost, Go twins of the plugins), wasm (agenthost, the Wasm plugins), dbos")
	f.StringVar(&p.Guests, "guests", string(plugincatalog.DefaultGuests), "which `BUILD` of the example plugins agenthost Wasm loads: c (make plugins-c: the C builds, which make run loads: prompt-builder, scripted-model, calculator) or go (make plugins: their Go builds)")
	f.IntVar(&p.PoolSize, "pool-size", 4, "instances per agenthost plugin kept warm (the config's plugins.ID.pool_size), as bench runs")
	f.IntVar(&p.MaxConns, "max-conns", pgstore.DefaultMaxConns, "working PostgreSQL connections a system may hold: pgstore's pool (its change feed holds 2 more), DBOS's pool less its listener's")
	f.StringVar(&p.plugins, "plugins", "../build/plugins", "the `DIR` that make plugins builds the plugins into")
	f.StringVar(&p.cacheDir, "cache-dir", "../.cache/wazero", "the wazero compilation cache (\"\" for none)")
	f.StringVar(&p.workDir, "work-dir", "", "where the agenthost configs go (default: the system's temp dir)")
	f.BoolVar(&p.json, "json", false, "print the result as JSON on stdout instead of tables")
	f.BoolVarP(&p.quiet, "quiet", "q", false, "print no progress on stderr")
	f.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "clients" {
			name = "concurrency"
		}
		return pflag.NormalizedName(name)
	})
	return cmd
}

// check parses --concurrency and --systems into p and checks the numbers.
func (p *params) check(conc, systems string) error {
	for _, f := range strings.Split(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return fmt.Errorf("--concurrency %q: want comma-separated positive numbers, like 1,16", conc)
		}
		p.Concurrency = append(p.Concurrency, c)
	}
	for _, s := range strings.Split(systems, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSystems, s) || slices.Contains(p.Systems, s) {
			return fmt.Errorf("--systems %q: want some of %s, each once", systems, strings.Join(allSystems, ","))
		}
		p.Systems = append(p.Systems, s)
	}
	if p.Runs < 1 || p.Rounds < 1 || p.Runs < p.Rounds {
		return fmt.Errorf("--runs %d --rounds %d: both must be at least 1, and --runs at least --rounds", p.Runs, p.Rounds)
	}
	if p.Warmup < 0 {
		return fmt.Errorf("--warmup %d: want 0 or more untimed Runs per client", p.Warmup)
	}
	if err := bench.CheckGuests(p.Guests); err != nil {
		return err
	}
	if p.PoolSize < 1 || p.MaxConns < 1 {
		return fmt.Errorf("--pool-size %d --max-conns %d: both must be at least 1", p.PoolSize, p.MaxConns)
	}
	return nil
}

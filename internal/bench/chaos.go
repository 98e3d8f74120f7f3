package bench

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/chaos"
	"github.com/agenthost/agenthost/internal/config"
)

// newBenchChaosCmd is `agenthost bench chaos`, the command of the chaos
// harness (internal/chaos): its flags are chaos.Options, by the same
// names, and it prints the Report as tables (chaos_tables.go) or JSON.
func newBenchChaosCmd(bf *benchFlags) *cobra.Command {
	o := &chaos.Options{FaultEvery: chaos.DurRange{Lo: 3 * time.Second, Hi: 10 * time.Second}, Pause: chaos.DurRange{Lo: time.Second, Hi: 4 * time.Second},
		Faults: chaos.DefaultFaults(config.DriverBadger, "")}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Kill, pause and restart real servers (and their PostgreSQL) under load, then check that no acknowledged Run was lost or mishandled",
		Long: `chaos starts --nodes ` + "`agenthost serve`" + ` child processes on one store (--store badger,
the default: one node on a fresh data dir; --store postgres: any number of
nodes on one fresh PostgreSQL database, on a throwaway server the bench
starts in its work dir with fsync on, or on the server --dsn names), with
two tenants whose Runs use the conformance plugins, and for --duration lets
--concurrency clients submit Runs of every kind: instant tools, slow tools
(slow_job, slow), failing tools (fail, flaky), tools that wait for an
approval (the clients approve or deny them), a model that asks the user
one or two questions (the clients answer each, under If-Match), slow ones
the clients cancel while in flight, one that loses its work (its policy
fails the Run), and hostile ones (an endless loop, a memory bomb, a trap,
huge or malformed output, a file read, HTTP to a host not allowed).

The clients submit round robin through the nodes and follow each Run's
event stream (Server-Sent Events) through a node other than the one that
acknowledged it, resuming it elsewhere with Last-Event-ID when a fault
cuts it off; they answer approvals and questions and ask for
cancellations through any node. A request a fault cuts off (a timeout, a
refused connection, a 503) is sent again to another node, a submission
with the same Idempotency-Key.

Every --fault-every it does one of the --faults to a node drawn at random:
kill SIGKILLs it and restarts it on the same store; pause SIGSTOPs it for
--pause and SIGCONTs it; term restarts it gracefully: SIGTERM, which must
make it exit 0 within --term-bound, then a start; pgrestart (postgres on
the bench's own server only) crashes and restarts PostgreSQL itself
(pg_ctl restart -m immediate) under the load; partition (postgres only)
cuts the node off from PostgreSQL for --partition, past its lease: each
node reaches the database through a loopback TCP proxy of its own, which
holds every byte both ways while the partition lasts, refusing and
closing nothing, so that the node's renewals hang rather than fail; the
node must give its lease up on its own clock before the lease runs out
at the store, and exit 1 (it is started again once the partition
heals). With more than one node a
share of the pauses (--long-pauses, and always the first) lasts
--long-pause, past the node lease (--lease-ttl, serve's 15s by default),
so that another node takes the paused node's sessions over; the paused
node must then exit 1 for its lost lease (and is started again), its
late work fenced off by the session epochs. The first faults are each
kind once, in a seeded order, so that even a short run has every kind;
then the kind is drawn at random.

Then it stops the faults, waits for every acknowledged Run to end
(approving and answering what still waits), stops every node with
SIGTERM (each must exit 0), opens the store (Badger, or PostgreSQL
through pgstore) and checks docs/DESIGN.md §9's invariants on every
acknowledged Run: it is terminal; its event log passes the Loop's log
check (loop.LogCheck): numbered 1..n with one terminal event, last; no
effect attempt settled twice, or without its dispatch; a gated call
dispatched only once approved; every approval and every input answers
what the Run was waiting on, once; no effect dispatched more attempts
than its policy allows; and the rest of that check's rules. Its event
streams delivered its log as the store holds it, none missing or
repeated, on whichever node. No slow job ran twice (the plugin counts
its executions in its KV); the watchdog found no stuck Run; a node
answered within --resume-bound after every SIGCONT (or, past its lease,
exited 1 within --term-bound); it exited 0 within --term-bound after every SIGTERM; the
clients' requests succeeded again within --pg-recover-bound of every
PostgreSQL restart; a node cut off from PostgreSQL gave its lease up
before the partition healed, and before any other node took one of its
sessions over (its "node lease lost" line is older than every takeover
naming it), and exited 1 within --term-bound of the heal.

It prints the faults survived, the Runs by kind and status, the effects
settled, recovery's decisions, with postgres the time from each node's
death (a kill, or a pause past the lease) to the first and to the last
takeover of its sessions, in multiples of the lease TTL, and the
clients' error window after each PostgreSQL restart, and the
violations; it exits non-zero if there is any, naming them, and keeps
the work dir (the nodes' logs, and the bench's own PostgreSQL data) for
a post-mortem. The seed (--seed, printed at the start) replays the same
choices: kinds, nodes, tenants, fault times; the timing of the
processes is not replayed.`,
		Example: `  make plugins build
  bin/agenthost bench chaos --duration 10m
  bin/agenthost bench chaos --store postgres --nodes 3 --duration 10m
  bin/agenthost bench chaos --store postgres --nodes 3 --dsn "host=db user=agenthost dbname=scratch" --duration 5m
  bin/agenthost bench chaos --duration 2m --seed 42 --fault-every 2s-5s --pause 1s-3s --json
  bin/agenthost bench chaos --duration 5m --faults term
  bin/agenthost bench chaos --store postgres --nodes 3 --duration 2m --faults partition,kill`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := settleChaos(cmd, o); err != nil {
				return err
			}
			return runChaos(cmd, bf, *o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", 10*time.Minute, "how long the faults and the load go on (the drain and the checks come after)")
	f.Uint64Var(&o.Seed, "seed", 0, "the seed of the random choices (0: a fresh one, printed)")
	f.IntVar(&o.Concurrency, "concurrency", 8, "clients submitting and following Runs at once")
	f.Var(&o.FaultEvery, "fault-every", "time between two faults, a range drawn uniformly (e.g. 3s-10s)")
	f.Var(&o.Faults, "faults", "the kinds of fault to draw from: kill (SIGKILL, restart), pause (SIGSTOP, SIGCONT), term (SIGTERM, restart), pgrestart (PostgreSQL crashed and restarted; --store postgres without --dsn), partition (a node cut off from PostgreSQL; --store postgres) (default kill,pause,term, and partition and pgrestart when they are available)")
	f.Var(&o.Pause, "pause", "how long a SIGSTOP lasts before its SIGCONT, a range (e.g. 1s-4s)")
	f.DurationVar(&o.ResumeBound, "resume-bound", 15*time.Second, "a node must answer /readyz this soon after a SIGCONT (paused past its lease, it must exit 1 within --term-bound instead)")
	f.DurationVar(&o.TermBound, "term-bound", 45*time.Second, "a node must exit 0 this soon after a SIGTERM (its own grace: 10s for requests, 20s for the runtime)")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 3*time.Minute, "bound on waiting for every acknowledged Run to end after the faults stop")
	f.DurationVar(&o.RequestTimeout, "request-timeout", 2*time.Second, "bound on one HTTP request of the clients")
	f.StringVar(&o.Store, "store", config.DriverBadger, "the store the nodes share: badger (one node, on its data dir) or postgres (one database, any number of nodes)")
	f.IntVar(&o.Nodes, "nodes", 1, "how many `agenthost serve` nodes run on the store at once (more than one needs --store postgres)")
	f.StringVar(&o.DSN, "dsn", "", "with --store postgres, the PostgreSQL server to use, in a fresh schema of the DSN's database, dropped at the end unless there were violations (default: a throwaway server the bench starts in its work dir, fsync on, and stops; only it can take the pgrestart fault)")
	f.DurationVar(&o.LeaseTTL, "lease-ttl", 0, "the nodes' lease_ttl (default: serve's, 15s); the takeover times are given in multiples of it")
	f.Var(&o.LongPause, "long-pause", "how long a pause past the lease lasts, a range (default 1.2 to 1.6 times the lease TTL)")
	f.Float64Var(&o.LongPauses, "long-pauses", 1.0/3, "the share of the pauses that last --long-pause, past the lease (with one node: 0 unless set); with more than one node the first pause always does")
	f.DurationVar(&o.PgRecoverBound, "pg-recover-bound", time.Minute, "the clients' requests must succeed again this soon after a PostgreSQL restart began")
	f.Var(&o.Partition, "partition", "how long a partition from PostgreSQL lasts, a range, at least the lease TTL (default 1.2 to 1.6 times the lease TTL)")
	return cmd
}

// settleChaos fills in the defaults that depend on other flags, and
// checks the flags against each other: --faults not given is every kind
// the store can take (with --store postgres, partition, and pgrestart on
// the bench's own server), and with one node --long-pauses not given is
// 0.
func settleChaos(cmd *cobra.Command, o *chaos.Options) error {
	f := cmd.Flags()
	if !f.Changed("faults") {
		o.Faults = chaos.DefaultFaults(o.Store, o.DSN)
	}
	if !f.Changed("long-pauses") && o.Nodes == 1 {
		o.LongPauses = 0
	}
	return o.Check()
}

// runChaos does the chaos run in a context that SIGINT and SIGTERM end,
// and prints its report: the tables, or JSON with --json. A report that
// found violations is printed before the error that names them.
func runChaos(cmd *cobra.Command, bf *benchFlags, o chaos.Options) error {
	env, err := bf.chaosEnv(cmd)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, env, o)
	if rep == nil {
		return err
	}
	out := benchOutput{Bench: "chaos", Started: rep.Started, Machine: bf.thisMachine(), Params: rep.Params, Result: rep.Result}
	if eerr := bf.emit(cmd.OutOrStdout(), out, chaosTables(&rep.Result)...); eerr != nil {
		return eerr
	}
	return err
}

// chaosEnv is what the chaos run takes from the shared flags: the binary
// its nodes run, its plugins under --plugins, --cache-dir, --work-dir,
// and the progress lines on stderr (none with --quiet).
func (bf *benchFlags) chaosEnv(cmd *cobra.Command) (chaos.Env, error) {
	bin, err := bf.binary()
	if err != nil {
		return chaos.Env{}, err
	}
	plugins, err := bf.pluginPaths(chaos.Plugins()...)
	if err != nil {
		return chaos.Env{}, err
	}
	cache, err := bf.cachePath()
	if err != nil {
		return chaos.Env{}, err
	}
	return chaos.Env{Binary: bin, Plugins: plugins, CacheDir: cache, WorkDir: bf.workDir,
		Progress: func(format string, args ...any) { bf.progressf(cmd, format, args...) }}, nil
}

package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The plugins chaos loads, by their paths under --plugins as `make
// plugins` lays them out (internal/plugincatalog names them for the
// tests, the bench and the Makefile alike).
const (
	chaosBuilder  = plugincatalog.ConformanceDir + plugincatalog.Builder
	chaosScripted = plugincatalog.ConformanceDir + plugincatalog.Scripted
	chaosHostile  = plugincatalog.ConformanceDir + plugincatalog.Hostile
	chaosSlowJob  = plugincatalog.SlowJobTool
)

// chaosOptions are the flags of `agenthost bench chaos`.
type chaosOptions struct {
	duration    time.Duration
	seed        uint64
	concurrency int
	faultEvery  durRange
	faults      faultKinds
	pause       durRange
	resumeBound time.Duration
	termBound   time.Duration
	drain       time.Duration
	timeout     time.Duration

	store          string
	nodes          int
	dsn            string
	leaseTTL       time.Duration
	longPause      durRange
	longPauses     float64
	pgRecoverBound time.Duration
	partition      durRange
}

func newBenchChaosCmd(bf *benchFlags) *cobra.Command {
	o := &chaosOptions{faultEvery: durRange{3 * time.Second, 10 * time.Second}, pause: durRange{time.Second, 4 * time.Second},
		faults: faultKinds{faultKill, faultPause, faultTerm}}
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
			if err := o.settle(cmd); err != nil {
				return err
			}
			return runChaos(cmd, bf, o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the faults and the load go on (the drain and the checks come after)")
	f.Uint64Var(&o.seed, "seed", 0, "the seed of the random choices (0: a fresh one, printed)")
	f.IntVar(&o.concurrency, "concurrency", 8, "clients submitting and following Runs at once")
	f.Var(&o.faultEvery, "fault-every", "time between two faults, a range drawn uniformly (e.g. 3s-10s)")
	f.Var(&o.faults, "faults", "the kinds of fault to draw from: kill (SIGKILL, restart), pause (SIGSTOP, SIGCONT), term (SIGTERM, restart), pgrestart (PostgreSQL crashed and restarted; --store postgres without --dsn), partition (a node cut off from PostgreSQL; --store postgres) (default kill,pause,term, and partition and pgrestart when they are available)")
	f.Var(&o.pause, "pause", "how long a SIGSTOP lasts before its SIGCONT, a range (e.g. 1s-4s)")
	f.DurationVar(&o.resumeBound, "resume-bound", 15*time.Second, "a node must answer /readyz this soon after a SIGCONT (paused past its lease, it must exit 1 within --term-bound instead)")
	f.DurationVar(&o.termBound, "term-bound", 45*time.Second, "a node must exit 0 this soon after a SIGTERM (its own grace: 10s for requests, 20s for the runtime)")
	f.DurationVar(&o.drain, "drain-timeout", 3*time.Minute, "bound on waiting for every acknowledged Run to end after the faults stop")
	f.DurationVar(&o.timeout, "request-timeout", 2*time.Second, "bound on one HTTP request of the clients")
	f.StringVar(&o.store, "store", config.DriverBadger, "the store the nodes share: badger (one node, on its data dir) or postgres (one database, any number of nodes)")
	f.IntVar(&o.nodes, "nodes", 1, "how many `agenthost serve` nodes run on the store at once (more than one needs --store postgres)")
	f.StringVar(&o.dsn, "dsn", "", "with --store postgres, the PostgreSQL server to use, in a fresh schema of the DSN's database, dropped at the end unless there were violations (default: a throwaway server the bench starts in its work dir, fsync on, and stops; only it can take the pgrestart fault)")
	f.DurationVar(&o.leaseTTL, "lease-ttl", 0, "the nodes' lease_ttl (default: serve's, 15s); the takeover times are given in multiples of it")
	f.Var(&o.longPause, "long-pause", "how long a pause past the lease lasts, a range (default 1.2 to 1.6 times the lease TTL)")
	f.Float64Var(&o.longPauses, "long-pauses", 1.0/3, "the share of the pauses that last --long-pause, past the lease (with one node: 0 unless set); with more than one node the first pause always does")
	f.DurationVar(&o.pgRecoverBound, "pg-recover-bound", time.Minute, "the clients' requests must succeed again this soon after a PostgreSQL restart began")
	f.Var(&o.partition, "partition", "how long a partition from PostgreSQL lasts, a range, at least the lease TTL (default 1.2 to 1.6 times the lease TTL)")
	return cmd
}

// settle checks the flags against each other and fills in the defaults
// that depend on others.
func (o *chaosOptions) settle(cmd *cobra.Command) error {
	f := cmd.Flags()
	switch o.store {
	case config.DriverBadger, config.DriverPostgres:
	default:
		return fmt.Errorf("bench chaos: --store %q: want badger or postgres", o.store)
	}
	switch {
	case o.concurrency < 1:
		return fmt.Errorf("bench chaos: --concurrency must be at least 1")
	case o.nodes < 1:
		return fmt.Errorf("bench chaos: --nodes must be at least 1")
	case o.nodes > 1 && o.store != config.DriverPostgres:
		return fmt.Errorf("bench chaos: --nodes %d needs --store postgres: a Badger data dir is one process's store", o.nodes)
	case o.dsn != "" && o.store != config.DriverPostgres:
		return fmt.Errorf("bench chaos: --dsn is for --store postgres")
	case o.longPauses < 0 || o.longPauses > 1:
		return fmt.Errorf("bench chaos: --long-pauses %g: want a share between 0 and 1", o.longPauses)
	case o.leaseTTL != 0 && o.leaseTTL < config.MinLeaseTTL:
		return fmt.Errorf("bench chaos: --lease-ttl %s: serve takes no lease shorter than %s", o.leaseTTL, config.MinLeaseTTL)
	}
	pgRestartable := o.store == config.DriverPostgres && o.dsn == ""
	if !f.Changed("faults") && o.store == config.DriverPostgres {
		o.faults = append(o.faults, faultPartition)
	}
	if !f.Changed("faults") && pgRestartable {
		o.faults = append(o.faults, faultPgRestart)
	}
	if len(o.faults) == 0 {
		return fmt.Errorf("bench chaos: --faults must name at least one of kill, pause, term, pgrestart and partition")
	}
	if o.faults.has(faultPartition) && o.store != config.DriverPostgres {
		return fmt.Errorf("bench chaos: the partition fault cuts a node off from PostgreSQL: it needs --store postgres")
	}
	if o.faults.has(faultPgRestart) && !pgRestartable {
		if o.dsn != "" {
			return fmt.Errorf("bench chaos: the pgrestart fault is unavailable with --dsn: the bench restarts only the PostgreSQL server it starts itself (pg_ctl restart -m immediate), never one of yours; drop --dsn, or pgrestart from --faults")
		}
		return fmt.Errorf("bench chaos: the pgrestart fault restarts PostgreSQL: it needs --store postgres")
	}
	if !f.Changed("long-pauses") && o.nodes == 1 {
		o.longPauses = 0
	}
	return nil
}

// chaosParams are the parameters, for --json.
type chaosParams struct {
	Seed           uint64  `json:"seed"`
	DurationS      float64 `json:"duration_s"`
	Concurrency    int     `json:"concurrency"`
	FaultEvery     string  `json:"fault_every"`
	Faults         string  `json:"faults"`
	Pause          string  `json:"pause"`
	ResumeBoundS   float64 `json:"resume_bound_s"`
	TermBoundS     float64 `json:"term_bound_s"`
	DrainTimeoutS  float64 `json:"drain_timeout_s"`
	RequestTimeout float64 `json:"request_timeout_s"`

	Store            string  `json:"store"`
	Nodes            int     `json:"nodes"`
	DSN              string  `json:"dsn,omitempty"` // --dsn, its password hidden
	LeaseTTLS        float64 `json:"lease_ttl_s"`
	LongPause        string  `json:"long_pause,omitempty"`
	LongPauses       float64 `json:"long_pauses"`
	PgRecoverBoundS  float64 `json:"pg_recover_bound_s,omitempty"`
	Partition        string  `json:"partition,omitempty"`
	WatchdogInterval string  `json:"watchdog_interval"`
}

// chaosResult is what a chaos run found, for --json.
type chaosResult struct {
	Seed       uint64  `json:"seed"`
	Store      string  `json:"store"`
	Nodes      int     `json:"nodes"`
	ElapsedS   float64 `json:"elapsed_s"`
	Kills      int     `json:"kills"`
	Pauses     int     `json:"pauses"`
	Restarts   int     `json:"graceful_restarts"`
	PgRestarts int     `json:"pg_restarts"`
	// PausesPastLease counts the pauses after which the node exited for
	// its lost lease (every --long-pause, and the odd shorter one);
	// LeaseLostExits every exit for a lost lease, those included.
	PausesPastLease int `json:"pauses_past_lease"`
	LeaseLostExits  int `json:"lease_lost_exits"`
	// Partitions counts the partitions of a node from PostgreSQL;
	// MaxLeaseGivenUpMS is the longest time from one's beginning to the
	// node giving its lease up (its log's "node lease lost"), which must
	// stay under the lease TTL less its margin; MaxPartitionExitMS the
	// longest to its exit.
	Partitions         int     `json:"partitions"`
	MaxLeaseGivenUpMS  float64 `json:"max_lease_given_up_after_partition_ms"`
	MaxPartitionExitMS float64 `json:"max_exit_after_partition_ms"`
	MaxReadyMS         float64 `json:"max_ready_after_restart_ms"`
	MaxResumMS         float64 `json:"max_answer_after_sigcont_ms"`
	MaxExitMS          float64 `json:"max_exit_after_sigterm_ms"`

	Submitted    int64                     `json:"submitted"`
	Acknowledged int                       `json:"acknowledged"`
	Kinds        map[string]map[string]int `json:"runs_by_kind"` // kind → status (and "acknowledged") → Runs
	ByStatus     map[string]int            `json:"runs_by_status"`
	Retries      int64                     `json:"submission_retries"`
	ClientErrors int64                     `json:"client_errors"`
	PauseErrors  int64                     `json:"client_errors_during_pauses"`
	Approved     int64                     `json:"approved"`
	Cancels      int64                     `json:"cancels"`
	Denied       int64                     `json:"denied"`
	Answered     int64                     `json:"answered"`
	Streams      chaosStreamStats          `json:"event_streams"`

	Dispatched     int            `json:"attempts_dispatched"`
	EffectsSettled map[string]int `json:"effects_settled"` // "kind state" → attempts settled
	SlowJobs       int            `json:"slow_jobs_checked"`
	Recovery       map[string]int `json:"recovery_decisions"`
	SessionsTaken  int            `json:"sessions_taken_over"`
	Watchdog       int            `json:"watchdog_reports"`
	DrainS         float64        `json:"drain_s"`
	// UnusualEnds lists the Runs that did not end as their kind usually
	// does (lost: failed; cancel: cancelled; the others: completed), with
	// why: not violations, but what to read first after a run.
	UnusualEnds []string `json:"unusual_ends"`

	// Takeovers times each node's deaths to the takeovers of its
	// sessions (postgres); PgRestartFigures each PostgreSQL restart.
	Takeovers        *chaosTakeoverReport `json:"takeovers,omitempty"`
	PgRestartFigures []chaosPgRestart     `json:"pg_restart_figures,omitempty"`

	Violations []string `json:"violations"`
}

// chaosStreamStats are the clients' event streams.
type chaosStreamStats struct {
	Opened int64 `json:"opened"`
	// CrossNode counts the streams opened on a node other than the one
	// that acknowledged their Run.
	CrossNode int64 `json:"on_another_node"`
	Events    int64 `json:"events"`
	// Followed counts the acknowledged Runs whose streams delivered their
	// whole log, to the terminal event.
	Followed int `json:"runs_followed_to_the_end"`
	// Broken, Idle and Stale count the streams given up before their
	// Run's end and resumed elsewhere: cut off (a node stopped or lost
	// its store), silent (a node paused), or behind the store.
	Broken int64 `json:"cut_off"`
	Idle   int64 `json:"silent"`
	Stale  int64 `json:"behind_the_store"`
}

// chaosPgRestart is one PostgreSQL restart under load.
type chaosPgRestart struct {
	AtS float64 `json:"at_s"`
	// RestartMS is how long pg_ctl restart -m immediate took: the crash,
	// the WAL recovery and the first connection.
	RestartMS float64 `json:"restart_ms"`
	// ErrorWindowS is from the restart's beginning to the last failed
	// client request before the clients' requests succeeded again (a
	// transport error or a 5xx answer); Failed counts those requests.
	ErrorWindowS float64 `json:"clients_error_window_s"`
	Failed       int     `json:"failed_requests"`
	// LeaseLost counts the nodes that exited for a lost lease meanwhile.
	LeaseLost int `json:"lease_lost_exits"`
}

// chaosConfig is a node's config: its store (storeYAML), the lease TTL
// (0: serve's default), the conformance builder and model, the scripted,
// hostile and slow-job executors, and tenants with one token each, an
// approval-gated tool (wire), retry policies on the tools that can be
// retried, and fail_run on the one that loses its work. Every node has
// the same, but for the store's data dir, which is relative to its own.
func chaosConfig(plugins map[string]string, cache string, tenants []chaosTenant, storeYAML string, leaseTTL time.Duration) string {
	var b strings.Builder
	b.WriteString(storeYAML)
	if leaseTTL > 0 {
		fmt.Fprintf(&b, "lease_ttl: %s\n", leaseTTL)
	}
	fmt.Fprintf(&b, `cache_dir: %q
retention: 0
# Scans often enough that the watchdog sees each incarnation's Runs (a
# stuck one is reported after two scans): its count must stay 0.
watchdog_interval: 1s
log: {format: text, level: info}
# The clients all come from one address: the caps and rates meant for
# many would throttle the faults' load (metrics: --metrics-listen).
http: {max_connections_per_client: 0, unauthenticated_rate: {per_second: 0}}
plugins:
  builder: {path: %q, role: builder}
  scripted: {path: %q, role: executor}
  hostile: {path: %q, role: executor, call_timeout: 2s, memory_pages: 256, pool_size: 2}
  slow-job: {path: %q, role: executor}
tenants:
`, cache, plugins[chaosBuilder], plugins[chaosScripted], plugins[chaosHostile], plugins[chaosSlowJob])
	for _, t := range tenants {
		fmt.Fprintf(&b, `  %s:
    tokens_sha256: [%s]
    builder: builder
    model: scripted
    tool_executors: [scripted, hostile, slow-job]
    model_policy: {mode: retry, max_attempts: 8, backoff: 100ms, max_backoff: 1s}
    quotas: {max_concurrent_reads: 0}
    rate_limits: {requests: {per_second: 0}, submissions: {per_second: 0}}
    tools:
      wire: {approval: always}
      flaky: {policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 500ms}}
      slow: {policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 500ms}}
      lost: {policy: {mode: fail_run}}
`, t.ID, httpapi.HashToken(t.Token))
	}
	return b.String()
}

// chaosDrain waits until every acknowledged Run is terminal, approving
// what waits for a person, until deadline; tick runs between two looks
// (it supervises the nodes). It returns the Runs that did not end.
func chaosDrain(c *chaosClients, acked []ackedRun, deadline time.Time, progressf func(string, ...any), tick func() error) ([]string, error) {
	open := map[string]ackedRun{}
	for _, r := range acked {
		open[r.ID] = r
	}
	last := time.Now()
	for len(open) > 0 && time.Now().Before(deadline) {
		if time.Since(last) >= 5*time.Second {
			progressf("chaos: draining: %d Runs not ended yet", len(open))
			last = time.Now()
		}
		for id, r := range open {
			if run, ok := c.step(r, nil); ok && run.Status.Terminal() {
				delete(open, id)
			}
		}
		if err := tick(); err != nil {
			return nil, err
		}
		if len(open) > 0 {
			time.Sleep(250 * time.Millisecond) // the poll's cadence, bounded by deadline
		}
	}
	var out []string
	for id, r := range open {
		out = append(out, r.Tenant+"/"+id)
	}
	sort.Strings(out)
	return out, nil
}

// scrapeCounter sums a counter over its labels from node i's /metrics (0
// if it cannot be read).
func scrapeCounter(c *chaosClients, i int, name string) int {
	addr := c.nodes[i].metricsAddr()
	if addr == "" {
		return 0
	}
	mc := &serveproc.Client{Base: "http://" + addr, HTTP: c.http}
	code, raw, err := mc.Do("GET", "/metrics", nil, nil, nil)
	if err != nil || code != http.StatusOK {
		return 0
	}
	total := 0.0
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return int(total)
}

// chaosCheckStore checks the invariants over every acknowledged Run in
// the store, once every node has stopped, adding its figures to res; the
// clients' streams are what each Run's event streams delivered.
func chaosCheckStore(ctx context.Context, store runtime.Store, acked []ackedRun, tenants []chaosTenant, streams map[string]*runStream, res *chaosResult) []string {
	var out []string
	for _, r := range acked {
		byKind := res.Kinds[r.Kind]
		if byKind == nil {
			byKind = map[string]int{}
			res.Kinds[r.Kind] = byKind
		}
		byKind["acknowledged"]++
		run, err := store.LoadRun(ctx, r.Tenant, r.ID)
		if err != nil {
			out = append(out, fmt.Sprintf("acknowledged run %s/%s is not in the store: %v", r.Tenant, r.ID, err))
			continue
		}
		byKind[string(run.Status)]++
		if usual := usualEnd(r.Kind); run.Status.Terminal() && run.Status != usual {
			why := ""
			if run.Failure != nil {
				why = ": " + run.Failure.Error()
			}
			res.UnusualEnds = append(res.UnusualEnds, fmt.Sprintf("%s/%s (%s) %s%s", r.Tenant, r.ID, r.Kind, run.Status, why))
		}
		res.ByStatus[string(run.Status)]++
		if !run.Status.Terminal() {
			out = append(out, fmt.Sprintf("run %s/%s (%s) is %s, not terminal", r.Tenant, r.ID, r.Kind, run.Status))
		}
		evs, err := store.Events(ctx, r.Tenant, r.ID, 1, 1_000_000)
		if err != nil {
			out = append(out, fmt.Sprintf("events of run %s/%s: %v", r.Tenant, r.ID, err))
			continue
		}
		for _, v := range chaosCheckLog(evs) {
			out = append(out, fmt.Sprintf("run %s/%s (%s): %s", r.Tenant, r.ID, r.Kind, v))
		}
		st := streams[r.ID]
		for _, v := range chaosCheckStream(st, evs) {
			out = append(out, fmt.Sprintf("run %s/%s (%s), acknowledged by node %d: %s", r.Tenant, r.ID, r.Kind, r.Node, v))
		}
		if st != nil && st.ended {
			res.Streams.Followed++
		}
		recs := loop.LogEffects(evs)
		jobs, v, err := CheckSlowJobs(ctx, store, r.Tenant, chaosSlowJob, recs)
		if err != nil {
			out = append(out, fmt.Sprintf("run %s/%s: reading the slow-job KV: %v", r.Tenant, r.ID, err))
		}
		out = append(out, v...)
		res.SlowJobs += jobs
		for _, e := range recs {
			res.Dispatched += e.Dispatched
			for _, o := range e.Settled {
				if o != nil {
					res.EffectsSettled[e.Kind+" "+string(o.State)]++
				}
			}
		}
	}
	// Nothing the clients did not hear about may be left running either.
	for _, t := range tenants {
		for _, st := range []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting} {
			ids, err := store.RunsByStatus(ctx, t.ID, st, "", 20)
			if err != nil {
				out = append(out, fmt.Sprintf("tenant %s: runs %s: %v", t.ID, st, err))
			} else if len(ids) > 0 {
				out = append(out, fmt.Sprintf("tenant %s: Runs still %s in the store: %s", t.ID, st, strings.Join(ids, ", ")))
			}
		}
	}
	return out
}

// usualEnd is how a Run of a kind ends when nothing goes wrong: a lost
// one fails (its policy is fail_run), a cancelled one is cancelled (unless
// it ended before its cancellation), every other completes.
func usualEnd(kind string) loop.Status {
	switch kind {
	case "lost":
		return loop.StatusFailed
	case "cancel":
		return loop.StatusCancelled
	}
	return loop.StatusCompleted
}

// chaosReadLog counts recovery's decisions, the sessions taken over and
// the watchdog's reports in the servers' log (every incarnation appends
// to it), and reports a panic as a violation.
func chaosReadLog(path string, res *chaosResult) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{fmt.Sprintf("reading the server log: %v", err)}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `msg="recovery decision"`):
			if _, d, ok := strings.Cut(line, " decision="); ok {
				res.Recovery[strings.Fields(d)[0]]++
			}
		case strings.Contains(line, "recovery: session taken over"):
			res.SessionsTaken++
		case strings.Contains(line, "watchdog: run is stuck"):
			res.Watchdog++
		case strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:"):
			out = append(out, "the server log has a Go "+line)
		}
	}
	if err := sc.Err(); err != nil {
		out = append(out, fmt.Sprintf("reading the server log: %v", err))
	}
	return out
}

// chaosTables is the human-readable summary.
func chaosTables(res *chaosResult) []table {
	header := []string{"kills", "pauses", "graceful restarts"}
	row := []string{strconv.Itoa(res.Kills), strconv.Itoa(res.Pauses), strconv.Itoa(res.Restarts)}
	if res.Store == config.DriverPostgres {
		header = append(header, "PostgreSQL restarts", "pauses past the lease", "partitions", "lease-lost exits", "slowest lease given up after a partition (ms)")
		row = append(row, strconv.Itoa(res.PgRestarts), strconv.Itoa(res.PausesPastLease), strconv.Itoa(res.Partitions), strconv.Itoa(res.LeaseLostExits),
			fmt.Sprintf("%.0f", res.MaxLeaseGivenUpMS))
	}
	header = append(header, "slowest ready after restart (ms)", "slowest answer after SIGCONT (ms)", "slowest exit after SIGTERM (ms)", "submission retries", "client errors", "of which during pauses")
	row = append(row, fmt.Sprintf("%.0f", res.MaxReadyMS), fmt.Sprintf("%.0f", res.MaxResumMS),
		fmt.Sprintf("%.0f", res.MaxExitMS), strconv.FormatInt(res.Retries, 10), strconv.FormatInt(res.ClientErrors, 10), strconv.FormatInt(res.PauseErrors, 10))
	faults := table{Title: "Faults", Header: header, Rows: [][]string{row},
		Notes: []string{fmt.Sprintf("seed %d; %d node(s) on %s; %.0f s in all, of which %.0f s draining; approvals answered: %d yes, %d no; questions answered: %d; cancellations asked: %d",
			res.Seed, res.Nodes, res.Store, res.ElapsedS, res.DrainS, res.Approved, res.Denied, res.Answered, res.Cancels)}}
	statuses := []string{"completed", "failed", "cancelled", "pending", "running", "waiting"}
	runs := table{Title: "Runs", Header: append([]string{"kind", "acknowledged"}, statuses...)}
	for _, k := range append(append([]string(nil), chaosKinds...), "total") {
		var byStatus map[string]int
		if k == "total" {
			byStatus = map[string]int{"acknowledged": res.Acknowledged}
			for s, n := range res.ByStatus {
				byStatus[s] = n
			}
		} else {
			byStatus = res.Kinds[k]
		}
		row := []string{k, strconv.Itoa(byStatus["acknowledged"])}
		for _, s := range statuses {
			row = append(row, strconv.Itoa(byStatus[s]))
		}
		runs.Rows = append(runs.Rows, row)
	}
	st := res.Streams
	runs.Notes = []string{fmt.Sprintf("%d submissions started, %d acknowledged; %d ended otherwise than their kind usually does", res.Submitted, res.Acknowledged, len(res.UnusualEnds)),
		fmt.Sprintf("event streams: %d opened (%d on a node other than the one that acknowledged the Run), %d events, %d Runs followed to their end; resumed elsewhere: %d cut off, %d silent, %d behind the store",
			st.Opened, st.CrossNode, st.Events, st.Followed, st.Broken, st.Idle, st.Stale)}
	for _, u := range firstN(res.UnusualEnds, 10) {
		runs.Notes = append(runs.Notes, "  "+u)
	}
	effects := countTable("Effects", []string{"settled", "attempts"}, res.EffectsSettled)
	effects.Notes = []string{fmt.Sprintf("%d attempts dispatched; %d slow jobs checked against the plugin's execution counts", res.Dispatched, res.SlowJobs)}
	recovery := countTable("Recovery", []string{"decision", "count"}, res.Recovery)
	recovery.Notes = []string{fmt.Sprintf("%d sessions taken over from a killed or stopped node; %d watchdog reports", res.SessionsTaken, res.Watchdog)}
	out := []table{faults, runs, effects, recovery}
	if res.Takeovers != nil {
		out = append(out, chaosTakeoverTables(res.Takeovers)...)
	}
	if res.Store == config.DriverPostgres {
		out = append(out, chaosPgRestartTable(res.PgRestartFigures))
	}
	verdict := table{Title: fmt.Sprintf("Violations: %d", len(res.Violations)), Header: []string{"#", "violation"}}
	for i, v := range res.Violations {
		verdict.Rows = append(verdict.Rows, []string{strconv.Itoa(i + 1), v})
	}
	if len(res.Violations) == 0 {
		verdict.Header, verdict.Notes = nil, []string{"every invariant held"}
	}
	return append(out, verdict)
}

// chaosPgRestartTable is one row per PostgreSQL restart.
func chaosPgRestartTable(rs []chaosPgRestart) table {
	t := table{Title: "PostgreSQL restarts", Header: []string{"at (s)", "pg_ctl restart -m immediate (ms)", "clients' error window (s)", "failed requests", "lease-lost exits"}}
	var worst float64
	for _, r := range rs {
		t.Rows = append(t.Rows, []string{fmt.Sprintf("%.1f", r.AtS), fmt.Sprintf("%.0f", r.RestartMS), fmt.Sprintf("%.2f", r.ErrorWindowS), strconv.Itoa(r.Failed), strconv.Itoa(r.LeaseLost)})
		worst = max(worst, r.ErrorWindowS)
	}
	if len(rs) == 0 {
		t.Header, t.Notes = nil, []string{"none"}
		return t
	}
	t.Notes = []string{fmt.Sprintf("the error window runs from the restart's beginning to the last request that failed (a transport error or a 5xx) before they succeeded again; the longest: %.2f s", worst)}
	return t
}

// countTable is a table of counts by name, sorted by name.
func countTable(title string, header []string, counts map[string]int) table {
	t := table{Title: title, Header: header}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Rows = append(t.Rows, []string{k, strconv.Itoa(counts[k])})
	}
	return t
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(append([]string(nil), s[:n]...), fmt.Sprintf("… and %d more", len(s)-n))
	}
	return s
}

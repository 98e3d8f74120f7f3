// Package chaos is the chaos harness: it starts `agenthost serve` nodes
// as child processes on one store (Badger, or a PostgreSQL database they
// share), puts them under load from clients that submit and follow Runs
// of every kind, kills, pauses and restarts them (and PostgreSQL, and
// their way to it) meanwhile, and then checks docs/DESIGN.md §9's
// invariants on every acknowledged Run. Run does one run; `agenthost
// bench chaos` (internal/bench) is its command, which fills Options from
// its flags and prints the Report. CheckSlowJobs and PostgresProxy are
// the parts the crash tests of cmd/agenthost share.
//
// Its errors name the options by the flags of `agenthost bench chaos`,
// which is where people meet them.
package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The plugins chaos loads, by their paths under the directory `make
// plugins` builds them into (internal/plugincatalog names them for the
// tests, the bench and the Makefile alike).
const (
	chaosBuilder  = plugincatalog.ConformanceDir + plugincatalog.Builder
	chaosScripted = plugincatalog.ConformanceDir + plugincatalog.Scripted
	chaosHostile  = plugincatalog.ConformanceDir + plugincatalog.Hostile
	chaosSlowJob  = plugincatalog.SlowJobTool
)

// Plugins are the plugins a run loads, by their paths under the
// directory `make plugins` builds them into: Env.Plugins maps each to its
// file.
func Plugins() []string { return []string{chaosBuilder, chaosScripted, chaosHostile, chaosSlowJob} }

// Kinds are the kinds of Run the clients submit, in the order the
// summary lists them: the keys of Result.Kinds.
func Kinds() []string { return slices.Clone(chaosKinds) }

// Options are what a run does: the flags of `agenthost bench chaos`, by
// the same names, which gives their defaults. Check tells which
// combinations are refused.
type Options struct {
	// Duration is how long the faults and the load go on (the drain and
	// the checks come after).
	Duration time.Duration
	// Seed seeds the random choices (kinds, nodes, tenants, fault times);
	// 0 draws a fresh one, which Params reports.
	Seed uint64
	// Concurrency is how many clients submit and follow Runs at once.
	Concurrency int
	// FaultEvery is the time between two faults, drawn uniformly.
	FaultEvery DurRange
	// Faults are the kinds of fault drawn from (DefaultFaults are those
	// a store can take); the first faults are each kind once.
	Faults FaultKinds
	// Pause is how long a SIGSTOP lasts before its SIGCONT.
	Pause DurRange
	// ResumeBound bounds a node's answer on /readyz after a SIGCONT.
	ResumeBound time.Duration
	// TermBound bounds a node's exit 0 after a SIGTERM (and its exit 1
	// after a pause or a partition past its lease).
	TermBound time.Duration
	// DrainTimeout bounds the wait for every acknowledged Run to end
	// after the faults stop.
	DrainTimeout time.Duration
	// RequestTimeout bounds one HTTP request of the clients.
	RequestTimeout time.Duration

	// Store is the store the nodes share: config.DriverBadger (one node)
	// or config.DriverPostgres (any number).
	Store string
	// Nodes is how many `agenthost serve` nodes run at once.
	Nodes int
	// DSN, with postgres, names a server of the caller's, in a fresh
	// schema of whose database the run goes ("": a throwaway server the
	// run starts in its work dir, the only one the pgrestart fault can
	// restart).
	DSN string
	// LeaseTTL is the nodes' lease_ttl (0: serve's default).
	LeaseTTL time.Duration
	// LongPause is how long a pause past the lease lasts (zero: 1.2 to
	// 1.6 lease TTLs); LongPauses is the share of the pauses that do
	// (with more than one node, the first always does).
	LongPause  DurRange
	LongPauses float64
	// PgRecoverBound bounds the clients' recovery from a PostgreSQL
	// restart: their requests must succeed again this soon after it
	// began.
	PgRecoverBound time.Duration
	// Partition is how long a partition from PostgreSQL lasts, at least
	// the lease TTL (zero: 1.2 to 1.6 lease TTLs).
	Partition DurRange
}

// DefaultFaults are the kinds of fault a run on store can take: kill,
// pause and term; with postgres, partition too, and pgrestart on the
// run's own PostgreSQL server (dsn empty), never on a server of the
// caller's.
func DefaultFaults(store, dsn string) FaultKinds {
	kinds := FaultKinds{FaultKill, FaultPause, FaultTerm}
	if store == config.DriverPostgres {
		kinds = append(kinds, FaultPartition)
		if dsn == "" {
			kinds = append(kinds, FaultPgRestart)
		}
	}
	return kinds
}

// Check checks the options against each other: a store it knows, at
// least one client and one node, several nodes and --dsn only on
// PostgreSQL, a share of long pauses between 0 and 1, a lease serve
// takes, and faults the store can take.
func (o *Options) Check() error {
	switch o.Store {
	case config.DriverBadger, config.DriverPostgres:
	default:
		return fmt.Errorf("bench chaos: --store %q: want badger or postgres", o.Store)
	}
	switch {
	case o.Concurrency < 1:
		return fmt.Errorf("bench chaos: --concurrency must be at least 1")
	case o.Nodes < 1:
		return fmt.Errorf("bench chaos: --nodes must be at least 1")
	case o.Nodes > 1 && o.Store != config.DriverPostgres:
		return fmt.Errorf("bench chaos: --nodes %d needs --store postgres: a Badger data dir is one process's store", o.Nodes)
	case o.DSN != "" && o.Store != config.DriverPostgres:
		return fmt.Errorf("bench chaos: --dsn is for --store postgres")
	case o.LongPauses < 0 || o.LongPauses > 1:
		return fmt.Errorf("bench chaos: --long-pauses %g: want a share between 0 and 1", o.LongPauses)
	case o.LeaseTTL != 0 && o.LeaseTTL < config.MinLeaseTTL:
		return fmt.Errorf("bench chaos: --lease-ttl %s: serve takes no lease shorter than %s", o.LeaseTTL, config.MinLeaseTTL)
	}
	if len(o.Faults) == 0 {
		return fmt.Errorf("bench chaos: --faults must name at least one of kill, pause, term, pgrestart and partition")
	}
	if o.Faults.Has(FaultPartition) && o.Store != config.DriverPostgres {
		return fmt.Errorf("bench chaos: the partition fault cuts a node off from PostgreSQL: it needs --store postgres")
	}
	if o.Faults.Has(FaultPgRestart) && !DefaultFaults(o.Store, o.DSN).Has(FaultPgRestart) {
		if o.DSN != "" {
			return fmt.Errorf("bench chaos: the pgrestart fault is unavailable with --dsn: the bench restarts only the PostgreSQL server it starts itself (pg_ctl restart -m immediate), never one of yours; drop --dsn, or pgrestart from --faults")
		}
		return fmt.Errorf("bench chaos: the pgrestart fault restarts PostgreSQL: it needs --store postgres")
	}
	return nil
}

// Env is what a run takes from its caller, which `agenthost bench`
// fills in from its shared flags.
type Env struct {
	// Binary is the agenthost binary the nodes run `serve` with.
	Binary string
	// Plugins maps each of Plugins() to its .wasm file.
	Plugins map[string]string
	// CacheDir is the wazero compilation cache the nodes share ("" for
	// none).
	CacheDir string
	// WorkDir is where the run's own directory goes ("" for the system's
	// temp dir): the nodes' configs, data dirs and logs, and its
	// PostgreSQL server's data. It is removed at the end unless there
	// were violations.
	WorkDir string
	// Progress prints a line of progress (nil: none).
	Progress func(format string, args ...any)
}

// Report is a run that went through to its checks: when its faults and
// load began, its options as it settled them, and what it found.
type Report struct {
	Started time.Time
	Params  Params
	Result  Result
}

// Params are a run's options as it settled them (the seed drawn, the
// lease TTL and the ranges derived from it): the "params" of `agenthost
// bench chaos --json`.
type Params struct {
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

// Result is what a chaos run found: the "result" of `agenthost bench
// chaos --json`, which also prints it as tables.
type Result struct {
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
	Streams      StreamStats               `json:"event_streams"`

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
	Takeovers        *TakeoverReport `json:"takeovers,omitempty"`
	PgRestartFigures []PgRestart     `json:"pg_restart_figures,omitempty"`

	Violations []string `json:"violations"`
}

// StreamStats are the clients' event streams.
type StreamStats struct {
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

// PgRestart is one PostgreSQL restart under load.
type PgRestart struct {
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
func chaosCheckStore(ctx context.Context, store runtime.Store, acked []ackedRun, tenants []chaosTenant, streams map[string]*runStream, res *Result) []string {
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
func chaosReadLog(path string, res *Result) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{fmt.Sprintf("reading the server log: %v", err)}
	}
	defer f.Close()
	var out []string
	stuck := 0
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
			// The first few lines themselves, so that a failed run in a
			// test whose work dir is gone still says which Run and when.
			if stuck++; stuck <= 3 {
				out = append(out, "a watchdog report in "+path+": "+line)
			}
		case strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:"):
			out = append(out, "the server log has a Go "+line)
		}
	}
	if err := sc.Err(); err != nil {
		out = append(out, fmt.Sprintf("reading the server log: %v", err))
	}
	return out
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(append([]string(nil), s[:n]...), fmt.Sprintf("… and %d more", len(s)-n))
	}
	return s
}

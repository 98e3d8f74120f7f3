package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The recovery bench's tenant, its question and the plugin whose polls the
// child holds back.
const (
	recoveryTenant   = "bench"
	recoveryQuestion = "Please run a slow job for %d seconds"
	recoveryJobTool  = plugincatalog.SlowJobTool
	// recoveryHold is the poll_after the child gives every pending job:
	// far longer than the child lives, so that it settles none of them.
	recoveryHold = time.Hour
	// recoveryReady starts the child's line that says its Runs are in
	// flight: "ready RUNS SUBMIT_MS".
	recoveryReady = "ready"
)

// recoveryParams are the recovery bench's parameters.
type recoveryParams struct {
	Runs        int  `json:"runs"`
	Concurrency int  `json:"concurrency"`
	JobSeconds  int  `json:"job_seconds"`
	SyncWrites  bool `json:"sync_writes"`
	// Store is badger or postgres (whose server is PostgreSQL, with its
	// version).
	Store      string `json:"store"`
	PostgreSQL string `json:"postgresql,omitempty"`
	// LeaseTTL is both processes' lease_ttl, which a restart on
	// PostgreSQL without a NodeName waits out.
	LeaseTTL time.Duration `json:"lease_ttl"`
	// NodeName is, on PostgreSQL, both processes' node.name: the restart
	// under it takes over the sessions of the killed child, its previous
	// incarnation, at once, without waiting out its lease. "" waits.
	NodeName string `json:"node_name,omitempty"`
	// PluginCallPath is both processes' plugin_call_path.
	PluginCallPath string `json:"plugin_call_path"`
	// Guests is the build of the three plugins: go or c.
	Guests string `json:"guests"`
}

// RecoveryResult is what the recovery bench measured: bench recovery
// --json prints it as "result", and benchpeers recovery decodes it from
// there. The times run from the moment the new incarnation starts
// opening the store.
type RecoveryResult struct {
	// SubmitMS is the child's time to put every Run in flight.
	SubmitMS float64 `json:"submit_ms"`
	// LeaseWaitMS is, on PostgreSQL without a node name, the wait after
	// the kill for the dead child's node lease to run out (lease_ttl): a
	// shared store cannot tell a dead node from a slow one sooner. The
	// times below start after it. 0 on Badger, whose directory lock makes
	// the dead incarnation dead at once, and under a node name, whose lock
	// does the same on PostgreSQL.
	LeaseWaitMS float64 `json:"lease_wait_ms"`
	// OpenMS is the time to open the store, load the plugins and start the
	// runtime (node.Open).
	OpenMS float64 `json:"open_ms"`
	// ReadyMS is the time until recovery's first pass has taken over every
	// orphaned session.
	ReadyMS float64 `json:"ready_ms"`
	// DecidedMS is the time until recovery has decided (re-attached,
	// settled, retried or failed) every in-flight effect.
	DecidedMS float64 `json:"decided_ms"`
	// TerminalMS is the time until every Run is terminal.
	TerminalMS float64 `json:"terminal_ms"`
	// RunsPerSec is Runs recovered to terminal per second (Runs/TerminalMS).
	RunsPerSec float64 `json:"runs_per_sec"`

	// Commits and ExecutorCalls are the new incarnation's store commits
	// and plugin calls until every Run was terminal.
	Commits       int64 `json:"commits"`
	ExecutorCalls int64 `json:"executor_calls"`
	// CommitGroups and GroupedCommits are the store's group transactions
	// (one sync each) and the Run commits they wrote (CommitGroups of
	// badgerstore.Store and pgstore.Store).
	CommitGroups   int64 `json:"commit_groups,omitempty"`
	GroupedCommits int64 `json:"grouped_commits,omitempty"`
	// On PostgreSQL, what the server did from the start of the restart
	// until every Run was terminal, per Run: the statements it executed
	// (pg_stat_statements; the BEGIN and COMMIT of pipelined batches not
	// counted), in all and by statement, and its CPU time.
	StatementsPerRun  float64          `json:"statements_per_run,omitempty"`
	Statements        []statementCount `json:"statements,omitempty"`
	ServerCPUMsPerRun float64          `json:"server_cpu_ms_per_run,omitempty"`
	// The same while the child put the Runs in flight (SubmitMS).
	SubmitStatementsPerRun  float64          `json:"submit_statements_per_run,omitempty"`
	SubmitStatements        []statementCount `json:"submit_statements,omitempty"`
	SubmitServerCPUMsPerRun float64          `json:"submit_server_cpu_ms_per_run,omitempty"`
	SessionsTaken           int64            `json:"sessions_taken"`
	Decisions               map[string]int64 `json:"decisions"`
	Completed               int              `json:"completed"`
	Failed                  int              `json:"failed"`
	Cancelled               int              `json:"cancelled"`
	NotTerminal             int              `json:"not_terminal"`
	// LogViolations counts what loop.CheckEnded finds wrong in the event
	// logs (an attempt settled twice, a gap in the numbering, a Run not
	// ended, attempts beyond the policy, …); JobsRerun counts slow jobs
	// the plugin ran more than once (its own exec count in its KV). Both
	// must be 0.
	LogViolations int `json:"log_violations"`
	JobsRerun     int `json:"jobs_rerun"`
	// JobsFailed counts slow jobs whose settlement is not the job's
	// finished result (a failure or a tool error): must be 0.
	JobsFailed int `json:"jobs_failed"`
	// BareMS is the time bare Badger (sync writes on, one 1.5 KB value a
	// transaction, recoveryBareConcurrency committers) takes for as many
	// synced commits as the restart made (Commits plus its claim
	// batches), measured in the same run right after it; BareMultiple is
	// TerminalMS / BareMS. 0 on PostgreSQL.
	BareMS       float64 `json:"bare_ms,omitempty"`
	BareCommits  int64   `json:"bare_commits,omitempty"`
	BareMultiple float64 `json:"bare_multiple,omitempty"`
	// PeakHeapBytes and PeakGoroutines are the largest Go heap (live and
	// unswept objects, runtime/metrics) and goroutine count seen, sampled
	// every 50 ms from the open until every Run was terminal; PeakRSSBytes
	// is the process's peak resident set (VmHWM), which includes the
	// plugins' linear memories and Badger's tables.
	PeakHeapBytes  uint64 `json:"peak_heap_bytes"`
	PeakGoroutines uint64 `json:"peak_goroutines"`
	PeakRSSBytes   uint64 `json:"peak_rss_bytes,omitempty"`
	// LeaseRenewals, LeaseGapMaxMS and LeaseRenewMaxMS are the node
	// lease's renewals during the restart, the longest time between the
	// starts of two successful ones (due every lease_ttl/3; the lease is
	// lost past lease_ttl less a fifth), and the longest renewal call.
	LeaseRenewals   int64   `json:"lease_renewals"`
	LeaseGapMaxMS   float64 `json:"lease_gap_max_ms"`
	LeaseRenewMaxMS float64 `json:"lease_renew_max_ms"`
	// Problems lists what the checks found wrong (empty when OK).
	Problems []string `json:"problems,omitempty"`
	OK       bool     `json:"ok"`
}

// commitGrouper is the Badger store's count of its group commits.
type commitGrouper interface {
	CommitGroups() (groups, commits int64)
}

// recoveryBareConcurrency is the bare baseline's committers: the
// runtime's default MaxDrivers, the sessions recovery drives at once.
const recoveryBareConcurrency = 128

func newBenchRecoveryCmd(bf *benchFlags) *cobra.Command {
	p := recoveryParams{SyncWrites: true}
	sf := &storeFlags{}
	var timeout time.Duration
	var cpuProfile, childProfile, memProfile, traceFile string
	cmd := &cobra.Command{
		Use:   "recovery",
		Short: "Kill -9 a process with N Runs in flight, restart, and time the recovery",
		Long: `recovery measures docs/DESIGN.md §6's recovery with real parts. A child agenthost
process opens a fresh store (sync_writes on) with the prompt-builder,
scripted-model and slow-job plugins, and submits --runs Runs, each in its own
session, whose model calls the slow_job tool for --job-seconds. The child
holds back its polls, so that no job is settled in it; once every Run waits
on its pending job it says so, and this process kills it with SIGKILL.

This process then opens the same store (a new incarnation, wired as run and
serve wire theirs) and measures, from the start of the open: the open
itself, the time until recovery's first pass is done (ready), the time until
every in-flight effect is re-attached or settled (decided), and the time
until every Run is terminal, with the Runs/s that makes. It then checks the
event logs: every Run must have completed, every log must pass
loop.CheckEnded (numbered 1..n, one terminal event, last; no effect attempt
settled twice; no more attempts than the policy allows), and the slow-job
plugin must have run no job twice.

With --store postgres both processes use pgstore, on a throwaway PostgreSQL
server the bench starts (fsync on) and stops, or on the server --dsn names.
Both run under one node.name (--node-name), as a restarted serve does: the
restart holds the name, so its previous incarnation is dead, and it takes
the child's sessions over at once. With --node-name "" the bench first
waits lease_ttl after the kill, for the dead child's node lease to run out
(a shared store cannot tell a dead node from a slow one sooner): that wait
is reported apart, and the times start after it.`,
		Example: `  bin/agenthost bench recovery --runs 1000
  bin/agenthost bench recovery --runs 10000 --json
  bin/agenthost bench recovery --runs 10000 --cpuprofile recovery.pprof
  bin/agenthost bench recovery --runs 10000 --trace recovery.trace
  bin/agenthost bench recovery --runs 10000 --store postgres`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.Runs < 1 || p.Concurrency < 1 || p.JobSeconds < 1 {
				return errors.New("bench: recovery: --runs, --concurrency and --job-seconds must be at least 1")
			}
			if p.LeaseTTL < config.MinLeaseTTL {
				return fmt.Errorf("bench: recovery: --lease-ttl %s: at least %s", p.LeaseTTL, config.MinLeaseTTL)
			}
			if err := sf.check(); err != nil {
				return err
			}
			if p.PluginCallPath != config.PluginCallNative && p.PluginCallPath != config.PluginCallSDK {
				return fmt.Errorf("bench recovery: --plugin-call-path %q: want %s or %s", p.PluginCallPath, config.PluginCallNative, config.PluginCallSDK)
			}
			if err := CheckGuests(p.Guests); err != nil {
				return err
			}
			p.Store = sf.store
			return benchRecovery(cmd, bf, p, sf.dsn, timeout, cpuProfile, childProfile, memProfile, traceFile)
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.Runs, "runs", 1000, "Runs in flight at the kill (the figure docs/BENCHMARKS.md quotes is 10000)")
	f.IntVar(&p.Concurrency, "concurrency", 128, "Runs the child submits at once")
	f.IntVar(&p.JobSeconds, "job-seconds", 1, "how long each slow job runs, in seconds (whole)")
	f.BoolVar(&p.SyncWrites, "sync-writes", true, "the store's sync_writes (false: commits are not fsynced, as a crash test would lose them)")
	f.DurationVar(&p.LeaseTTL, "lease-ttl", config.DefaultLeaseTTL, "both processes' lease_ttl; with --store postgres and --node-name \"\" the restart waits it out first")
	f.StringVar(&p.NodeName, "node-name", "bench-recovery", "with --store postgres, both processes' node.name, under which the restart takes the child's sessions over at once; \"\": none, the restart waits out the child's lease")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up when the child or the recovery takes longer than this")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process from the open until every Run is terminal to `FILE` (go tool pprof)")
	f.StringVar(&childProfile, "child-cpuprofile", "", "write a CPU profile of the child from its open until every Run is in flight (the submission) to `FILE` (go tool pprof)")
	f.StringVar(&traceFile, "trace", "", "write an execution trace of this process from the open until every Run is terminal to `FILE` (go tool trace): where the restart waits, not only where it burns CPU")
	f.StringVar(&memProfile, "memprofile", "", "write a heap profile of this process to `FILE` when every Run is terminal (go tool pprof)")
	f.StringVar(&p.PluginCallPath, "plugin-call-path", config.PluginCallNative, "both processes' plugin_call_path: native or extism-sdk")
	sf.add(cmd)
	guestsFlag(cmd, &p.Guests)
	return cmd
}

func benchRecovery(cmd *cobra.Command, bf *benchFlags, p recoveryParams, dsn string, timeout time.Duration, cpuProfile, childProfile, memProfile, traceFile string) error {
	started := time.Now()
	store := ""
	var pg *benchPostgres // nil on Badger
	if p.Store == config.DriverPostgres {
		// Two processes in turn, each a runtime pool and a change feed.
		var err error
		pg, err = startBenchPostgres(benchContext(cmd), cmd, bf, dsn, 2*(pgstore.DefaultMaxConns+2))
		if err != nil {
			return err
		}
		defer pg.stop()
		p.PostgreSQL, store = pg.version, pg.storeYAML()
	}
	paths, err := bf.guestPaths(p.Guests, plugincatalog.PromptBuilder, plugincatalog.ScriptedModel, recoveryJobTool)
	if err != nil {
		return err
	}
	cache, err := bf.cachePath()
	if err != nil {
		return err
	}
	bin, err := bf.binary()
	if err != nil {
		return err
	}
	dir, cleanup, err := bf.tempDir("recovery")
	if err != nil {
		return err
	}
	defer cleanup()
	if p.Store != config.DriverPostgres {
		p.NodeName = "" // Badger's directory lock tells a dead incarnation at once
	} else if p.NodeName != "" {
		store += fmt.Sprintf("node: {name: %q}\n", p.NodeName)
	}
	cfg, err := writeBenchConfig(dir, store+"plugin_call_path: "+p.PluginCallPath+"\n"+recoveryConfig(dir, cache, paths, p.SyncWrites, p.LeaseTTL))
	if err != nil {
		return fmt.Errorf("bench: recovery: config: %w", err)
	}

	// The first incarnation: a child process that puts the Runs in flight
	// and is killed.
	bf.progressf(cmd, "recovery: a child process puts %d Runs in flight (slow jobs of %d s)", p.Runs, p.JobSeconds)
	var (
		submit    time.Duration
		submitted serverSpent // what the server did for the child
	)
	if err := pg.measure(cmd.Context(), &submitted, func() (err error) {
		submit, err = runRecoveryChild(cmd, bf, bin, cfg.File, filepath.Join(dir, "child.log"), p, childProfile, timeout)
		return err
	}); err != nil {
		return err
	}
	var leaseWait time.Duration
	switch {
	case p.Store == config.DriverPostgres && p.NodeName != "":
		bf.progressf(cmd, "recovery: %d Runs in flight after %s; child killed with SIGKILL; restarting under node name %q, which takes its sessions over at once",
			p.Runs, submit.Round(time.Millisecond), p.NodeName)
	case p.Store == config.DriverPostgres:
		// The child renewed its lease at most lease_ttl ago.
		leaseWait = cfg.LeaseTTL + time.Second
		bf.progressf(cmd, "recovery: %d Runs in flight after %s; child killed with SIGKILL; waiting %s for its node lease (lease_ttl %s) to run out",
			p.Runs, submit.Round(time.Millisecond), leaseWait, cfg.LeaseTTL)
		time.Sleep(leaseWait)
		bf.progressf(cmd, "recovery: restarting")
	default:
		bf.progressf(cmd, "recovery: %d Runs in flight after %s; child killed with SIGKILL; restarting", p.Runs, submit.Round(time.Millisecond))
	}

	// The second incarnation: this process.
	logf, err := os.Create(filepath.Join(dir, "recovery.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	if cpuProfile != "" {
		pf, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: recovery: --cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("bench: recovery: --cpuprofile: %w", err)
		}
		// Stopped at the latest here; measureRecovery stops it as soon as
		// every Run is terminal, before its checks.
		defer pprof.StopCPUProfile()
	}
	if traceFile != "" {
		tf, err := os.Create(traceFile)
		if err != nil {
			return fmt.Errorf("bench: recovery: --trace: %w", err)
		}
		defer tf.Close()
		if err := trace.Start(tf); err != nil {
			return fmt.Errorf("bench: recovery: --trace: %w", err)
		}
		// Stopped at the latest here; measureRecovery stops it with the
		// CPU profile, as soon as every Run is terminal.
		defer trace.Stop()
	}
	res, err := measureRecovery(cmd, bf, cfg, pg, logf, p.Runs, timeout, memProfile)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, serveproc.TailFile(logf.Name(), 20))
	}
	res.SubmitMS, res.LeaseWaitMS = msf(submit), msf(leaseWait)
	res.SubmitStatementsPerRun, res.SubmitStatements, res.SubmitServerCPUMsPerRun = submitted.perRunFigures(float64(p.Runs))
	if p.Store != config.DriverPostgres {
		// The same number of synced commits on bare Badger, on the same
		// disk, right after.
		bare, err := benchkit.OpenBareBadger(filepath.Join(dir, "bare"))
		if err != nil {
			return err
		}
		res.BareCommits = res.Commits + int64((res.SessionsTaken+255)/256)
		took, err := bare.Round(recoveryBareConcurrency, int(res.BareCommits))
		_ = bare.Close()
		if err != nil {
			return err
		}
		res.BareMS = msf(took)
		if res.BareMS > 0 {
			res.BareMultiple = res.TerminalMS / res.BareMS
		}
	}

	out := benchOutput{Bench: "recovery", Started: started, Machine: bf.thisMachine(), Params: p, Result: res}
	storeName := "badgerstore"
	if p.Store == config.DriverPostgres {
		storeName = "pgstore on PostgreSQL " + p.PostgreSQL
	}
	tbl := table{
		Title:  fmt.Sprintf("recovery of %d Runs in flight after kill -9 on %s, plugin_call_path %s, %s of the plugins (from the start of the restart)", p.Runs, storeName, p.PluginCallPath, GuestsTitle(p.Guests)),
		Header: []string{"phase", "ms", "Runs/s"},
		Rows: [][]string{
			{"open (store, plugins, runtime)", fmt.Sprintf("%.1f", res.OpenMS), ""},
			{"ready (first recovery pass)", fmt.Sprintf("%.1f", res.ReadyMS), rate(p.Runs, res.ReadyMS)},
			{"every effect re-attached or settled", fmt.Sprintf("%.1f", res.DecidedMS), rate(p.Runs, res.DecidedMS)},
			{"every Run terminal", fmt.Sprintf("%.1f", res.TerminalMS), rate(p.Runs, res.TerminalMS)},
		},
		Notes: []string{
			fmt.Sprintf("child: %d Runs in flight in %.0f ms (concurrency %d), then SIGKILL", p.Runs, res.SubmitMS, p.Concurrency),
			fmt.Sprintf("sessions taken over %d; decisions %s", res.SessionsTaken, formatDecisions(res.Decisions)),
			fmt.Sprintf("commits %d (%.1f a Run), executor calls %d (%.1f a Run)", res.Commits, float64(res.Commits)/float64(p.Runs),
				res.ExecutorCalls, float64(res.ExecutorCalls)/float64(p.Runs)),
			fmt.Sprintf("peak Go heap %.1f MiB, peak goroutines %d, peak RSS %.1f MiB", float64(res.PeakHeapBytes)/(1<<20), res.PeakGoroutines, float64(res.PeakRSSBytes)/(1<<20)),
			fmt.Sprintf("node lease: %d renewals, longest gap between two %.0f ms, longest renewal %.1f ms (lease_ttl %s: renewed every %s, lost past %s)",
				res.LeaseRenewals, res.LeaseGapMaxMS, res.LeaseRenewMaxMS, cfg.LeaseTTL, cfg.LeaseTTL/3, cfg.LeaseTTL-cfg.LeaseTTL/5),
			fmt.Sprintf("Runs completed %d, failed %d, cancelled %d, not terminal %d; event log violations %d; jobs run twice %d; jobs not finished %d",
				res.Completed, res.Failed, res.Cancelled, res.NotTerminal, res.LogViolations, res.JobsRerun, res.JobsFailed),
		},
	}
	if res.CommitGroups > 0 {
		tbl.Notes = append(tbl.Notes, fmt.Sprintf("Run commits grouped: %d transactions, one sync each, wrote %d (%.1f a transaction)",
			res.CommitGroups, res.GroupedCommits, float64(res.GroupedCommits)/float64(res.CommitGroups)))
	}
	if res.BareMS > 0 {
		tbl.Rows = append(tbl.Rows, []string{fmt.Sprintf("bare Badger: %d synced commits, %d committers", res.BareCommits, recoveryBareConcurrency),
			fmt.Sprintf("%.1f", res.BareMS), ""})
		tbl.Notes = append(tbl.Notes, fmt.Sprintf("every Run terminal in %.2f× the time bare Badger takes for as many synced commits", res.BareMultiple))
	}
	for _, s := range []struct {
		when    string
		perRun  float64
		stmts   []statementCount
		cpuMsPR float64
	}{
		{"while the child put the Runs in flight", res.SubmitStatementsPerRun, res.SubmitStatements, res.SubmitServerCPUMsPerRun},
		{"from the restart until every Run was terminal", res.StatementsPerRun, res.Statements, res.ServerCPUMsPerRun},
	} {
		if s.perRun == 0 && s.cpuMsPR == 0 {
			continue
		}
		tbl.Notes = append(tbl.Notes, fmt.Sprintf("PostgreSQL %s: %.1f statements a Run (pg_stat_statements; pipelined BEGIN and COMMIT not counted), %.2f ms of server CPU a Run",
			s.when, s.perRun, s.cpuMsPR))
		for _, st := range s.stmts {
			if st.PerRun >= 0.05 {
				tbl.Notes = append(tbl.Notes, fmt.Sprintf("  %.2f a Run: %s", st.PerRun, st.Statement))
			}
		}
	}
	if leaseWait > 0 {
		tbl.Notes = append(tbl.Notes, fmt.Sprintf("before the restart: %.0f ms for the dead child's node lease (lease_ttl %s) to run out; not in the times above", res.LeaseWaitMS, cfg.LeaseTTL))
	}
	if err := bf.emit(cmd.OutOrStdout(), out, tbl); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("bench: recovery: the checks failed: %s", strings.Join(res.Problems, "; "))
	}
	return nil
}

func rate(n int, msec float64) string {
	if msec <= 0 {
		return ""
	}
	return fmt.Sprintf("%.0f", float64(n)/(msec/1000))
}

func formatDecisions(d map[string]int64) string {
	var parts []string
	for _, k := range []string{"reattach", "settle", "retry", "fail", "fail_run", "defer"} {
		if d[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, d[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// recoveryConfig is the bench's config: a fresh data dir, the shared
// wazero cache and one tenant whose model calls slow_job.
func recoveryConfig(dir, cache string, paths map[string]string, syncWrites bool, leaseTTL time.Duration) string {
	return fmt.Sprintf(`data_dir: %q
sync_writes: %t
lease_ttl: %s
cache_dir: %q
log: {format: text, level: warn}
plugins:
  prompt-builder: {path: %q, role: builder}
  scripted-model: {path: %q, role: executor}
  slow-job: {path: %q, role: executor}
tenants:
  %s:
    builder: prompt-builder
    model: scripted-model
    tool_executors: [slow-job]
`, filepath.Join(dir, "data"), syncWrites, leaseTTL, cache,
		paths[plugincatalog.PromptBuilder], paths[plugincatalog.ScriptedModel], paths[recoveryJobTool], recoveryTenant)
}

// runRecoveryChild starts `agenthost bench recovery-child`, relays its
// progress, waits for its ready line and kills it with SIGKILL. It returns
// the child's time to put the Runs in flight. With profile set, the
// child writes its CPU profile of the submission there.
func runRecoveryChild(cmd *cobra.Command, bf *benchFlags, bin, cfgPath, logPath string, p recoveryParams, profile string, timeout time.Duration) (time.Duration, error) {
	args := []string{"bench", "recovery-child", "--config", cfgPath, "--log", logPath,
		"--runs", strconv.Itoa(p.Runs), "--concurrency", strconv.Itoa(p.Concurrency), "--job-seconds", strconv.Itoa(p.JobSeconds)}
	if profile != "" {
		args = append(args, "--cpuprofile", profile)
	}
	if bf.quiet {
		args = append(args, "--quiet")
	}
	child := exec.Command(bin, args...)
	child.Stderr = cmd.ErrOrStderr()
	// The child exits when its stdin closes: it does not outlive this
	// process, whatever becomes of it.
	stdin, err := child.StdinPipe()
	if err != nil {
		return 0, err
	}
	defer stdin.Close()
	stdout, err := child.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := child.Start(); err != nil {
		return 0, fmt.Errorf("bench: recovery: starting %s: %w", bin, err)
	}
	lines := make(chan string, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	kill := func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	}
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			err := child.Wait()
			return 0, fmt.Errorf("bench: recovery: the child exited before its Runs were in flight (%v)\n%s", err, serveproc.TailFile(logPath, 20))
		}
		line = l
	case <-time.After(timeout):
		kill()
		return 0, fmt.Errorf("bench: recovery: the child did not put its Runs in flight within %s (raise --timeout)\n%s", timeout, serveproc.TailFile(logPath, 20))
	}
	// The crash: SIGKILL, nothing closed.
	kill()
	var n int
	var submitMS float64
	if _, err := fmt.Sscanf(line, recoveryReady+" %d %f", &n, &submitMS); err != nil || n != p.Runs {
		return 0, fmt.Errorf("bench: recovery: the child said %q, want %q", line, fmt.Sprintf("%s %d MS", recoveryReady, p.Runs))
	}
	return time.Duration(submitMS * float64(time.Millisecond)), nil
}

// recoveringNode is what awaitRecovery watches of the restarted node: its
// *runtime.Runtime.
type recoveringNode interface {
	Ready() bool
	Recovery() runtime.RecoveryStats
	Stats() runtime.Stats
	LeaseLost() <-chan struct{}
}

// recoveryTimes are the moments, counted from the start of the restart,
// at which awaitRecovery saw recovery's first pass done (ready), every
// in-flight effect decided, and every Run terminal.
type recoveryTimes struct {
	ready, decided, terminal time.Duration
}

// awaitRecovery polls rt until its n Runs are terminal, and returns when
// it saw each phase end. It gives up at timeout, and at once when the
// node loses its node lease: a runtime that lost its lease has given up
// every session and drives nothing more (docs/DESIGN.md §5.3, invariant
// 11), so waiting on would only run into the timeout with no word of
// why.
func awaitRecovery(ctx context.Context, rt recoveringNode, n int, start time.Time, timeout, leaseTTL time.Duration) (recoveryTimes, error) {
	var at recoveryTimes
	progress := func() string {
		return fmt.Sprintf("ready %t, %d of %d effects decided, %d of %d Runs terminal",
			rt.Ready(), rt.Recovery().Decided(), n, rt.Stats().RunsEnded(), n)
	}
	lost := rt.LeaseLost()
	leaseLost := func() error {
		st := rt.Stats()
		return fmt.Errorf("bench: recovery: the restarted node lost its node lease %s after the restart (lease_ttl %s; %d renewals, the longest gap between two %s): it gave up every session, so its Runs cannot end; "+
			"no renewal succeeded within the lease's trust window, which happens when the process is starved of CPU for that long: raise --lease-ttl or load the machine less (%s)",
			time.Since(start).Round(time.Millisecond), leaseTTL, st.LeaseRenewals, st.LeaseGapMax.Round(time.Millisecond), progress())
	}
	tick := time.NewTicker(2 * time.Millisecond) // the measurement's resolution
	defer tick.Stop()
	deadline := time.After(timeout)
	for at.terminal == 0 {
		select {
		case <-tick.C:
		case <-lost:
			return at, leaseLost()
		case <-deadline:
			select {
			case <-lost:
				return at, leaseLost()
			default:
			}
			return at, fmt.Errorf("bench: recovery: not done within %s (raise --timeout): %s", timeout, progress())
		case <-ctx.Done():
			return at, ctx.Err()
		}
		now := time.Since(start)
		if at.ready == 0 && rt.Ready() {
			at.ready = now
		}
		if at.decided == 0 && rt.Recovery().Decided() >= int64(n) {
			at.decided = now
		}
		if rt.Stats().RunsEnded() >= int64(n) {
			at.terminal = now
		}
	}
	// The last Run may have ended before a poll saw Ready.
	if at.ready == 0 {
		at.ready = at.terminal
	}
	if at.decided == 0 {
		at.decided = at.terminal
	}
	return at, nil
}

// nodeNameFreed bounds the wait for the server to free the killed child's
// node name lock.
const nodeNameFreed = 10 * time.Second

// measureRecovery opens the system over the killed child's store and
// times its recovery, then checks the event logs.
func measureRecovery(cmd *cobra.Command, bf *benchFlags, cfg *config.Config, pg *benchPostgres, logw io.Writer, n int, timeout time.Duration, memProfile string) (RecoveryResult, error) {
	var res RecoveryResult
	ctx := cmd.Context()
	var c0 serverCounts
	if pg != nil {
		var err error
		if c0, err = pg.counts(ctx); err != nil {
			return res, err
		}
	}
	start := time.Now()
	sys, err := node.Open(ctx, cfg, []string{recoveryTenant}, node.NewLogger(cfg, logw), node.Wiring{})
	// Under a node name, the server frees the killed child's lock when it
	// sees the child's connection closed, which may be a moment after
	// the kill; the times include that wait.
	for deadline := start.Add(nodeNameFreed); errors.Is(err, runtime.ErrNodeNameHeld) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		sys, err = node.Open(ctx, cfg, []string{recoveryTenant}, node.NewLogger(cfg, logw), node.Wiring{})
	}
	if err != nil {
		return res, fmt.Errorf("bench: recovery: reopening: %w", err)
	}
	defer sys.Close(context.WithoutCancel(ctx))
	opened := time.Since(start)
	rt := sys.Runtime()
	m := bf.startMeter(cmd, "recovery: Runs terminal", int64(n), func() int64 { return rt.Stats().RunsEnded() })
	peaks := startPeakSampler(50 * time.Millisecond)
	at, err := awaitRecovery(ctx, rt, n, start, timeout, cfg.LeaseTTL)
	m.Stop()
	res.PeakHeapBytes, res.PeakGoroutines = peaks.stop()
	if err != nil {
		return res, err
	}
	if pg != nil {
		// Read before the checks below, which read every Run.
		c1, err := pg.counts(ctx)
		if err != nil {
			return res, err
		}
		var sp serverSpent
		sp.add(c0, c1)
		res.StatementsPerRun, res.Statements, res.ServerCPUMsPerRun = sp.perRunFigures(float64(n))
	}
	res.PeakRSSBytes = peakRSS()
	if memProfile != "" {
		if err := writeHeapProfile(memProfile); err != nil {
			return res, err
		}
	}
	// --cpuprofile and --trace cover the recovery, not the checks.
	pprof.StopCPUProfile()
	trace.Stop()
	r := rt.Recovery()
	res.OpenMS, res.ReadyMS, res.DecidedMS, res.TerminalMS = msf(opened), msf(at.ready), msf(at.decided), msf(at.terminal)
	res.RunsPerSec = float64(n) / at.terminal.Seconds()
	res.SessionsTaken = r.SessionsTaken
	st := rt.Stats()
	res.Commits, res.ExecutorCalls = st.Commits, st.ExecutorCalls
	if g, ok := sys.Store().(commitGrouper); ok {
		res.CommitGroups, res.GroupedCommits = g.CommitGroups()
	}
	res.LeaseRenewals, res.LeaseGapMaxMS, res.LeaseRenewMaxMS = st.LeaseRenewals, msf(st.LeaseGapMax), msf(st.LeaseRenewMax)
	res.Decisions = map[string]int64{"reattach": r.Reattach, "settle": r.Settle, "retry": r.Retry,
		"fail": r.Fail, "fail_run": r.FailRun, "defer": r.Defer}
	bf.progressf(cmd, "recovery: every Run terminal after %s; checking the event logs", at.terminal.Round(time.Millisecond))
	if err := checkRecovered(ctx, sys.Store(), n, &res); err != nil {
		return res, err
	}
	return res, nil
}

// checkRecovered reads what the recovery left: every Run of the tenant
// must be completed, its event log must pass loop.CheckEnded (no effect
// attempt settled twice, …), and the slow-job plugin must have run each
// job once (its exec count in its KV).
func checkRecovered(ctx context.Context, store runtime.Store, n int, res *RecoveryResult) error {
	var ids []string
	for _, st := range []loop.Status{loop.StatusCompleted, loop.StatusFailed, loop.StatusCancelled,
		loop.StatusPending, loop.StatusRunning, loop.StatusWaiting} {
		count := 0
		for after := ""; ; {
			page, err := store.RunsByStatus(ctx, recoveryTenant, st, after, 1000)
			if err != nil {
				return fmt.Errorf("bench: recovery: listing %s Runs: %w", st, err)
			}
			count += len(page)
			ids = append(ids, page...)
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1]
		}
		switch st {
		case loop.StatusCompleted:
			res.Completed = count
		case loop.StatusFailed:
			res.Failed = count
		case loop.StatusCancelled:
			res.Cancelled = count
		default:
			res.NotTerminal += count
		}
	}
	if len(ids) != n {
		res.Problems = append(res.Problems, fmt.Sprintf("the store holds %d Runs, want %d", len(ids), n))
	}
	if res.Completed != n {
		res.Problems = append(res.Problems, fmt.Sprintf("%d of %d Runs completed", res.Completed, n))
	}
	for _, id := range ids {
		evs, err := store.Events(ctx, recoveryTenant, id, 1, 100000)
		if err != nil {
			return fmt.Errorf("bench: recovery: events of %s: %w", id, err)
		}
		for _, v := range loop.CheckEnded(evs) {
			if res.LogViolations++; res.LogViolations <= 5 {
				res.Problems = append(res.Problems, fmt.Sprintf("run %s: %s", id, v))
			}
		}
		for _, ev := range evs {
			k := fmt.Sprintf("%s#%d", ev.EffectID, ev.Attempt)
			switch ev.Type {
			case loop.EventEffectSettled:
				if ref, err := loop.ParseEffectID(ev.EffectID); err == nil && ref.Kind == "tool" && !jobFinished(ev.Outcome) {
					res.JobsFailed++
					if res.JobsFailed == 1 {
						res.Problems = append(res.Problems, fmt.Sprintf("slow job %s did not finish: %s", k, describeOutcome(ev.Outcome)))
					}
				}
			case loop.EventEffectDispatched:
				if ref, err := loop.ParseEffectID(ev.EffectID); err != nil || ref.Kind != "tool" {
					continue
				}
				v, err := store.KVGet(ctx, recoveryTenant, recoveryJobTool, []byte("exec/"+k))
				if err != nil {
					return fmt.Errorf("bench: recovery: slow-job's exec count of %s: %w", k, err)
				}
				if c, _ := strconv.Atoi(string(v)); c > 1 {
					res.JobsRerun++
				}
			}
		}
	}
	if res.JobsFailed > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d slow jobs did not finish", res.JobsFailed))
	}
	if res.LogViolations > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d violations of loop.CheckEnded in the event logs", res.LogViolations))
	}
	if res.JobsRerun > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d slow jobs ran more than once", res.JobsRerun))
	}
	res.OK = len(res.Problems) == 0
	return nil
}

// newBenchRecoveryChildCmd is the first incarnation of `bench recovery`:
// it puts the Runs in flight, says so on stdout and waits to be killed.
func newBenchRecoveryChildCmd(bf *benchFlags) *cobra.Command {
	p := recoveryParams{}
	var cfgPath, logPath string
	cmd := &cobra.Command{
		Use:    "recovery-child",
		Short:  "The process `bench recovery` kills (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			return recoveryChild(cmd, bf, cfg, logPath, p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", "", "the config `bench recovery` wrote")
	f.StringVar(&logPath, "log", "", "where the runtime's log goes")
	f.IntVar(&p.Runs, "runs", 1000, "Runs to put in flight")
	f.IntVar(&p.Concurrency, "concurrency", 128, "Runs submitted at once")
	f.IntVar(&p.JobSeconds, "job-seconds", 1, "how long each slow job runs, in seconds")
	return cmd
}

func recoveryChild(cmd *cobra.Command, bf *benchFlags, cfg *config.Config, logPath string, p recoveryParams) error {
	ctx := cmd.Context()
	logw := io.Discard
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return err
		}
		// Never closed: the process is killed.
		logw = f
	}
	var held, heldStarts counter
	w := node.Wiring{Executor: func(plugin string, ex runtime.Executor) runtime.Executor {
		if plugin == recoveryJobTool {
			return heldPolls{Executor: ex, polls: &held, starts: &heldStarts}
		}
		return ex
	}}
	sys, err := node.Open(ctx, cfg, []string{recoveryTenant}, node.NewLogger(cfg, logw), w)
	if err != nil {
		return fmt.Errorf("bench: recovery-child: %w", err)
	}
	start := time.Now()
	var inFlight counter
	m := bf.startMeter(cmd, "recovery: child: Runs in flight", int64(p.Runs), inFlight.get)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		next     = make(chan int)
	)
	input := fmt.Sprintf(recoveryQuestion, p.JobSeconds)
	for range min(p.Concurrency, p.Runs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res, err := sys.Runtime().Execute(ctx, runtime.Request{Tenant: recoveryTenant, Session: fmt.Sprintf("s%06d", i), Input: input})
				if err == nil && (res.Kind != runtime.ResultWaiting || res.Waiting == nil || len(res.Waiting.Pending) != 1) {
					err = fmt.Errorf("run %s ended %s (status %s, failure %+v, %v), not waiting on its one slow job", res.Run.ID, res.Kind, res.Run.Status, res.Run.Failure, res.Err)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					continue
				}
				inFlight.Add(1)
			}
		}()
	}
	for i := range p.Runs {
		next <- i
	}
	close(next)
	wg.Wait()
	m.Stop()
	if firstErr != nil {
		return fmt.Errorf("bench: recovery-child: %w", firstErr)
	}
	if n := held.get(); n > 0 {
		bf.progressf(cmd, "recovery: child: the runtime polled pending jobs %d times before their poll_after of %s (answered pending, not passed to the plugin)", n, recoveryHold)
	}
	if n := heldStarts.get(); n > 0 {
		bf.progressf(cmd, "recovery: child: %d starts returned after their job was due (answered pending, left to the restart's attach)", n)
	}
	// --cpuprofile covers the submission: written before the kill.
	bf.stopProfile()
	fmt.Fprintf(cmd.OutOrStdout(), "%s %d %.1f\n", recoveryReady, p.Runs, msf(time.Since(start)))
	// Wait for the SIGKILL. Should the parent go away instead, stdin
	// closes: exit as abruptly as the kill would have.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
	return nil
}

// heldPolls wraps the slow-job executor of the child so that no job
// settles before the kill and every one is left to recovery: a pending
// job is next polled only after recoveryHold, and a poll made all the same
// does not reach the plugin (it answers pending, and is counted). A start
// that returns after its job is due (the plugin answers done: under load
// its KV writes can take longer than a short job) is answered pending
// too, and counted: its job is on record, and the restart's attach finds
// it done.
type heldPolls struct {
	runtime.Executor
	polls  *counter
	starts *counter // starts whose job was done when they returned
}

func (h heldPolls) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	r, err := h.Executor.Start(ctx, c)
	switch {
	case err != nil:
	case r.State == abi.StatePending:
		r.PollAfterMS = recoveryHold.Milliseconds()
	case r.State == abi.StateDone:
		h.starts.Add(1)
		r = abi.EffectReply{State: abi.StatePending, Handle: "held/" + c.Input.Effect.ID, PollAfterMS: recoveryHold.Milliseconds()}
	}
	return r, err
}

func (h heldPolls) Poll(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	h.polls.Add(1)
	return abi.EffectReply{State: abi.StatePending, Handle: c.Input.Handle, PollAfterMS: recoveryHold.Milliseconds()}, nil
}

// jobFinished reports whether a slow job's settlement is its finished
// result.
func jobFinished(o *loop.Outcome) bool {
	return o != nil && o.State == loop.OutcomeDone && o.Tool != nil && !o.Tool.IsError
}

func describeOutcome(o *loop.Outcome) string {
	switch {
	case o == nil:
		return "no outcome"
	case o.Error != nil:
		return fmt.Sprintf("%s: %+v", o.State, *o.Error)
	case o.Tool != nil:
		return fmt.Sprintf("%s: %s", o.State, o.Tool.Content)
	}
	return string(o.State)
}

// peakSampler samples the Go heap and the goroutine count through
// runtime/metrics (no stop-the-world) until stop, keeping the largest.
type peakSampler struct {
	done           chan struct{}
	finished       chan struct{}
	heap, routines uint64
}

func startPeakSampler(every time.Duration) *peakSampler {
	p := &peakSampler{done: make(chan struct{}), finished: make(chan struct{})}
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	read := func() {
		metrics.Read(samples)
		if samples[0].Value.Kind() == metrics.KindUint64 {
			p.heap = max(p.heap, samples[0].Value.Uint64())
		}
		if samples[1].Value.Kind() == metrics.KindUint64 {
			p.routines = max(p.routines, samples[1].Value.Uint64())
		}
	}
	go func() {
		defer close(p.finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			read()
			select {
			case <-t.C:
			case <-p.done:
				read()
				return
			}
		}
	}()
	return p
}

// stop ends the sampling and returns the peaks.
func (p *peakSampler) stop() (heap, goroutines uint64) {
	close(p.done)
	<-p.finished
	return p.heap, p.routines
}

// peakRSS is the process's peak resident set (VmHWM in
// /proc/self/status), 0 where there is none.
func peakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// writeHeapProfile writes the live heap's profile to path (--memprofile).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: recovery: --memprofile: %w", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("bench: recovery: --memprofile: %w", err)
	}
	return nil
}

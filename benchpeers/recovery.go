package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/bench"
	"github.com/agenthost/agenthost/pgstore"
)

// The recovery comparison (`benchpeers recovery`): N Runs in flight, each
// on a slow job, the process killed with SIGKILL, a new one started, and
// the time from the start of the restart until every Run is terminal, on
// agenthost and on DBOS, on one throwaway PostgreSQL server, in
// alternating rounds. The agenthost side is `agenthost bench recovery
// --store postgres --dsn` (its child, its kill and its checks), which
// keeps its tables in a schema of its own and drops it; the DBOS side is
// dbosrecovery.go's child process, in a schema of its own per round.

// recoveryParams are the recovery comparison's parameters, as --json
// reports them.
type recoveryParams struct {
	Runs        int    `json:"runs"`
	JobSeconds  int    `json:"job_seconds"`
	Rounds      int    `json:"rounds"`
	Concurrency int    `json:"concurrency"`
	MaxConns    int    `json:"max_conns"`
	DBOSJobs    string `json:"dbos_jobs"`
	PostgreSQL  string `json:"postgresql"`
	DBOS        string `json:"dbos"`

	agenthost, plugins, cacheDir, workDir string
	timeout                               time.Duration
	quiet, json                           bool
}

// recoveryRound is one system's recovery in one round.
type recoveryRound struct {
	System string `json:"system"`
	Round  int    `json:"round"`
	Runs   int    `json:"runs"`
	// SubmitMS is the first incarnation's time to put every Run in
	// flight (every DBOS workflow in its step).
	SubmitMS float64 `json:"submit_ms"`
	// LeaseWaitMS is agenthost's wait after the kill for the dead
	// process's node lease (0 under a node name; DBOS has none).
	LeaseWaitMS float64 `json:"lease_wait_ms"`
	// OpenMS is the restart's open: agenthost's node.Open, DBOS's Launch
	// returned (seen by the bench: the child's start included).
	OpenMS float64 `json:"open_ms"`
	// TerminalMS is the time from the start of the restart until every
	// Run was terminal; TotalMS adds the lease wait, and RunsPerSec is
	// Runs / TotalMS.
	TerminalMS float64 `json:"terminal_ms"`
	TotalMS    float64 `json:"total_ms"`
	RunsPerSec float64 `json:"runs_per_sec"`
	// Completed counts the Runs that ended well (agenthost: completed;
	// DBOS: SUCCESS); NotCompleted the others.
	Completed    int `json:"completed"`
	NotCompleted int `json:"not_completed"`
	// Violations are agenthost's event-log violations and jobs that did
	// not finish, and DBOS workflows without a recorded step start.
	Violations int `json:"violations"`
	// JobsRerun counts jobs run more than once: for agenthost a violation
	// (the slow-job plugin's own exec counts), for DBOS a step in progress
	// at the kill that ran again (at least once: not a violation);
	// JobStarts is DBOS's step starts over both incarnations.
	JobsRerun int `json:"jobs_rerun"`
	JobStarts int `json:"job_starts,omitempty"`
}

// recoveryRatio is agenthost's time over DBOS's in one round, and over
// all rounds (Round 0: the sums).
type recoveryRatio struct {
	Round int     `json:"round"`
	Total float64 `json:"total"`
}

type recoveryResult struct {
	Rounds []recoveryRound `json:"rounds"`
	Ratios []recoveryRatio `json:"ratios"`
	OK     bool            `json:"ok"`
}

func newRecoveryCommand() *cobra.Command {
	p := &recoveryParams{}
	cmd := &cobra.Command{
		Use:   "recovery",
		Short: "agenthost against DBOS: kill -9 with N Runs on slow jobs, restart, time until every Run is terminal",
		Long: `recovery puts --runs Runs in flight, each on a slow job of --job-seconds, kills
the process with SIGKILL, starts a new one and times, from the start of the
restart, until every Run is terminal, on agenthost and on DBOS Transact, in
--rounds rounds (agenthost, DBOS; DBOS, agenthost; …), on one throwaway
PostgreSQL server it starts (fsync on) and stops.

agenthost: ` + "`agenthost bench recovery --store postgres --dsn`" + ` on that server (--agenthost,
built by make build), in a schema of its own, both incarnations under one
node name, so that the lease wait is 0; it checks every event log and that no
job ran twice. DBOS: this binary, re-executed, launches DBOS with a fixed
executor ID and application version and starts the workflows, each one step
that records its start and takes --job-seconds; it is killed once every step
has started, and a new process under the same executor ID recovers them at
Launch. A step in progress at the kill runs again (DBOS's steps are at least
once): --dbos-jobs rerun (the default) runs the job again in full, resume
waits only what is left since its first start, as agenthost's slow-job
plugin attaches to its job. Re-runs are counted, not failed.`,
		Example: `  make bench-peers-recovery
  go run . recovery --runs 200 --job-seconds 5 --rounds 2
  go run . recovery --runs 10000 --job-seconds 5 --rounds 2 --json`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.Runs < 1 || p.JobSeconds < 1 || p.Rounds < 1 || p.Concurrency < 1 || p.MaxConns < 1 {
				return errors.New("benchpeers recovery: --runs, --job-seconds, --rounds, --concurrency and --max-conns must be at least 1")
			}
			if p.DBOSJobs != dbosJobsRerun && p.DBOSJobs != dbosJobsResume {
				return fmt.Errorf("benchpeers recovery: --dbos-jobs %q: want %s or %s", p.DBOSJobs, dbosJobsRerun, dbosJobsResume)
			}
			bin, err := filepath.Abs(p.agenthost)
			if err == nil {
				_, err = os.Stat(bin)
			}
			if err != nil {
				return fmt.Errorf("benchpeers recovery: --agenthost %s: %w: build it with make build, or point --agenthost at the binary", p.agenthost, err)
			}
			p.agenthost = bin
			return compareRecovery(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), p)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&p.Runs, "runs", "n", 200, "Runs in flight at the kill, each system, each round (issue 39's figure: 10000)")
	f.IntVar(&p.JobSeconds, "job-seconds", 5, "how long each slow job takes, in seconds")
	f.IntVar(&p.Rounds, "rounds", 2, "rounds, each recovering --runs Runs on every system in turn, the order alternating")
	f.IntVar(&p.Concurrency, "concurrency", 128, "Runs the first incarnation submits at once (bench recovery's --concurrency)")
	f.IntVar(&p.MaxConns, "max-conns", pgstore.DefaultMaxConns, "DBOS's working connections (its pool less its listener's), as pgstore's default pool")
	f.StringVar(&p.DBOSJobs, "dbos-jobs", dbosJobsRerun, "how a restarted DBOS step takes its job up: rerun (in full) or resume (what is left since its first start)")
	f.StringVar(&p.agenthost, "agenthost", "../bin/agenthost", "the agenthost binary (make build)")
	f.StringVar(&p.plugins, "plugins", "../build/plugins", "the `DIR` that make plugins builds the plugins into")
	f.StringVar(&p.cacheDir, "cache-dir", "../.cache/wazero", "the wazero compilation cache (\"\" for none)")
	f.StringVar(&p.workDir, "work-dir", "", "where agenthost's temporary files go (default: the system's temp dir)")
	f.DurationVar(&p.timeout, "timeout", 10*time.Minute, "give up on a system's round when it takes longer than this")
	f.BoolVar(&p.json, "json", false, "print the result as JSON on stdout instead of tables")
	f.BoolVarP(&p.quiet, "quiet", "q", false, "print no progress on stderr")
	return cmd
}

// compareRecovery starts the throwaway PostgreSQL server, measures both
// systems' recovery in alternating rounds, and prints the result on w,
// its progress on log.
func compareRecovery(ctx context.Context, w, log io.Writer, p *recoveryParams) error {
	started := time.Now()
	progress := func(format string, args ...any) {
		if !p.quiet {
			fmt.Fprintf(log, "benchpeers: "+format+"\n", args...)
		}
	}
	progress("starting a throwaway PostgreSQL server (fsync on)")
	// One system at a time, two incarnations each (the killed one's
	// connections close with it), and the bench's own.
	srv, dsn, err := startServer(ctx, 4*(p.MaxConns+2)+20)
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop() }()
	if p.PostgreSQL, err = bench.PostgresVersion(ctx, dsn); err != nil {
		return err
	}
	p.DBOS = moduleVersion("github.com/dbos-inc/dbos-transact-golang")
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("benchpeers: PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var res recoveryResult
	systems := []string{"agenthost", sysDBOS}
	for r := 1; r <= p.Rounds; r++ {
		for i := range systems {
			name := systems[(i+r-1)%len(systems)]
			progress("round %d: %s, %d Runs on slow jobs of %d s", r, recoveryTitle(name), p.Runs, p.JobSeconds)
			var rr recoveryRound
			if name == sysDBOS {
				rr, err = recoverDBOS(ctx, conn, dsn, fmt.Sprintf("dbos_recovery_%d", r), p, progress)
			} else {
				rr, err = recoverAgenthost(ctx, log, dsn, p)
			}
			if err != nil {
				return fmt.Errorf("benchpeers: recovery, round %d, %s: %w", r, recoveryTitle(name), err)
			}
			rr.System, rr.Round = name, r
			progress("round %d: %s: every Run terminal %.0f ms after the restart began (lease wait %.0f ms); %d completed, %d jobs run again",
				r, recoveryTitle(name), rr.TerminalMS, rr.LeaseWaitMS, rr.Completed, rr.JobsRerun)
			res.Rounds = append(res.Rounds, rr)
		}
	}
	res.Ratios = recoveryRatios(res.Rounds)
	res.OK = true
	for _, rr := range res.Rounds {
		if rr.Completed != rr.Runs || rr.NotCompleted > 0 || rr.Violations > 0 || (rr.System != sysDBOS && rr.JobsRerun > 0) {
			res.OK = false
		}
	}
	if err := bench.Emit(w, p.json, "(this checkout)", "peers-recovery", started, p, res, recoveryTable(p, res.Rounds), recoveryRatiosTable(res.Ratios)); err != nil {
		return err
	}
	if !res.OK {
		return errors.New("benchpeers: recovery: a system left Runs not completed, or broke a check (the table says which)")
	}
	return nil
}

func recoveryTitle(system string) string {
	if system == sysDBOS {
		return systemTitles[sysDBOS]
	}
	return "agenthost"
}

// recoverAgenthost runs `agenthost bench recovery --store postgres` on
// the server dsn names and reads its JSON.
func recoverAgenthost(ctx context.Context, log io.Writer, dsn string, p *recoveryParams) (recoveryRound, error) {
	args := []string{"bench", "recovery", "--store", "postgres", "--dsn", dsn, "--runs", strconv.Itoa(p.Runs),
		"--job-seconds", strconv.Itoa(p.JobSeconds), "--concurrency", strconv.Itoa(p.Concurrency),
		"--timeout", p.timeout.String(), "--plugins", p.plugins, "--cache-dir", p.cacheDir, "--json"}
	if p.workDir != "" {
		args = append(args, "--work-dir", p.workDir)
	}
	if p.quiet {
		args = append(args, "--quiet")
	}
	cmd := exec.CommandContext(ctx, p.agenthost, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = io.MultiWriter(log, &stderr)
	if p.quiet {
		cmd.Stderr = &stderr
	}
	runErr := cmd.Run()
	var out struct {
		Result bench.RecoveryResult `json:"result"`
	}
	// It prints its JSON when its checks fail too, and exits 1.
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return recoveryRound{}, fmt.Errorf("%s %s: %v (%v)\n%s", p.agenthost, strings.Join(args[:2], " "), runErr, err, tail(stderr.String(), 20))
	}
	r := out.Result
	if r.TerminalMS <= 0 {
		return recoveryRound{}, fmt.Errorf("%s bench recovery: no time in its result: %v\n%s", p.agenthost, runErr, tail(stderr.String(), 20))
	}
	total := r.LeaseWaitMS + r.TerminalMS
	return recoveryRound{Runs: p.Runs, SubmitMS: r.SubmitMS, LeaseWaitMS: r.LeaseWaitMS, OpenMS: r.OpenMS,
		TerminalMS: r.TerminalMS, TotalMS: total, RunsPerSec: float64(p.Runs) / (total / 1000),
		Completed: r.Completed, NotCompleted: r.Failed + r.Cancelled + r.NotTerminal,
		Violations: r.LogViolations + r.JobsFailed, JobsRerun: r.JobsRerun}, nil
}

// recoverDBOS runs DBOS's two incarnations in schema: the first starts
// the workflows and is killed once each is in its step; the second
// recovers them. It polls DBOS's workflow_status until every workflow
// has succeeded, then reads the step starts.
func recoverDBOS(ctx context.Context, conn *pgx.Conn, dsn, schema string, p *recoveryParams, progress func(string, ...any)) (recoveryRound, error) {
	jobs := dbosJobsTable(schema)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s_jobs; CREATE TABLE %s (workflow_id text PRIMARY KEY, starts int NOT NULL, first_start_ms bigint NOT NULL)", schema, jobs)); err != nil {
		return recoveryRound{}, fmt.Errorf("the table of step starts: %w", err)
	}
	defer func() {
		cctx := context.WithoutCancel(ctx)
		_, _ = conn.Exec(cctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; DROP SCHEMA IF EXISTS %s_jobs CASCADE", schema, schema))
	}()
	self, err := os.Executable()
	if err != nil {
		return recoveryRound{}, err
	}
	args := []string{dbosChildCommand, "--dsn", dsn, "--schema", schema, "--dbos-jobs", p.DBOSJobs,
		"--runs", strconv.Itoa(p.Runs), "--concurrency", strconv.Itoa(p.Concurrency),
		"--job-seconds", strconv.Itoa(p.JobSeconds), "--max-conns", strconv.Itoa(p.MaxConns + 1)}

	first, err := startChild(self, args...)
	if err != nil {
		return recoveryRound{}, err
	}
	line, err := first.line(p.timeout)
	// The crash: SIGKILL, nothing closed.
	first.kill()
	if err != nil {
		return recoveryRound{}, fmt.Errorf("the first incarnation: %w", err)
	}
	var n int
	var submitMS float64
	if _, err := fmt.Sscanf(line, dbosReadyLine+" %d %f", &n, &submitMS); err != nil || n != p.Runs {
		return recoveryRound{}, fmt.Errorf("the first incarnation said %q; want %q", line, fmt.Sprintf("%s %d MS", dbosReadyLine, p.Runs))
	}
	progress("DBOS: %d workflows in their step after %.0f ms; killed with SIGKILL; restarting under executor ID %q", n, submitMS, dbosExecutorID)

	start := time.Now()
	restart, err := startChild(self, append(args, "--restart")...)
	if err != nil {
		return recoveryRound{}, err
	}
	defer restart.stop()
	var launched time.Duration
	lines := restart.lines
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	deadline := time.After(p.timeout)
	rr := recoveryRound{Runs: p.Runs, SubmitMS: submitMS}
	count := func() (done, ended int, err error) {
		err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'))
			FROM %s.workflow_status WHERE name = $1`, schema), dbosRecoveryWorkflow).Scan(&done, &ended)
		return done, ended, err
	}
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				lines = nil
				if launched == 0 {
					return rr, fmt.Errorf("the restart exited before it launched DBOS (%v)\n%s", restart.cmd.Wait(), tail(restart.stderr.String(), 20))
				}
				continue
			}
			if strings.HasPrefix(l, dbosLaunchedLine) && launched == 0 {
				launched = time.Since(start)
			}
			continue
		case <-poll.C:
		case <-deadline:
			done, _, _ := count()
			return rr, fmt.Errorf("%d of %d workflows succeeded within %s (raise --timeout)", done, p.Runs, p.timeout)
		case <-ctx.Done():
			return rr, ctx.Err()
		}
		done, ended, err := count()
		if err != nil {
			return rr, fmt.Errorf("reading DBOS's workflow_status: %w", err)
		}
		if ended >= p.Runs {
			rr.TerminalMS = ms(time.Since(start))
			rr.Completed, rr.NotCompleted = done, ended-done
			break
		}
	}
	rr.OpenMS, rr.TotalMS = ms(launched), rr.TerminalMS
	rr.RunsPerSec = float64(p.Runs) / (rr.TotalMS / 1000)
	var recorded int
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE starts > 1), coalesce(sum(starts), 0) FROM %s", jobs)).
		Scan(&recorded, &rr.JobsRerun, &rr.JobStarts); err != nil {
		return rr, fmt.Errorf("reading the step starts: %w", err)
	}
	rr.Violations = p.Runs - recorded
	return rr, nil
}

// child is a child process whose stdout lines are read as they come; it
// exits when its stdin closes.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
}

func startChild(bin string, args ...string) (*child, error) {
	c := &child{cmd: exec.Command(bin, args...), lines: make(chan string, 16), stderr: &bytes.Buffer{}}
	c.cmd.Stderr = c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

// line waits for the child's first line.
func (c *child) line(timeout time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("exited first (%v)\n%s", c.cmd.Wait(), tail(c.stderr.String(), 20))
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("nothing said within %s (raise --timeout)", timeout)
	}
}

// kill ends the child with SIGKILL and reaps it.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// stop closes the child's stdin, on which it shuts down and exits, and
// kills it if it has not within 30 s.
func (c *child) stop() {
	_ = c.stdin.Close()
	exited := make(chan struct{})
	go func() {
		for range c.lines {
		}
		_ = c.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
	}
}

// recoveryRatios are agenthost's total times over DBOS's, round by
// round, then over all rounds (Round 0).
func recoveryRatios(rounds []recoveryRound) []recoveryRatio {
	var out []recoveryRatio
	var a, d float64
	for _, ar := range rounds {
		if ar.System == sysDBOS {
			continue
		}
		for _, dr := range rounds {
			if dr.System == sysDBOS && dr.Round == ar.Round {
				out = append(out, recoveryRatio{Round: ar.Round, Total: ar.TotalMS / dr.TotalMS})
				a, d = a+ar.TotalMS, d+dr.TotalMS
			}
		}
	}
	if d > 0 {
		out = append(out, recoveryRatio{Round: 0, Total: a / d})
	}
	return out
}

func recoveryTable(p *recoveryParams, rounds []recoveryRound) bench.Table {
	t := bench.Table{
		Title: fmt.Sprintf("Recovery of %d Runs on slow jobs of %d s after kill -9, agenthost and DBOS %s in alternating rounds (PostgreSQL %s, a throwaway server, fsync on)",
			p.Runs, p.JobSeconds, p.DBOS, p.PostgreSQL),
		Header: []string{"round", "system", "Runs", "submit ms", "lease wait ms", "open ms", "restart to all terminal ms", "Runs/s", "completed", "violations", "jobs run again"},
	}
	for _, r := range rounds {
		t.Rows = append(t.Rows, []string{strconv.Itoa(r.Round), recoveryTitle(r.System), strconv.Itoa(r.Runs),
			fmt.Sprintf("%.0f", r.SubmitMS), fmt.Sprintf("%.0f", r.LeaseWaitMS), fmt.Sprintf("%.0f", r.OpenMS),
			fmt.Sprintf("%.0f", r.TotalMS), fmt.Sprintf("%.0f", r.RunsPerSec),
			strconv.Itoa(r.Completed), strconv.Itoa(r.Violations), strconv.Itoa(r.JobsRerun)})
	}
	t.Notes = []string{
		"restart to all terminal: from the start of the restart (agenthost: its open of the store; DBOS: the new process's start, Launch recovers) until every Run is terminal, the lease wait included (0: both incarnations share a node name).",
		"agenthost: a violation is an event-log violation or a job that did not finish, and a job run again fails the check. DBOS: a violation is a workflow whose step never started; a job run again is a step in progress at the kill that started again on recovery (steps are at least once), not a violation.",
		fmt.Sprintf("agenthost's slow job keeps its clock across the restart (the plugin attaches to it); DBOS's restarted step (--dbos-jobs %s) %s.", p.DBOSJobs,
			map[string]string{dbosJobsRerun: "takes the whole job again", dbosJobsResume: "waits what is left since its first start"}[p.DBOSJobs]),
	}
	return t
}

func recoveryRatiosTable(rs []recoveryRatio) bench.Table {
	t := bench.Table{Title: "agenthost ÷ DBOS, restart to all terminal (same round)", Header: []string{"round", "time"}}
	for _, r := range rs {
		round := strconv.Itoa(r.Round)
		if r.Round == 0 {
			round = "all"
		}
		t.Rows = append(t.Rows, []string{round, fmt.Sprintf("%.2f", r.Total)})
	}
	t.Notes = []string{"< 1: agenthost recovers every Run sooner."}
	return t
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

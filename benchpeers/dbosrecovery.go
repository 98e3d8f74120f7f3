package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/benchkit"
)

// The DBOS side of the recovery comparison: a child process (this binary,
// re-executed with the hidden command dbos-recovery-child) launches DBOS
// with a fixed executor ID and application version, so that the process
// that replaces it recovers its pending workflows at Launch, as a
// restarted DBOS application does. Each workflow runs one step, the slow
// job: it records its start in the bench's own table (jobs.starts counts
// the step's starts, which DBOS's tables do not: a step's output is
// written only when it returns) and then takes --job-seconds.

// The recovery workflow's names and identity, the same in both
// incarnations.
const (
	dbosRecoveryWorkflow = "slow-job-run"
	dbosRecoveryStep     = "slow_job"
	dbosExecutorID       = "benchpeers-recovery"
	dbosAppVersion       = "benchpeers-recovery-1"
	// dbosChildCommand is the hidden command of the child process.
	dbosChildCommand = "dbos-recovery-child"
	// The child's lines on stdout: "ready RUNS SUBMIT_MS" once every
	// workflow is in its step (the first incarnation), "launched MS" once
	// Launch has returned (the restart).
	dbosReadyLine    = "ready"
	dbosLaunchedLine = "launched"
)

// The ways a restarted step takes its job up again (--dbos-jobs).
const (
	// dbosJobsRerun runs the job again in full, as a step that sleeps
	// --job-seconds does: DBOS steps are at least once.
	dbosJobsRerun = "rerun"
	// dbosJobsResume waits only what is left of the job since its first
	// start, as agenthost's slow-job plugin attaches to a job it keeps in
	// its KV.
	dbosJobsResume = "resume"
)

// dbosChildParams are the child's flags.
type dbosChildParams struct {
	dsn, schema, jobs string
	runs, concurrency int
	jobSeconds        int
	maxConns          int
	restart           bool
}

func newDBOSChildCommand() *cobra.Command {
	p := &dbosChildParams{}
	cmd := &cobra.Command{
		Use:          dbosChildCommand,
		Short:        "The DBOS process `benchpeers recovery` kills and restarts (internal)",
		Hidden:       true,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return dbosRecoveryChild(cmd.Context(), cmd.OutOrStdout(), p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.dsn, "dsn", "", "the database (a key/value DSN)")
	f.StringVar(&p.schema, "schema", "", "DBOS's system schema; the bench's table of step starts is SCHEMA_jobs.starts")
	f.StringVar(&p.jobs, "dbos-jobs", dbosJobsRerun, "rerun or resume")
	f.IntVar(&p.runs, "runs", 0, "workflows to start (the first incarnation)")
	f.IntVar(&p.concurrency, "concurrency", 128, "workflows started at once")
	f.IntVar(&p.jobSeconds, "job-seconds", 5, "how long each slow job takes")
	f.IntVar(&p.maxConns, "max-conns", 17, "DBOS's pool")
	f.BoolVar(&p.restart, "restart", false, "the second incarnation: launch, recover, and wait for stdin to close")
	return cmd
}

// dbosJobsTable is the bench's table of step starts for DBOS's schema.
func dbosJobsTable(schema string) string { return schema + "_jobs.starts" }

// dbosRecoveryChild is one incarnation of the DBOS application. The first
// starts p.runs workflows, says "ready" once every one is in its step,
// and holds every step until it is killed; the restart launches DBOS,
// which recovers them, says "launched", and runs until stdin closes.
func dbosRecoveryChild(ctx context.Context, out io.Writer, p *dbosChildParams) error {
	// The start counts are the bench's bookkeeping, not DBOS's work: not
	// synchronous, so that they cost the recovery no fsync. A killed
	// client loses none of them; only a server crash would.
	pool, err := pgxpool.New(ctx, fmt.Sprintf("%s pool_max_conns=%d options='-c synchronous_commit=off'", p.dsn, p.maxConns))
	if err != nil {
		return fmt.Errorf("%s: %w", dbosChildCommand, err)
	}
	defer pool.Close()
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:            "agenthost-bench-peers",
		DatabaseURL:        fmt.Sprintf("%s pool_max_conns=%d", p.dsn, p.maxConns),
		DatabaseSchema:     p.schema,
		ExecutorID:         dbosExecutorID,
		ApplicationVersion: dbosAppVersion,
		Logger:             slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return fmt.Errorf("%s: DBOS: %w", dbosChildCommand, err)
	}
	var inStep atomic.Int64
	job := &slowJob{pool: pool, table: dbosJobsTable(p.schema), seconds: p.jobSeconds, hold: !p.restart,
		resume: p.jobs == dbosJobsResume, started: &inStep}
	dbos.RegisterWorkflow(dctx, job.workflow, dbos.WithWorkflowName(dbosRecoveryWorkflow))
	t0 := time.Now()
	if err := dbos.Launch(dctx); err != nil {
		return fmt.Errorf("%s: DBOS: %w", dbosChildCommand, err)
	}
	if p.restart {
		fmt.Fprintf(out, "%s %.1f\n", dbosLaunchedLine, ms(time.Since(t0)))
		// Run until the parent closes stdin, then shut down.
		_, _ = io.Copy(io.Discard, os.Stdin)
		if err := dbos.Shutdown(dctx, 10*time.Second); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%s: DBOS shutdown: %w", dbosChildCommand, err)
		}
		return nil
	}
	var failed atomic.Pointer[error]
	benchkit.Parallel(p.concurrency, p.runs, func(int) {
		if _, err := dbos.RunWorkflow(dctx, job.workflow, p.jobSeconds); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	})
	if e := failed.Load(); e != nil {
		return fmt.Errorf("%s: DBOS: starting a workflow: %w", dbosChildCommand, *e)
	}
	for inStep.Load() < int64(p.runs) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "%s %d %.1f\n", dbosReadyLine, p.runs, ms(time.Since(t0)))
	// Wait for the SIGKILL; should the parent go away instead, stdin
	// closes: exit as abruptly as the kill would have.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
	return nil
}

// slowJob is the workflow's one step.
type slowJob struct {
	pool    *pgxpool.Pool
	table   string
	seconds int
	// hold keeps every step from returning (the first incarnation, which
	// is killed with every workflow in its step, as agenthost's child
	// holds back its polls); resume makes a restarted step wait only what
	// is left of the job since its first start.
	hold, resume bool
	started      *atomic.Int64
}

// workflow runs the slow job as a step and returns its result.
func (j *slowJob) workflow(ctx dbos.Context, seconds int) (string, error) {
	wfID, err := dbos.GetWorkflowID(ctx)
	if err != nil {
		return "", err
	}
	return dbos.RunAsStep(ctx, func(sctx context.Context) (string, error) {
		return j.run(sctx, wfID, seconds)
	}, dbos.WithStepName(dbosRecoveryStep))
}

// run records the step's start, then takes the job's time.
func (j *slowJob) run(ctx context.Context, wfID string, seconds int) (string, error) {
	var firstMS int64
	err := j.pool.QueryRow(ctx, "INSERT INTO "+j.table+" (workflow_id, starts, first_start_ms) VALUES ($1, 1, $2) "+
		"ON CONFLICT (workflow_id) DO UPDATE SET starts = "+j.table+".starts + 1 RETURNING first_start_ms",
		wfID, time.Now().UnixMilli()).Scan(&firstMS)
	if err != nil {
		return "", fmt.Errorf("recording the start of %s: %w", wfID, err)
	}
	j.started.Add(1)
	if j.hold {
		<-ctx.Done()
		return "", ctx.Err()
	}
	wait := time.Duration(seconds) * time.Second
	if j.resume {
		wait = time.Until(time.UnixMilli(firstMS).Add(wait))
	}
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return fmt.Sprintf("job finished after %d s", seconds), nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"

	"github.com/agenthost/agenthost/internal/bench"
	"github.com/agenthost/agenthost/plugins/abi"
)

// The DBOS side: the Run of `agenthost bench runs` as a DBOS workflow, in
// DBOS's recommended shape. Each model call and each tool call is a step
// (dbos.RunAsStep; the two tool calls of a model reply at once, each
// through dbos.Go), so that DBOS checkpoints every result in its system
// database before the workflow acts on it, as agenthost commits every
// effect's outcome before the next step. The steps give the answers of
// agenthost's in-process plugins (bench.ModelReply, bench.Calculate); the
// builder's work (the transcript and the tools) is the workflow's own
// deterministic code, as a builder's output is part of agenthost's model
// effect.

// dbosMaxSteps bounds a Run's model steps, as the bench tenant's
// limits.max_steps does agenthost's.
const dbosMaxSteps = 4

// agentRun is the workflow: model, tools in parallel, model, until the
// model answers.
func agentRun(ctx dbos.Context, question string) (string, error) {
	req := abi.ModelRequest{Messages: []abi.Message{{Role: abi.MessageUser, Content: question}}, Tools: []abi.Tool{bench.CalculateTool()}}
	for step := 1; step <= dbosMaxSteps; step++ {
		out, err := dbos.RunAsStep(ctx, func(context.Context) (abi.ModelOutcome, error) {
			return bench.ModelReply(req), nil
		}, dbos.WithStepName("model"))
		if err != nil {
			return "", err
		}
		req.Messages = append(req.Messages, out.Message)
		calls := out.Message.ToolCalls
		if len(calls) == 0 {
			return out.Message.Content, nil
		}
		results := make([]<-chan dbos.StepOutcome[abi.ToolOutcome], len(calls))
		for i, call := range calls {
			if results[i], err = dbos.Go(ctx, func(context.Context) (abi.ToolOutcome, error) {
				return bench.Calculate(call.Arguments), nil
			}, dbos.WithStepName("tool "+call.Name)); err != nil {
				return "", err
			}
		}
		for i, ch := range results {
			o := <-ch
			if o.Err != nil {
				return "", o.Err
			}
			req.Messages = append(req.Messages, abi.Message{Role: abi.MessageTool, Content: o.Result.Content, ToolCallID: calls[i].ID, IsError: o.Result.IsError})
		}
	}
	return "", fmt.Errorf("no answer after %d model steps", dbosMaxSteps)
}

// dbosSystem is a launched DBOS context with agentRun registered.
type dbosSystem struct {
	ctx dbos.Context
}

// openDBOS launches DBOS on the database dsn names (a key/value DSN), its
// system database in the schema "dbos" (DBOS's default), its pool
// bounded to maxConns connections, and runs one Run, which checks the
// answer and opens the connections.
func openDBOS(ctx context.Context, dsn string, maxConns int) (*dbosSystem, error) {
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:     "agenthost-bench-peers",
		DatabaseURL: fmt.Sprintf("%s pool_max_conns=%d", dsn, maxConns),
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("DBOS: %w", err)
	}
	dbos.RegisterWorkflow(dctx, agentRun, dbos.WithWorkflowName("agent-run"))
	if err := dbos.Launch(dctx); err != nil {
		_ = dbos.Shutdown(dctx, 10*time.Second)
		return nil, fmt.Errorf("DBOS: %w", err)
	}
	d := &dbosSystem{ctx: dctx}
	if _, err := d.Run(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Run runs one workflow to its end and checks its answer; it returns its
// latency, submit to result.
func (d *dbosSystem) Run() (time.Duration, error) {
	t0 := time.Now()
	h, err := dbos.RunWorkflow(d.ctx, agentRun, bench.BenchQuestion)
	if err != nil {
		return 0, fmt.Errorf("DBOS: %w", err)
	}
	answer, err := h.GetResult()
	elapsed := time.Since(t0)
	if err != nil {
		return elapsed, fmt.Errorf("DBOS: workflow %s: %w", h.GetWorkflowID(), err)
	}
	if answer != bench.BenchAnswer {
		return elapsed, fmt.Errorf("DBOS: workflow %s answered %q; want %q", h.GetWorkflowID(), answer, bench.BenchAnswer)
	}
	return elapsed, nil
}

// Close shuts DBOS down.
func (d *dbosSystem) Close() {
	if err := dbos.Shutdown(d.ctx, 30*time.Second); err != nil && !errors.Is(err, context.Canceled) {
		slog.Warn("benchpeers: DBOS shutdown", "err", err)
	}
}

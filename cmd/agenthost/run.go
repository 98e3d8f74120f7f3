package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/internal/tracing"
	"github.com/agenthost/agenthost/runtime"
)

func newRunCmd(g *globals) *cobra.Command {
	var tenant, session, agent string
	cmd := &cobra.Command{
		Use:   `run "question"`,
		Short: "Run one question in-process and stream the Run's events",
		Long: `run opens the config's store (Badger in data_dir, or PostgreSQL with
store.driver postgres), loads the tenant's plugins, starts
a runtime in this process and submits the question as a new Run. It streams
the Run as it goes: the model steps, the tool calls with their arguments,
their results, and the final answer.

Exit status: 0 when the Run completed; 1 when it failed or was cancelled
(the failure is printed), or on any error; 2 when it waits for a person
(a tool approval or an answer to the model's question; what it waits for is
printed, and the Run stays in the store).`,
		Example: `  agenthost run --config config.example.yaml "What is (2+3)*4?"
  agenthost run --tenant demo --session s1 "And what is that times 2?"
  agenthost run --agent research "What is the boiling point of water at 2000 m?"
  agenthost run --data-dir /tmp/agenthost "What is 2+3?"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			tenantID, err := pickTenant(cfg, tenant)
			if err != nil {
				return err
			}
			if session == "" {
				session = "cli-" + strings.TrimPrefix(runtime.NewRunID(time.Now()), "run_")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runQuestion(ctx, cmd, cfg, tenantID, session, strings.ToLower(agent), args[0])
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant to run as (default: the only tenant, or demo)")
	cmd.Flags().StringVar(&session, "session", "", "the session the Run joins; its earlier Runs are the history (default: a new session)")
	cmd.Flags().StringVar(&agent, "agent", "", "the tenant's agent the Run runs as (default: the agent named default)")
	return cmd
}

// pickTenant returns the tenant the flag names, or the only one, or demo.
func pickTenant(cfg *config.Config, flag string) (string, error) {
	ids := make([]string, 0, len(cfg.Tenants))
	for id := range cfg.Tenants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	switch {
	case flag != "":
		if _, ok := cfg.Tenants[strings.ToLower(flag)]; !ok {
			return "", fmt.Errorf("run: %s declares no tenant %q (it declares %s): pass one of them with --tenant", cfg.File, flag, strings.Join(ids, ", "))
		}
		return strings.ToLower(flag), nil
	case len(ids) == 1:
		return ids[0], nil
	}
	if _, ok := cfg.Tenants["demo"]; ok {
		return "demo", nil
	}
	return "", fmt.Errorf("run: %s declares several tenants (%s): pick one with --tenant", cfg.File, strings.Join(ids, ", "))
}

func runQuestion(ctx context.Context, cmd *cobra.Command, cfg *config.Config, tenantID, session, agent, question string) (err error) {
	out := cmd.OutOrStdout()
	log := node.NewLogger(cfg, cmd.ErrOrStderr())
	stopTracing, err := tracing.Start(ctx, cfg.Tracing, version, log)
	if err != nil {
		return err
	}
	// Deferred first, so it runs last: the spans go out once the runtime
	// has stopped.
	defer func() { _ = stopTracing(context.WithoutCancel(ctx)) }()
	sys, err := node.Open(ctx, cfg, []string{tenantID}, log, node.Wiring{})
	if err != nil {
		return err
	}
	_, _ = node.PruneRetention(ctx, sys.Store(), cfg, log) // logged; the next start tries again
	defer func() {
		if cerr := sys.Close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = fmt.Errorf("run: shutting down: %w", cerr)
		}
	}()
	rt := sys.Runtime()
	runID := runtime.NewRunID(time.Now())
	if _, _, err := rt.Submit(ctx, runtime.Request{Tenant: tenantID, Session: session, RunID: runID, Input: question, Agent: agent}); err != nil {
		var unknown *runtime.UnknownAgentError
		if errors.As(err, &unknown) {
			return fmt.Errorf("run: %s: tenant %s has no agent %q (its agents: %s): pass one of them with --agent, or leave --agent out for %q",
				cfg.File, tenantID, unknown.Agent, strings.Join(unknown.Known, ", "), runtime.DefaultAgent)
		}
		return fmt.Errorf("run: submitting the Run: %w", err)
	}

	p := newPrinter(out)
	seen := newProgress()
	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	go func() {
		err := rt.Follow(followCtx, tenantID, runID, 1, func(it runtime.StreamItem) error {
			p.item(it)
			if it.Event != nil {
				seen.advance(it.Event.Seq)
			}
			return nil
		})
		seen.finish(err)
	}()

	res, err := rt.Wait(ctx, tenantID, runID)
	for {
		if err != nil {
			return interrupted(ctx, runID, cfg, err)
		}
		switch res.Kind {
		case runtime.ResultBoundary:
			return fmt.Errorf("run: this process stopped driving Run %s: %w (it is in the store, %s; recovery takes it over at the next start)", runID, res.Err, cfg.StoreLocation())
		case runtime.ResultTerminal:
			if err := seen.waitDone(ctx); err != nil {
				return interrupted(ctx, runID, cfg, err)
			}
			switch res.Run.Status {
			case "completed":
				return nil
			case "failed":
				why := "no reason recorded"
				if f := res.Run.Failure; f != nil {
					why = f.Error()
				}
				return &exitError{code: exitFailed, msg: fmt.Sprintf("run %s failed: %s", runID, why)}
			default:
				return &exitError{code: exitFailed, msg: fmt.Sprintf("run %s ended %s", runID, res.Run.Status)}
			}
		}
		// Waiting: show every event up to the snapshot first.
		if err := seen.waitFor(ctx, res.Run.Seq); err != nil {
			return interrupted(ctx, runID, cfg, err)
		}
		w := res.Waiting
		if w == nil {
			w = runtime.WaitingFor(res.Run)
		}
		if len(w.Approvals) > 0 || w.Input != nil || w.Queued {
			p.waiting(w, session)
			return &exitError{code: exitWaiting, msg: fmt.Sprintf("run %s waits for a person; it is kept in the store (%s) and goes on once it gets what it waits for", runID, cfg.StoreLocation())}
		}
		// Pending effects or a timer: the Run goes on by itself. Wait for
		// its next event before asking again.
		if err := seen.waitFor(ctx, res.Run.Seq+1); err != nil {
			return interrupted(ctx, runID, cfg, err)
		}
		res, err = rt.Wait(ctx, tenantID, runID)
	}
}

func interrupted(ctx context.Context, runID string, cfg *config.Config, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("run: interrupted; Run %s is kept in the store (%s) and recovery goes on with it at the next start", runID, cfg.StoreLocation())
	}
	return fmt.Errorf("run: following Run %s: %w", runID, err)
}

// progress is how far the follower has printed, for the main goroutine
// to wait on without sleeping.
type progress struct {
	mu   sync.Mutex
	seq  int64
	done bool
	err  error
	ch   chan struct{} // closed and replaced on every change
}

func newProgress() *progress { return &progress{ch: make(chan struct{})} }

func (p *progress) advance(seq int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = seq
	p.changed()
}

func (p *progress) finish(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.err = true, err
	p.changed()
}

// changed wakes the waiters; p.mu is held.
func (p *progress) changed() {
	close(p.ch)
	p.ch = make(chan struct{})
}

// waitFor returns once the follower printed event seq, or ended.
func (p *progress) waitFor(ctx context.Context, seq int64) error {
	return p.wait(ctx, func() bool { return p.seq >= seq })
}

// waitDone returns once the follower printed the terminal event.
func (p *progress) waitDone(ctx context.Context) error { return p.wait(ctx, nil) }

// wait returns nil once reached (when not nil) holds, or the follower's
// error once it ended, or ctx's.
func (p *progress) wait(ctx context.Context, reached func() bool) error {
	for {
		p.mu.Lock()
		if reached != nil && reached() {
			p.mu.Unlock()
			return nil
		}
		if p.done {
			err := p.err
			p.mu.Unlock()
			return err
		}
		ch := p.ch
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

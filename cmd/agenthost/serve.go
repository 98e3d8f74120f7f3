package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/cmd/agenthost/internal/config"
	"github.com/agenthost/agenthost/cmd/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/cmd/agenthost/internal/metrics"
)

// Grace periods of a clean stop: the HTTP server's in-flight requests,
// then the runtime's in-progress commits and calls.
const (
	httpShutdownGrace    = 10 * time.Second
	runtimeShutdownGrace = 20 * time.Second
	// activeRunsScrapeLimit caps the status index read per tenant and
	// status at each /metrics scrape.
	activeRunsScrapeLimit = 10000
)

func newServeCmd(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API for every tenant of the config",
		Long: `serve opens the config's data dir (Badger), loads the plugins of every tenant,
starts the runtime (recovery's first pass takes over what a previous process
left in flight) and serves the HTTP API: bearer tokens map to tenants
(tenants.ID.tokens_sha256), quotas answer 429, /healthz, /readyz (ready once
recovery's first pass is done) and /metrics (Prometheus).

It prints the address it listens on. SIGTERM or SIGINT stops it cleanly: new
requests answer 503 and event streams end, in-flight requests and commits
finish, the runtime stops (effects still executing are left for recovery at
the next start), and it exits 0.

If the process loses its node lease (it was paused, or starved of CPU, for
longer than lease_ttl), it can no longer commit anything: it stops the same
way and exits 1, so that a supervisor starts it again and recovery takes
every session over.

Retention runs at start and then every retention_interval: the event logs and
command IDs of terminal Runs older than retention are pruned.`,
		Example: `  agenthost serve --config config.example.yaml
  agenthost serve --listen 0.0.0.0:9090 --data-dir /var/lib/agenthost
  curl -s -H 'Authorization: Bearer demo-token' http://127.0.0.1:8080/v1/sessions/s1/runs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.Listen = listen
			}
			log := newLogger(cfg, cmd.ErrOrStderr())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			srv, err := startServer(ctx, cfg, log)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agenthost serving on http://%s (data dir %s)\n", srv.Addr(), cfg.DataDir)
			select {
			case <-ctx.Done():
				log.Info("stopping: a signal asked for it; new requests answer 503 while in-flight work finishes")
			case err := <-srv.Failed():
				log.Error("stopping: the HTTP server failed", "err", err)
				_ = srv.Shutdown(context.Background())
				return fmt.Errorf("serve: the HTTP server failed: %w", err)
			case <-srv.sys.runtime.LeaseLost():
				log.Error("stopping: this process's node lease expired, so it drives no session any more; "+
					"start it again and recovery takes every session over (was the process paused, or starved of CPU, for longer than lease_ttl?)",
					"lease_ttl", cfg.LeaseTTL)
				_ = srv.Shutdown(context.Background())
				return fmt.Errorf("serve: the node lease expired (lease_ttl %s): exiting, for a restart to recover the sessions", cfg.LeaseTTL)
			}
			if err := srv.Shutdown(context.Background()); err != nil {
				return fmt.Errorf("serve: stopping: %w", err)
			}
			log.Info("stopped cleanly")
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "the HTTP address to listen on, overriding listen of the config (port 0 picks a free port)")
	return cmd
}

// server is `agenthost serve` in a process: a system (store, host,
// runtime) for every tenant of the config, behind the HTTP API.
type server struct {
	cfg     *config.Config
	log     *slog.Logger
	sys     *system
	metrics *metrics.Metrics
	api     *httpapi.Server
	http    *http.Server
	ln      net.Listener
	failed  chan error

	stopRetention context.CancelFunc
	retentionDone chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// startServer listens on cfg.Listen, opens the system for every tenant,
// and serves the API. It returns once the server accepts connections;
// /readyz answers 200 once recovery's first pass is done.
func startServer(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *server, err error) {
	tenantIDs := make([]string, 0, len(cfg.Tenants))
	tokens := map[string][]string{}
	quotas := map[string]httpapi.Quota{}
	for id, t := range cfg.Tenants {
		tenantIDs = append(tenantIDs, id)
		if len(t.TokenSHA256) > 0 {
			tokens[id] = t.TokenSHA256
		}
		quotas[id] = httpapi.Quota{
			MaxActiveRuns:      t.Quotas.MaxActiveRuns,
			MaxInFlightEffects: t.Quotas.MaxInflightEffects,
			TokenBudget:        t.Quotas.TokenBudget,
		}
	}
	sort.Strings(tenantIDs)
	auth, err := httpapi.NewTokenAuthenticator(tokens)
	if err != nil {
		return nil, fmt.Errorf("%s: tenants: %w", cfg.File, err)
	}
	if len(tokens) == 0 {
		log.Warn("no tenant has an API token: every /v1 request answers 401; add tenants.ID.tokens_sha256 (printf %s TOKEN | sha256sum)")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("serve: listen on %s: %w (pick another address with --listen or listen in %s)", cfg.Listen, err, cfg.File)
	}
	defer func() {
		if err != nil {
			ln.Close()
		}
	}()

	m := metrics.New()
	ledger := httpapi.NewUsageLedger()
	sys, err := openSystem(ctx, cfg, tenantIDs, log, wiring{
		Observer: metrics.Tee{m, ledger},
		Executor: m.Executor,
		Builder:  m.Builder,
		BeforeStart: func(s *system) error {
			if err := m.RegisterRuntime(s.runtime); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterActiveRuns(s.store, tenantIDs, activeRunsScrapeLimit, log); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := ledger.Seed(ctx, s.store, tenantIDs...); err != nil {
				return fmt.Errorf("serve: reading the tenants' token usage: %w", err)
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	api, err := httpapi.New(httpapi.Config{
		Runtime: sys.runtime, Store: sys.store, Auth: auth, Quotas: quotas, Usage: ledger,
		Ready: sys.runtime.Ready, Metrics: m.Handler(), Logger: log,
	})
	if err != nil {
		_ = sys.close(context.WithoutCancel(ctx))
		return nil, err
	}
	s := &server{
		cfg: cfg, log: log, sys: sys, metrics: m, api: api, ln: ln,
		failed:        make(chan error, 1),
		retentionDone: make(chan struct{}),
		http: &http.Server{
			Handler:           api.Handler(),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	var rctx context.Context
	rctx, s.stopRetention = context.WithCancel(context.WithoutCancel(ctx))
	go s.retain(rctx)
	log.Info("serving", "addr", s.Addr(), "tenants", tenantIDs, "data_dir", cfg.DataDir)
	return s, nil
}

// Addr is the address the server listens on.
func (s *server) Addr() string { return s.ln.Addr().String() }

// Failed delivers the error of an HTTP server that stopped by itself.
func (s *server) Failed() <-chan error { return s.failed }

// retain prunes by the retention at once, then every retention interval,
// until ctx ends.
func (s *server) retain(ctx context.Context) {
	defer close(s.retentionDone)
	if s.cfg.Retention <= 0 {
		return
	}
	tick := time.NewTicker(s.cfg.RetentionInterval)
	defer tick.Stop()
	for {
		if st, err := pruneRetention(ctx, s.sys.store, s.cfg, s.log); err == nil {
			s.metrics.Pruned(st)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Shutdown stops intake (new requests answer 503, event streams end),
// lets in-flight requests finish, stops retention, then stops the runtime
// (in-progress commits finish; effects still executing stay on record for
// recovery) and closes the host and the store. It is safe to call more
// than once.
func (s *server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.api.Drain()
		hctx, cancel := context.WithTimeout(ctx, httpShutdownGrace)
		herr := s.http.Shutdown(hctx)
		cancel()
		if herr != nil {
			s.log.Warn("some requests did not finish in time; closing their connections", "err", herr)
			_ = s.http.Close()
		}
		s.stopRetention()
		<-s.retentionDone
		s.shutdownErr = s.sys.closeWithin(ctx, runtimeShutdownGrace)
	})
	return s.shutdownErr
}

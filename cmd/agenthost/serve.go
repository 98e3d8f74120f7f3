package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/internal/tracing"
)

func newServeCmd(g *globals) *cobra.Command {
	var listen, metricsListen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API for every tenant of the config",
		Long: `serve opens the config's store (Badger in data_dir, or PostgreSQL with
store.driver postgres), loads the plugins of every tenant,
starts the runtime (recovery's first pass takes over what a previous process
left in flight) and serves the HTTP API: bearer tokens map to tenants
(tenants.ID.tokens_sha256), quotas and rate limits answer 429, /healthz and
/readyz (ready once recovery's first pass is done); /metrics (Prometheus) is
served on a listener of its own, metrics.listen (127.0.0.1:9464 by default).

It prints the address it listens on, and where /metrics is, and writes its
process ID to pid_file (agenthost.pid in data_dir by default). SIGHUP, or
agenthost reload, makes it read the config again and apply it whole or not at
all (see agenthost reload --help). SIGTERM or SIGINT stops it cleanly: new
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
			// load reads the config with the flags over it, at the start
			// and at each reload.
			load := func() (*config.Config, error) {
				cfg, err := g.loadConfig()
				if err != nil {
					return nil, err
				}
				if listen != "" {
					cfg.Listen = listen
				}
				if metricsListen != "" {
					cfg.Metrics.Listen = metricsListen
				}
				return cfg, nil
			}
			cfg, err := load()
			if err != nil {
				return err
			}
			log := node.NewLogger(cfg, cmd.ErrOrStderr())
			stopTracing, err := tracing.Start(cmd.Context(), cfg.Tracing, version, log)
			if err != nil {
				return err
			}
			// The spans not yet exported go out once the server has
			// stopped.
			defer func() { _ = stopTracing(context.Background()) }()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// SIGHUP is taken from the start, so that one sent while the
			// server starts does not end the process.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			srv, err := node.StartServer(ctx, cfg, log)
			if err != nil {
				return err
			}
			if err := writePIDFile(cfg.PIDFile); err != nil {
				_ = srv.Shutdown(context.Background())
				return fmt.Errorf("serve: %w (set pid_file to a writable path)", err)
			}
			defer removePIDFile(cfg)
			var reloads int64
			if err := writeReloadStatus(cfg, reloadStatus{Result: "started"}); err != nil {
				log.Warn("serve: the reload status file cannot be written; agenthost reload cannot report", "path", cfg.ReloadStatusFile(), "err", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agenthost serving on http://%s (%s)\n", srv.Addr(), cfg.StoreLocation())
			if addr := srv.MetricsAddr(); addr != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "agenthost metrics on http://%s/metrics\n", addr)
			}
			// A reload runs beside the loop, which keeps watching the
			// HTTP server and the lease meanwhile (a reload may take
			// minutes: a plugin compiled, MCP servers reached); its
			// outcome comes back on reloaded. One runs at a time: the
			// SIGHUPs that arrive during one make one more after it.
			reloaded := make(chan reloadStatus, 1)
			reloading, again := false, false
			startReload := func() {
				reloads++
				reloading = true
				go func(seq int64) {
					st := reloadStatus{Seq: seq, Result: "applied"}
					var err error
					if st.Changes, err = srv.Reload(ctx, load); err != nil {
						st.Result, st.Error = "refused", err.Error()
					}
					reloaded <- st
				}(reloads)
			}
			for stopping := false; !stopping; {
				select {
				case <-hup:
					if reloading {
						again = true
						continue
					}
					startReload()
				case st := <-reloaded:
					reloading = false
					if err := writeReloadStatus(cfg, st); err != nil {
						log.Warn("serve: the reload status file cannot be written; agenthost reload cannot report", "path", cfg.ReloadStatusFile(), "err", err)
					}
					if again {
						again = false
						startReload()
					}
				case <-ctx.Done():
					log.Info("stopping: a signal asked for it; new requests answer 503 while in-flight work finishes")
					stopping = true
				case err := <-srv.Failed():
					log.Error("stopping: the HTTP server failed", "err", err)
					_ = srv.Shutdown(context.Background())
					return fmt.Errorf("serve: the HTTP server failed: %w", err)
				case <-srv.Runtime().LeaseLost():
					log.Error("stopping: this process's node lease expired, so it drives no session any more; "+
						"start it again and recovery takes every session over (was the process paused, or starved of CPU, for longer than lease_ttl?)",
						"lease_ttl", cfg.LeaseTTL)
					_ = srv.Shutdown(context.Background())
					return fmt.Errorf("serve: the node lease expired (lease_ttl %s): exiting, for a restart to recover the sessions", cfg.LeaseTTL)
				}
			}
			if reloading {
				<-reloaded // the stop cancelled it: it is ending
			}
			if err := srv.Shutdown(context.Background()); err != nil {
				return fmt.Errorf("serve: stopping: %w", err)
			}
			log.Info("stopped cleanly")
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "the HTTP address to listen on, overriding listen of the config (port 0 picks a free port)")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "where to serve /metrics, overriding metrics.listen of the config: an address (port 0 picks a free port), api (on the API listener, without a token) or off")
	return cmd
}

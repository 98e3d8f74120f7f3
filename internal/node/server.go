package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/connlimit"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/metrics"
	"github.com/agenthost/agenthost/runtime"
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

// Server is `agenthost serve` in a process: a System (store, host,
// runtime) for every tenant of the config, behind the HTTP API.
type Server struct {
	cfg     *config.Config
	log     *slog.Logger
	sys     *System
	metrics *metrics.Metrics
	api     *httpapi.Server
	http    *http.Server
	ln      *connlimit.Listener
	failed  chan error

	// The /metrics listener of its own (metrics.listen), or nil.
	metricsHTTP *http.Server
	metricsLn   net.Listener

	stopRetention context.CancelFunc
	retentionDone chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// StartServer listens on cfg.Listen, opens the system for every tenant,
// and serves the API. It returns once the server accepts connections;
// /readyz answers 200 once recovery's first pass is done.
func StartServer(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *Server, err error) {
	tenantIDs := make([]string, 0, len(cfg.Tenants))
	tokens := map[string][]string{}
	quotas := map[string]httpapi.Quota{}
	limits := map[string]httpapi.TenantLimits{}
	for id, t := range cfg.Tenants {
		tenantIDs = append(tenantIDs, id)
		if len(t.TokenSHA256) > 0 {
			tokens[id] = t.TokenSHA256
		}
		quotas[id] = httpapi.Quota{
			MaxActiveRuns:      t.Quotas.MaxActiveRuns,
			MaxInFlightEffects: t.Quotas.MaxInflightEffects,
			TokenBudget:        t.Quotas.TokenBudget,
			MaxStoredBytes:     t.Quotas.MaxStoredBytes,
		}
		limits[id] = httpapi.TenantLimits{
			Requests:           httpapi.Rate(t.RateLimits.Requests),
			Submissions:        httpapi.Rate(t.RateLimits.Submissions),
			MaxConcurrentReads: t.Quotas.MaxConcurrentReads,
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
	m := metrics.New()
	caps, warn := connlimit.Resolve(cfg.HTTP.MaxConnections, cfg.HTTP.MaxConnectionsPerClient, connlimit.OpenFileLimit())
	if warn != "" {
		log.Warn(warn)
	}
	caps.MaxUnauthenticated = connlimit.UnauthenticatedShare(cfg.HTTP.MaxUnauthenticatedConnections, caps.Max)
	caps.UnauthenticatedIdleTimeout = cfg.HTTP.UnauthenticatedIdleTimeout
	caps.IPv6ClientPrefix = cfg.HTTP.IPv6ClientPrefix
	inner, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("serve: listen on %s: %w (pick another address with --listen or listen in %s)", cfg.Listen, err, cfg.File)
	}
	ln := connlimit.NewListener(inner, caps, func(reason string) { m.Limited(reason, "") })
	defer func() {
		if err != nil {
			ln.Close()
		}
	}()
	var metricsLn net.Listener
	switch cfg.Metrics.Listen {
	case config.MetricsOnAPI, config.MetricsOff:
	default:
		if metricsLn, err = net.Listen("tcp", cfg.Metrics.Listen); err != nil {
			return nil, fmt.Errorf("serve: listen for /metrics on %s: %w (pick another address with --metrics-listen or metrics.listen in %s; \"off\" serves no metrics)", cfg.Metrics.Listen, err, cfg.File)
		}
		defer func() {
			if err != nil {
				metricsLn.Close()
			}
		}()
	}

	ledger := httpapi.NewUsageLedger()
	sys, err := Open(ctx, cfg, tenantIDs, log, Wiring{
		Observer: metrics.Tee{m, ledger},
		Executor: m.Executor,
		Builder:  m.Builder,
		Events:   m.Events,
		BeforeStart: func(s *System) error {
			if err := m.RegisterRuntime(s.runtime); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterActiveRuns(s.store, tenantIDs, activeRunsScrapeLimit, log); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterCommitGroups(s.store); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			refusals := map[string]metrics.HTTPRefusals{}
			waits := map[string]metrics.InstanceWaits{}
			for id, p := range s.plugins {
				refusals[id] = func() (int64, int64) { st := p.HTTPStats(); return st.Denied, st.Refused }
				waits[id] = func() (int64, float64) { st := p.InstanceWaits(); return st.Waits, st.Waited.Seconds() }
			}
			if err := m.RegisterPluginHTTP(refusals); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterModelBudgets(s.budgets); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterInstanceWaits(waits); err != nil {
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
	apiCfg := httpapi.Config{
		Runtime: sys.runtime, Store: sys.store, Auth: auth, Quotas: quotas, Usage: ledger,
		Ready: sys.runtime.Ready, Logger: log, AgentsOf: sys.AgentsOf,
		Limits: limits, UnauthenticatedRate: httpapi.Rate(cfg.HTTP.UnauthenticatedRate), OnLimit: m.Limited,
		MaxStreamsPerTenant: cfg.HTTP.MaxStreamsPerTenant, StreamWriteTimeout: cfg.HTTP.StreamWriteTimeout,
		MaxPageBytes: cfg.HTTP.MaxPageBytes,
		Fields: httpapi.FieldLimits{MaxInputBytes: cfg.HTTP.MaxInputBytes, MaxMetadataBytes: cfg.HTTP.MaxMetadataBytes,
			MaxReasonBytes: cfg.HTTP.MaxReasonBytes},
	}
	if cfg.HTTP.MaxStreamsPerTenant == 0 {
		apiCfg.MaxStreamsPerTenant = -1 // 0 in the config is no limit
	}
	if cfg.Metrics.Listen == config.MetricsOnAPI {
		apiCfg.Metrics = m.Handler()
	}
	api, err := httpapi.New(apiCfg)
	if err != nil {
		_ = sys.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: log, sys: sys, metrics: m, api: api, ln: ln,
		failed:        make(chan error, 1),
		retentionDone: make(chan struct{}),
		http: &http.Server{
			Handler:           api.Handler(),
			ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
			ReadTimeout:       cfg.HTTP.ReadTimeout,
			WriteTimeout:      cfg.HTTP.WriteTimeout,
			IdleTimeout:       cfg.HTTP.IdleTimeout,
			MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
			ConnContext:       connlimit.WithConn,
			ConnState:         connlimit.ConnState,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
	if cfg.HTTP.IdleTimeout == 0 && cfg.HTTP.ReadTimeout > 0 {
		// net/http would take the read timeout for the idle one; 0 in
		// the config means no idle timeout.
		s.http.IdleTimeout = -1
	}
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	if metricsLn != nil {
		s.metricsLn = metricsLn
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", m.Handler())
		s.metricsHTTP = &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      time.Minute,
			IdleTimeout:       time.Minute,
			MaxHeaderBytes:    config.DefaultMaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go func() {
			if err := s.metricsHTTP.Serve(metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.failed <- fmt.Errorf("the /metrics listener: %w", err)
			}
		}()
	}
	var rctx context.Context
	rctx, s.stopRetention = context.WithCancel(context.WithoutCancel(ctx))
	go s.retain(rctx)
	log.Info("serving", "addr", s.Addr(), "tenants", tenantIDs, "store", cfg.StoreLocation(),
		"metrics", s.MetricsAddr(), "max_connections", caps.Max, "max_connections_per_client", caps.PerClient, "hard_connections", caps.Hard,
		"max_unauthenticated_connections", caps.MaxUnauthenticated)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// MetricsAddr is where /metrics is served: an address of its own, the
// API's (metrics.listen api), or "" (off).
func (s *Server) MetricsAddr() string {
	switch {
	case s.metricsLn != nil:
		return s.metricsLn.Addr().String()
	case s.cfg.Metrics.Listen == config.MetricsOnAPI:
		return s.Addr()
	}
	return ""
}

// Failed delivers the error of an HTTP server that stopped by itself.
func (s *Server) Failed() <-chan error { return s.failed }

// Runtime is the runtime behind the API (its LeaseLost, Ready and Stats).
func (s *Server) Runtime() *runtime.Runtime { return s.sys.runtime }

// Store is the store behind the API.
func (s *Server) Store() runtime.Store { return s.sys.store }

// Metrics is what the server exports on /metrics.
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// retain prunes by the retention at once, then every retention interval,
// until ctx ends.
func (s *Server) retain(ctx context.Context) {
	defer close(s.retentionDone)
	if s.cfg.Retention <= 0 {
		return
	}
	tick := time.NewTicker(s.cfg.RetentionInterval)
	defer tick.Stop()
	for {
		if st, err := PruneRetention(ctx, s.sys.store, s.cfg, s.log); err == nil {
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
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.api.Drain()
		hctx, cancel := context.WithTimeout(ctx, httpShutdownGrace)
		herr := s.http.Shutdown(hctx)
		cancel()
		if herr != nil {
			s.log.Warn("some requests did not finish in time; closing their connections", "err", herr)
			_ = s.http.Close()
		}
		if s.metricsHTTP != nil {
			_ = s.metricsHTTP.Close()
		}
		s.stopRetention()
		<-s.retentionDone
		s.shutdownErr = s.sys.closeWithin(ctx, runtimeShutdownGrace)
	})
	return s.shutdownErr
}

package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
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

	// ledger is the tenants' token usage; wiring what Open was given,
	// which a reload gives the tenants it builds.
	ledger *httpapi.UsageLedger
	wiring Wiring
	// reloadMu serializes the config reloads (Reload).
	reloadMu sync.Mutex

	shutdownOnce sync.Once
	shutdownErr  error
}

// StartServer listens on cfg.Listen, opens the system for every tenant,
// and serves the API. It returns once the server accepts connections;
// /readyz answers 200 once recovery's first pass is done.
func StartServer(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *Server, err error) {
	tenantIDs := slices.Sorted(maps.Keys(cfg.Tenants))
	tenants, err := apiTenants(cfg)
	if err != nil {
		return nil, err
	}
	if tenants.Auth.(*httpapi.TokenAuthenticator).Len() == 0 {
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
	wiring := Wiring{
		// The ledger first: what the metrics show of a commit's tokens,
		// the token budget already counts.
		Observer: metrics.Tee{ledger, m},
		Executor: m.Executor,
		Builder:  m.Builder,
		Events:   m.Events,
		BeforeStart: func(s *System) error {
			if err := m.RegisterRuntime(s.runtime); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			// The tenants and plugins in force at each scrape: a reload
			// changes them.
			tenantsNow := func() []string { return slices.Sorted(maps.Keys(s.tenants.load().tenants)) }
			if err := m.RegisterActiveRuns(s.store, tenantsNow, activeRunsScrapeLimit, log); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			if err := m.RegisterCommitGroups(s.store); err != nil {
				return fmt.Errorf("serve: metrics: %w", err)
			}
			refusals := func() map[string]metrics.HTTPRefusals {
				out := map[string]metrics.HTTPRefusals{}
				for id, p := range s.pluginsInForce() {
					out[id] = func() (int64, int64) { st := p.HTTPStats(); return st.Denied, st.Refused }
				}
				return out
			}
			waits := func() map[string]metrics.InstanceWaits {
				out := map[string]metrics.InstanceWaits{}
				for id, p := range s.pluginsInForce() {
					out[id] = func() (int64, float64) { st := p.InstanceWaits(); return st.Waits, st.Waited.Seconds() }
				}
				return out
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
	}
	sys, err := Open(ctx, cfg, tenantIDs, log, wiring)
	if err != nil {
		return nil, err
	}
	apiCfg := httpapi.Config{
		Runtime: sys.runtime, Store: sys.store, Auth: tenants.Auth, Quotas: tenants.Quotas, Usage: ledger,
		Ready: sys.runtime.Ready, Logger: log, AgentsOf: sys.AgentsOf,
		Limits: tenants.Limits, UnauthenticatedRate: httpapi.Rate(cfg.HTTP.UnauthenticatedRate), OnLimit: m.Limited,
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
		cfg: cfg, log: log, sys: sys, metrics: m, api: api, ln: ln, ledger: ledger, wiring: wiring,
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

// apiTenants returns the tenants of cfg as the API holds them: their
// tokens, quotas and limits.
func apiTenants(cfg *config.Config) (httpapi.Tenants, error) {
	tokens := map[string][]string{}
	t := httpapi.Tenants{Quotas: map[string]httpapi.Quota{}, Limits: map[string]httpapi.TenantLimits{}}
	for id, tc := range cfg.Tenants {
		if len(tc.TokenSHA256) > 0 {
			tokens[id] = tc.TokenSHA256
		}
		t.Quotas[id] = httpapi.Quota{
			MaxActiveRuns:      tc.Quotas.MaxActiveRuns,
			MaxInFlightEffects: tc.Quotas.MaxInflightEffects,
			TokenBudget:        tc.Quotas.TokenBudget,
			MaxStoredBytes:     tc.Quotas.MaxStoredBytes,
		}
		t.Limits[id] = httpapi.TenantLimits{
			Requests:           httpapi.Rate(tc.RateLimits.Requests),
			Submissions:        httpapi.Rate(tc.RateLimits.Submissions),
			MaxConcurrentReads: tc.Quotas.MaxConcurrentReads,
		}
	}
	auth, err := httpapi.NewTokenAuthenticator(tokens)
	if err != nil {
		return httpapi.Tenants{}, fmt.Errorf("%s: tenants: %w", cfg.File, err)
	}
	t.Auth = auth
	return t, nil
}

// Reload reads the config with load and puts it in force, whole, or
// refuses it and keeps the config in force (reload.go): the tenants with their tokens, quotas, limits and
// agents, the plugins and the MCP servers. A config that changes a key
// only a restart applies (restartKeys) is refused, naming the keys; so is
// one that fails a check of the start, with the start's error. It returns what changed, logs the
// outcome and counts it (agenthost_config_reloads_total). The API serves
// throughout: a request sees the config in force when it starts.
func (s *Server) Reload(ctx context.Context, load func() (*config.Config, error)) (changes []string, err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	defer func() {
		if err != nil {
			s.metrics.ConfigReloaded(metrics.ReloadRefused)
			s.log.Error("config reload refused; the config in force stays", "file", s.cfg.File, "err", err)
			return
		}
		s.metrics.ConfigReloaded(metrics.ReloadApplied)
		if len(changes) == 0 {
			changes = []string{"nothing changed"}
		}
		s.log.Info("config reloaded: new Runs get the new config; Runs in flight keep their pinned agents", "file", s.cfg.File, "changes", strings.Join(changes, "; "))
	}()
	next, err := load()
	if err != nil {
		return nil, err
	}
	if keys := restartKeys(s.cfg, next); len(keys) > 0 {
		return nil, fmt.Errorf("%s: %s changed, and only a restart applies that: put the old value back and reload, or restart agenthost to apply it", next.File, strings.Join(keys, ", "))
	}
	tenants, err := apiTenants(next)
	if err != nil {
		return nil, err
	}
	if err := tenants.Check(); err != nil {
		return nil, fmt.Errorf("%s: tenants: %w", next.File, err)
	}
	b, err := s.sys.prepareReload(ctx, next, s.wiring)
	if err != nil {
		return nil, err
	}
	var added []string
	for id := range next.Tenants {
		if _, ok := s.sys.tenants.load().tenants[id]; !ok {
			added = append(added, id)
		}
	}
	if err := s.ledger.Seed(ctx, s.sys.store, added...); err != nil {
		b.discard(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("reading the new tenants' token usage: %w", err)
	}
	// No request may see a token whose tenant the runtime lacks: the API
	// drops the tokens of removed tenants before the runtime drops them,
	// and takes those of added tenants after the runtime has them.
	kept := *next
	kept.Tenants = maps.Clone(next.Tenants)
	maps.DeleteFunc(kept.Tenants, func(id string, _ config.Tenant) bool { return slices.Contains(added, id) })
	keptTenants, err := apiTenants(&kept)
	if err != nil {
		b.discard(context.WithoutCancel(ctx))
		return nil, err
	}
	setAPI := func(t httpapi.Tenants) func() {
		return func() {
			if err := s.api.SetTenants(t); err != nil {
				panic("node: tenants checked before the swap were refused after it: " + err.Error())
			}
		}
	}
	s.sys.commitReload(b, setAPI(keptTenants), setAPI(tenants))
	return b.changes, nil
}

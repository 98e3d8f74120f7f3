// Package node wires an agenthost from its config: a System is a
// store (badgerstore, or pgstore with store.driver postgres), a plugin
// host and a runtime over them (what `agenthost run`
// drives), and a Server is a System for every tenant of the config behind
// the HTTP API, with metrics, the usage ledger and scheduled retention
// (what `agenthost serve` drives, and the in-process benches measure).
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// System is a store, a plugin host and a runtime wired from a config: what
// `run` and `serve` drive. Both build it with Open.
type System struct {
	store   runtime.Store
	host    *host.Host
	plugins map[string]*host.Plugin // by plugin ID: the ones some tenant uses
	runtime *runtime.Runtime
	tenants runtime.TenantMap
	log     *slog.Logger
}

// NewLogger returns the process logger the config asks for, writing to w.
func NewLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // checked by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Wiring is what a command adds to Open's wiring; the zero value adds
// nothing (`run`).
type Wiring struct {
	// Observer receives what the runtime does (metrics, usage).
	Observer runtime.Observer
	// Executor and Builder wrap every plugin adapter (metrics timing),
	// given the plugin's ID.
	Executor func(plugin string, ex runtime.Executor) runtime.Executor
	Builder  func(plugin string, b runtime.Builder) runtime.Builder
	// BeforeStart runs once the runtime exists and before it starts.
	BeforeStart func(*System) error
}

func (w Wiring) executor(plugin string, ex runtime.Executor) runtime.Executor {
	if w.Executor == nil {
		return ex
	}
	return w.Executor(plugin, ex)
}

func (w Wiring) builder(plugin string, b runtime.Builder) runtime.Builder {
	if w.Builder == nil {
		return b
	}
	return w.Builder(plugin, b)
}

// Open opens the store, loads the plugins of the given tenants (one
// host: the per-tenant instance pools are the host's) and starts a runtime
// over them, whose Hub is the host's event sink so that plugin emits reach
// Follow. Everything that can be refused without touching the store (a
// missing plugin file) is refused first. On error, whatever was opened is
// closed again.
func Open(ctx context.Context, cfg *config.Config, tenantIDs []string, log *slog.Logger, w Wiring) (_ *System, err error) {
	if missing := usedMissingFiles(cfg, tenantIDs); len(missing) > 0 {
		return nil, errors.New(strings.Join(missing, "\n"))
	}
	s := &System{log: log, tenants: runtime.TenantMap{}}
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
		}
	}()
	s.store, err = OpenStore(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	hub := runtime.NewHub()
	s.host, err = host.New(host.Config{
		CacheDir: cfg.CacheDir, KV: s.store, Events: hub, Logger: log,
		MaxInstanceMemory: cfg.MaxInstanceMemory, CallPath: host.CallPath(cfg.PluginCallPath),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: cache_dir: %w", cfg.File, err)
	}
	plugins := map[string]*host.Plugin{}
	for _, id := range tenantIDs {
		t := cfg.Tenants[id]
		for _, pid := range usedPlugins(t) {
			if _, done := plugins[pid]; done {
				continue
			}
			p, err := s.host.Load(ctx, pluginSpec(cfg.Plugins[pid]))
			if err != nil {
				return nil, fmt.Errorf("%s: plugins.%s: %w", cfg.File, pid, err)
			}
			plugins[pid] = p
		}
		rt, err := buildTenant(cfg, t, plugins, w)
		if err != nil {
			return nil, err
		}
		s.tenants[id] = rt
	}
	s.plugins = plugins
	s.runtime, err = runtime.New(runtime.Options{
		Store: s.store, Tenants: s.tenants, Clock: runtime.SystemClock{}, Logger: log, Hub: hub,
		Observer: w.Observer, WatchdogInterval: cfg.WatchdogInterval, LeaseTTL: cfg.LeaseTTL,
	})
	if err != nil {
		return nil, err
	}
	if w.BeforeStart != nil {
		if err := w.BeforeStart(s); err != nil {
			return nil, err
		}
	}
	if err := s.runtime.Start(ctx); err != nil {
		s.runtime = nil
		return nil, err
	}
	return s, nil
}

// OpenStore opens the store the config names: Badger in data_dir (the
// default), or PostgreSQL at store.dsn with store.driver postgres. Its
// errors are one line that names the config key and says what to do; a
// DSN's password never shows in them.
func OpenStore(ctx context.Context, cfg *config.Config, log *slog.Logger) (runtime.Store, error) {
	switch cfg.Store.Driver {
	case config.DriverPostgres:
		pg := cfg.Store.Postgres
		st, err := pgstore.Open(ctx, pgstore.Options{
			DSN: cfg.Store.DSN, MaxConns: int32(pg.MaxConns), StatementTimeout: pg.StatementTimeout, Schema: pg.Schema,
			// No Clock: leases and claims are judged by the database's
			// clock, the one every node shares.
			Logger: log,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: store (%s): %w", cfg.File, cfg.StoreLocation(), err)
		}
		return st, nil
	case config.DriverBadger, "":
		st, err := badgerstore.Open(cfg.DataDir, badgerstore.Options{NoSyncWrites: !cfg.SyncWrites, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("%s: data_dir: %w", cfg.File, err)
		}
		return st, nil
	}
	return nil, fmt.Errorf("%s: store.driver: %q is not a store driver: want badger or postgres", cfg.File, cfg.Store.Driver)
}

// Store is the system's store.
func (s *System) Store() runtime.Store { return s.store }

// Runtime is the system's runtime.
func (s *System) Runtime() *runtime.Runtime { return s.runtime }

// Close stops the runtime (leaving what is in flight to recovery), then
// closes the host and the store.
func (s *System) Close(ctx context.Context) error {
	return s.closeWithin(ctx, 10*time.Second)
}

// closeWithin is Close with the time the runtime gets to finish the work
// in progress (commits and calls) before what is left is cancelled.
func (s *System) closeWithin(ctx context.Context, grace time.Duration) error {
	var errs []error
	if s.runtime != nil {
		sctx, cancel := context.WithTimeout(ctx, grace)
		errs = append(errs, s.runtime.Stop(sctx))
		cancel()
	}
	if s.host != nil {
		errs = append(errs, s.host.Close(ctx))
	}
	if s.store != nil {
		errs = append(errs, s.store.Close())
	}
	return errors.Join(errs...)
}

func usedPlugins(t config.Tenant) []string {
	ids := []string{t.Builder, t.Model}
	for _, id := range t.ToolExecutors {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func usedMissingFiles(cfg *config.Config, tenantIDs []string) []string {
	used := map[string]bool{}
	for _, id := range tenantIDs {
		for _, pid := range usedPlugins(cfg.Tenants[id]) {
			used[pid] = true
		}
	}
	var out []string
	for _, line := range cfg.MissingFiles() {
		for pid := range used {
			if strings.Contains(line, ": plugins."+pid+".path: ") {
				out = append(out, line)
			}
		}
	}
	return out
}

func pluginSpec(p config.Plugin) host.PluginSpec {
	return host.PluginSpec{
		Name: p.ID, Path: p.Path, SHA256: p.SHA256, Role: p.Role,
		Limits: host.Limits{
			MemoryPages: p.MemoryPages, CallTimeout: p.CallTimeout, InitTimeout: p.InitTimeout,
			MaxInputBytes: p.MaxInputBytes, MaxOutputBytes: p.MaxOutputBytes,
			PoolSize: p.PoolSize, IdleTimeout: p.IdleTimeout,
		},
		Sandbox: host.Sandbox{
			Config: p.Config, AllowedHosts: p.AllowedHosts, HTTPTimeout: p.HTTPTimeout,
			MaxHTTPResponseBytes: p.MaxHTTPResponseBytes, MaxHTTPResponseHeaderBytes: p.MaxHTTPResponseHeaderBytes,
		},
	}
}

// buildTenant wires a tenant from its config and its loaded plugins: the
// tools come from the tool executors' describe, with the config's
// approval and policy overrides.
func buildTenant(cfg *config.Config, t config.Tenant, plugins map[string]*host.Plugin, w Wiring) (*runtime.Tenant, error) {
	k := cfg.File + ": tenants." + t.ID + "."
	b, err := plugins[t.Builder].Builder()
	if err != nil {
		return nil, fmt.Errorf("%sbuilder: %w", k, err)
	}
	mp := plugins[t.Model]
	if !slices.Contains(mp.Describe().Effects, abi.KindModel) {
		return nil, fmt.Errorf("%smodel: plugin %q does not carry out model effects (its describe lists effects %v): name a model executor", k, t.Model, mp.Describe().Effects)
	}
	model, err := mp.Executor()
	if err != nil {
		return nil, fmt.Errorf("%smodel: %w", k, err)
	}
	rt := &runtime.Tenant{
		ID: t.ID, Builder: w.builder(t.Builder, b), Model: w.executor(t.Model, model),
		Limits:     t.Limits.LoopLimits(),
		RunTimeout: t.Limits.RunTimeout, EffectTimeout: t.Limits.EffectTimeout,
		ModelPolicy: t.ModelPolicy, HistoryRuns: t.HistoryRuns,
	}
	offeredBy := map[string]string{}
	for _, pid := range t.ToolExecutors {
		p := plugins[pid]
		if !slices.Contains(p.Describe().Effects, abi.KindTool) {
			return nil, fmt.Errorf("%stool_executors: plugin %q offers no tools (its describe lists effects %v): remove it from tool_executors", k, pid, p.Describe().Effects)
		}
		ex, err := p.Executor()
		if err != nil {
			return nil, fmt.Errorf("%stool_executors: %w", k, err)
		}
		for _, tool := range p.Describe().Tools {
			if other, dup := offeredBy[tool.Name]; dup {
				return nil, fmt.Errorf("%stool_executors: plugins %q and %q both offer tool %q: a tenant's tool names must be unique, so keep one of them", k, other, pid, tool.Name)
			}
			offeredBy[tool.Name] = pid
			approval := t.ToolApproval(tool.Name, tool.Approval)
			d := tool
			d.Approval = abi.ApprovalNever
			if approval {
				d.Approval = abi.ApprovalAlways
			}
			rt.Tools = append(rt.Tools, runtime.Tool{
				Descriptor: d,
				Spec:       loop.ToolSpec{Name: tool.Name, Approval: approval, Policy: t.ToolPolicy(tool.Name, tool.Idempotent)},
				Executor:   w.executor(pid, ex),
			})
		}
	}
	for name := range t.Tools {
		if _, ok := offeredBy[name]; !ok {
			return nil, fmt.Errorf("%stools.%s: no tool executor of the tenant offers a tool %q (offered: %s): fix the name or add its executor to tool_executors",
				k, name, name, strings.Join(sortedNames(offeredBy), ", "))
		}
	}
	return rt, nil
}

func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// PruneRetention removes the event logs and command IDs of the terminal
// Runs older than the config's retention (none when it is 0), and logs
// what it removed.
func PruneRetention(ctx context.Context, store runtime.Store, cfg *config.Config, log *slog.Logger) (runtime.PruneStats, error) {
	if cfg.Retention <= 0 {
		return runtime.PruneStats{}, nil
	}
	before := time.Now().Add(-cfg.Retention)
	st, err := store.Prune(ctx, before.UnixMilli())
	if err != nil {
		log.Warn("retention: pruning terminal Runs failed; the next pass tries again", "retention", cfg.Retention, "err", err)
		return st, err
	}
	log.Info("retention: pruned terminal Runs", "older_than", before.UTC().Format(time.RFC3339),
		"runs", st.Runs, "events", st.Events, "commands", st.Commands)
	return st, nil
}

// Package node wires an agenthost from its config: a System is a
// store (badgerstore, or pgstore with store.driver postgres), a plugin
// host and a runtime over them (what `agenthost run`
// drives), and a Server is a System for every tenant of the config behind
// the HTTP API, with metrics, the usage ledger and scheduled retention
// (what `agenthost serve` drives, and the in-process benches measure).
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agenthost/agenthost/internal/budget"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/mcptool"
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
	// budgets are the model budgets (plugins.ID.budget) by plugin ID, one
	// each, shared by every agent of every tenant that uses the plugin as
	// its model.
	budgets map[string]*budget.Budget
	runtime *runtime.Runtime
	// tenants are the tenants as the runtime sees them now: built at Open,
	// and again for the tenants that use an MCP server when its tools
	// change (mcp.go), with each tenant's agents as the API shows them.
	tenants *liveTenants
	// wired are each tenant's plugin adapters, which its rebuilds reuse.
	wired map[string]*pluginAdapters
	// versions are the loaded versions of each executor plugin, by plugin
	// ID (versions.go); the tenants' executors route over them.
	versions map[string]*pluginVersions
	// mcp are the MCP servers the tenants use, connecting in the
	// background; nil when none.
	mcp *mcptool.Manager
	// cfg is the config in force. It, plugins, wired, versions and mcp
	// change at a reload (reload.go), under tenants.rebuild.
	cfg *config.Config
	log *slog.Logger

	// retiredMu guards retired: the plugin versions and MCP servers a
	// reload replaced, closed after their drain or with the system.
	retiredMu sync.Mutex
	retired   []*retired
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
	// Events wraps the plugins' event sink, the Hub (metrics timing).
	Events func(runtime.EventSink) runtime.EventSink
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

// mcpStartWait bounds how long Open waits for the MCP servers' first
// connections, so that the first Runs are offered the tools of the
// servers that are up; one still unanswered then joins later.
const mcpStartWait = 10 * time.Second

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
	s := &System{log: log, cfg: cfg, tenants: &liveTenants{}, wired: map[string]*pluginAdapters{}}
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
	var events runtime.EventSink = hub
	if w.Events != nil {
		events = w.Events(hub)
	}
	s.host, err = host.New(host.Config{
		CacheDir: cfg.CacheDir, KV: s.store, Events: events, Logger: log,
		MaxInstanceMemory: cfg.MaxInstanceMemory, CallPath: host.CallPath(cfg.PluginCallPath),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: cache_dir: %w", cfg.File, err)
	}
	plugins := map[string]*host.Plugin{}
	s.budgets = map[string]*budget.Budget{}
	for id, p := range cfg.Plugins {
		if !p.Budget.IsZero() {
			s.budgets[id] = budget.New(id, p.Budget)
		}
	}
	for _, id := range tenantIDs {
		for _, pid := range usedPlugins(cfg.Tenants[id]) {
			if _, done := plugins[pid]; done {
				continue
			}
			p, err := s.host.Load(ctx, pluginSpec(cfg.Plugins[pid]))
			if err != nil {
				return nil, fmt.Errorf("%s: plugins.%s: %w", cfg.File, pid, err)
			}
			plugins[pid] = p
		}
	}
	s.plugins = plugins
	s.versions = map[string]*pluginVersions{}
	for pid, p := range plugins {
		if p.Spec().Role != abi.RoleExecutor {
			continue
		}
		s.versions[pid] = &pluginVersions{id: pid, log: log}
		if err := s.versions[pid].setCurrent(p, cfg.PluginDrain, s.retire); err != nil {
			return nil, fmt.Errorf("%s: plugins.%s: %w", cfg.File, pid, err)
		}
	}
	// The MCP servers connect in the background: one that is down holds
	// nothing up, and its tools join the agents that name it once it is
	// reached (mcpToolsChanged).
	if servers := usedMCPServers(cfg, tenantIDs); len(servers) > 0 {
		if s.mcp, err = mcptool.Start(servers, mcptool.Options{Logger: log, OnChange: s.mcpToolsChanged, Version: hostVersion()}); err != nil {
			return nil, err
		}
		s.mcp.WaitTried(ctx, mcpStartWait)
	}
	if err := s.buildTenants(tenantIDs, w); err != nil {
		return nil, err
	}
	s.runtime, err = runtime.New(runtime.Options{
		Store: s.store, Tenants: s.tenants, Clock: runtime.SystemClock{}, Logger: log, Hub: hub, NodeName: cfg.NodeName,
		Observer: w.Observer, WatchdogInterval: cfg.WatchdogInterval, LeaseTTL: cfg.LeaseTTL,
		ModelBudgets: slices.Collect(maps.Values(s.budgets)),
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
			DSN: cfg.Store.DSN, MaxConns: int32(pg.MaxConns), WriteGroups: pg.WriteGroups, StatementTimeout: pg.StatementTimeout, Schema: pg.Schema,
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

// Agents returns the agents of each tenant as the API shows them
// (GET /v1/agents) now, sorted by name.
func (s *System) Agents() map[string][]httpapi.AgentJSON { return s.tenants.load().agents }

// AgentsOf returns a tenant's agents as the API shows them now.
func (s *System) AgentsOf(tenant string) []httpapi.AgentJSON { return s.tenants.load().agents[tenant] }

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
	s.closeRetired(ctx)
	s.tenants.rebuild.Lock()
	mcp := s.mcp // a reload may have replaced it
	s.tenants.rebuild.Unlock()
	mcp.Close() // not under the lock: its OnChange takes it
	if s.host != nil {
		errs = append(errs, s.host.Close(ctx))
	}
	if s.store != nil {
		errs = append(errs, s.store.Close())
	}
	return errors.Join(errs...)
}

// usedPlugins returns the IDs of the plugins the tenant's agents use,
// without repeats, in a fixed order.
func usedPlugins(t config.Tenant) []string {
	var ids []string
	for _, name := range sortedKeys(t.Agents) {
		for _, id := range t.Agents[name].Plugins() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
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
			PoolSize: p.PoolSize, MaxInstances: p.MaxInstances, IdleTimeout: p.IdleTimeout,
		},
		Sandbox: host.Sandbox{
			Config: p.Config, AllowedHosts: p.AllowedHosts, HTTPTimeout: p.HTTPTimeout,
			MaxHTTPResponseBytes: p.MaxHTTPResponseBytes, MaxHTTPResponseHeaderBytes: p.MaxHTTPResponseHeaderBytes,
		},
	}
}

// buildTenant wires a tenant from its config and its loaded plugins: each
// of its agents (buildAgent), and its own Builder, Model, Tools and rules
// as its default agent's, when it has one.
func buildTenant(cfg *config.Config, t config.Tenant, wired *pluginAdapters) (*runtime.Tenant, []httpapi.AgentJSON, error) {
	rt := &runtime.Tenant{ID: t.ID, Agents: map[string]*runtime.Agent{}, MaxAgentDepth: t.MaxAgentDepth}
	shown := make([]httpapi.AgentJSON, 0, len(t.Agents))
	for _, name := range sortedKeys(t.Agents) {
		a, sources, err := buildAgent(cfg, t, t.Agents[name], wired)
		if err != nil {
			return nil, nil, err
		}
		rt.Agents[name] = a
		shown = append(shown, agentJSON(t.Agents[name], a, sources))
	}
	if def, ok := rt.Agents[runtime.DefaultAgent]; ok {
		rt.Builder, rt.Model, rt.ModelBudget, rt.Tools = def.Builder, def.Model, def.ModelBudget, def.Tools
		rt.Limits, rt.RunTimeout, rt.WaitTimeout, rt.EffectTimeout = def.Limits, def.RunTimeout, def.WaitTimeout, def.EffectTimeout
		rt.ModelPolicy, rt.HistoryRuns = def.ModelPolicy, def.HistoryRuns
	}
	return rt, shown, nil
}

// pluginAdapters makes one builder or executor adapter per plugin of a
// tenant, which its agents share, and hands out the tools of the MCP
// servers.
type pluginAdapters struct {
	plugins   map[string]*host.Plugin
	versions  map[string]*pluginVersions // the executors' versions, by plugin ID
	budgets   map[string]*budget.Budget  // by plugin ID; nil for none
	mcp       *mcptool.Manager           // nil when no tenant uses an MCP server
	log       *slog.Logger
	w         Wiring
	builders  map[string]runtime.Builder
	executors map[string]runtime.Executor
}

func newPluginAdapters(plugins map[string]*host.Plugin, versions map[string]*pluginVersions, budgets map[string]*budget.Budget, mcp *mcptool.Manager, log *slog.Logger, w Wiring) *pluginAdapters {
	return &pluginAdapters{plugins: plugins, versions: versions, budgets: budgets, mcp: mcp, log: log, w: w,
		builders: map[string]runtime.Builder{}, executors: map[string]runtime.Executor{}}
}

func (p *pluginAdapters) builder(id string) (runtime.Builder, error) {
	if b, ok := p.builders[id]; ok {
		return b, nil
	}
	b, err := p.plugins[id].Builder()
	if err != nil {
		return nil, err
	}
	p.builders[id] = p.w.builder(id, b)
	return p.builders[id], nil
}

func (p *pluginAdapters) executor(id string) (runtime.Executor, error) {
	if ex, ok := p.executors[id]; ok {
		return ex, nil
	}
	if _, err := p.plugins[id].Executor(); err != nil {
		return nil, err // not loaded as an executor
	}
	p.executors[id] = p.w.executor(id, versionedExecutor{vs: p.versions[id]})
	return p.executors[id], nil
}

// buildAgent wires one agent of tenant t: its builder, its model executor
// and its tools, which come from its tool executors' describe with the
// config's approval and policy overrides, and its version (AgentVersion).
// It returns the agent and the plugin of each of its tools. Errors name
// the config key at fault: the tenant's top-level keys for the agent its
// top-level form defines, the agent's own keys otherwise.
func buildAgent(cfg *config.Config, t config.Tenant, a config.Agent, wired *pluginAdapters) (_ *runtime.Agent, sources []string, _ error) {
	k := cfg.File + ": tenants." + t.ID + "."
	if !a.TopLevel {
		k += "agents." + a.Name + "."
	}
	modelKey, toolsKey := "model", "tool_executors"
	if !a.TopLevel {
		modelKey, toolsKey = "model.plugin", "tools"
	}
	b, err := wired.builder(a.Builder)
	if err != nil {
		return nil, nil, fmt.Errorf("%sbuilder: %w", k, err)
	}
	mp := wired.plugins[a.Model]
	if !slices.Contains(mp.Describe().Effects, abi.KindModel) {
		return nil, nil, fmt.Errorf("%s%s: plugin %q does not carry out model effects (its describe lists effects %v): name a model executor", k, modelKey, a.Model, mp.Describe().Effects)
	}
	model, err := wired.executor(a.Model)
	if err != nil {
		return nil, nil, fmt.Errorf("%s%s: %w", k, modelKey, err)
	}
	ra := &runtime.Agent{
		Name: a.Name, Instructions: a.Instructions, OutputSchema: a.OutputSchema, Builder: b, Model: model, ModelBudget: wired.budgets[a.Model],
		Limits:     a.Limits.LoopLimits(),
		RunTimeout: a.Limits.RunTimeout, WaitTimeout: a.Limits.WaitTimeout, EffectTimeout: a.Limits.EffectTimeout,
		ModelPolicy: a.ModelPolicy, HistoryRuns: a.HistoryRuns,
	}
	if a.Settings != nil {
		if ra.Settings, err = json.Marshal(a.Settings); err != nil {
			return nil, nil, fmt.Errorf("%smodel.settings: %w", k, err)
		}
	}
	offeredBy := map[string]string{}
	for i, entry := range a.Tools {
		ek := toolsKey
		if !a.TopLevel {
			ek = fmt.Sprintf("tools[%d]", i)
		}
		if entry.Agent != "" {
			if other, dup := offeredBy[entry.Agent]; dup {
				return nil, nil, fmt.Errorf("%s%s.agent: plugin %q offers a tool %q too: an agent's tool names must be unique, so list only one of them", k, ek, other, entry.Agent)
			}
			offeredBy[entry.Agent] = "agent " + entry.Agent
			ra.Tools = append(ra.Tools, agentTool(a, entry, t.Agents[entry.Agent]))
			sources = append(sources, "")
			continue
		}
		if entry.MCP != "" {
			for _, tl := range wired.mcpTools(t, a, entry, offeredBy) {
				ra.Tools = append(ra.Tools, tl)
				sources = append(sources, mcpSourcePrefix+entry.MCP)
			}
			continue
		}
		p := wired.plugins[entry.Plugin]
		if !slices.Contains(p.Describe().Effects, abi.KindTool) {
			if a.TopLevel {
				return nil, nil, fmt.Errorf("%stool_executors: plugin %q offers no tools (its describe lists effects %v): remove it from tool_executors", k, entry.Plugin, p.Describe().Effects)
			}
			return nil, nil, fmt.Errorf("%s%s.plugin: plugin %q offers no tools (its describe lists effects %v): remove it from the agent's tools", k, ek, entry.Plugin, p.Describe().Effects)
		}
		ex, err := wired.executor(entry.Plugin)
		if err != nil {
			return nil, nil, fmt.Errorf("%s%s: %w", k, ek, err)
		}
		found := false
		for _, tool := range p.Describe().Tools {
			if entry.Tool != "" && tool.Name != entry.Tool {
				continue
			}
			found = true
			if other, dup := offeredBy[tool.Name]; dup && strings.HasPrefix(other, "agent ") {
				return nil, nil, fmt.Errorf("%s%s: plugin %q offers a tool %q, which is the name of the agent listed as a tool too: an agent's tool names must be unique, so list only one of them (with tool: NAME for the plugin's other tools)", k, ek, entry.Plugin, tool.Name)
			} else if dup {
				if a.TopLevel {
					return nil, nil, fmt.Errorf("%stool_executors: plugins %q and %q both offer tool %q: a tenant's tool names must be unique, so keep one of them", k, other, entry.Plugin, tool.Name)
				}
				return nil, nil, fmt.Errorf("%s%s: plugins %q and %q both offer tool %q: an agent's tool names must be unique, so list only one of them (with tool: NAME for the others' other tools)", k, ek, other, entry.Plugin, tool.Name)
			}
			offeredBy[tool.Name] = entry.Plugin
			approval := a.ToolApproval(entry, tool.Name, tool.Approval)
			d := tool
			d.Approval = abi.ApprovalNever
			if approval {
				d.Approval = abi.ApprovalAlways
			}
			ra.Tools = append(ra.Tools, runtime.Tool{
				Descriptor: d,
				Spec:       loop.ToolSpec{Name: tool.Name, Approval: approval, Policy: a.ToolPolicy(entry, tool.Name, tool.Idempotent)},
				Executor:   ex,
			})
			sources = append(sources, entry.Plugin)
		}
		if entry.Tool != "" && !found {
			var names []string
			for _, tool := range p.Describe().Tools {
				names = append(names, tool.Name)
			}
			return nil, nil, fmt.Errorf("%s%s.tool: plugin %q offers no tool %q (it offers: %s): fix the name", k, ek, entry.Plugin, entry.Tool, strings.Join(names, ", "))
		}
	}
	for name := range a.Overrides {
		if _, ok := offeredBy[name]; !ok && !namesMCPTool(a, name) {
			return nil, nil, fmt.Errorf("%stools.%s: no tool executor of the tenant offers a tool %q (offered: %s): fix the name or add its executor to tool_executors",
				k, name, name, strings.Join(sortedNames(offeredBy), ", "))
		}
	}
	if ra.Version, err = AgentVersion(a, ra, wired.sha256Of, sources); err != nil {
		return nil, nil, fmt.Errorf("%smodel.settings: %w", k, err)
	}
	return ra, sources, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
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

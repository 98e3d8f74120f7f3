package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/mcptool"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// A config reload (SIGHUP, `agenthost reload`).
//
// The config is read again and applied whole, or not at all: the tenants
// (their tokens, quotas, limits and agents), the plugins (added, removed,
// or changed: another file at the path, or other keys) and the MCP
// servers. Everything is built beside what is in force, with the same
// checks and the same errors as at the start; only once all of it is
// built is it swapped in (liveTenants, httpapi.Server.SetTenants). A Run
// in flight keeps the agent it pinned at creation (DESIGN.md §5.7); its
// executors are looked up by name at each call, and each call of an
// attempt goes to the plugin version that holds it (versions.go). An
// executor plugin version a reload replaced drains there; any other
// plugin no build uses any more, and MCP servers replaced, are closed once
// the calls they may still be carrying out are over (retire).

// retireMargin is added to a retired plugin's call_timeout before it is
// closed: a call looked up just before the swap starts a moment after it.
const retireMargin = 5 * time.Second

// reloadable are the top-level keys a reload applies; every other key of
// Config is one only a restart applies (restartKeys).
var reloadable = map[string]bool{"File": true, "Dir": true, "Plugins": true, "MCPServers": true, "Tenants": true}

// configKeys names the Config fields as the file does.
var configKeys = map[string]string{
	"Store": "store", "DataDir": "data_dir", "SyncWrites": "sync_writes", "CacheDir": "cache_dir",
	"Retention": "retention", "RetentionInterval": "retention_interval", "WatchdogInterval": "watchdog_interval",
	"LeaseTTL": "lease_ttl", "Listen": "listen", "HTTP": "http", "Metrics": "metrics", "Log": "log",
	"MaxInstanceMemory": "max_instance_memory", "PluginCallPath": "plugin_call_path", "PIDFile": "pid_file",
	"PluginDrain": "plugin_drain", "Tracing": "tracing", "NodeName": "node.name",
}

// restartKeys returns the keys that differ between the config in force and
// next and that only a restart applies: every top-level key but plugins,
// mcp_servers and tenants, and a plugin's budget (the runtime shares the
// model budgets among the nodes from its start).
func restartKeys(now, next *config.Config) []string {
	var out []string
	a, b := reflect.ValueOf(*now), reflect.ValueOf(*next)
	for i := range a.NumField() {
		f := a.Type().Field(i)
		if reloadable[f.Name] || reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			continue
		}
		key, ok := configKeys[f.Name]
		if !ok {
			key = f.Name
		}
		out = append(out, key)
	}
	for _, id := range slices.Sorted(maps.Keys(next.Plugins)) {
		if !reflect.DeepEqual(now.Plugins[id].Budget, next.Plugins[id].Budget) {
			out = append(out, "plugins."+id+".budget")
		}
	}
	for _, id := range slices.Sorted(maps.Keys(now.Plugins)) {
		if _, kept := next.Plugins[id]; !kept && !now.Plugins[id].Budget.IsZero() {
			out = append(out, "plugins."+id+".budget")
		}
	}
	return out
}

// reloadBuild is a config built beside the one in force, ready to be
// swapped in (commit) or dropped (discard).
type reloadBuild struct {
	cfg     *config.Config
	plugins map[string]*host.Plugin
	loaded  []*host.Plugin // the plugins this build loaded; the others it shares with the one in force
	mcp     *mcptool.Manager
	newMCP  bool // mcp was started for this build
	tenants *tenantsBuilt
	wired   map[string]*pluginAdapters
	// versions are the executor plugins' versions, by plugin ID: those
	// of the config in force for the plugins it keeps, new ones (nothing
	// in force yet) for the others.
	versions map[string]*pluginVersions
	// changes say what differs from the config in force, for the log.
	changes []string
}

// prepareReload loads what next needs that is not loaded (a plugin that is
// new or changed, the MCP servers when they changed) and builds every
// tenant of next, without touching what is in force. Its errors are the
// ones Open gives for the same config.
func (s *System) prepareReload(ctx context.Context, next *config.Config, w Wiring) (_ *reloadBuild, err error) {
	tenantIDs := slices.Sorted(maps.Keys(next.Tenants))
	if missing := usedMissingFiles(next, tenantIDs); len(missing) > 0 {
		return nil, errors.New(strings.Join(missing, "\n"))
	}
	s.tenants.rebuild.Lock()
	now, nowPlugins, nowMCP, nowVersions := s.cfg, s.plugins, s.mcp, s.versions
	s.tenants.rebuild.Unlock()

	b := &reloadBuild{cfg: next, plugins: map[string]*host.Plugin{}, wired: map[string]*pluginAdapters{}, versions: map[string]*pluginVersions{}}
	defer func() {
		if err != nil {
			b.discard(context.WithoutCancel(ctx))
		}
	}()
	for _, id := range tenantIDs {
		for _, pid := range usedPlugins(next.Tenants[id]) {
			if _, done := b.plugins[pid]; done {
				continue
			}
			spec := pluginSpec(next.Plugins[pid])
			if old, ok := nowPlugins[pid]; ok && samePlugin(old, spec) {
				b.plugins[pid] = old
				continue
			}
			p, err := s.host.LoadBeside(ctx, spec)
			if err != nil {
				return nil, fmt.Errorf("%s: plugins.%s: %w", next.File, pid, err)
			}
			b.loaded = append(b.loaded, p)
			b.plugins[pid] = p
			if old, ok := nowPlugins[pid]; ok {
				b.changes = append(b.changes, fmt.Sprintf("plugins.%s changed (sha256 %s, version %s → sha256 %s, version %s)",
					pid, short(old.SHA256()), old.Describe().Version, short(p.SHA256()), p.Describe().Version))
			} else {
				b.changes = append(b.changes, fmt.Sprintf("plugins.%s added (sha256 %s, version %s)", pid, short(p.SHA256()), p.Describe().Version))
			}
		}
	}
	for pid, p := range b.plugins {
		if p.Spec().Role != abi.RoleExecutor {
			continue
		}
		if vs, ok := nowVersions[pid]; ok {
			b.versions[pid] = vs // commitReload puts the new version in force
		} else {
			b.versions[pid] = &pluginVersions{id: pid, log: s.log}
		}
	}
	for _, pid := range slices.Sorted(maps.Keys(nowPlugins)) {
		if _, kept := b.plugins[pid]; !kept {
			b.changes = append(b.changes, "plugins."+pid+" removed")
		}
	}
	servers := usedMCPServers(next, tenantIDs)
	if reflect.DeepEqual(servers, usedMCPServers(now, slices.Collect(maps.Keys(now.Tenants)))) {
		b.mcp = nowMCP
	} else {
		b.changes = append(b.changes, "mcp_servers changed: every server is connected again")
		if len(servers) > 0 {
			if b.mcp, err = mcptool.Start(servers, mcptool.Options{Logger: s.log, OnChange: s.mcpToolsChanged, Version: hostVersion()}); err != nil {
				return nil, err
			}
			b.newMCP = true
			b.mcp.WaitTried(ctx, mcpStartWait)
		}
	}
	b.tenants = &tenantsBuilt{tenants: runtime.TenantMap{}, agents: map[string][]httpapi.AgentJSON{}}
	for _, id := range tenantIDs {
		b.wired[id] = newPluginAdapters(b.plugins, b.versions, s.budgets, b.mcp, s.log, w)
		rt, shown, err := buildTenant(next, next.Tenants[id], b.wired[id])
		if err != nil {
			return nil, err
		}
		b.tenants.tenants[id], b.tenants.agents[id] = rt, shown
		switch old, ok := now.Tenants[id]; {
		case !ok:
			b.changes = append(b.changes, "tenants."+id+" added")
		case !reflect.DeepEqual(old, next.Tenants[id]):
			b.changes = append(b.changes, "tenants."+id+" changed")
		}
	}
	for _, id := range slices.Sorted(maps.Keys(now.Tenants)) {
		if _, kept := next.Tenants[id]; !kept {
			b.changes = append(b.changes, "tenants."+id+" removed")
		}
	}
	return b, nil
}

// discard closes what the build loaded.
func (b *reloadBuild) discard(ctx context.Context) {
	for _, p := range b.loaded {
		_ = p.Close(ctx)
	}
	if b.newMCP {
		b.mcp.Close()
	}
}

// commitReload swaps b in: new Runs, and the next call of every Run, see
// it. A replaced executor plugin version drains (versions.go); the other
// plugins and the MCP servers b does not use are closed once their calls
// are over. before and after (nil: nothing) run just before and just
// after the tenants of b are put in force, in the same step as far as
// a reload is concerned: Server.Reload swaps the API's tenants with
// them. When b started MCP servers, their tools are read again once b is
// in force: a change of tools during the build went to the tenants then
// in force.
func (s *System) commitReload(b *reloadBuild, before, after func()) {
	s.tenants.rebuild.Lock()
	if before != nil {
		before()
	}
	oldPlugins, oldMCP, oldVersions := s.plugins, s.mcp, s.versions
	for pid, vs := range b.versions {
		if vs.current == nil || vs.current.plugin != b.plugins[pid] {
			// Checked as an executor by prepareReload's build.
			_ = vs.setCurrent(b.plugins[pid], b.cfg.PluginDrain, s.retire)
		}
	}
	for pid, vs := range oldVersions {
		if _, kept := b.versions[pid]; !kept {
			_ = vs.setCurrent(nil, b.cfg.PluginDrain, s.retire)
		}
	}
	s.cfg, s.plugins, s.wired, s.mcp, s.versions = b.cfg, b.plugins, b.wired, b.mcp, b.versions
	s.tenants.now.Store(b.tenants)
	if after != nil {
		after()
	}
	s.tenants.rebuild.Unlock()
	if b.newMCP {
		for _, server := range slices.Sorted(maps.Keys(usedMCPServers(b.cfg, slices.Collect(maps.Keys(b.cfg.Tenants))))) {
			s.mcpToolsChanged(server)
		}
	}
	for _, p := range oldPlugins {
		if b.plugins[p.Name()] != p && p.Spec().Role != abi.RoleExecutor {
			s.retire(p.Spec().Limits.CallTimeout+retireMargin, p.Close)
		}
	}
	if oldMCP != b.mcp && oldMCP != nil {
		s.retire(retireMargin, func(context.Context) error { oldMCP.Close(); return nil })
	}
}

// pluginsInForce are the plugins of the config in force, by plugin ID: a
// copy, which a reload that commits afterwards does not change.
func (s *System) pluginsInForce() map[string]*host.Plugin {
	s.tenants.rebuild.Lock()
	defer s.tenants.rebuild.Unlock()
	return maps.Clone(s.plugins)
}

// retire closes a plugin version or MCP manager no build uses any more
// after drain, or when the system closes, whichever comes first. It is
// forgotten once closed.
func (s *System) retire(drain time.Duration, close func(context.Context) error) {
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	r := &retired{close: close}
	r.timer = time.AfterFunc(drain, func() {
		s.retiredMu.Lock()
		s.retired = slices.DeleteFunc(s.retired, func(o *retired) bool { return o == r })
		s.retiredMu.Unlock()
		r.do(context.Background())
	})
	s.retired = append(s.retired, r)
}

// retired is something closed after its drain (retire).
type retired struct {
	timer *time.Timer
	close func(context.Context) error
}

func (r *retired) do(ctx context.Context) { _ = r.close(ctx) }

// closeRetired closes, now, what is still draining.
func (s *System) closeRetired(ctx context.Context) {
	s.retiredMu.Lock()
	rs := s.retired
	s.retired = nil
	s.retiredMu.Unlock()
	for _, r := range rs {
		if r.timer.Stop() {
			r.do(ctx)
		}
	}
}

// samePlugin reports whether the loaded plugin p is what spec loads: the
// same keys, and the same file at the path (by its sha256).
func samePlugin(p *host.Plugin, spec host.PluginSpec) bool {
	if !reflect.DeepEqual(spec.WithDefaults(), p.Spec()) {
		return false
	}
	sum, err := fileSHA256(spec.Path)
	return err == nil && sum == p.SHA256()
}

// fileSHA256 returns the hex sha256 of the file at path.
func fileSHA256(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// short is the first 12 hex digits of a sha256, for the log.
func short(sum string) string { return sum[:min(12, len(sum))] }

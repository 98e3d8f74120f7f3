package node

import (
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The tools of MCP servers in the wiring.
//
// A tenant's agents are built from the config and what its tool sources
// offer now. A plugin's tools are fixed once it is loaded; an MCP server's
// are listed when it is reached, which may be after the start (it was
// down), and again when it says they changed. So the tenants the runtime
// sees (liveTenants) are replaced, whole, each time the tools of a server
// they use change: the tenants that use it are built again, with the same
// plugin adapters, and swapped in at once. A Run keeps the tools it was
// created with (their descriptors and rules are in its spec); only the
// executor of a tool is looked up again at each call, by name, in the
// tenants of the moment.

// mcpSourcePrefix marks, in an agent's tool sources, a tool of an MCP
// server ("mcp/NAME") rather than of a plugin.
const mcpSourcePrefix = "mcp/"

// liveTenants are the tenants as they are now: runtime.Tenants over the
// last build, replaced whole by each rebuild.
type liveTenants struct {
	now atomic.Pointer[tenantsBuilt]
	// rebuild serializes the builds.
	rebuild sync.Mutex
}

// tenantsBuilt is one build of the tenants, with their agents as the API
// shows them.
type tenantsBuilt struct {
	tenants runtime.TenantMap
	agents  map[string][]httpapi.AgentJSON
}

var _ runtime.Tenants = (*liveTenants)(nil)

// Tenant implements runtime.Tenants.
func (l *liveTenants) Tenant(id string) (*runtime.Tenant, bool) {
	b := l.load()
	t, ok := b.tenants[id]
	return t, ok
}

func (l *liveTenants) load() *tenantsBuilt {
	if b := l.now.Load(); b != nil {
		return b
	}
	return &tenantsBuilt{}
}

// buildTenants builds every tenant of ids, the first time.
func (s *System) buildTenants(ids []string, w Wiring) error {
	s.tenants.rebuild.Lock()
	defer s.tenants.rebuild.Unlock()
	b := &tenantsBuilt{tenants: runtime.TenantMap{}, agents: map[string][]httpapi.AgentJSON{}}
	for _, id := range ids {
		s.wired[id] = newPluginAdapters(s.plugins, s.versions, s.budgets, s.mcp, s.log, w)
		rt, shown, err := buildTenant(s.cfg, s.cfg.Tenants[id], s.wired[id])
		if err != nil {
			return err
		}
		b.tenants[id], b.agents[id] = rt, shown
	}
	s.tenants.now.Store(b)
	return nil
}

// mcpToolsChanged builds again the tenants whose agents use the MCP server
// whose tools changed, and swaps them in. A tenant whose build fails keeps
// the one it had (the error is logged).
func (s *System) mcpToolsChanged(server string) {
	s.tenants.rebuild.Lock()
	defer s.tenants.rebuild.Unlock()
	old := s.tenants.now.Load()
	if old == nil {
		return // the first build is under way, and reads the tools itself
	}
	b := &tenantsBuilt{tenants: maps.Clone(old.tenants), agents: maps.Clone(old.agents)}
	for _, id := range slices.Sorted(maps.Keys(old.tenants)) {
		t := s.cfg.Tenants[id]
		if !tenantUsesMCP(t, server) {
			continue
		}
		rt, shown, err := buildTenant(s.cfg, t, s.wired[id])
		if err != nil {
			s.log.Error("mcp: the tools of a server changed, but the tenant's agents could not be built again; they keep the tools they had",
				"mcp_server", server, "tenant", id, "err", err)
			continue
		}
		b.tenants[id], b.agents[id] = rt, shown
		versions := make([]string, 0, len(shown))
		for _, a := range shown {
			versions = append(versions, a.Name+"="+a.Version)
		}
		s.log.Info("mcp: the tools of a server changed; the tenant's agents that use it now offer them to new Runs",
			"mcp_server", server, "tenant", id, "agents", strings.Join(versions, " "))
	}
	s.tenants.now.Store(b)
}

// tenantUsesMCP reports whether an agent of t has tools of server.
func tenantUsesMCP(t config.Tenant, server string) bool {
	for _, a := range t.Agents {
		if slices.Contains(a.MCPServers(), server) {
			return true
		}
	}
	return false
}

// usedMCPServers returns the MCP servers the tenants' agents use.
func usedMCPServers(cfg *config.Config, tenantIDs []string) map[string]config.MCPServer {
	out := map[string]config.MCPServer{}
	for _, id := range tenantIDs {
		for _, a := range cfg.Tenants[id].Agents {
			for _, name := range a.MCPServers() {
				out[name] = cfg.MCPServers[name]
			}
		}
	}
	return out
}

// mcpTools returns the tools of an agent's entry {mcp: NAME[, tool:
// TOOL]}, as the server lists them now (none while it was never reached),
// with the config's approval and policy: an MCP tool is never taken for
// idempotent, so its default policy is fail. A tool whose name another
// tool of the agent has already is left out, with a warning; offeredBy
// records the others.
func (p *pluginAdapters) mcpTools(t config.Tenant, a config.Agent, entry config.AgentTool, offeredBy map[string]string) []runtime.Tool {
	server := p.mcp.Server(entry.MCP)
	if server == nil {
		return nil
	}
	var out []runtime.Tool
	for _, tl := range server.Tools() {
		if entry.Tool != "" && tl.Original != entry.Tool {
			continue
		}
		if other, dup := offeredBy[tl.Name]; dup {
			p.log.Warn("mcp: a tool of the server is left out of an agent: another of its tools has its name",
				"tenant", t.ID, "agent", a.Name, "tool", tl.Name, "mcp_server", entry.MCP, "other", other)
			continue
		}
		offeredBy[tl.Name] = mcpSourcePrefix + entry.MCP
		approval := a.ToolApproval(entry, tl.Name, abi.ApprovalNever)
		d := tl.Descriptor
		d.Approval = abi.ApprovalNever
		if approval {
			d.Approval = abi.ApprovalAlways
		}
		out = append(out, runtime.Tool{
			Descriptor: d,
			Spec:       loop.ToolSpec{Name: tl.Name, Approval: approval, Policy: a.ToolPolicy(entry, tl.Name, false)},
			Executor:   p.w.executor(mcpSourcePrefix+entry.MCP, server.Executor(tl.Original)),
		})
	}
	return out
}

// namesMCPTool reports whether name (a key of the agent's tools overrides)
// is the name of a tool of one of the agent's MCP servers, listed or not
// yet: SERVER__TOOL.
func namesMCPTool(a config.Agent, name string) bool {
	server, _, ok := strings.Cut(name, config.MCPToolSeparator)
	return ok && slices.Contains(a.MCPServers(), server)
}

// sha256Of returns a tool source's file hash for the agent's version: a
// plugin's, or "" for an MCP server (which has no file).
func (p *pluginAdapters) sha256Of(id string) string {
	if strings.HasPrefix(id, mcpSourcePrefix) {
		return ""
	}
	pl, ok := p.plugins[id]
	if !ok {
		panic(fmt.Sprintf("node: the agent's version names plugin %q, which is not loaded", id))
	}
	return pl.SHA256()
}

// hostVersion is the version of this binary, for the MCP servers it
// speaks to.
func hostVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}

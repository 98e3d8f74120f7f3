package node

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/mcptool"
	"github.com/agenthost/agenthost/internal/mcptool/mcptest"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestAnAgentsMCPToolsFollowTheConfig: the tools of an agent's entry
// {mcp: NAME} are the server's tools as listed now, under NAME__TOOL, with
// their schemas, the config's approval and policy (fail by default: an
// MCP tool is never taken for idempotent); {mcp: NAME, tool: T} takes one
// of them by the server's name; a tool whose name the agent has already
// is left out.
func TestAnAgentsMCPToolsFollowTheConfig(t *testing.T) {
	srv := mcptest.New()
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	mgr, err := mcptool.Start(map[string]config.MCPServer{"web": {Name: "web", URL: srv.URL(), CallTimeout: 10 * time.Second,
		MaxResultBytes: 4096, Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}, mcptool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	conformance.WaitUntil(t, 30*time.Second, "the server's tools", func() (bool, error) { return len(mgr.Server("web").Tools()) == 3, nil })
	p := newPluginAdapters(nil, nil, nil, mgr, slog.New(slog.DiscardHandler), Wiring{})
	tenant := config.Tenant{ID: "acme"}
	a := config.Agent{Name: "default", TopLevel: true, Overrides: map[string]config.ToolOverride{"web__add": {Approval: abi.ApprovalAlways}}}

	got := p.mcpTools(tenant, a, config.AgentTool{MCP: "web"}, map[string]string{})
	byName := map[string]int{}
	for i, tl := range got {
		byName[tl.Spec.Name] = i
		if tl.Executor == nil || len(tl.Descriptor.InputSchema) == 0 || tl.Descriptor.Name != tl.Spec.Name {
			t.Errorf("tool %s: %+v", tl.Spec.Name, tl)
		}
		if tl.Spec.Policy != loop.DefaultToolPolicy(false) {
			t.Errorf("tool %s's policy %+v, want fail (not idempotent)", tl.Spec.Name, tl.Spec.Policy)
		}
	}
	if len(got) != 3 {
		t.Fatalf("tools %v, want web__add, web__slow and web__fail", byName)
	}
	add := got[byName["web__add"]]
	if !add.Spec.Approval || add.Descriptor.Approval != abi.ApprovalAlways || !json.Valid(add.Descriptor.InputSchema) {
		t.Errorf("web__add: %+v; want it to wait for approval, as the config says", add)
	}

	one := p.mcpTools(tenant, a, config.AgentTool{MCP: "web", Tool: mcptest.ToolSlow}, map[string]string{})
	if len(one) != 1 || one[0].Spec.Name != "web__slow" {
		t.Fatalf("{mcp: web, tool: slow}: %+v", one)
	}
	taken := map[string]string{"web__add": "calc"}
	if rest := p.mcpTools(tenant, a, config.AgentTool{MCP: "web"}, taken); len(rest) != 2 || taken["web__add"] != "calc" {
		t.Fatalf("with web__add taken by a plugin: %d tools, offered by %v", len(rest), taken)
	}
	if !namesMCPTool(config.Agent{Tools: []config.AgentTool{{MCP: "web"}}}, "web__later") || namesMCPTool(a, "calc__x") {
		t.Error("namesMCPTool does not tell the tools of the agent's MCP servers")
	}
}

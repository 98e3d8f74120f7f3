package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/agenthost/agenthost/runtime"
)

// CodeAgentNotFound is the code of a request naming an agent its tenant
// does not have: a submission's "agent", or GET /v1/agents/{name}.
const CodeAgentNotFound = "agent_not_found"

// AgentJSON is an agent as GET /v1/agents and GET /v1/agents/{name} show
// it: its definition as the server runs new Runs with it. It holds no
// secret: a plugin's own config (where API keys live) is never shown.
type AgentJSON struct {
	Name string `json:"name"`
	// Version is the hash of the agent's resolved definition: the one a
	// Run created now records (a Run's agent_version).
	Version     string `json:"version"`
	Description string `json:"description,omitempty"`
	// Instructions are the system prompt the builder is given; only GET
	// /v1/agents/{name} shows them.
	Instructions string          `json:"instructions,omitempty"`
	Builder      string          `json:"builder"`
	Model        AgentModelJSON  `json:"model"`
	Tools        []AgentToolJSON `json:"tools"`
	Limits       AgentLimitsJSON `json:"limits"`
	HistoryRuns  int             `json:"history_runs"`
	// OutputSchema is the JSON Schema (2020-12) the agent's final answers
	// must match; absent when it has none.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}

// AgentModelJSON is an agent's model: the executor plugin and the
// settings it is given (as request params).
type AgentModelJSON struct {
	Plugin   string          `json:"plugin"`
	Settings json.RawMessage `json:"settings,omitempty"`
}

// AgentToolJSON is one tool an agent's Runs may call.
type AgentToolJSON struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Plugin is the executor plugin that carries the tool out; none for
	// an agent tool.
	Plugin string `json:"plugin,omitempty"`
	// Agent is set on an agent tool: the agent of the tenant each call
	// runs as, in a child Run.
	Agent string `json:"agent,omitempty"`
	// MCP is set on a tool of an MCP server: the server (mcp_servers)
	// that carries it out.
	MCP string `json:"mcp,omitempty"`
	// Approval is "always" when a call waits for a person, else "never".
	Approval   string `json:"approval"`
	Idempotent bool   `json:"idempotent,omitempty"`
}

// AgentLimitsJSON bounds each Run of an agent; a timeout of "0s" is none.
// RunTimeout bounds a Run's work time, which does not count its waits for
// a person; WaitTimeout bounds each of those waits.
type AgentLimitsJSON struct {
	MaxSteps             int    `json:"max_steps"`
	MaxToolCallsPerStep  int    `json:"max_tool_calls_per_step"`
	MaxParallelToolCalls int    `json:"max_parallel_tool_calls"`
	RunTimeout           string `json:"run_timeout"`
	WaitTimeout          string `json:"wait_timeout"`
	EffectTimeout        string `json:"effect_timeout"`
}

// AgentListJSON is the answer of GET /v1/agents: the tenant's agents, by
// name.
type AgentListJSON struct {
	Agents []AgentJSON `json:"agents"`
}

func (s *Server) listAgents(w http.ResponseWriter, _ *http.Request, tenant string) error {
	agents := s.agentsOf(tenant)
	out := AgentListJSON{Agents: make([]AgentJSON, 0, len(agents))}
	for _, a := range agents {
		a.Instructions = "" // GET /v1/agents/{name} has them
		out.Agents = append(out.Agents, a)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getAgent(w http.ResponseWriter, r *http.Request, tenant string) error {
	name := r.PathValue("name")
	for _, a := range s.agentsOf(tenant) {
		if a.Name == name {
			writeJSON(w, http.StatusOK, a)
			return nil
		}
	}
	return s.agentNotFound(tenant, name)
}

// agentsOf returns the tenant's agents as they are now.
func (s *Server) agentsOf(tenant string) []AgentJSON {
	if s.cfg.AgentsOf != nil {
		return s.cfg.AgentsOf(tenant)
	}
	return s.cfg.Agents[tenant]
}

// agentNotFound answers 404 agent_not_found for a name the tenant has no
// agent of, naming the agents it has.
func (s *Server) agentNotFound(tenant, name string) *apiError {
	agents := s.agentsOf(tenant)
	names := make([]string, 0, len(agents))
	for _, a := range agents {
		names = append(names, a.Name)
	}
	known := "it has none"
	if len(names) > 0 {
		known = "its agents: " + strings.Join(names, ", ")
	}
	return errorf(http.StatusNotFound, CodeAgentNotFound,
		"this tenant has no agent %q (%s); name one of them in \"agent\", or leave \"agent\" out for %q. GET /v1/agents lists them",
		truncate(name, 80), known, runtime.DefaultAgent)
}

package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// withAgents makes tenant acme two agents, "default" and "support", of
// its own builder, model and tools, and lists them for GET /v1/agents.
func withAgents(cfg *httpapi.Config, ropts *runtime.Options) {
	tenants := ropts.Tenants.(runtime.TenantMap)
	acme := tenants["acme"]
	agent := func(name, version, instructions string) *runtime.Agent {
		return &runtime.Agent{Name: name, Version: version, Instructions: instructions, Settings: json.RawMessage(`{"temperature":0.5}`),
			Builder: acme.Builder, Model: acme.Model, Tools: acme.Tools, Limits: acme.Limits, ModelPolicy: acme.ModelPolicy}
	}
	tenants["acme"] = &runtime.Tenant{ID: "acme", Agents: map[string]*runtime.Agent{
		"default": agent("default", "v-00000000000d", ""),
		"support": agent("support", "v-00000000000s", "You help customers."),
	}}
	cfg.Agents = map[string][]httpapi.AgentJSON{"acme": {
		{Name: "default", Version: "v-00000000000d", Builder: "echo-builder", Model: httpapi.AgentModelJSON{Plugin: "scripted-model"}, Tools: []httpapi.AgentToolJSON{}},
		{Name: "support", Version: "v-00000000000s", Description: "Answers customers.", Instructions: "You help customers.", Builder: "echo-builder",
			Model: httpapi.AgentModelJSON{Plugin: "scripted-model", Settings: json.RawMessage(`{"temperature":0.5}`)},
			Tools: []httpapi.AgentToolJSON{{Name: "wire", Plugin: "scripted-tools", Approval: "always"}},
			// As a node lists it; the runtime's support above has none, so
			// that its Runs complete with any answer.
			OutputSchema: json.RawMessage(`{"type":"object","required":["answer"]}`)},
	}}
}

func (e *env) submitAs(token, session, agent, script string) reply {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"input": script, "agent": agent})
	return e.do("POST", "/v1/sessions/"+session+"/runs", token, string(body))
}

// TestASubmissionNamesItsAgent: a submission runs as the agent it names,
// or as "default"; the Run's JSON names its agent and the version it was
// created with, and so does its summary.
func TestASubmissionNamesItsAgent(t *testing.T) {
	e := newEnv(t, withAgents)
	r := e.submitAs(tokenAcme, "s1", "support", "answer:x")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	run := r.run(t)
	require.Equal(t, "support", run.Agent)
	require.Equal(t, "v-00000000000s", run.AgentVersion)
	plain := e.submit(tokenAcme, "s2", "answer:y")
	require.Equal(t, "default", plain.Agent)
	require.Equal(t, "v-00000000000d", plain.AgentVersion)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	e.waitStatus(tokenAcme, plain.ID, loop.StatusCompleted)

	page := e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "")
	require.Equal(t, http.StatusOK, page.Status)
	require.Contains(t, string(page.Body), `"agent":"support"`)

	// A tenant without agents is its own default agent, of no version.
	other := e.submit(tokenGlobex, "s1", "answer:z")
	require.Equal(t, "default", other.Agent)
	require.Empty(t, other.AgentVersion)
}

// TestAnUnknownAgentAnswers404: a submission naming an agent the tenant
// does not have answers 404 agent_not_found, naming the agents it has, and
// stores nothing.
func TestAnUnknownAgentAnswers404(t *testing.T) {
	e := newEnv(t, withAgents)
	r := e.submitAs(tokenAcme, "s1", "research", "answer:x")
	require.Equal(t, http.StatusNotFound, r.Status, "body: %s", r.Body)
	require.Equal(t, httpapi.CodeAgentNotFound, r.errCode(t))
	msg := r.message(t)
	require.Contains(t, msg, `no agent "research"`)
	require.Contains(t, msg, "its agents: default, support")
	require.Empty(t, e.tenantRuns(tokenAcme, "").Runs, "a refused submission stored a Run")

	r = e.do("GET", "/v1/agents/research", tokenAcme, "")
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, httpapi.CodeAgentNotFound, r.errCode(t))
}

// TestAgentsAreListed: GET /v1/agents lists the tenant's agents without
// their instructions (with their output schema); GET /v1/agents/{name}
// shows one whole; another
// tenant's agents are not shown.
func TestAgentsAreListed(t *testing.T) {
	e := newEnv(t, withAgents)
	r := e.do("GET", "/v1/agents", tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var list httpapi.AgentListJSON
	require.NoError(t, json.Unmarshal(r.Body, &list))
	require.Len(t, list.Agents, 2)
	require.Equal(t, "support", list.Agents[1].Name)
	require.Equal(t, "v-00000000000s", list.Agents[1].Version)
	require.Empty(t, list.Agents[1].Instructions, "the list shows no instructions")
	require.Equal(t, "always", list.Agents[1].Tools[0].Approval)
	require.JSONEq(t, `{"type":"object","required":["answer"]}`, string(list.Agents[1].OutputSchema), "the list shows the output schema")
	require.Empty(t, list.Agents[0].OutputSchema)

	r = e.do("GET", "/v1/agents/support", tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var one httpapi.AgentJSON
	require.NoError(t, json.Unmarshal(r.Body, &one))
	require.Equal(t, "You help customers.", one.Instructions)
	require.JSONEq(t, `{"temperature":0.5}`, string(one.Model.Settings))
	require.JSONEq(t, `{"type":"object","required":["answer"]}`, string(one.OutputSchema))

	r = e.do("GET", "/v1/agents", tokenGlobex, "")
	require.Equal(t, http.StatusOK, r.Status)
	require.JSONEq(t, `{"agents":[]}`, string(r.Body))
	r = e.do("GET", "/v1/agents/support", tokenGlobex, "")
	require.Equal(t, http.StatusNotFound, r.Status)
}

// TestTenantRunsAreFilteredByAgent: GET /v1/runs?agent= lists the Runs of
// one agent.
func TestTenantRunsAreFilteredByAgent(t *testing.T) {
	e := newEnv(t, withAgents)
	support := e.submitAs(tokenAcme, "s1", "support", "answer:x").run(t)
	plain := e.submit(tokenAcme, "s2", "answer:y")
	e.waitStatus(tokenAcme, support.ID, loop.StatusCompleted)
	e.waitStatus(tokenAcme, plain.ID, loop.StatusCompleted)
	require.Equal(t, []string{support.ID}, ids(e.tenantRuns(tokenAcme, "?agent=support")))
	require.Equal(t, []string{plain.ID}, ids(e.tenantRuns(tokenAcme, "?agent=default")))
	require.Empty(t, ids(e.tenantRuns(tokenAcme, "?agent=research")))
	r := e.do("GET", "/v1/runs?agent="+strings.Repeat("x", 100), tokenAcme, "")
	require.Equal(t, http.StatusBadRequest, r.Status)
}

// TestAnIdempotentReplayMustNameTheSameAgent: a key reused for a
// submission of another agent answers 422, naming the agent.
func TestAnIdempotentReplayMustNameTheSameAgent(t *testing.T) {
	e := newEnv(t, withAgents)
	body := func(agent string) string {
		b, _ := json.Marshal(map[string]any{"input": "answer:x", "agent": agent})
		return string(b)
	}
	r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body("support"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	r = e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body("support"), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body(""), "Idempotency-Key", "k1")
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
	require.Contains(t, string(r.Body), `agent (it was \"support\")`)
}

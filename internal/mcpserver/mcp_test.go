package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
)

// TestTheToolsAreTheTenantsAgents: the Go SDK's client lists the tenant's
// agents as tools: the input schema, a description (the agent's, or its
// instructions'), the output schema of an agent that has one; on the
// wire, each tool takes a task, and the server declares tasks.
func TestTheToolsAreTheTenantsAgents(t *testing.T) {
	s := newServer(t)
	cs := s.connect(tokenAcme, nil)
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, res.Tools, 2)
	def, support := res.Tools[0], res.Tools[1]
	require.Equal(t, "default", def.Name)
	require.Equal(t, "An agent instructed: Answer the question.\nBe brief.", def.Description)
	require.Nil(t, def.OutputSchema)
	schema, err := json.Marshal(def.InputSchema)
	require.NoError(t, err)
	require.JSONEq(t, `{"type": "object", "required": ["question"], "additionalProperties": false, "properties": {
		"question": {"type": "string", "minLength": 1, "description": "What to ask the agent: the Run's input."},
		"session": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "description": "The session the Run joins: its Runs run one at a time, and the agent sees the earlier ones' conversation. Absent: a session of its own."}}}`,
		string(schema))
	require.Equal(t, "support", support.Name)
	require.Equal(t, "Answers customers.", support.Description)
	out, err := json.Marshal(support.OutputSchema)
	require.NoError(t, err)
	require.JSONEq(t, supportSchema, string(out))

	w := s.openWire(tokenAcme)
	list := w.call("tools/list", `{}`)
	require.Nil(t, list.Error)
	var tools struct {
		Tools []struct {
			Name      string          `json:"name"`
			Execution json.RawMessage `json:"execution"`
		} `json:"tools"`
	}
	require.NoError(t, json.Unmarshal(list.Result, &tools))
	require.Len(t, tools.Tools, 2)
	for _, tl := range tools.Tools {
		require.JSONEq(t, `{"taskSupport": "optional"}`, string(tl.Execution), tl.Name)
	}
	init := (&wire{s: s, token: tokenAcme}).call("initialize", `{"protocolVersion": "2026-07-28", "capabilities": {}, "clientInfo": {"name": "w", "version": "1"}}`)
	var caps struct {
		ProtocolVersion string `json:"protocolVersion"`
		Capabilities    struct {
			Tasks json.RawMessage `json:"tasks"`
		} `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(init.Result, &caps))
	require.Equal(t, "2025-11-25", caps.ProtocolVersion, "the revision whose tasks the server has")
	require.JSONEq(t, `{"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}`, string(caps.Capabilities.Tasks))
}

// TestACallWaitsForTheRunAndSendsProgress: a tools/call without a task
// starts a Run, sends progress (the first names the Run), and answers the
// Run's final answer, with the Run's ID in _meta; the Run is the API's.
// An agent with an object output schema answers structured content too.
func TestACallWaitsForTheRunAndSendsProgress(t *testing.T) {
	s := newServer(t)
	var mu sync.Mutex
	var notes []*mcp.ProgressNotificationParams
	cs := s.connect(tokenAcme, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		defer mu.Unlock()
		notes = append(notes, r.Params)
	}})
	params := &mcp.CallToolParams{Name: "default", Arguments: map[string]any{"question": `call:echo({"text":"e"})|answer:got $results`}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(context.Background(), params)
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	require.Equal(t, "got e", res.Content[0].(*mcp.TextContent).Text)
	runID, _ := res.Meta["agenthost/run"].(string)
	require.NotEmpty(t, runID, "the result names its Run: %v", res.Meta)
	run, err := s.rt.LoadRun(context.Background(), "acme", runID)
	require.NoError(t, err)
	require.Equal(t, loop.StatusCompleted, run.Status)
	require.Equal(t, "default", run.Agent.Name)
	require.Equal(t, `call:echo({"text":"e"})|answer:got $results`, run.Input)
	require.True(t, strings.HasPrefix(run.Session, "mcp-"), run.Session)

	conformance.Eventually(t, "the progress notifications", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(notes) > 0 && notes[len(notes)-1].Message == "the run completed"
	})
	mu.Lock()
	require.Contains(t, notes[0].Message, "run "+runID+" of agent \"default\" started")
	for i := 1; i < len(notes); i++ {
		require.Greater(t, notes[i].Progress, notes[i-1].Progress, "progress only grows")
	}
	mu.Unlock()

	structured, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "support",
		Arguments: map[string]any{"question": `answer:{"answer": "yes"}`, "session": "s-support"}})
	require.NoError(t, err)
	require.Equal(t, map[string]any{"answer": "yes"}, structured.StructuredContent)
	run, err = s.rt.LoadRun(context.Background(), "acme", structured.Meta["agenthost/run"].(string))
	require.NoError(t, err)
	require.Equal(t, "s-support", run.Session)

	// Arguments the schema refuses, and an agent the tenant lacks.
	for _, bad := range []*mcp.CallToolParams{
		{Name: "default", Arguments: map[string]any{}},
		{Name: "default", Arguments: map[string]any{"question": "x", "extra": 1}},
		{Name: "default", Arguments: map[string]any{"question": "x", "session": "not valid"}},
		{Name: "research", Arguments: map[string]any{"question": "x"}},
	} {
		_, err := cs.CallTool(context.Background(), bad)
		require.Error(t, err, "%+v", bad)
	}
}

// TestTasksAreRunsAnyReaderAnswersFromTheStore: a tools/call made as a
// task answers at once with a task whose ID is the Run's; tasks/get
// answers from the store, tasks/result answers the Run's result, a Run
// waiting for an approval is input_required (its message says what it
// waits for and how to answer), tasks/list lists it, and tasks/cancel
// cancels a Run.
func TestTasksAreRunsAnyReaderAnswersFromTheStore(t *testing.T) {
	s := newServer(t)
	w := s.openWire(tokenAcme)
	tk := w.createTask("default", `call:wire({"text":"w"})|answer:wired $results`)
	require.Contains(t, []string{"working", "input_required"}, tk.Status)
	require.Nil(t, tk.TTL)
	require.Equal(t, int64(1000), tk.PollInterval)
	run, err := s.rt.LoadRun(context.Background(), "acme", tk.TaskID)
	require.NoError(t, err, "the task's ID is the Run's")
	require.Equal(t, "default", run.Agent.Name)

	waiting := w.waitTask(tk.TaskID, "input_required")
	require.Contains(t, waiting.StatusMessage, "waiting for the approval of wire (tool call ")
	require.Contains(t, waiting.StatusMessage, "POST /v1/runs/"+tk.TaskID+"/input")

	// Another session (as another node would) answers the same.
	other := s.openWire(tokenAcme)
	again, r := other.getTask(tk.TaskID)
	require.Nil(t, r.Error)
	require.Equal(t, waiting.Status, again.Status)

	// The approval, through the API.
	run, err = s.rt.LoadRun(context.Background(), "acme", tk.TaskID)
	require.NoError(t, err)
	approve := `{"approvals": [{"tool_call_id": "` + run.Effects[len(run.Effects)-1].ToolCallID + `", "approved": true}]}`
	req, _ := http.NewRequest(http.MethodPost, s.ts.URL+"/v1/runs/"+tk.TaskID+"/input", strings.NewReader(approve))
	req.Header.Set("Authorization", "Bearer "+tokenAcme)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	result := w.call("tasks/result", `{"taskId": "`+tk.TaskID+`"}`)
	require.Nil(t, result.Error)
	var tr struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
		Meta    map[string]any          `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(result.Result, &tr))
	require.False(t, tr.IsError)
	require.Equal(t, "wired w", tr.Content[0].Text)
	require.Equal(t, map[string]any{"taskId": tk.TaskID}, tr.Meta["io.modelcontextprotocol/related-task"])
	done, _ := w.getTask(tk.TaskID)
	require.Equal(t, "completed", done.Status)

	// A Run that blocks in a tool, cancelled.
	blocked := w.createTask("default", `call:block({})|answer:never`)
	cancelled := w.call("tasks/cancel", `{"taskId": "`+blocked.TaskID+`"}`)
	require.Nil(t, cancelled.Error, "%+v", cancelled.Error)
	w.waitTask(blocked.TaskID, "cancelled")
	result = w.call("tasks/result", `{"taskId": "`+blocked.TaskID+`"}`)
	require.NoError(t, json.Unmarshal(result.Result, &tr))
	require.True(t, tr.IsError)
	require.Contains(t, tr.Content[0].Text, "cancelled through MCP tasks/cancel")
	again2 := w.call("tasks/cancel", `{"taskId": "`+blocked.TaskID+`"}`)
	require.NotNil(t, again2.Error)
	require.Equal(t, -32602, again2.Error.Code, "a task that has ended cannot be cancelled")

	list := w.call("tasks/list", `{}`)
	require.Nil(t, list.Error)
	var tl struct {
		Tasks []task `json:"tasks"`
	}
	require.NoError(t, json.Unmarshal(list.Result, &tl))
	statuses := map[string]string{}
	for _, listed := range tl.Tasks {
		statuses[listed.TaskID] = listed.Status
	}
	require.Equal(t, map[string]string{tk.TaskID: "completed", blocked.TaskID: "cancelled"}, statuses)
}

// TestAnotherTenantsTaskIsNotFound: a task of acme's, asked for with
// globex's token, answers exactly as a task that does not exist, for
// every task method; globex's list does not hold it.
func TestAnotherTenantsTaskIsNotFound(t *testing.T) {
	s := newServer(t)
	tk := s.openWire(tokenAcme).createTask("default", "answer:secret")
	globex := s.openWire(tokenGlobex)
	for _, method := range []string{"tasks/get", "tasks/result", "tasks/cancel"} {
		theirs := globex.call(method, `{"taskId": "`+tk.TaskID+`"}`)
		require.NotNil(t, theirs.Error, method)
		const unknown = "run_0000000000000_nosuchrun"
		none := globex.call(method, `{"taskId": "`+unknown+`"}`)
		require.NotNil(t, none.Error, method)
		require.Equal(t, none.Error.Code, theirs.Error.Code, method)
		require.Equal(t, strings.ReplaceAll(none.Error.Message, unknown, tk.TaskID), theirs.Error.Message, method)
		require.Contains(t, theirs.Error.Message, "not found")
	}
	list := globex.call("tasks/list", `{}`)
	require.Nil(t, list.Error)
	require.NotContains(t, string(list.Result), tk.TaskID)
}

// TestAnApprovalIsAskedForByElicitation: a client that takes
// elicitations is asked for the approval a Run waits for, during a call
// without a task and during tasks/result; its answer goes to the Run.
func TestAnApprovalIsAskedForByElicitation(t *testing.T) {
	s := newServer(t)
	var mu sync.Mutex
	var asked []string
	cs := s.connect(tokenAcme, &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		mu.Lock()
		asked = append(asked, r.Params.Message)
		mu.Unlock()
		if strings.Contains(r.Params.Message, "asks:") {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "Paris"}}, nil
		}
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approved": true, "reason": "fine"}}, nil
	}})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "default",
		Arguments: map[string]any{"question": `call:wire({"text":"w"})|ask:Which city?|answer:$results`}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	require.Equal(t, "w", res.Content[0].(*mcp.TextContent).Text)
	mu.Lock()
	require.Len(t, asked, 2)
	require.Contains(t, asked[0], `asks to call the tool "wire" with the arguments {"text":"w"}`)
	require.Contains(t, asked[1], "asks: Which city?")
	mu.Unlock()
	run, err := s.rt.LoadRun(context.Background(), "acme", res.Meta["agenthost/run"].(string))
	require.NoError(t, err)
	require.Contains(t, run.Transcript[len(run.Transcript)-2].Content, "Paris", "the answer reached the model")
}

// TestMCPNeedsTheTenantsToken: /mcp without a token, or with one no
// tenant has, answers 401 as the API does; a session is served to its
// tenant only.
func TestMCPNeedsTheTenantsToken(t *testing.T) {
	s := newServer(t)
	for _, token := range []string{"", "not-a-token"} {
		req, _ := http.NewRequest(http.MethodPost, s.url(), strings.NewReader(`{"jsonrpc": "2.0", "id": 1, "method": "ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := s.ts.Client().Do(req)
		require.NoError(t, err)
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Equal(t, "unauthorized", body.Error.Code)
	}
	acme := s.openWire(tokenAcme)
	stolen := &wire{s: s, token: tokenGlobex, session: acme.session}
	resp := stolen.post(`{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}`)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "acme's session is not globex's")
}

// TestQuotasApplyToToolCalls: a tool call is a submission: past the
// tenant's active Runs quota, a call without a task is a tool error that
// says so, and one as a task a JSON-RPC error whose data has the API's
// code.
func TestQuotasApplyToToolCalls(t *testing.T) {
	s := newServer(t, withQuota("acme", httpapi.Quota{MaxActiveRuns: 1}))
	w := s.openWire(tokenAcme)
	w.createTask("default", `call:block({})|answer:never`)
	refused := w.call("tools/call", `{"name": "default", "arguments": {"question": "answer:x"}, "task": {}}`)
	require.NotNil(t, refused.Error)
	require.Equal(t, -32000, refused.Error.Code)
	require.Contains(t, string(refused.Error.Data), `"code":"quota_active_runs"`)
	cs := s.connect(tokenAcme, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "default", Arguments: map[string]any{"question": "answer:x"}})
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "active")
	// Globex has no quota.
	globex := s.connect(tokenGlobex, nil)
	res, err = globex.CallTool(context.Background(), &mcp.CallToolParams{Name: "default", Arguments: map[string]any{"question": "answer:x"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
}

// TestDrainingEndsAWaitingCall: a call waiting for its Run ends when the
// server drains, naming the Run, which goes on; new requests answer 503.
func TestDrainingEndsAWaitingCall(t *testing.T) {
	s := newServer(t)
	cs := s.connect(tokenAcme, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "default", Arguments: map[string]any{"question": `call:block({})|answer:x`}})
		errc <- err
	}()
	conformance.Eventually(t, "a Run blocked in its tool", func() bool {
		runs, _ := s.store.RunsByStatus(context.Background(), "acme", loop.StatusRunning, "", 10)
		return len(runs) == 1
	})
	s.api.Drain()
	err := <-errc
	require.Error(t, err)
	require.Contains(t, err.Error(), "shutting down")
}

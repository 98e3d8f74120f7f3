package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The tokens of the two tenants of a test server.
const (
	tokenAcme   = "token-acme-mcp"
	tokenGlobex = "token-globex-mcp"
)

// supportSchema is the output schema of acme's agent "support".
const supportSchema = `{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}`

// server is the HTTP API, /mcp with it, on 127.0.0.1, over a runtime
// with the conformance fakes: the scripted model (the Run's input is its
// script, conformance/script) and the scripted tools ("wire" waits for an
// approval; "block" blocks until the test ends).
type server struct {
	t     *testing.T
	rt    *runtime.Runtime
	store *conformance.MemStore
	api   *httpapi.Server
	ts    *httptest.Server
}

type serverOption func(*httpapi.Config)

func withQuota(tenant string, q httpapi.Quota) serverOption {
	return func(c *httpapi.Config) { c.Quotas = map[string]httpapi.Quota{tenant: q} }
}

func newServer(t *testing.T, opts ...serverOption) *server {
	t.Helper()
	clock := conformance.NewFakeClock(time.Time{})
	s := &server{t: t, store: conformance.NewMemStore(clock, conformance.KVLimits{})}
	tools := &conformance.ScriptedTools{}
	tenants := runtime.TenantMap{}
	shown := map[string][]httpapi.AgentJSON{}
	for _, id := range []string{"acme", "globex"} {
		base := runtime.Agent{Builder: &conformance.EchoBuilder{}, Model: &conformance.ScriptedModel{},
			Limits:      loop.Limits{MaxSteps: 8, MaxToolCallsPerStep: 8, MaxParallelToolCalls: 4},
			ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 1000}}
		for _, tl := range tools.Tools() {
			base.Tools = append(base.Tools, runtime.Tool{Descriptor: tl, Executor: tools,
				Spec: loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}, Approval: tl.Name == "wire"}})
		}
		def, support := base, base
		def.Name, def.Version = "default", "v-000000000001"
		support.Name, support.Version, support.Instructions = "support", "v-000000000002", "You help customers."
		tenants[id] = &runtime.Tenant{ID: id, Agents: map[string]*runtime.Agent{"default": &def, "support": &support}}
		shown[id] = []httpapi.AgentJSON{
			{Name: "default", Version: def.Version, Instructions: "Answer the question.\nBe brief."},
			{Name: "support", Version: support.Version, Description: "Answers customers.", OutputSchema: json.RawMessage(supportSchema)},
		}
	}
	auth, err := httpapi.NewTokenAuthenticator(map[string][]string{
		"acme": {httpapi.HashToken(tokenAcme)}, "globex": {httpapi.HashToken(tokenGlobex)},
	})
	require.NoError(t, err)
	s.rt, err = runtime.New(runtime.Options{Store: s.store, Tenants: tenants, Clock: clock, NodeID: "node-mcp",
		PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		RecoveryInterval: time.Hour, WatchdogInterval: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.rt.Start(context.Background()))
	conformance.Eventually(t, "the runtime's first recovery pass", s.rt.Ready)
	cfg := httpapi.Config{Runtime: s.rt, Store: s.store, Auth: auth, Agents: shown}
	for _, o := range opts {
		o(&cfg)
	}
	s.api, err = httpapi.New(cfg)
	require.NoError(t, err)
	s.ts = httptest.NewServer(s.api.Handler())
	t.Cleanup(func() {
		tools.Release()
		s.api.Drain()
		s.ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.rt.Stop(ctx)
	})
	return s
}

// url is the MCP endpoint's.
func (s *server) url() string { return s.ts.URL + "/mcp" }

// bearer adds a tenant's token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connect opens a session of the Go SDK's client as the token's tenant.
func (s *server) connect(token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	s.t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "agenthost-test", Version: "1"}, opts)
	transport := &mcp.StreamableClientTransport{Endpoint: s.url(),
		HTTPClient: &http.Client{Transport: bearer{token, s.ts.Client().Transport}}}
	cs, err := client.Connect(context.Background(), transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// wire is a session of JSON-RPC messages posted by hand, to see the
// protocol's JSON as it is on the wire (the SDK's types lack the fields
// of tasks).
type wire struct {
	s       *server
	token   string
	session string
	id      int
}

// rpcReply is a JSON-RPC answer.
type rpcReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// openWire initializes a session as the token's tenant.
func (s *server) openWire(token string) *wire {
	s.t.Helper()
	w := &wire{s: s, token: token}
	init := w.call("initialize", `{"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "wire", "version": "1"}}`)
	require.Nil(s.t, init.Error)
	w.notify("notifications/initialized")
	return w
}

func (w *wire) post(body string) *http.Response {
	w.s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.s.url(), strings.NewReader(body))
	require.NoError(w.s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if w.session != "" {
		req.Header.Set("Mcp-Session-Id", w.session)
	}
	resp, err := w.s.ts.Client().Do(req)
	require.NoError(w.s.t, err)
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		w.session = id
	}
	return resp
}

func (w *wire) notify(method string) {
	w.s.t.Helper()
	resp := w.post(`{"jsonrpc": "2.0", "method": "` + method + `"}`)
	resp.Body.Close()
	require.Equal(w.s.t, http.StatusAccepted, resp.StatusCode)
}

// call sends a request and returns its answer, read from the JSON body
// or from the stream the server answered with.
func (w *wire) call(method, params string) rpcReply {
	w.s.t.Helper()
	w.id++
	resp := w.post(`{"jsonrpc": "2.0", "id": ` + itoa(w.id) + `, "method": "` + method + `", "params": ` + params + `}`)
	defer resp.Body.Close()
	require.Equal(w.s.t, http.StatusOK, resp.StatusCode, "%s answered %d", method, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(w.s.t, err)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		body = lastAnswer(w.s.t, body)
	}
	var r rpcReply
	require.NoError(w.s.t, json.Unmarshal(body, &r), "%s", body)
	return r
}

// lastAnswer is the data of the stream's last message that answers a
// request (it has "result" or "error").
func lastAnswer(t *testing.T, stream []byte) []byte {
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if ok && (strings.Contains(data, `"result"`) || strings.Contains(data, `"error"`)) {
			last = []byte(data)
		}
	}
	require.NotNil(t, last, "no answer in the stream: %s", stream)
	return last
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// task is a task as the wire shows it.
type task struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  int64  `json:"pollInterval"`
}

// createTask calls a tool as a task and returns the task.
func (w *wire) createTask(tool, question string) task {
	w.s.t.Helper()
	args, _ := json.Marshal(map[string]string{"question": question})
	r := w.call("tools/call", `{"name": "`+tool+`", "arguments": `+string(args)+`, "task": {"ttl": 60000}}`)
	require.Nil(w.s.t, r.Error, "%+v", r.Error)
	var out struct {
		Task task `json:"task"`
	}
	require.NoError(w.s.t, json.Unmarshal(r.Result, &out))
	require.NotEmpty(w.s.t, out.Task.TaskID, "%s", r.Result)
	return out.Task
}

// getTask answers tasks/get.
func (w *wire) getTask(id string) (task, rpcReply) {
	w.s.t.Helper()
	r := w.call("tasks/get", `{"taskId": "`+id+`"}`)
	var out task
	if r.Error == nil {
		require.NoError(w.s.t, json.Unmarshal(r.Result, &out))
	}
	return out, r
}

// waitTask polls tasks/get until the task has the status.
func (w *wire) waitTask(id, status string) task {
	w.s.t.Helper()
	var last task
	conformance.Eventually(w.s.t, "task "+id+" "+status, func() bool {
		last, _ = w.getTask(id)
		return last.Status == status
	})
	return last
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/mcptool/mcptest"
	"github.com/agenthost/agenthost/loop"
)

// mcpServeConfig writes the config of a serve whose tenant "demo" runs
// the conformance builder and scripted model, with the tools of the MCP
// servers given (name → URL), each retried within half a second.
func mcpServeConfig(t *testing.T, dir, token string, servers map[string]string) string {
	t.Helper()
	var decl, names []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range servers {
			if !yield(n) {
				return
			}
		}
	}) {
		decl = append(decl, fmt.Sprintf("  %s: {url: %q, backoff: 50ms, max_backoff: 500ms}", name, servers[name]))
		names = append(names, name)
	}
	return writeConfig(t, dir, `
data_dir: data
sync_writes: true
cache_dir: `+conformance.WazeroCacheDir()+`
log: {format: text, level: info}
plugins:
  builder: {path: `+conformancePlugin(t, conformance.PluginBuilder)+`, role: builder}
  scripted: {path: `+conformancePlugin(t, conformance.PluginScripted)+`, role: executor}
mcp_servers:
`+strings.Join(decl, "\n")+`
tenants:
  demo:
    tokens_sha256: [`+httpapi.HashToken(token)+`]
    builder: builder
    model: scripted
    mcp_servers: [`+strings.Join(names, ", ")+`]
`)
}

// offers reports whether the tenant's default agent offers tool now
// (GET /v1/agents).
func (c *apiClient) offers(t testing.TB, tool string) bool {
	t.Helper()
	var list httpapi.AgentListJSON
	if code, raw, err := c.Do("GET", "/v1/agents", nil, nil, &list); err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/agents: %d %v %s", code, err, raw)
	}
	for _, a := range list.Agents {
		for _, tl := range a.Tools {
			if a.Name == "default" && tl.Name == tool {
				return true
			}
		}
	}
	return false
}

// waitEvent waits for an event of type typ in the Run's event stream.
func (c *apiClient) waitEvent(t *testing.T, addr, token, runID string, typ loop.EventType) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/v1/runs/"+runID+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	found := false
	_ = readSSE(resp.Body, func(ev sseEvent) bool {
		found = loop.EventType(ev.Event) == typ
		return found
	})
	if !found {
		t.Fatalf("run %s: no %s event", runID, typ)
	}
}

// TestMCPToolCallsSurviveKill9: serve is SIGKILLed while a Run waits on a
// task-augmented call of an MCP server's tool and another on a plain call
// of a server without tasks, and is started again on the same data.
// The first call is attached by tasks/get of the task ID its effect
// stored: the Run completes with the tool's result, and the tool ran
// once by the server's own count (one task). The second could not be
// attached (a plain call leaves nothing to ask about): the tool's
// missing-effect policy decides, fail by default for an MCP tool, so the
// model is told the call was lost, the tool is not called again, and the
// Run completes with that. Both logs pass loop.CheckEnded, and each tool
// effect was dispatched once.
func TestMCPToolCallsSurviveKill9(t *testing.T) {
	conformance.SkipInShort(t, "SIGKILLing serve with MCP tool calls in flight")
	withTasks, plain := mcptest.New(), mcptest.New()
	plain.DisableTasks()
	for _, s := range []*mcptest.Server{withTasks, plain} {
		if _, err := s.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
	}
	bin := buildBinary(t)
	const token = "mcp-token"
	dir := t.TempDir()
	cfgPath := mcpServeConfig(t, dir, token, map[string]string{"tasks": withTasks.URL(), "plain": plain.URL()})
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c := newClient(proc.Addr(), token)
	waitUntil(t, 30*time.Second, "the MCP tools offered", func() (bool, error) {
		return c.offers(t, "tasks__slow") && c.offers(t, "plain__slow"), nil
	})

	taskRun := c.submit(t, "s-task", `call:tasks__slow({"label":"k9"})|answer:$results`)
	plainRun := c.submit(t, "s-plain", `call:plain__slow({"label":"p9"})|answer:$results`)
	c.waitEvent(t, proc.Addr(), token, taskRun.ID, loop.EventEffectPending)
	waitUntil(t, 30*time.Second, "the plain call on the server", func() (bool, error) { return plain.Runs("slow:p9") == 1, nil })

	if err := proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, proc, 30*time.Second)
	plain.Release("p9")
	gets := withTasks.Gets()
	proc = startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	// The new serve's attach asks for the task, and finds it working; only
	// then does the job finish.
	waitUntil(t, 60*time.Second, "the restarted serve to ask for the task", func() (bool, error) { return withTasks.Gets() > gets, nil })
	withTasks.Release("k9")
	c = newClient(proc.Addr(), token)

	got := c.waitRun(t, taskRun.ID, 90*time.Second, "terminal", runView.terminal)
	if got.Status != "completed" || got.Result == nil || got.Result.Content != "slow job k9 finished" {
		t.Fatalf("the task's Run: %s %+v %+v; want completed with the job's result", got.Status, got.Result, got.Failure)
	}
	if n, tasks := withTasks.Runs("slow:k9"), withTasks.Tasks(); n != 1 || tasks != 1 {
		t.Errorf("the job with tasks ran %d times in %d tasks; want once, in one", n, tasks)
	}
	got = c.waitRun(t, plainRun.ID, 90*time.Second, "terminal", runView.terminal)
	if got.Status != "completed" || got.Result == nil || !strings.Contains(got.Result.Content, "holds no record of the attempt") {
		t.Fatalf("the plain call's Run: %s %+v %+v; want completed, the model told the call was lost", got.Status, got.Result, got.Failure)
	}
	if n := plain.Runs("slow:p9"); n != 1 {
		t.Errorf("the plain job ran %d times; its policy (fail) allows no second call", n)
	}
	// What recovery decided: the task, attached while it worked, was
	// polled to its end; the plain call was left to its policy.
	for run, want := range map[string]string{taskRun.ID: "decision=reattach", plainRun.ID: "decision=fail"} {
		if d := recoveryDecisions(t, logPath, run); !slices.Contains(d, want) {
			t.Errorf("recovery decided %v for run %s; want %s", d, run, want)
		}
	}

	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, proc, 60*time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}
	store, err := badgerstore.Open(filepath.Join(dir, "data"), badgerstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, id := range []string{taskRun.ID, plainRun.ID} {
		evs, err := store.Events(context.Background(), "demo", id, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range loop.CheckEnded(evs) {
			t.Errorf("run %s: %s", id, v)
		}
		for _, r := range loop.LogEffects(evs) {
			if r.Kind == "tool" && r.Dispatched != 1 {
				t.Errorf("run %s: tool effect %s dispatched %d attempts, want 1", id, r.ID, r.Dispatched)
			}
		}
	}
}

// recoveryDecisions returns the decisions the log's "recovery decision"
// lines record for the effects of run.
func recoveryDecisions(t *testing.T, logPath, run string) []string {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `msg="recovery decision"`) || !strings.Contains(line, "/"+run+".") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "decision=") {
				out = append(out, f)
			}
		}
	}
	return out
}

// TestAnMCPServerDownAtStartJoinsLater: serve starts while its MCP server
// is down; its tools are not offered, and a Run that calls one is told
// so; once the server is up, serve connects to it in the background, the
// agent offers its tools, and a Run calls one and completes.
func TestAnMCPServerDownAtStartJoinsLater(t *testing.T) {
	conformance.SkipInShort(t, "serve with an MCP server that comes up late")
	srv := mcptest.New()
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	bin := buildBinary(t)
	const token = "mcp-token"
	dir := t.TempDir()
	cfgPath := mcpServeConfig(t, dir, token, map[string]string{"web": srv.URL()})
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c := newClient(proc.Addr(), token)
	if c.offers(t, "web__add") {
		t.Fatal("a server that is down has its tools offered")
	}
	early := c.submit(t, "s1", `call:web__add({"a":2,"b":3})|answer:$results`)
	got := c.waitRun(t, early.ID, 60*time.Second, "terminal", runView.terminal)
	if got.Status != "completed" || got.Result == nil || !strings.Contains(got.Result.Content, "web__add") {
		t.Fatalf("a Run calling a tool not offered: %s %+v %+v", got.Status, got.Result, got.Failure)
	}

	if _, err := srv.Start(""); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	waitUntil(t, 30*time.Second, "the server's tools offered", func() (bool, error) { return c.offers(t, "web__add"), nil })
	late := c.submit(t, "s2", `call:web__add({"a":2,"b":3})|answer:$results`)
	got = c.waitRun(t, late.ID, 60*time.Second, "terminal", runView.terminal)
	if got.Status != "completed" || got.Result == nil || got.Result.Content != "2 + 3 = 5" {
		t.Fatalf("a Run calling the tool once offered: %s %+v %+v", got.Status, got.Result, got.Failure)
	}
	if n := srv.Runs(mcptest.ToolAdd); n != 1 {
		t.Errorf("add ran %d times, want 1", n)
	}
}

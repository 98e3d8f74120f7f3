package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
)

// reloadConfig is the config of TestServeReloadsConfig: tenant demo (its
// token, its quota of active Runs, agent research with its instructions,
// whose slow jobs wait for an approval, the slow-job plugin at slowJob) and tenant watch, whose token never
// changes, for the requests that must not fail meanwhile. extra is more
// top-level YAML.
func reloadConfig(t *testing.T, token, instructions, slowJob string, maxActive int, extra string) string {
	paths := map[string]string{}
	for _, name := range []string{"prompt-builder", "scripted-model"} {
		paths[name] = conformance.ExampleWasm(t, name)
	}
	return `
data_dir: data
sync_writes: true
cache_dir: ` + conformance.WazeroCacheDir() + `
log: {format: text, level: info}
` + extra + `
plugins:
  prompt-builder: {path: ` + paths["prompt-builder"] + `, role: builder}
  scripted-model: {path: ` + paths["scripted-model"] + `, role: executor}
  slow-job: {path: ` + slowJob + `, role: executor}
tenants:
  demo:
    tokens_sha256: [` + httpapi.HashToken(token) + `]
    quotas: {max_active_runs: ` + strconv.Itoa(maxActive) + `}
    builder: prompt-builder
    model: scripted-model
    tool_executors: [slow-job]
    agents:
      research: {instructions: "` + instructions + `", model: {plugin: scripted-model}, tools: [{plugin: slow-job, approval: always}]}
  watch:
    tokens_sha256: [` + httpapi.HashToken("watch-token") + `]
    builder: prompt-builder
    model: scripted-model
`
}

// withCustomSection returns wasm with a custom section appended: another
// file (another sha256) that loads and behaves the same.
func withCustomSection(wasm []byte, name, payload string) []byte {
	body := binary.AppendUvarint(nil, uint64(len(name)))
	body = append(body, name...)
	body = append(body, payload...)
	out := append([]byte{}, wasm...)
	out = append(out, 0) // custom section
	out = binary.AppendUvarint(out, uint64(len(body)))
	return append(out, body...)
}

// TestServeReloadsConfig is issue 38's reload under a running serve: a
// tenant's token, a quota, an agent's instructions and a plugin file
// change and SIGHUP (or `agenthost reload`) applies them for new work; a
// Run in flight completes on the agent version it pinned; a config that
// fails a check of the start is refused with the start's error and the old
// one stays, as is one that changes a key only a restart applies; and the
// requests of another tenant, sent all along, never fail.
func TestServeReloadsConfig(t *testing.T) {
	conformance.SkipInShort(t, "starting serve and reloading its config")
	bin := buildBinary(t)
	dir := t.TempDir()
	wasm, err := os.ReadFile(conformance.ExampleWasm(t, "slow-job"))
	if err != nil {
		t.Fatal(err)
	}
	slowJob := filepath.Join(dir, "slow-job.wasm")
	if err := os.WriteFile(slowJob, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, dir, reloadConfig(t, "old-token", "You are v1.", slowJob, 1, ""))
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	demo := newClient(proc.Addr(), "old-token")

	// Tenant watch reads all along; not one request may fail.
	var watched, failed atomic.Int64
	var firstFailure, stopOnce sync.Once
	stop, watching := make(chan struct{}), make(chan struct{})
	stopWatching := func() { stopOnce.Do(func() { close(stop); <-watching }) }
	defer stopWatching()
	go func() {
		defer close(watching)
		watch := newClient(proc.Addr(), "watch-token")
		pace := time.NewTicker(20 * time.Millisecond) // within the default request rate
		defer pace.Stop()
		for {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			for _, path := range []string{"/v1/agents", "/readyz"} {
				code, raw, err := watch.Do("GET", path, nil, nil, nil)
				watched.Add(1)
				if err != nil || code != http.StatusOK {
					failed.Add(1)
					firstFailure.Do(func() { t.Errorf("GET %s during the reloads: %d %v %s", path, code, err, raw) })
				}
			}
		}
	}()

	agentVersion := func(c *apiClient) string {
		var a struct {
			Version      string `json:"version"`
			Instructions string `json:"instructions"`
		}
		if code, raw, err := c.Do("GET", "/v1/agents/research", nil, nil, &a); err != nil || code != http.StatusOK {
			t.Fatalf("GET /v1/agents/research: %d %v %s", code, err, raw)
		}
		return a.Instructions + " " + a.Version
	}
	v1 := agentVersion(demo)

	// A Run of agent research in flight: it waits for the approval of
	// its slow job through the reload.
	var inflight struct {
		ID           string `json:"id"`
		AgentVersion string `json:"agent_version"`
	}
	if code, raw, err := demo.Do("POST", "/v1/sessions/s1/runs", map[string]any{"input": "Please run a slow job for 1 seconds", "agent": "research"}, nil, &inflight); err != nil || code != http.StatusCreated {
		t.Fatalf("submit: %d %v %s", code, err, raw)
	}
	waiting := demo.waitRun(t, inflight.ID, 60*time.Second, "waits for an approval", func(r runView) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})
	// max_active_runs 1: a second Run is refused while it is active.
	if code, raw, _ := demo.Do("POST", "/v1/sessions/s2/runs", map[string]any{"input": "hello"}, nil, nil); code != http.StatusTooManyRequests || !strings.Contains(string(raw), "quota_active_runs") {
		t.Fatalf("a second Run under max_active_runs 1: %d %s, want 429 quota_active_runs", code, raw)
	}

	// Change the token, the quota, the instructions and the plugin file;
	// agenthost reload signals the serve and reports.
	if err := os.WriteFile(slowJob, withCustomSection(wasm, "reload-test", "v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Tenant late is added; tenants is the config's last mapping.
	late := "  late:\n    tokens_sha256: [" + httpapi.HashToken("late-token") + "]\n    builder: prompt-builder\n    model: scripted-model\n"
	writeConfig(t, dir, reloadConfig(t, "new-token", "You are v2.", slowJob, 5, "")+late)
	r := runCLI(t, bin, nil, "reload", "--config", cfgPath)
	if r.code != 0 {
		t.Fatalf("agenthost reload: exit %d\n%s", r.code, r.stderr)
	}
	mustContain(t, "agenthost reload's report", r.stdout, "plugins.slow-job changed", "tenants.demo changed", "tenants.late added")

	if code, _, _ := demo.Do("GET", "/v1/agents", nil, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("the old token after the reload: %d, want 401", code)
	}
	demo = newClient(proc.Addr(), "new-token")
	v2 := agentVersion(demo)
	if !strings.HasPrefix(v2, "You are v2. ") || v2 == v1 {
		t.Fatalf("agent research after the reload: %q, before: %q; want the new instructions and version", v2, v1)
	}
	// The quota is 5 now: the second Run is taken while the first is active.
	second := demo.submit(t, "s2", "Please run a slow job for 1 seconds")
	newer := demo.waitRun(t, second.ID, 60*time.Second, "completed", func(r runView) bool { return r.terminal() })
	if newer.Status != "completed" {
		t.Fatalf("a Run after the reload: %s %+v", newer.Status, newer.Failure)
	}

	// The Run in flight completes on the version it pinned.
	approval := map[string]any{"approvals": []any{map[string]any{"tool_call_id": waiting.Waiting.Approvals[0].ToolCallID, "approved": true}}}
	if code, raw, err := demo.Do("POST", "/v1/runs/"+inflight.ID+"/input", approval, nil, nil); err != nil || code != http.StatusOK {
		t.Fatalf("approve: %d %v %s", code, err, raw)
	}
	done := demo.waitRun(t, inflight.ID, 60*time.Second, "completed", func(r runView) bool { return r.terminal() })
	if done.Status != "completed" {
		t.Fatalf("the Run in flight: %s %+v", done.Status, done.Failure)
	}
	var pinned struct {
		AgentVersion string `json:"agent_version"`
	}
	if code, raw, err := demo.Do("GET", "/v1/runs/"+inflight.ID, nil, nil, &pinned); err != nil || code != http.StatusOK {
		t.Fatalf("get run: %d %v %s", code, err, raw)
	}
	if pinned.AgentVersion != inflight.AgentVersion || strings.HasSuffix(v2, " "+pinned.AgentVersion) {
		t.Fatalf("the Run in flight has agent version %s; it pinned %s at creation (the new version is %s)", pinned.AgentVersion, inflight.AgentVersion, v2)
	}

	// Each attempt's effect_dispatched names the plugin version it went
	// to: both slow jobs were dispatched after the reload, to the new file.
	for _, id := range []string{inflight.ID, second.ID} {
		if got, want := dispatchedTo(t, demo, id, "slow-job"), fileSHA256(withCustomSection(wasm, "reload-test", "v2")); got != want {
			t.Errorf("run %s: its slow job was dispatched to slow-job sha256 %q, want the new file's %s", id, got, want)
		}
	}

	// An invalid config is refused with the start's error; the old stays.
	bad := reloadConfig(t, "bad-token", "You are v3.", slowJob, 5, "") + "    nonsense_key: 1\n"
	writeConfig(t, dir, bad)
	r = runCLI(t, bin, nil, "reload", "--config", cfgPath)
	if r.code == 0 {
		t.Fatal("agenthost reload of an invalid config: exit 0")
	}
	start := runCLI(t, bin, nil, "serve", "--config", cfgPath, "--listen", "127.0.0.1:0", "--metrics-listen", "off")
	startErr := strings.TrimPrefix(strings.TrimSpace(start.stderr), "Error: ")
	if start.code == 0 || startErr == "" || !strings.Contains(r.stderr, startErr) {
		t.Fatalf("the reload's error is not the start's:\nreload: %s\nstart: %s", r.stderr, start.stderr)
	}
	// agenthost reload checks the file before it signals; a bare SIGHUP
	// has the serve refuse it, with the same error.
	if err := proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the serve's log says the invalid config was refused", func() (bool, error) {
		return strings.Contains(serveLog(t, logPath), "tenants.watch.nonsense_key: unknown key"), nil
	})
	if got := agentVersion(demo); got != v2 {
		t.Fatalf("after a refused reload agent research is %q, want the config in force (%q)", got, v2)
	}

	// A key only a restart applies: refused, naming it (a bare SIGHUP).
	writeConfig(t, dir, reloadConfig(t, "bad-token", "You are v3.", slowJob, 5, "lease_ttl: 21s"))
	if err := proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the log says the reload was refused for lease_ttl", func() (bool, error) {
		return strings.Contains(serveLog(t, logPath), "lease_ttl changed, and only a restart applies that"), nil
	})
	if code, _, _ := newClient(proc.Addr(), "bad-token").Do("GET", "/v1/agents", nil, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("the token of a refused config: %d, want 401", code)
	}

	code, raw, err := newClient(proc.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	// The metrics follow the reload: tenant late, added by it, has its
	// active Runs counted; the plugins in force have theirs.
	mustContain(t, "/metrics", string(raw), `agenthost_config_reloads_total{result="applied"} 1`, `agenthost_config_reloads_total{result="refused"} 2`,
		`agenthost_runs_active{status="pending",tenant="late"} 0`, `agenthost_plugin_instance_waits_total{plugin="slow-job"}`)
	stopWatching()
	if watched.Load() == 0 || failed.Load() != 0 {
		t.Fatalf("tenant watch's requests during the reloads: %d, %d failed", watched.Load(), failed.Load())
	}
	t.Logf("tenant watch sent %d requests during the reloads, none failed", watched.Load())
}

// dispatchedTo reads the events of an ended Run through c and returns the
// sha256 its effect_dispatched events name for plugin, failing the test
// unless there is one, with the plugin's declared version.
func dispatchedTo(t *testing.T, c *apiClient, runID, plugin string) string {
	t.Helper()
	var shas []string
	for _, e := range runEvents(t, c, runID) {
		if e.Type == loop.EventEffectDispatched && e.Plugin != nil && e.Plugin.Name == plugin && e.Plugin.Version != "" {
			shas = append(shas, e.Plugin.SHA256)
		}
	}
	if len(shas) != 1 {
		t.Fatalf("run %s: effect_dispatched events naming plugin %s: %q, want one", runID, plugin, shas)
	}
	return shas[0]
}

func fileSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// serveLog is the server's log so far.
func serveLog(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

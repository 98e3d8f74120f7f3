package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/loop"
)

// The tenants of the end-to-end config and their tokens.
const (
	acmeToken   = "acme-token"
	globexToken = "globex-token"
	smallToken  = "small-token"
)

// hostileCallTimeout bounds one call of the hostile plugin: an endless
// loop ends there, as plugin_timeout.
const hostileCallTimeout = 10 * time.Second

// e2eConfig writes a config of three tenants over the conformance plugins
// (builder, scripted model and tools, hostile) and the slow-job example:
//   - acme and globex share every plugin, each with its own instances,
//     KV and quotas; acme's wire tool waits for approval;
//   - small may have one active Run and 30 model tokens in all.
func e2eConfig(t *testing.T, dir string) *config.Config {
	t.Helper()
	slowJob := conformance.ExampleWasm(t, "slow-job")
	tenant := func(id, token, extra string) string {
		return `
  ` + id + `:
    tokens_sha256: [` + httpapi.HashToken(token) + `]
    builder: builder
    model: scripted
    tool_executors: [scripted, hostile, slow-job]` + extra
	}
	path := writeConfig(t, dir, `
data_dir: data
cache_dir: `+conformance.WazeroCacheDir()+`
retention: 0
log: {format: text, level: info}
plugins:
  builder: {path: `+conformancePlugin(t, conformance.PluginBuilder)+`, role: builder}
  scripted: {path: `+conformancePlugin(t, conformance.PluginScripted)+`, role: executor}
  hostile: {path: `+conformancePlugin(t, conformance.PluginHostile)+`, role: executor, call_timeout: `+hostileCallTimeout.String()+`, memory_pages: 256, pool_size: 2}
  slow-job: {path: `+slowJob+`, role: executor}
tenants:`+
		tenant("acme", acmeToken, `
    quotas: {max_active_runs: 20}
    tools:
      wire: {approval: always}`)+
		tenant("globex", globexToken, `
    quotas: {max_active_runs: 20}`)+
		tenant("small", smallToken, `
    quotas: {max_active_runs: 1, token_budget: 30}`)+"\n")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.Metrics.Listen = "127.0.0.1:0"
	return cfg
}

// startInProcess starts serve's server in this process, its logs in
// dir/serve.log, and waits until it is ready.
func startInProcess(t *testing.T, cfg *config.Config) *node.Server {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(cfg.Dir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	srv, err := node.StartServer(context.Background(), cfg, slog.New(slog.NewTextHandler(logf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	c := newClient(srv.Addr(), "")
	waitUntil(t, 60*time.Second, "readyz", func() (bool, error) {
		code, raw, err := c.Do("GET", "/readyz", nil, nil, nil)
		return code == http.StatusOK, fmt.Errorf("%d %v %s", code, err, raw)
	})
	return srv
}

// settledTools returns the settlements of a Run's tool effects, by tool
// effect ID, from the store.
func settledTools(t *testing.T, srv *node.Server, tenant, runID string) map[string]loop.Outcome {
	t.Helper()
	evs, err := srv.Store().Events(context.Background(), tenant, runID, 1, 10000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]loop.Outcome{}
	for _, ev := range evs {
		if ref, err := loop.ParseEffectID(ev.EffectID); err == nil && ref.Kind == "tool" && ev.Type == loop.EventEffectSettled {
			out[ev.EffectID] = *ev.Outcome
		}
	}
	return out
}

// TestServeEndToEnd drives `serve` over real HTTP on 127.0.0.1, with real
// Wasm plugins and a real Badger dir: a Run's life through the API
// (submit, stream, approve, deny, answer, cancel with a tool in flight),
// quotas, and a restart in the middle of an event stream.
func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	cfg := e2eConfig(t, dir)
	logTailOnFailure(t, filepath.Join(dir, "serve.log"), 60)
	srv := startInProcess(t, cfg)
	acme := newClient(srv.Addr(), acmeToken)

	t.Run("submit and stream a completed run", func(t *testing.T) {
		run := acme.submit(t, "stream", `call:echo({"text":"hi"})|answer:got $results`)
		if run.Status != "pending" || run.Session != "stream" {
			t.Fatalf("a new Run: %+v", run)
		}
		req, _ := http.NewRequest("GET", acme.Base+"/v1/runs/"+run.ID+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("Content-Type %q", ct)
		}
		var types []string
		next := int64(1)
		if err := readSSE(resp.Body, func(ev sseEvent) bool {
			if ev.ID == "" {
				return false // a plugin's progress
			}
			if id, _ := strconv.ParseInt(ev.ID, 10, 64); id != next {
				t.Errorf("event id %s, want %d", ev.ID, next)
			}
			next++
			types = append(types, ev.Event)
			return false
		}); err != nil {
			t.Fatal(err)
		}
		if len(types) < 4 || types[0] != "run_created" || types[len(types)-1] != "run_completed" {
			t.Fatalf("the stream: %v", types)
		}
		done := acme.run(t, run.ID)
		if done.Status != "completed" || done.Result == nil || !strings.Contains(done.Result.Content, "got") || done.Usage.InputTokens == 0 {
			t.Fatalf("the completed Run: %+v", done)
		}
		if done.Seq != next-1 {
			t.Errorf("the Run's seq is %d, the stream ended at %d", done.Seq, next-1)
		}
	})

	t.Run("an approved call runs, a denied one does not", func(t *testing.T) {
		for _, approve := range []bool{true, false} {
			run := acme.submit(t, fmt.Sprintf("approve-%v", approve), `call:wire({"n":1})|answer:results=$results`)
			w := acme.waitRun(t, run.ID, 30*time.Second, "waiting for an approval", func(r runView) bool {
				return r.Status == "waiting" && r.Waiting != nil && len(r.Waiting.Approvals) == 1
			})
			call := w.Waiting.Approvals[0]
			if call.Tool != "wire" || call.ToolCallID == "" {
				t.Fatalf("what it waits for: %+v", w.Waiting)
			}
			body := map[string]any{"approvals": []map[string]any{{"tool_call_id": call.ToolCallID, "approved": approve, "reason": "test says so"}}}
			if code, raw, err := acme.Do("POST", "/v1/runs/"+run.ID+"/input", body, nil, nil); err != nil || code != http.StatusOK {
				t.Fatalf("approve=%v: %d %v %s", approve, code, err, raw)
			}
			done := acme.waitRun(t, run.ID, 30*time.Second, "completed", runView.terminal)
			if done.Status != "completed" {
				t.Fatalf("approve=%v: %+v", approve, done)
			}
			settled := settledTools(t, srv, "acme", run.ID)
			if approve {
				if len(settled) != 1 {
					t.Fatalf("the approved call settled %d times: %+v", len(settled), settled)
				}
				for _, o := range settled {
					if o.State != loop.OutcomeDone || o.Tool == nil {
						t.Errorf("the approved call: %+v", o)
					}
				}
				continue
			}
			// A denied call is closed by the approval itself: never
			// dispatched, never settled; the model sees the denial.
			if len(settled) != 0 {
				t.Errorf("the denied call was carried out: %+v", settled)
			}
			if !strings.Contains(done.Result.Content, "the call was denied: test says so") {
				t.Errorf("the model did not see the denial: %q", done.Result.Content)
			}
		}
	})

	t.Run("a run waiting for input goes on with the answer", func(t *testing.T) {
		run := acme.submit(t, "ask", `ask:What is your name?|answer:nice to meet you`)
		w := acme.waitRun(t, run.ID, 30*time.Second, "waiting for input", func(r runView) bool {
			return r.Status == "waiting" && r.Waiting != nil && r.Waiting.Input != nil
		})
		if w.Waiting.Input.Prompt != "What is your name?" {
			t.Fatalf("prompt %q", w.Waiting.Input.Prompt)
		}
		if code, raw, err := acme.Do("POST", "/v1/runs/"+run.ID+"/input", map[string]any{"message": "Ada"}, nil, nil); err != nil || code != http.StatusOK {
			t.Fatalf("input: %d %v %s", code, err, raw)
		}
		done := acme.waitRun(t, run.ID, 30*time.Second, "terminal", runView.terminal)
		if done.Status != "completed" || done.Result == nil || done.Result.Content != "nice to meet you" {
			t.Fatalf("%+v", done)
		}
	})

	t.Run("cancel with a tool in flight", func(t *testing.T) {
		run := acme.submit(t, "cancel", `call:slow_job({"seconds":300,"label":"long"}),echo({"x":1})|answer:never`)
		acme.waitRun(t, run.ID, 30*time.Second, "with slow_job in flight", func(r runView) bool {
			if r.Waiting == nil {
				return false
			}
			for _, p := range r.Waiting.Pending {
				if p.Tool == "slow_job" {
					return true
				}
			}
			return false
		})
		if code, raw, err := acme.Do("POST", "/v1/runs/"+run.ID+"/cancel", map[string]any{"reason": "changed my mind"}, nil, nil); err != nil || code != http.StatusAccepted {
			t.Fatalf("cancel: %d %v %s", code, err, raw)
		}
		done := acme.waitRun(t, run.ID, 30*time.Second, "terminal", runView.terminal)
		if done.Status != "cancelled" {
			t.Fatalf("%+v", done)
		}
		code, raw, _ := acme.Do("POST", "/v1/runs/"+run.ID+"/cancel", nil, nil, nil)
		if code != http.StatusConflict || !strings.Contains(string(raw), "run_terminal") {
			t.Errorf("cancelling a cancelled Run: %d %s", code, raw)
		}
	})

	t.Run("quotas answer 429 with Retry-After", func(t *testing.T) {
		small := newClient(srv.Addr(), smallToken)
		first := small.submit(t, "q1", `call:slow_job({"seconds":300})|answer:never`)
		code, raw, err := small.Do("POST", "/v1/sessions/q2/runs", map[string]any{"input": "answer:hi"}, nil, nil)
		if err != nil || code != http.StatusTooManyRequests || !strings.Contains(string(raw), "quota_active_runs") {
			t.Fatalf("a second active Run: %d %v %s", code, err, raw)
		}
		resp, err := http.DefaultClient.Do(mustRequest(t, "POST", small.Base+"/v1/sessions/q2/runs", smallToken, `{"input":"answer:hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %d %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		small.waitRun(t, first.ID, 30*time.Second, "with its model step settled", func(r runView) bool { return r.Usage.InputTokens > 0 })
		if code, raw, err := small.Do("POST", "/v1/runs/"+first.ID+"/cancel", nil, nil, nil); err != nil || code != http.StatusAccepted {
			t.Fatalf("cancel: %d %v %s", code, err, raw)
		}
		small.waitRun(t, first.ID, 30*time.Second, "terminal", runView.terminal)
		second := small.submit(t, "q2", "answer:hi")
		small.waitRun(t, second.ID, 30*time.Second, "terminal", runView.terminal)
		// 2 model steps of 15 tokens: the budget of 30 is used up. The
		// ledger counts a commit's tokens just after the commit a client
		// sees, and before the metrics do: wait for the metrics.
		waitForMetrics(t, srv.MetricsAddr(), "the metrics of the second Run's tokens",
			`agenthost_model_tokens_total{tenant="small",type="input"} 20`,
			`agenthost_model_tokens_total{tenant="small",type="output"} 10`)
		code, raw, err = small.Do("POST", "/v1/sessions/q3/runs", map[string]any{"input": "answer:hi"}, nil, nil)
		if err != nil || code != http.StatusTooManyRequests || !strings.Contains(string(raw), "quota_token_budget") {
			t.Fatalf("past the token budget: %d %v %s", code, err, raw)
		}
	})

	t.Run("metrics show the tenants' work", func(t *testing.T) {
		// Observers run just after the commits a client sees: wait for them.
		want := []string{
			`agenthost_ready 1`,
			`agenthost_run_transitions_total{status="completed",tenant="acme"}`,
			`agenthost_effects_settled_total{class="",kind="tool",state="done",tenant="acme"}`,
			`agenthost_plugin_call_duration_seconds_count{export="start",plugin="slow-job"}`,
			`agenthost_model_tokens_total{tenant="small",type="input"} 20`,
			`agenthost_runs_active{status="running",tenant="acme"}`,
			`agenthost_plugin_http_refused_total{plugin="hostile",reason="address"} 0`,
			`agenthost_plugin_instance_waits_total{plugin="slow-job"}`,
			`agenthost_plugin_instance_wait_seconds_total{plugin="slow-job"}`}
		waitForMetrics(t, srv.MetricsAddr(), "the metrics of the work above", want...)
		if srv.MetricsAddr() == srv.Addr() {
			t.Fatalf("/metrics is served on the API listener %s; metrics.listen asked for one of its own", srv.Addr())
		}
		// The tenants' IDs and counts are not for whoever reaches the API.
		code, raw, err := newClient(srv.Addr(), "").Do("GET", "/metrics", nil, nil, nil)
		if err != nil || code != http.StatusNotFound {
			t.Fatalf("GET /metrics on the API listener: %d %v %s; want 404 when metrics.listen is an address", code, err, raw)
		}
	})

	t.Run("a restart in the middle of an event stream resumes from Last-Event-ID", func(t *testing.T) {
		run := acme.submit(t, "restart", `call:slow_job({"seconds":2,"label":"restart"})|answer:$results`)
		seen := map[int64]bool{}
		var last int64
		resp, err := http.DefaultClient.Do(mustRequest(t, "GET", acme.Base+"/v1/runs/"+run.ID+"/events", acmeToken, ""))
		if err != nil {
			t.Fatal(err)
		}
		if err := readSSE(resp.Body, func(ev sseEvent) bool {
			if ev.ID == "" {
				return false
			}
			id, _ := strconv.ParseInt(ev.ID, 10, 64)
			seen[id], last = true, id
			return ev.Event == "effect_pending" // the job runs: stop the server now
		}); err != nil {
			t.Fatal(err)
		}
		// Stop the server with the stream open: Drain ends it.
		stopped := make(chan error, 1)
		go func() { stopped <- srv.Shutdown(context.Background()) }()
		if err := readSSE(resp.Body, func(ev sseEvent) bool {
			if ev.ID != "" {
				id, _ := strconv.ParseInt(ev.ID, 10, 64)
				if seen[id] {
					t.Errorf("event %d came twice", id)
				}
				seen[id], last = true, id
			}
			return false
		}); err != nil {
			t.Logf("the stream ended with %v", err)
		}
		resp.Body.Close()
		if err := <-stopped; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if seen[0] || len(seen) == 0 {
			t.Fatalf("before the restart: %v", seen)
		}
		if _, _, err := newClient(srv.Addr(), "").Do("GET", "/healthz", nil, nil, nil); err == nil {
			t.Fatal("the stopped server still answers")
		}

		srv = startInProcess(t, cfg)
		acme = newClient(srv.Addr(), acmeToken)
		req := mustRequest(t, "GET", acme.Base+"/v1/runs/"+run.ID+"/events", acmeToken, "")
		req.Header.Set("Last-Event-ID", strconv.FormatInt(last, 10))
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var final string
		if err := readSSE(resp.Body, func(ev sseEvent) bool {
			if ev.ID == "" {
				return false
			}
			id, _ := strconv.ParseInt(ev.ID, 10, 64)
			if seen[id] {
				t.Errorf("event %d came again after the resume from %d", id, last)
			}
			seen[id], final = true, ev.Event
			return false
		}); err != nil {
			t.Fatal(err)
		}
		done := acme.run(t, run.ID)
		if final != "run_completed" || done.Status != "completed" || !strings.Contains(done.Result.Content, "finished") {
			t.Fatalf("after the resume: last event %q, Run %+v", final, done)
		}
		for id := int64(1); id <= done.Seq; id++ {
			if !seen[id] {
				t.Errorf("event %d of %d was lost across the restart", id, done.Seq)
			}
		}
		if int64(len(seen)) != done.Seq {
			t.Errorf("got %d events, the Run has %d", len(seen), done.Seq)
		}
	})
}

func mustRequest(t *testing.T, method, url, token, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// TestServeRetention shows retention on its schedule: with a retention of
// 1 ms and an interval of 200 ms, a completed Run's event log is pruned by
// a later pass (not only the one at start), the metric counts it, and the
// Run itself still answers with its result.
func TestServeRetention(t *testing.T) {
	dir := t.TempDir()
	cfg := e2eConfig(t, dir)
	cfg.Retention, cfg.RetentionInterval = time.Millisecond, 200*time.Millisecond
	srv := startInProcess(t, cfg)
	acme := newClient(srv.Addr(), acmeToken)
	run := acme.submit(t, "retained", "answer:short-lived")
	acme.waitRun(t, run.ID, 30*time.Second, "completed", func(r runView) bool { return r.Status == "completed" })
	waitUntil(t, 30*time.Second, "the Run's events pruned by a retention pass", func() (bool, error) {
		evs, err := srv.Store().Events(context.Background(), "acme", run.ID, 1, 100)
		return err == nil && len(evs) == 0, fmt.Errorf("%d events, %v", len(evs), err)
	})
	// The pass counts what it pruned once Prune returns: wait for that too.
	waitUntil(t, 30*time.Second, "the pruned Run counted in the metrics", func() (bool, error) {
		code, raw, err := newClient(srv.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
		if err != nil || code != http.StatusOK {
			return false, fmt.Errorf("%d %v", code, err)
		}
		pruned := -1.0
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, `agenthost_retention_pruned_total{what="runs"} `); ok {
				pruned, _ = strconv.ParseFloat(v, 64)
			}
		}
		return pruned >= 1, fmt.Errorf("agenthost_retention_pruned_total{what=\"runs\"} is %v (-1: absent)", pruned)
	})
	if r := acme.run(t, run.ID); r.Status != "completed" || r.Result == nil || r.Result.Content != "short-lived" {
		t.Errorf("the pruned Run: %+v", r)
	}
}

// On the Badger store, /metrics counts the group transactions of the Run
// commits and the commits they wrote.
func TestServeCountsCommitGroups(t *testing.T) {
	srv := startInProcess(t, e2eConfig(t, t.TempDir()))
	acme := newClient(srv.Addr(), acmeToken)
	run := acme.submit(t, "grouped", "answer:done")
	acme.waitRun(t, run.ID, 30*time.Second, "completed", func(r runView) bool { return r.Status == "completed" })
	code, raw, err := newClient(srv.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	got := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		for _, name := range []string{"agenthost_store_commit_groups_total", "agenthost_store_grouped_commits_total"} {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				got[name], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	groups, commits := got["agenthost_store_commit_groups_total"], got["agenthost_store_grouped_commits_total"]
	if groups < 1 || commits < groups {
		t.Fatalf("after a completed Run: %v group transactions wrote %v commits; want at least 1, and at least one commit each", groups, commits)
	}
}

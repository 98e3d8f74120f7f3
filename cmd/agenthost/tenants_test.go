package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestServeTenantIsolation shows, through a real server, that tenants are
// sandboxed from one another: acme and globex run the same plugins, yet
// neither sees the other's Runs, KV, instances or limits.
func TestServeTenantIsolation(t *testing.T) {
	dir := t.TempDir()
	cfg := e2eConfig(t, dir)
	logTailOnFailure(t, filepath.Join(dir, "serve.log"), 60)
	srv := startInProcess(t, cfg)
	acme, globex := newClient(srv.Addr(), acmeToken), newClient(srv.Addr(), globexToken)

	t.Run("a tenant's token cannot see or touch another tenant's Runs", func(t *testing.T) {
		run := globex.submit(t, "private", `ask:secret question?|answer:ok`)
		globex.waitRun(t, run.ID, 30*time.Second, "waiting for input", func(r runView) bool { return r.Status == "waiting" })
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/v1/runs/" + run.ID, ""},
			{"GET", "/v1/runs/" + run.ID + "/events", ""},
			{"POST", "/v1/runs/" + run.ID + "/input", `{"message":"from acme"}`},
			{"POST", "/v1/runs/" + run.ID + "/cancel", `{"reason":"from acme"}`},
			{"GET", "/v1/sessions/private/runs", ""},
		} {
			resp, err := http.DefaultClient.Do(mustRequest(t, c.method, acme.Base+c.path, acmeToken, c.body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("acme's %s %s answered %d, want 404", c.method, c.path, resp.StatusCode)
			}
		}
		after := globex.run(t, run.ID)
		if after.Status != "waiting" || after.Seq != globex.run(t, run.ID).Seq {
			t.Errorf("acme's requests changed globex's Run: %+v", after)
		}
		var list struct {
			Runs []runView `json:"runs"`
		}
		if code, raw, err := globex.Do("GET", "/v1/sessions/private/runs", nil, nil, &list); err != nil || code != http.StatusOK || len(list.Runs) != 1 {
			t.Errorf("globex's own session: %d %v %s", code, err, raw)
		}
	})

	t.Run("a tenant's plugin cannot read another tenant's KV", func(t *testing.T) {
		put := globex.submit(t, "kv-put", `call:kv_put({"key":"secret","value":"globex-only"})|answer:$results`)
		if r := globex.waitRun(t, put.ID, 30*time.Second, "terminal", runView.terminal); r.Status != "completed" || !strings.Contains(r.Result.Content, "stored") {
			t.Fatalf("globex's put: %+v", r)
		}
		own := globex.submit(t, "kv-own", `call:kv_read({"key":"secret"})|answer:$results`)
		if r := globex.waitRun(t, own.ID, 30*time.Second, "terminal", runView.terminal); r.Status != "completed" || !strings.Contains(r.Result.Content, "globex-only") {
			t.Fatalf("globex reads its own key (the control): %+v", r)
		}
		// The hostile plugin tries the key and crafted variants of it.
		steal := acme.submit(t, "kv-steal", `call:kv_read({"key":"secret"})|answer:$results`)
		r := acme.waitRun(t, steal.ID, 30*time.Second, "terminal", runView.terminal)
		if r.Status != "completed" || strings.Contains(r.Result.Content, "globex-only") {
			t.Fatalf("acme's read of globex's key: %+v", r)
		}
		for _, o := range settledTools(t, srv, "acme", steal.ID) {
			if o.State != loop.OutcomeFailed || o.Error == nil || !strings.Contains(o.Error.Message, "not found") {
				t.Errorf("acme's kv_read settled %+v, want failed: not found", o)
			}
		}
	})

	t.Run("a hostile plugin of one tenant does not hold up another's Runs", func(t *testing.T) {
		// acme's two endless loops take two of its hostile instances until
		// the call timeout; its memory bomb runs too.
		loops := acme.submit(t, "hostile-loop", `call:loop({}),loop({})|answer:$results`)
		bomb := acme.submit(t, "hostile-oom", `call:oom({})|answer:$results`)
		acme.waitRun(t, loops.ID, 30*time.Second, "with both loops in flight", func(r runView) bool {
			return r.Waiting != nil && len(r.Waiting.Pending) == 2
		})
		began := time.Now()
		// globex calls the same plugin: its own instances, free at once.
		ok := globex.submit(t, "hostile-ok", `call:ok({})|answer:$results`)
		r := globex.waitRun(t, ok.ID, hostileCallTimeout, "completed while acme's loops run", runView.terminal)
		latency := time.Since(began)
		if r.Status != "completed" || !strings.Contains(r.Result.Content, "ok") {
			t.Fatalf("globex's Run: %+v", r)
		}
		if still := acme.run(t, loops.ID); still.terminal() || len(settledTools(t, srv, "acme", loops.ID)) != 0 {
			t.Fatalf("acme's loops ended before globex's Run did (took %s): the test shows nothing", latency)
		}
		t.Logf("globex's Run completed in %s while acme's loops ran", latency)

		// acme's calls fail, each classified, once its own limits stop them.
		for id, want := range map[string]abi.ErrorClass{loops.ID: abi.ClassPluginTimeout, bomb.ID: abi.ClassPluginOOM} {
			done := acme.waitRun(t, id, hostileCallTimeout+30*time.Second, "terminal", runView.terminal)
			settled := settledTools(t, srv, "acme", id)
			if done.Status != "completed" || len(settled) == 0 {
				t.Fatalf("acme's hostile Run %s: %+v, settled %+v", id, done, settled)
			}
			for eff, o := range settled {
				if o.State != loop.OutcomeFailed || o.Error == nil || o.Error.Class != want {
					t.Errorf("%s settled %+v, want failed %s", eff, o, want)
				}
			}
		}
		// And the server stays healthy and serving.
		again := globex.submit(t, "hostile-ok-2", `call:ok({})|answer:$results`)
		if r := globex.waitRun(t, again.ID, 30*time.Second, "terminal", runView.terminal); r.Status != "completed" {
			t.Fatalf("after acme's hostile calls: %+v", r)
		}
	})

	t.Run("quotas and limits are per tenant", func(t *testing.T) {
		// small's one active Run does not count against acme, and small is
		// refused while acme is not.
		small := newClient(srv.Addr(), smallToken)
		hold := small.submit(t, "hold", `call:slow_job({"seconds":300})|answer:never`)
		code, raw, _ := small.Do("POST", "/v1/sessions/other/runs", map[string]any{"input": "answer:hi"}, nil, nil)
		if code != http.StatusTooManyRequests {
			t.Fatalf("small past its quota: %d %s", code, raw)
		}
		r := acme.submit(t, "free", "answer:hi")
		if done := acme.waitRun(t, r.ID, 30*time.Second, "terminal", runView.terminal); done.Status != "completed" {
			t.Fatalf("acme: %+v", done)
		}
		if code, raw, err := small.Do("POST", "/v1/runs/"+hold.ID+"/cancel", nil, nil, nil); err != nil || code != http.StatusAccepted {
			t.Fatalf("cancel: %d %v %s", code, err, raw)
		}
	})

	t.Run("no token or a wrong one is 401", func(t *testing.T) {
		for _, tok := range []string{"", "not-a-token"} {
			code, raw, _ := newClient(srv.Addr(), tok).Do("GET", "/v1/sessions/private/runs", nil, nil, nil)
			if code != http.StatusUnauthorized || !strings.Contains(string(raw), `"code":"unauthorized"`) {
				t.Errorf("token %q: %d %s", tok, code, raw)
			}
		}
	})
}

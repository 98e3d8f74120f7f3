package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
)

// slowJobVersionConfig is the config of TestServePluginVersions: tenant
// demo with the slow-job plugin at path, declaring version and
// attachesFrom (its config keys for upgrade demonstrations).
func slowJobVersionConfig(t *testing.T, token, path, version, attachesFrom string) string {
	return `
data_dir: data
sync_writes: true
cache_dir: ` + conformance.WazeroCacheDir() + `
log: {format: text, level: info}
plugins:
  prompt-builder: {path: ` + conformance.ExampleWasm(t, "prompt-builder") + `, role: builder}
  scripted-model: {path: ` + conformance.ExampleWasm(t, "scripted-model") + `, role: executor}
  slow-job: {path: ` + path + `, role: executor, config: {version: "` + version + `", attaches_from: "` + attachesFrom + `"}}
tenants:
  demo:
    tokens_sha256: [` + httpapi.HashToken(token) + `]
    builder: prompt-builder
    model: scripted-model
    tool_executors: [slow-job]
`
}

// runEvents reads the whole log of an ended Run through c.
func runEvents(t *testing.T, c *apiClient, runID string) []loop.Event {
	t.Helper()
	req, err := http.NewRequest("GET", c.Base+"/v1/runs/"+runID+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []loop.Event
	err = readSSE(resp.Body, func(ev sseEvent) bool {
		if ev.ID == "" {
			return false // progress, model_delta, run_waiting: not the log
		}
		var e loop.Event
		if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
			t.Fatalf("event %s: %v", ev.Data, err)
		}
		evs = append(evs, e)
		return e.Terminal()
	})
	if err != nil {
		t.Fatalf("run %s's events: %v", runID, err)
	}
	return evs
}

// slowJobEvents returns the events of the effects dispatched to the
// slow-job plugin, failing the test unless there are some.
func slowJobEvents(t *testing.T, evs []loop.Event) []loop.Event {
	t.Helper()
	jobs := map[string]bool{}
	var out []loop.Event
	for _, e := range evs {
		if e.Type == loop.EventEffectDispatched && e.Plugin != nil && e.Plugin.Name == "slow-job" {
			jobs[e.EffectID] = true
		}
		if jobs[e.EffectID] {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no effect of the Run was dispatched to slow-job: %+v", evs)
	}
	return out
}

// TestServePluginVersions is issue 38's plugin upgrade with an attempt in
// flight, under a real serve: slow-job v1 starts a job; v2 (another file,
// another declared version, not listing v1 in attaches_from) replaces it
// by a reload, and v1 stays loaded and polls its job to the end. Then a
// job of v1 is pending when the server is SIGKILLed and started again with
// only v2: the missing-effect policy settles it (slow_job is not
// idempotent: fail), and the log says why. Then the same with a v2 that
// lists 1.0.0 in attaches_from: v2 attaches and finishes the job, and the
// log names v2 on the attempt.
func TestServePluginVersions(t *testing.T) {
	conformance.SkipInShort(t, "upgrading a plugin under serve, with kill -9")
	bin := buildBinary(t)
	const token = "versions-token"
	dir := t.TempDir()
	wasm, err := os.ReadFile(conformance.ExampleWasm(t, "slow-job"))
	if err != nil {
		t.Fatal(err)
	}
	slowJob := filepath.Join(dir, "slow-job.wasm")
	v1 := func() {
		t.Helper()
		if err := os.WriteFile(slowJob, wasm, 0o644); err != nil {
			t.Fatal(err)
		}
		writeConfig(t, dir, slowJobVersionConfig(t, token, slowJob, "1.0.0", ""))
	}
	v2 := func(attachesFrom string) {
		t.Helper()
		if err := os.WriteFile(slowJob, withCustomSection(wasm, "version", "2.0.0"), 0o644); err != nil {
			t.Fatal(err)
		}
		writeConfig(t, dir, slowJobVersionConfig(t, token, slowJob, "2.0.0", attachesFrom))
	}
	v1()
	cfgPath := filepath.Join(dir, "agenthost.yaml")
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c := newClient(proc.Addr(), token)

	// pending waits until the Run's slow job has started: its
	// effect_pending is in the log, so the job's record is in the KV.
	// (Waiting on the job alone is not enough: the Run waits on it from
	// its dispatch, and a kill before the start wrote the record leaves
	// nothing for a later attach.)
	pending := func(id string) {
		t.Helper()
		c.waitEvent(t, proc.Addr(), token, id, loop.EventEffectPending)
	}
	ended := func(id string) (runView, []loop.Event) {
		t.Helper()
		r := c.waitRun(t, id, 90*time.Second, "ended", func(r runView) bool { return r.terminal() })
		return r, slowJobEvents(t, runEvents(t, c, id))
	}
	restart := func() {
		t.Helper()
		proc.Kill()
		proc = startServe(t, bin, cfgPath, logPath)
		mustReady(t, proc, 60*time.Second)
		c = newClient(proc.Addr(), token)
	}

	// 1. v1's job is pending when v2 replaces v1: v1 polls it to its end.
	first := c.submit(t, "s1", "Please run a slow job for 3 seconds")
	pending(first.ID)
	v2("")
	if r := runCLI(t, bin, nil, "reload", "--config", cfgPath); r.code != 0 {
		t.Fatalf("agenthost reload: exit %d\n%s", r.code, r.stderr)
	}
	run, job := ended(first.ID)
	if run.Status != "completed" {
		t.Fatalf("the Run whose job v1 started: %s %+v", run.Status, run.Failure)
	}
	for _, e := range job {
		switch {
		case e.Type == loop.EventEffectDispatched && (e.Plugin == nil || e.Plugin.Version != "1.0.0"):
			t.Errorf("the job's effect_dispatched names %+v, want slow-job 1.0.0", e.Plugin)
		case e.Type == loop.EventEffectSettled && (e.Outcome == nil || e.Outcome.State != loop.OutcomeDone || e.Plugin != nil):
			t.Errorf("the job settled %+v by %+v; want done, by the version that started it", e.Outcome, e.Plugin)
		}
	}
	waitUntil(t, 30*time.Second, "v1 is closed once its job ended", func() (bool, error) {
		return strings.Contains(serveLog(t, logPath), `plugin version closed: the attempts it held have ended" plugin=slow-job version=1.0.0`), nil
	})

	// 2. A job of v1 pending at a kill -9; the restart has only v2, which
	// does not take v1's attempts over: the policy (fail) settles it.
	// startedByV1 reloads back to v1, leaves a job of v1 pending in a
	// Run of session, and restarts with only v2 (attachesFrom: what its
	// describe lists in attaches_from); it returns the Run's ID.
	startedByV1 := func(session, attachesFrom string) string {
		v1()
		if r := runCLI(t, bin, nil, "reload", "--config", cfgPath); r.code != 0 {
			t.Fatalf("agenthost reload back to v1: exit %d\n%s", r.code, r.stderr)
		}
		id := c.submit(t, session, "Please run a slow job for 4 seconds").ID
		pending(id)
		v2(attachesFrom)
		restart()
		return id
	}
	_, job = ended(startedByV1("s2", ""))
	var settled *loop.Event
	for i, e := range job {
		if e.Type == loop.EventEffectSettled {
			settled = &job[i]
		}
	}
	if settled == nil || settled.Outcome == nil || settled.Outcome.Error == nil ||
		!strings.Contains(settled.Outcome.Error.Message, "the plugin version that started the attempt is no longer loaded") {
		t.Fatalf("the job of the gone v1 settled as %+v; want a failure that says v1 is gone and v2 does not take it over", settled)
	}
	mustContain(t, "the serve's log", serveLog(t, logPath), `does not list \"1.0.0\" in its describe's attaches_from`)

	// 3. The same, with a v2 that lists 1.0.0 in attaches_from: it
	// attaches, and the log names it on the attempt.
	run, job = ended(startedByV1("s3", "1.0.0"))
	if run.Status != "completed" {
		t.Fatalf("the Run whose job v2 took over: %s %+v", run.Status, run.Failure)
	}
	takenBy := ""
	for _, e := range job {
		if (e.Type == loop.EventEffectPending || e.Type == loop.EventEffectSettled) && e.Plugin != nil {
			takenBy = e.Plugin.Version
		}
		if e.Type == loop.EventEffectSettled && (e.Outcome == nil || e.Outcome.State != loop.OutcomeDone) {
			t.Errorf("the job v2 took over settled %+v, want done", e.Outcome)
		}
	}
	if takenBy != "2.0.0" {
		t.Fatalf("no effect_pending or effect_settled of the job names slow-job 2.0.0 (%q): the log does not say v2 took it over", takenBy)
	}
	mustContain(t, "the serve's log", serveLog(t, logPath), "plugin version takes over an attempt")
}

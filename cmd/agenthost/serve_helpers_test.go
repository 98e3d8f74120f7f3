package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/chaos"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
)

// waitUntil polls cond until it holds, failing the test at the deadline.
var waitUntil = conformance.WaitUntil

// apiClient speaks to an agenthost server as one tenant: the benches'
// client (Do), with the tests' helpers.
type apiClient struct{ *serveproc.Client }

func newClient(addr, token string) *apiClient {
	return &apiClient{serveproc.NewClient(addr, token, 30*time.Second)}
}

// runView is the part of a Run's JSON the tests read.
type runView struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	Status  string `json:"status"`
	Seq     int64  `json:"seq"`
	Usage   struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	Result *struct {
		Content string `json:"content"`
	} `json:"result"`
	Failure *struct {
		Class   string `json:"class"`
		Message string `json:"message"`
	} `json:"failure"`
	Waiting *struct {
		Approvals []struct {
			ToolCallID string `json:"tool_call_id"`
			Tool       string `json:"tool"`
		} `json:"approvals"`
		Input *struct {
			Prompt string `json:"prompt"`
		} `json:"input"`
		Pending []struct {
			Effect string `json:"effect"`
			Kind   string `json:"kind"`
			Tool   string `json:"tool"`
			Budget *struct {
				Endpoint string `json:"endpoint"`
				Until    string `json:"until"`
			} `json:"budget"`
			Instance *struct {
				Plugin string `json:"plugin"`
				Since  string `json:"since"`
			} `json:"instance"`
		} `json:"pending"`
	} `json:"waiting"`
}

func (r runView) terminal() bool {
	return r.Status == "completed" || r.Status == "failed" || r.Status == "cancelled"
}

func (c *apiClient) submit(t testing.TB, session, input string) runView {
	t.Helper()
	var run runView
	code, raw, err := c.Do("POST", "/v1/sessions/"+session+"/runs", map[string]any{"input": input}, nil, &run)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("submit %q: %d %v %s", input, code, err, raw)
	}
	return run
}

func (c *apiClient) run(t testing.TB, id string) runView {
	t.Helper()
	var run runView
	code, raw, err := c.Do("GET", "/v1/runs/"+id, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		t.Fatalf("get run %s: %d %v %s", id, code, err, raw)
	}
	return run
}

// waitRun waits until the Run satisfies cond and returns it.
func (c *apiClient) waitRun(t testing.TB, id string, timeout time.Duration, what string, cond func(runView) bool) runView {
	t.Helper()
	var run runView
	waitUntil(t, timeout, "run "+id+" "+what, func() (bool, error) {
		var got runView
		code, raw, err := c.Do("GET", "/v1/runs/"+id, nil, nil, &got)
		if err != nil || code != http.StatusOK {
			return false, fmt.Errorf("%d %v %s", code, err, raw)
		}
		run = got
		return cond(got), fmt.Errorf("status %s", got.Status)
	})
	return run
}

// sseEvent is one message of an event stream.
type sseEvent struct {
	ID    string
	Event string
	Data  string
}

// readSSE reads an event stream until it ends or stop says so, handing
// each message to fn.
func readSSE(r io.Reader, fn func(sseEvent) (stop bool)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Event != "" || len(data) > 0 {
				ev.Data = strings.Join(data, "\n")
				if fn(ev) {
					return nil
				}
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.Event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
	return sc.Err()
}

// startServe starts the binary's serve on a free port (serveproc.Start),
// its logs appended to logPath, and kills it when the test ends.
func startServe(t testing.TB, bin, cfgPath, logPath string) *serveproc.Child {
	t.Helper()
	p, err := serveproc.Start(bin, cfgPath, logPath, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// mustReady waits until p's /readyz answers 200.
func mustReady(t testing.TB, p *serveproc.Child, timeout time.Duration) {
	t.Helper()
	if err := p.WaitReady(timeout); err != nil {
		t.Fatal(err)
	}
}

// mustExit waits for p to exit and returns its exit code.
func mustExit(t testing.TB, p *serveproc.Child, timeout time.Duration) int {
	t.Helper()
	code, err := p.WaitExit(timeout)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// logTailOnFailure logs the last n lines of a server's log file when the
// test fails.
func logTailOnFailure(t testing.TB, path string, n int) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log (tail):\n%s", serveproc.TailFile(path, n))
		}
	})
}

// slowJobServeConfig writes the config of a serve on dir/data whose tenant
// "demo" (bearer token) runs the example prompt-builder, scripted-model and
// slow-job plugins; extra is YAML added at the top level. Beside its
// default agent (the top-level form) the tenant has two more: research,
// with the slow job, and lead, which calls research as a tool.
func slowJobServeConfig(t *testing.T, dir, token, extra string) string {
	t.Helper()
	paths := map[string]string{}
	for _, name := range []string{"prompt-builder", "scripted-model", "slow-job"} {
		p := conformance.ExampleWasm(t, name)
		paths[name] = p
	}
	return writeConfig(t, dir, `
data_dir: data
sync_writes: true
cache_dir: `+conformance.WazeroCacheDir()+`
log: {format: text, level: info}
`+extra+`
plugins:
  prompt-builder: {path: `+paths["prompt-builder"]+`, role: builder}
  scripted-model: {path: `+paths["scripted-model"]+`, role: executor}
  slow-job: {path: `+paths["slow-job"]+`, role: executor}
tenants:
  demo:
    tokens_sha256: [`+httpapi.HashToken(token)+`]
    builder: prompt-builder
    model: scripted-model
    tool_executors: [slow-job]
    model_policy: {mode: retry, max_attempts: 8, backoff: 100ms, max_backoff: 1s}
    agents:
      lead: {model: {plugin: scripted-model}, tools: [{agent: research}]}
      research: {model: {plugin: scripted-model}, tools: [{plugin: slow-job}]}
`)
}

// runLogReader is what checkServedRuns reads of a store: Run logs and
// the slow-job plugin's KV.
type runLogReader interface {
	chaos.KVReader
	Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error)
}

// checkServedRuns holds the logs of tenant demo's Runs ids to
// loop.CheckEnded, the one log checker, each tool effect to one dispatched
// attempt (slow_job is not idempotent, so its policy, fail, allows one;
// an agent tool's child is attached to, never started again), and the
// slow-job plugin's own execution counts to "each job ran once". It
// returns the number of slow jobs checked.
func checkServedRuns(t testing.TB, store runLogReader, ids []string) int {
	t.Helper()
	ctx := context.Background()
	jobs := 0
	for _, id := range ids {
		evs, err := store.Events(ctx, "demo", id, 1, 0)
		if err != nil {
			t.Fatalf("events of %s: %v", id, err)
		}
		for _, v := range loop.CheckEnded(evs) {
			t.Errorf("run %s: %s", id, v)
		}
		recs := loop.LogEffects(evs)
		for _, r := range recs {
			if r.Kind == "tool" && r.Dispatched > 1 {
				t.Errorf("run %s: tool effect %s dispatched %d attempts; its policy allows 1", id, r.ID, r.Dispatched)
			}
		}
		n, violations, err := chaos.CheckSlowJobs(ctx, store, "demo", "slow-job", recs)
		if err != nil {
			t.Fatal(err)
		}
		jobs += n
		for _, v := range violations {
			t.Error(v)
		}
	}
	return jobs
}

// waitForMetrics waits, 30 s at most, until the /metrics that addr
// serves holds every line of want (each as a substring).
func waitForMetrics(t *testing.T, addr, what string, want ...string) {
	t.Helper()
	waitUntil(t, 30*time.Second, what, func() (bool, error) {
		code, raw, err := newClient(addr, "").Do("GET", "/metrics", nil, nil, nil)
		if err != nil || code != http.StatusOK {
			return false, fmt.Errorf("%d %v", code, err)
		}
		for _, w := range want {
			if !strings.Contains(string(raw), w) {
				return false, fmt.Errorf("/metrics lacks %q", w)
			}
		}
		return true, nil
	})
}

package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowModelCallsDoNotQueueForInstances: 32 Runs submitted together
// against a slow model, with the default pool limits, all reach the model
// while none has been answered: none queues for a plugin instance behind
// pool_size while others only wait on the network. The fake model holds
// every request until it has seen all 32 (a slow model whose slowness is
// a condition, not a sleep), so with queueing the test could only time
// out. It logs the time from each Run's submission to its request's
// arrival.
func TestSlowModelCallsDoNotQueueForInstances(t *testing.T) {
	const runs = 32
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "slow-model-token"

	// The fake model: chatModel's answers, each given only once all the
	// Runs' requests are in.
	model := &chatModel{}
	var (
		mu      sync.Mutex
		arrived = map[string]time.Time{} // by the Run's input
		allIn   = make(chan struct{})
	)
	hold := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		input := ""
		if i := strings.Index(string(body), "question "); i >= 0 {
			input = string(body[i:])
			input = input[:strings.IndexAny(input, `"`)]
		}
		mu.Lock()
		if _, seen := arrived[input]; !seen && input != "" {
			arrived[input] = time.Now()
			if len(arrived) == runs {
				close(allIn)
			}
		}
		mu.Unlock()
		select {
		case <-allIn:
		case <-r.Context().Done():
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		model.serve(w, r)
	}
	model.srv = httptest.NewServer(http.HandlerFunc(hold))
	t.Cleanup(model.srv.Close)

	addr := model.srv.Listener.Addr().String()
	// The call and HTTP timeouts are raised so that a slow machine, making
	// 32 instances while the first requests are held, cannot time those
	// out; the pool limits (pool_size, max_instances) are the defaults.
	cfg := providerServe{Token: token, Model: "openai", Addr: addr, URL: "http://" + addr + "/v1",
		Config: "model: slow-model, api_key: not-a-real-key", PluginYAML: "    call_timeout: 5m\n    http_timeout: 5m",
		Tenant: "    model: openai\n",
	}.write(t, dir)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)

	submitted := make([]time.Time, runs)
	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			submitted[i] = time.Now()
			ids[i] = c.submit(t, fmt.Sprintf("s%d", i), fmt.Sprintf("question %d", i)).ID
		}()
	}
	wg.Wait()
	select {
	case <-allIn:
	case <-time.After(3 * time.Minute):
		mu.Lock()
		n := len(arrived)
		mu.Unlock()
		t.Fatalf("only %d of %d Runs' model calls reached the model, none answered: the others queue for a plugin instance", n, runs)
	}
	var slowest time.Duration
	mu.Lock()
	for i := range runs {
		d := arrived[fmt.Sprintf("question %d", i)].Sub(submitted[i])
		slowest = max(slowest, d)
	}
	mu.Unlock()
	t.Logf("all %d Runs reached the model before any was answered; the slowest %s after its submission", runs, slowest.Round(time.Millisecond))
	for _, id := range ids {
		if done := c.waitRun(t, id, 2*time.Minute, "to end", runView.terminal); done.Status != "completed" {
			t.Fatalf("run %s: %s %+v", id, done.Status, done.Failure)
		}
	}
}

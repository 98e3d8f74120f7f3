package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// firstArrivals returns when the first request of each conversation came
// to f, by the conversation's last user message.
func firstArrivals(f *conformance.FakeOpenAI) map[string]time.Time {
	out := map[string]time.Time{}
	for _, r := range f.Requests() {
		if _, seen := out[r.LastUser()]; !seen {
			out[r.LastUser()] = r.Received
		}
	}
	return out
}

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

	// The fake model: its default answers, each given only once all the
	// Runs' requests are in.
	model := conformance.NewFakeOpenAI(t, "not-a-real-key")
	var (
		allIn, ended = make(chan struct{}), make(chan struct{})
		allInOnce    sync.Once
	)
	t.Cleanup(func() { close(ended) }) // before the fake closes, which waits for the requests it holds
	model.Script(func(conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		if len(firstArrivals(model)) == runs {
			allInOnce.Do(func() { close(allIn) })
		}
		select {
		case <-allIn:
		case <-ended:
		}
		return conformance.OpenAIAnswer{}, false
	})

	// The call and HTTP timeouts are raised so that a slow machine, making
	// 32 instances while the first requests are held, cannot time those
	// out; the pool limits (pool_size, max_instances) are the defaults.
	cfg := providerServe{Token: token, Model: "openai", Addr: model.Addr, URL: model.URL,
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
		n := len(firstArrivals(model))
		t.Fatalf("only %d of %d Runs' model calls reached the model, none answered: the others queue for a plugin instance", n, runs)
	}
	var slowest time.Duration
	arrived := firstArrivals(model)
	for i := range runs {
		slowest = max(slowest, arrived[fmt.Sprintf("question %d", i)].Sub(submitted[i]))
	}
	t.Logf("all %d Runs reached the model before any was answered; the slowest %s after its submission", runs, slowest.Round(time.Millisecond))
	for _, id := range ids {
		if done := c.waitRun(t, id, 2*time.Minute, "to end", runView.terminal); done.Status != "completed" {
			t.Fatalf("run %s: %s %+v", id, done.Status, done.Failure)
		}
	}
}

// TestARunShowsItsWaitForAnInstance: with the openai plugin's
// max_instances at 1 and one model call held by the model, a second
// Run's model call waits for the instance, and GET /v1/runs/{id} shows
// it in the step's pending entry, naming the plugin and since when; the
// metrics count the wait, and both Runs complete once the model answers.
func TestARunShowsItsWaitForAnInstance(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "instance-wait-token"
	model := conformance.NewFakeOpenAI(t, "not-a-real-key")
	var (
		arrived    = make(chan struct{}, 2)
		answer     = make(chan struct{})
		answerOnce sync.Once
	)
	letAnswer := func() { answerOnce.Do(func() { close(answer) }) }
	t.Cleanup(letAnswer) // before the fake closes, which waits for the requests it holds
	model.Script(func(conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		select {
		case arrived <- struct{}{}:
		default: // more than two came: the check below fails on the second
		}
		<-answer
		return conformance.OpenAIAnswer{}, false
	})
	cfg := providerServe{Token: token, Model: "openai", Addr: model.Addr, URL: model.URL,
		Config:     "model: held-model, api_key: not-a-real-key",
		PluginYAML: "    pool_size: 1\n    max_instances: 1\n    call_timeout: 5m\n    http_timeout: 5m",
		Tenant:     "    model: openai\n",
	}.write(t, dir)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)

	first := c.submit(t, "s1", "question 1")
	select {
	case <-arrived:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first Run's model call never reached the model")
	}
	submitted := time.Now()
	second := c.submit(t, "s2", "question 2")
	run := c.waitRun(t, second.ID, time.Minute, "to wait for an instance", func(r runView) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Instance != nil
	})
	w := run.Waiting.Pending[0]
	since, err := time.Parse(time.RFC3339Nano, w.Instance.Since)
	if w.Kind != "model" || w.Instance.Plugin != "openai" || err != nil || since.Before(submitted.Add(-time.Second)) || since.After(time.Now()) {
		t.Fatalf("the second Run's pending step %+v, instance %+v; want a model step waiting for an instance of openai since its submission (%s)",
			w, *w.Instance, submitted.Format(time.RFC3339Nano))
	}
	select {
	case <-arrived:
		t.Fatal("the second Run's model call reached the model while the only instance was busy")
	default:
	}
	letAnswer()
	for _, id := range []string{first.ID, second.ID} {
		if done := c.waitRun(t, id, time.Minute, "to end", runView.terminal); done.Status != "completed" {
			t.Fatalf("run %s: %s %+v", id, done.Status, done.Failure)
		}
	}
	code, raw, err := newClient(p.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
	if err != nil || code != http.StatusOK || !strings.Contains(string(raw), `agenthost_plugin_instance_waits_total{plugin="openai"} 1`) {
		t.Fatalf("/metrics (%d %v) lacks one instance wait of openai", code, err)
	}
}

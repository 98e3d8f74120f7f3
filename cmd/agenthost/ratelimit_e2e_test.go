package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// newThrottledModel is a fake OpenAI server (taking no API key) that
// rate-limits every conversation (told apart by the user's message): it
// answers the first limited requests of each with 429 and "Retry-After:
// N" (retryAfter, in whole seconds), and the next with "hello: MESSAGE".
func newThrottledModel(t *testing.T, limited int, retryAfter time.Duration) *conformance.FakeOpenAI {
	f := conformance.NewFakeOpenAI(t, "")
	f.Script(func(req conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		if len(conversation(f, req.LastUser())) <= limited {
			return conformance.OpenAIAnswer{Failure: &conformance.OpenAIFailure{
				Status: http.StatusTooManyRequests, RetryAfter: fmt.Sprint(int(retryAfter.Seconds()))}}, true
		}
		return conformance.OpenAIAnswer{Content: "hello: " + req.LastUser()}, true
	})
	return f
}

// conversation returns the requests f was sent whose last user message
// is user, in the order they came.
func conversation(f *conformance.FakeOpenAI, user string) []conformance.OpenAIRequest {
	return slices.DeleteFunc(f.Requests(), func(r conformance.OpenAIRequest) bool { return r.LastUser() != user })
}

// earlyRetries describes each request of f's conversations that came
// earlier after a 429 than its Retry-After asked (retryAfter, counted
// from when the 429 was sent).
func earlyRetries(f *conformance.FakeOpenAI, retryAfter time.Duration) []string {
	var early []string
	limitedAt := map[string]time.Time{} // by user message: when the last 429 was sent
	for _, r := range f.Requests() {
		user := r.LastUser()
		if asked, ok := limitedAt[user]; ok && r.Received.Before(asked.Add(retryAfter)) {
			early = append(early, fmt.Sprintf("%q came %s after a 429 that asked for %s", user, r.Received.Sub(asked), retryAfter))
		}
		if r.Status == http.StatusTooManyRequests {
			limitedAt[user] = r.Answered
		}
	}
	return early
}

// TestRunsOutlastAProviderThatRateLimitsThem: through serve and the
// openai plugin, Runs whose every model call is first answered 429 with
// "Retry-After: 2", twice, all complete, under a model policy of one
// attempt and a 1s max_backoff: the rate-limited attempts count against
// their own budget, no retry comes earlier than the server asked, the
// Runs' events carry the class rate_limited and the wait, the metrics
// count the settlements and the openai plugin's calls as rate_limited and
// time the model calls and the Runs, and the log has a line for each,
// naming the endpoint.
func TestRunsOutlastAProviderThatRateLimitsThem(t *testing.T) {
	const runs, limited, retryAfter = 4, 2, 2 * time.Second
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "throttled-token"
	model := newThrottledModel(t, limited, retryAfter)
	cfg := providerServe{Token: token, Model: "openai", Addr: model.Addr, URL: model.URL,
		Config: "model: throttled-model", LogFormat: "json",
		Tenant: "    model: openai\n    model_policy: {mode: retry, max_attempts: 1, backoff: 100ms, max_backoff: 1s}\n",
	}.write(t, dir)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c := newClient(p.Addr(), token)

	var (
		wg        sync.WaitGroup
		submitted [runs]runView
	)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			submitted[i] = c.submit(t, fmt.Sprintf("s%d", i), fmt.Sprintf("question %d", i))
		}()
	}
	wg.Wait()
	for i, r := range submitted {
		done := c.waitRun(t, r.ID, 60*time.Second, "to end", runView.terminal)
		if done.Status != "completed" || done.Result == nil || done.Result.Content != fmt.Sprintf("hello: question %d", i) {
			t.Fatalf("run %s: %s, result %+v, failure %+v", r.ID, done.Status, done.Result, done.Failure)
		}
		if calls := conversation(model, fmt.Sprintf("question %d", i)); len(calls) != limited+1 {
			t.Errorf("run %s: the server saw %d requests, want %d (%d answered 429)", r.ID, len(calls), limited+1, limited)
		}
	}
	if early := earlyRetries(model, retryAfter); len(early) > 0 {
		t.Fatalf("%d requests came earlier than the server asked:\n%s", len(early), strings.Join(early, "\n"))
	}

	// The events say which attempts were rate-limited, and the wait asked.
	req, _ := http.NewRequest("GET", c.Base+"/v1/runs/"+submitted[0].ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	limitedSettled := 0
	if err := readSSE(resp.Body, func(ev sseEvent) bool {
		var e struct {
			Attempt int `json:"attempt"`
			Outcome *struct {
				Error *struct {
					Class        string `json:"class"`
					RetryAfterMS int64  `json:"retry_after_ms"`
				} `json:"error"`
			} `json:"outcome"`
		}
		if ev.Event != "effect_settled" || json.Unmarshal([]byte(ev.Data), &e) != nil || e.Outcome == nil || e.Outcome.Error == nil {
			return ev.Event == "run_completed"
		}
		if f := e.Outcome.Error; f.Class != "rate_limited" || f.RetryAfterMS != retryAfter.Milliseconds() {
			t.Errorf("attempt %d settled with %+v, want rate_limited asking for %s", e.Attempt, *f, retryAfter)
		}
		limitedSettled++
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if limitedSettled != limited {
		t.Errorf("%d rate-limited settlements in the events, want %d", limitedSettled, limited)
	}

	// The metrics count them apart from other failures, by tenant and by
	// endpoint; each model call is timed by endpoint and outcome, and each
	// Run's duration by its agent.
	wants := []string{
		fmt.Sprintf(`agenthost_effects_settled_total{class="rate_limited",kind="model",state="failed",tenant="demo"} %d`, runs*limited),
		fmt.Sprintf(`agenthost_executor_calls_total{class="rate_limited",export="start",kind="model",plugin="openai",state="failed"} %d`, runs*limited),
		fmt.Sprintf(`agenthost_executor_calls_total{class="",export="start",kind="model",plugin="openai",state="done"} %d`, runs),
		fmt.Sprintf(`agenthost_model_call_seconds_count{class="rate_limited",plugin="openai",state="failed"} %d`, runs*limited),
		fmt.Sprintf(`agenthost_model_call_seconds_count{class="",plugin="openai",state="done"} %d`, runs),
		fmt.Sprintf(`agenthost_run_duration_seconds_count{agent="default",status="completed",tenant="demo"} %d`, runs),
	}
	waitForMetrics(t, p.MetricsAddr(), "the rate-limited settlements in the metrics", wants...)

	// The log has a line for each rate-limited attempt.
	lines := 0
	logged, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(logged), "\n") {
		if strings.Contains(l, "the provider rate-limited an attempt; the next one waits") &&
			strings.Contains(l, `"tenant":"demo"`) && strings.Contains(l, `"endpoint":"openai"`) && strings.Contains(l, `"retry_after_ms":2000`) {
			lines++
		}
	}
	if lines != runs*limited {
		t.Errorf("%d log lines for rate-limited attempts, want %d", lines, runs*limited)
	}
}

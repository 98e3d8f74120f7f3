package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// throttledChat is an OpenAI-compatible chat-completions server on
// 127.0.0.1 that rate-limits every conversation: it answers the first
// limited requests of each (told apart by the user's message) with 429
// and "Retry-After: N" (retryAfter, in whole seconds), and the next with
// "hello: MESSAGE". It records, for each conversation, when each request
// came and when each 429 was sent, and every request that came earlier
// after a 429 than the server asked.
type throttledChat struct {
	srv        *httptest.Server
	limited    int
	retryAfter time.Duration

	mu    sync.Mutex
	calls map[string][]time.Time // by user message: when each request came
	early []string
	last  map[string]time.Time // by user message: when the last 429 was sent
}

func newThrottledChat(t *testing.T, limited int, retryAfter time.Duration) *throttledChat {
	m := &throttledChat{limited: limited, retryAfter: retryAfter, calls: map[string][]time.Time{}, last: map[string]time.Time{}}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *throttledChat) serve(w http.ResponseWriter, r *http.Request) {
	came := time.Now()
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	if r.URL.Path != "/v1/chat/completions" || json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"not a chat completion"}}`, http.StatusBadRequest)
		return
	}
	user := ""
	for _, msg := range req.Messages {
		if msg.Role == "user" && msg.Content != nil {
			user = *msg.Content
		}
	}
	m.mu.Lock()
	if asked, ok := m.last[user]; ok && came.Before(asked.Add(m.retryAfter)) {
		m.early = append(m.early, fmt.Sprintf("%q came %s after a 429 that asked for %s", user, came.Sub(asked), m.retryAfter))
	}
	m.calls[user] = append(m.calls[user], came)
	n := len(m.calls[user])
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n <= m.limited {
		w.Header().Set("Retry-After", fmt.Sprint(int(m.retryAfter.Seconds())))
		m.mu.Lock()
		m.last[user] = time.Now() // the wait counts from the answer
		m.mu.Unlock()
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": "hello: " + user}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5},
	})
}

// callsOf returns when each request of the conversation of user came.
func (m *throttledChat) callsOf(user string) []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.calls[user]...)
}

func (m *throttledChat) earlyCalls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.early...)
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
	model := newThrottledChat(t, limited, retryAfter)
	host := model.srv.Listener.Addr().String()
	cfg := providerServe{Token: token, Model: "openai", Addr: host, URL: "http://" + host + "/v1",
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
		if calls := model.callsOf(fmt.Sprintf("question %d", i)); len(calls) != limited+1 {
			t.Errorf("run %s: the server saw %d requests, want %d (%d answered 429)", r.ID, len(calls), limited+1, limited)
		}
	}
	if early := model.earlyCalls(); len(early) > 0 {
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
	waitUntil(t, 30*time.Second, "the rate-limited settlements in the metrics", func() (bool, error) {
		code, raw, err := newClient(p.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
		if err != nil || code != http.StatusOK {
			return false, fmt.Errorf("%d %v", code, err)
		}
		for _, want := range wants {
			if !strings.Contains(string(raw), want) {
				return false, fmt.Errorf("/metrics lacks %q", want)
			}
		}
		return true, nil
	})

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

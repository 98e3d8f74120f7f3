package runtime_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// throttledModel is a model executor behind a provider that answers the
// first limited starts of each effect with a rate limit, asking for a
// wait of retryAfter, and then lets the scripted model answer. It records
// when (on the clock) each start came.
type throttledModel struct {
	runtime.Executor
	clock      runtime.Clock
	limited    int
	retryAfter time.Duration

	mu     sync.Mutex
	starts map[string][]time.Time // by effect ID
}

func (m *throttledModel) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.mu.Lock()
	id := c.Input.Effect.ID
	m.starts[id] = append(m.starts[id], m.clock.Now())
	n := len(m.starts[id])
	m.mu.Unlock()
	if n <= m.limited {
		return abi.RateLimited("the server answered 429: slow down", m.retryAfter.Milliseconds()), nil
	}
	return m.Executor.Start(ctx, c)
}

// Endpoint names the model's endpoint, as host.Executor names its plugin.
func (m *throttledModel) Endpoint() string { return "openai" }

func (m *throttledModel) startsOf(id string) []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.starts[id]...)
}

// TestARateLimitedModelStepWaitsAsAskedAndOutlastsMaxAttempts: a model
// step whose provider answers 429 three times, asking each time for 20 s,
// under a policy of 2 attempts and a 2 s max_backoff, is attempted a
// fourth time and completes; no attempt came earlier than the provider
// asked; each rate-limited attempt is logged with its tenant, Run,
// effect, attempt and wait, and settles as rate_limited for the metrics.
func TestARateLimitedModelStepWaitsAsAskedAndOutlastsMaxAttempts(t *testing.T) {
	const retryAfter = 20 * time.Second
	var model *throttledModel
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], func(tn *runtime.Tenant) {
		model = &throttledModel{Executor: tn.Model, limited: 3, retryAfter: retryAfter, starts: map[string][]time.Time{}}
		tn.Model = model
		tn.ModelPolicy = loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 2, BackoffMS: 1000, MaxBackoffMS: 2000}
	})
	model.clock = e.Clock
	// The env's own runtime logs nowhere and observes nothing: this one
	// takes its place before any Run is made.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Runtime.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	log := &conformance.LogBuffer{}
	obs := &recordingObserver{}
	rt, err := runtime.New(runtime.Options{Store: e.Store, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: "node-rl", PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		MaxDefer: 30 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour, Observer: obs,
		Logger: slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	conformance.Eventually(t, "node-rl's first recovery pass", rt.Ready)

	res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: "answer:after the window"})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	if res.Kind != runtime.ResultTerminal {
		run = e.UntilTerminal(rt, res.Run.ID, 5*time.Second)
	}
	if run.Status != loop.StatusCompleted || run.Result != "after the window" {
		t.Fatalf("the Run ended %s with %q, failure %+v", run.Status, run.Result, run.Failure)
	}
	effect := loop.ModelEffectID(run.ID, 1)
	starts := model.startsOf(effect)
	if len(starts) != 4 {
		t.Fatalf("the model was started %d times, want 4 (3 rate-limited, then the answer)", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < retryAfter {
			t.Errorf("attempt %d started %s after attempt %d, which was asked to wait %s", i+1, gap, i, retryAfter)
		}
	}

	// The log and the events say what happened, attempt by attempt.
	lines := log.Lines(`"msg":"the provider rate-limited an attempt; the next one waits"`)
	if len(lines) != 3 {
		t.Fatalf("%d log lines for rate-limited attempts, want 3; the log:\n%s", len(lines), log.String())
	}
	for i, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		for k, want := range map[string]any{"tenant": "acme", "run": run.ID, "effect": effect, "attempt": float64(i + 1),
			"retry_after_ms": float64(retryAfter.Milliseconds()), "rate_limited_attempts": float64(i + 1), "wait_ms": float64(retryAfter.Milliseconds()), "endpoint": "openai"} {
			if rec[k] != want {
				t.Errorf("log line %d: %s is %v, want %v: %s", i+1, k, rec[k], want, l)
			}
		}
	}
	evs, err := e.Store.Events(context.Background(), "acme", run.ID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v := loop.CheckEnded(evs); v != nil {
		t.Fatalf("the log breaks the Loop's rules: %q", v)
	}
	limited := 0
	for _, ev := range evs {
		if ev.Type == loop.EventEffectSettled && ev.Outcome.Error != nil {
			if f := ev.Outcome.Error; f.Class != abi.ClassRateLimited || !f.Retriable || f.RetryAfterMS != retryAfter.Milliseconds() {
				t.Errorf("attempt %d settled with %+v, want a retriable rate_limited failure asking for %s", ev.Attempt, f, retryAfter)
			}
			limited++
		}
	}
	if limited != 3 {
		t.Errorf("%d rate-limited settlements in the log, want 3", limited)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got := strings.Join(obs.settled, " "); got != "model:failed:rate_limited model:failed:rate_limited model:failed:rate_limited model:done:" {
		t.Errorf("the observer saw settlements %q", got)
	}
}

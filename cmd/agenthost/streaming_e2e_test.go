package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// streamingProvider is a fake provider as the streaming test drives it.
type streamingProvider struct {
	URL, Addr string
	Hold      func(n int) *conformance.StreamHold
	CutNext   func(n int, how conformance.StreamCut)
}

// TestStreamedAnswersReachFollowersBeforeTheySettle: through serve, the
// openai and anthropic example plugins and their fake providers, a Run's
// answer reaches an event stream as model_delta events while the provider
// still holds the rest of it, before the model effect settles; the
// pieces add up to the committed reply; none of them is in the stored log
// (a stream of the ended Run replays none); a stream the provider cuts is
// retried and its pieces start again under attempt 2; and the time to the
// first piece is in the metrics.
func TestStreamedAnswersReachFollowersBeforeTheySettle(t *testing.T) {
	bin := buildBinary(t)
	const key = "sk-stream-test"
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			var fake streamingProvider
			switch provider {
			case "openai":
				f := conformance.NewFakeOpenAI(t, key)
				fake = streamingProvider{f.URL, f.Addr, f.Hold, f.CutNext}
			case "anthropic":
				f := conformance.NewFakeAnthropic(t, key)
				fake = streamingProvider{f.URL, f.Addr, f.Hold, f.CutNext}
			}
			dir := t.TempDir()
			const token = "stream-token"
			cfg := providerServe{Token: token, Model: provider, Addr: fake.Addr, URL: fake.URL,
				Config: "model: stream-model, api_key: " + key,
				Tenant: "    model: " + provider + "\n    model_policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 1s}\n",
			}.write(t, dir)
			logPath := filepath.Join(dir, "serve.log")
			logTailOnFailure(t, logPath, 60)
			p := startServe(t, bin, cfg, logPath)
			mustReady(t, p, 90*time.Second)
			c := newClient(p.Addr(), token)
			const answer = "hello from stream-model" // the fakes' answer, in pieces of 4 runes

			// The provider holds the answer after its first two pieces.
			// The Run waits in its session behind one whose answer the
			// provider holds before its first piece, so that its stream
			// is open before its call begins: a stream gets the pieces
			// sent once it is open, not those before.
			first, hold := fake.Hold(0), fake.Hold(2)
			c.submit(t, "s1", "hi")
			run := c.submit(t, "s1", "hi")
			s := openRunStream(t, c, run.ID)
			first.Release()
			s.until(t, "the first two pieces", func() bool { return s.text(1) == answer[:8] })
			waitClosed(t, hold.Reached(), "the provider to hold the answer")
			if settled := s.settledModel(); len(settled) != 0 {
				t.Fatalf("the model effect settled before the answer was complete: %v", settled)
			}
			if got := c.run(t, run.ID); got.Status != "running" {
				t.Fatalf("the Run is %s while its answer streams, want running", got.Status)
			}
			hold.Release()
			s.until(t, "the Run's end", s.ended)
			s.checkPieces(t, map[int]string{1: answer}, answer)

			// None of it was stored: the ended Run's stream replays its
			// log, without a delta.
			replay := openRunStream(t, c, run.ID)
			replay.until(t, "the replayed end", replay.ended)
			if n := len(replay.deltas); n != 0 {
				t.Fatalf("a replay of the stored log has %d model_delta events", n)
			}

			// A stream cut after two pieces is retried: the pieces start
			// again under attempt 2, and attempt 2's make the reply.
			hold = fake.Hold(0)
			fake.CutNext(2, conformance.CutConnection)
			run = c.submit(t, "s2", "hi")
			s = openRunStream(t, c, run.ID)
			hold.Release() // the stream is open (its follower made) before the first piece
			s.until(t, "the Run's end", s.ended)
			s.checkPieces(t, map[int]string{1: answer[:8], 2: answer}, answer)

			waitForMetrics(t, p.MetricsAddr(), "the time to the first piece in the metrics",
				`agenthost_model_time_to_first_token_seconds_count{plugin="`+provider+`"} 4`)
		})
	}
}

// runStream is an event stream of one Run, read in the background.
type runStream struct {
	events chan sseEvent
	seen   []sseEvent
	deltas []httpapi.ModelDeltaJSON
	done   bool
}

func openRunStream(t *testing.T, c *apiClient, runID string) *runStream {
	t.Helper()
	resp, err := http.DefaultClient.Do(mustRequest(t, "GET", c.Base+"/v1/runs/"+runID+"/events", c.Token, ""))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the events of %s: %d", runID, resp.StatusCode)
	}
	s := &runStream{events: make(chan sseEvent, 1024)}
	go func() {
		defer close(s.events)
		_ = readSSE(resp.Body, func(ev sseEvent) bool { s.events <- ev; return false })
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return s
}

// until reads the stream until cond holds.
func (s *runStream) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for !cond() {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("the stream ended before %s; it had: %v", what, s.types())
			}
			s.take(t, ev)
		case <-deadline:
			t.Fatalf("no %s within 60s; the stream had: %v", what, s.types())
		}
	}
}

func (s *runStream) take(t *testing.T, ev sseEvent) {
	t.Helper()
	s.seen = append(s.seen, ev)
	switch ev.Event {
	case abi.EmitModelDelta:
		if ev.ID != "" {
			t.Errorf("a model_delta with id %s: deltas are not durable", ev.ID)
		}
		var d httpapi.ModelDeltaJSON
		if err := json.Unmarshal([]byte(ev.Data), &d); err != nil {
			t.Fatalf("a model_delta: %v: %s", err, ev.Data)
		}
		s.deltas = append(s.deltas, d)
	case string(loop.EventRunCompleted), string(loop.EventRunFailed), string(loop.EventRunCancelled):
		s.done = true
	}
}

func (s *runStream) ended() bool { return s.done }

// text is what the deltas of attempt say so far.
func (s *runStream) text(attempt int) string {
	var b strings.Builder
	for _, d := range s.deltas {
		if d.Attempt == attempt {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

// settledModel returns the model effects settled so far, by ID, with
// their committed text.
func (s *runStream) settledModel() map[string]string {
	out := map[string]string{}
	for _, ev := range s.seen {
		if ev.Event != string(loop.EventEffectSettled) {
			continue
		}
		var e loop.Event
		if json.Unmarshal([]byte(ev.Data), &e) != nil || e.Outcome == nil || e.Outcome.Model == nil {
			continue
		}
		out[e.EffectID] = e.Outcome.Model.Message.Content
	}
	return out
}

func (s *runStream) types() []string {
	var ts []string
	for _, ev := range s.seen {
		ts = append(ts, ev.Event)
	}
	return ts
}

// checkPieces checks the ended stream: each attempt's pieces say what
// texts gives, numbered from 1 without a gap, all of them before their
// effect settled, and the settled reply is want.
func (s *runStream) checkPieces(t *testing.T, texts map[int]string, want string) {
	t.Helper()
	settled := s.settledModel()
	if len(settled) != 1 {
		t.Fatalf("%d model effects settled, want 1: %v", len(settled), settled)
	}
	for effect, text := range settled {
		if text != want {
			t.Fatalf("the committed reply is %q, want %q", text, want)
		}
		settledAt := -1
		for i, ev := range s.seen {
			if ev.Event == string(loop.EventEffectSettled) && strings.Contains(ev.Data, effect) {
				settledAt = i
			}
		}
		for i, ev := range s.seen {
			if ev.Event == abi.EmitModelDelta && i > settledAt {
				t.Fatalf("a model_delta came after its effect settled: %v", s.types())
			}
		}
		for _, d := range s.deltas {
			if d.Effect != effect {
				t.Fatalf("a delta of effect %s, want %s", d.Effect, effect)
			}
		}
	}
	next := map[int]int64{}
	for _, d := range s.deltas {
		next[d.Attempt]++
		if d.Seq != next[d.Attempt] {
			t.Fatalf("attempt %d's delta has seq %d, want %d", d.Attempt, d.Seq, next[d.Attempt])
		}
	}
	for attempt, text := range texts {
		if got := s.text(attempt); got != text {
			t.Fatalf("attempt %d's pieces make %q, want %q", attempt, got, text)
		}
	}
	if len(next) != len(texts) {
		t.Fatalf("deltas of attempts %v, want those of %v", next, texts)
	}
}

// waitClosed waits for ch to be closed.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("no %s within 60s", what)
	}
}

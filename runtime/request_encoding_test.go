package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// plannedRequests is a store that records the request of each
// ModelStepPlanned event the runtime commits, as the runtime built it,
// before the store encodes the event.
type plannedRequests struct {
	runtime.Store
	mu       sync.Mutex
	requests []json.RawMessage
}

func (s *plannedRequests) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	s.mu.Lock()
	for _, ev := range c.Events {
		if ev.Type == loop.EventModelStepPlanned {
			s.requests = append(s.requests, bytes.Clone(ev.Request))
		}
	}
	s.mu.Unlock()
	return s.Store.Commit(ctx, c)
}

func (s *plannedRequests) all() []json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]json.RawMessage(nil), s.requests...)
}

// TestTheModelStepsRequestIsStoredWithoutHTMLEscapes: the request the
// runtime builds for a model step, which its ModelStepPlanned event and
// the Run's snapshot hold, has the transcript's <, > and & as one byte
// each, not encoding/json's six (\u003c), reads as the request the
// builder gave, and is stored as it was built.
func TestTheModelStepsRequestIsStoredWithoutHTMLEscapes(t *testing.T) {
	var recorder *plannedRequests
	e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		recorder = &plannedRequests{Store: s}
		return recorder
	}}, nil)
	markup := strings.Repeat("<a&b>", 200)
	input := "answer:" + markup
	res := e.Execute("s1", input)
	if res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusCompleted {
		t.Fatalf("the Run ended %s with status %s, want completed", res.Kind, res.Run.Status)
	}
	requests := recorder.all()
	if len(requests) != 1 {
		t.Fatalf("%d model steps planned, want 1", len(requests))
	}
	built := requests[0]
	for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`} {
		if n := bytes.Count(built, []byte(esc)); n > 0 {
			t.Errorf("the model step's request holds %s %d times: the runtime escaped the transcript's HTML characters, six bytes each", esc, n)
		}
	}
	if !bytes.Contains(built, []byte(markup)) {
		t.Errorf("the model step's request does not hold the input's text as it is: %.200s", built)
	}
	var req abi.ModelRequest
	if err := json.Unmarshal(built, &req); err != nil {
		t.Fatalf("the model step's request is not JSON: %v", err)
	}
	if len(req.Messages) != 1 || req.Messages[0].Content != input {
		t.Fatalf("the model step's request reads as %+v, want the one user message %q", req.Messages, input)
	}

	evs, err := e.Store.Events(context.Background(), "acme", res.Run.ID, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == loop.EventModelStepPlanned && !bytes.Equal(ev.Request, built) {
			t.Errorf("the store read back a request of %d bytes, the runtime built one of %d: %.200s", len(ev.Request), len(built), ev.Request)
		}
	}
}

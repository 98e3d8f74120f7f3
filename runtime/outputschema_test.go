package runtime_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// weatherOutputSchema is the output schema of the weather agent.
const weatherOutputSchema = `{"type":"object","properties":{"city":{"type":"string"},"temp":{"type":"number"}},"required":["city","temp"]}`

// agentSeeingBuilder is a builder that records the agent of every build
// input, and builds as next does.
type agentSeeingBuilder struct {
	next runtime.Builder
	mu   sync.Mutex
	seen []*abi.AgentView
}

func (b *agentSeeingBuilder) Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error) {
	b.mu.Lock()
	b.seen = append(b.seen, in.Agent)
	b.mu.Unlock()
	return b.next.Build(ctx, tenant, in)
}

// TestAnAnswerThatFailsTheOutputSchemaIsAskedAgain: the weather agent's
// Runs are pinned to its output schema, which the builder is given; the
// scripted model's first answer is not JSON, so the Loop tells it why and
// asks again, and its second answer, valid JSON, is the Run's result.
func TestAnAnswerThatFailsTheOutputSchemaIsAskedAgain(t *testing.T) {
	var builder *agentSeeingBuilder
	e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}, func(tn *runtime.Tenant) {
		builder = &agentSeeingBuilder{next: tn.Builder}
		tn.Agents = map[string]*runtime.Agent{"weather": {Name: "weather", Version: "v-weather", Builder: builder, Model: tn.Model,
			Tools: tn.Tools, Limits: tn.Limits, ModelPolicy: tn.ModelPolicy, OutputSchema: json.RawMessage(weatherOutputSchema)}}
	})
	const answer = `{"city": "Paris", "temp": 21.5}`
	run := submitAs(t, e, "weather", "s1", "answer:It is 21.5 degrees in Paris.|answer:"+answer)
	run = e.UntilTerminal(e.Runtime, run.ID, 100*time.Millisecond)
	if run.Status != loop.StatusCompleted || run.Result != answer {
		t.Fatalf("the Run: %s, result %q, failure %+v; want completed with the JSON answer", run.Status, run.Result, run.Failure)
	}
	if run.Agent == nil || string(run.Agent.OutputSchema) != weatherOutputSchema {
		t.Fatalf("the Run's pin %+v does not carry the agent's output schema", run.Agent)
	}

	// The transcript: the input, the refused answer, the Loop's message
	// saying why, the answer that passed.
	tr := run.Transcript
	if len(tr) != 4 || tr[1].Content != "It is 21.5 degrees in Paris." || tr[2].Role != abi.MessageUser || tr[3].Content != answer {
		t.Fatalf("the transcript: %+v", tr)
	}
	for _, want := range []string{loop.OutputRetryPrefix + "it is not valid JSON", "The output schema: " + weatherOutputSchema} {
		if !strings.Contains(tr[2].Content, want) {
			t.Errorf("the message to the model %q does not say %q", tr[2].Content, want)
		}
	}
	// The second model request carried it to the model.
	var requests []abi.ModelRequest
	for _, ev := range ctxEvents(t, e, run.ID) {
		if ev.Type == loop.EventModelStepPlanned {
			var req abi.ModelRequest
			if err := json.Unmarshal(ev.Request, &req); err != nil {
				t.Fatal(err)
			}
			requests = append(requests, req)
		}
	}
	if len(requests) != 2 || requests[1].Messages[len(requests[1].Messages)-1].Content != tr[2].Content {
		t.Fatalf("the model requests: %+v; want two, the second ending with the Loop's message", requests)
	}
	builder.mu.Lock()
	defer builder.mu.Unlock()
	for i, a := range builder.seen {
		if a == nil || string(a.OutputSchema) != weatherOutputSchema {
			t.Errorf("build %d was given the agent %+v, want its output schema", i+1, a)
		}
	}
	if v := loop.CheckEnded(ctxEvents(t, e, run.ID)); len(v) > 0 {
		t.Fatalf("the Run's log: %v", v)
	}
}

package loop

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

const weatherSchema = `{"type":"object","properties":{"city":{"type":"string"},"temp":{"type":"number"}},"required":["city","temp"],"additionalProperties":false}`

// outputRun returns a started Run of an agent with the given output
// schema and max_steps.
func outputRun(t *testing.T, schema string, maxSteps int) Run {
	t.Helper()
	spec := baseSpec()
	spec.Limits.MaxSteps = maxSteps
	spec.Agent = &AgentPin{Name: "weather", Version: "v-1"}
	if schema != "" {
		spec.Agent.OutputSchema = json.RawMessage(schema)
	}
	return mustApply(t, Run{}, RunCreated(spec, 1), Event{Type: EventRunStarted, At: 2})
}

// answer plans the Run's next model step, dispatches it and settles it
// with an assistant message of content.
func answer(t *testing.T, r Run, content string) Run {
	t.Helper()
	step := r.Step + 1
	id := ModelEffectID(r.ID, step)
	at := int64(10 * step)
	return mustApply(t, r,
		Event{Type: EventModelStepPlanned, At: at, Step: step, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: at + 1, EffectID: id, Attempt: 1, Epoch: 1},
		Settled(id, 1, Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{
			Message: abi.Message{Role: abi.MessageAssistant, Content: content}}}, at+2),
	)
}

// retryMessage returns the message the Loop asked the model again with,
// failing the test if the Run did not ask again.
func retryMessage(t *testing.T, r Run) string {
	t.Helper()
	if r.Verdict != nil {
		t.Fatalf("the Run is ending (%+v), want it to ask the model again", r.Verdict)
	}
	last := r.Transcript[len(r.Transcript)-1]
	if last.Role != abi.MessageUser || !strings.HasPrefix(last.Content, OutputRetryPrefix) {
		t.Fatalf("the transcript ends with %+v, want a user message that begins %q", last, OutputRetryPrefix)
	}
	if acts := Decide(r); len(acts) != 1 || acts[0].Type != ActionPlanModelStep {
		t.Fatalf("Decide: %+v, want one plan_model_step", acts)
	}
	return last.Content
}

// TestAnAnswerThatIsNotJSONIsToldWhyAndAskedAgain: the model's answer
// that is not JSON stays in the transcript, a user message says why and
// asks for the JSON alone, and the next answer, valid, completes the Run
// with its text as the result.
func TestAnAnswerThatIsNotJSONIsToldWhyAndAskedAgain(t *testing.T) {
	r := answer(t, outputRun(t, weatherSchema, 4), "It is 21 degrees in Paris.")
	msg := retryMessage(t, r)
	for _, want := range []string{"it is not valid JSON", "invalid character 'I'", "only one JSON value", "no code fence",
		"The output schema: " + weatherSchema} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message to the model %q does not say %q", msg, want)
		}
	}
	if got := r.Transcript[len(r.Transcript)-2]; got.Role != abi.MessageAssistant || got.Content != "It is 21 degrees in Paris." {
		t.Errorf("the refused answer is not kept before the message: %+v", got)
	}
	if r.Status != StatusRunning || len(r.Effects) != 0 {
		t.Fatalf("the Run is %s with effects %+v, want running and ready for a step", r.Status, r.Effects)
	}

	const valid = " {\"city\": \"Paris\", \"temp\": 21.5}\n"
	r = answer(t, r, valid)
	if r.Verdict == nil || r.Verdict.Status != StatusCompleted || r.Verdict.Result != valid {
		t.Fatalf("verdict %+v, want completed with the answer as the model wrote it", r.Verdict)
	}
	acts := Decide(r)
	if len(acts) != 1 || acts[0].Type != ActionComplete {
		t.Fatalf("Decide: %+v", acts)
	}
	r = mustApply(t, r, Event{Type: EventRunCompleted, At: 100, Result: valid})
	if r.Status != StatusCompleted || r.Result != valid || r.Step != 2 {
		t.Fatalf("the Run: %s, result %q, step %d", r.Status, r.Result, r.Step)
	}
}

// TestAnAnswerThatFailsTheSchemaIsToldEachProblem: JSON that breaks the
// schema gets the problems, sorted, with their paths and rules.
func TestAnAnswerThatFailsTheSchemaIsToldEachProblem(t *testing.T) {
	r := answer(t, outputRun(t, weatherSchema, 4), `{"temp":"warm","wind":3}`)
	msg := retryMessage(t, r)
	want := OutputRetryPrefix + "it does not match the output schema: " +
		"at the top level: additional properties 'wind' not allowed (rule #/additionalProperties); " +
		"at the top level: missing property 'city' (rule #/required); " +
		"at /temp: got string, want number (rule #/properties/temp/type)."
	if !strings.HasPrefix(msg, want) {
		t.Fatalf("the message is\n%s\nwant it to begin\n%s", msg, want)
	}
	// Other JSON values than objects are checked as they are.
	for _, c := range []struct{ answer, want string }{
		{`"Paris"`, "got string, want object"},
		{`[1,2]`, "got array, want object"},
		{`{"city":"Paris","temp":1} {}`, "not one JSON value: something follows the first value"},
		{`{"city":"Paris","city":"Lyon","temp":1}`, `"city" appears twice`},
		{"   ", "it is empty"},
		{"```json\n{\"city\":\"Paris\",\"temp\":1}\n```", "not valid JSON"},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), "deeper than 64"},
	} {
		r := answer(t, outputRun(t, weatherSchema, 4), c.answer)
		if msg := retryMessage(t, r); !strings.Contains(msg, c.want) {
			t.Errorf("answer %q: the message %q does not say %q", c.answer, msg, c.want)
		}
	}
}

// TestManyProblemsAreCountedAndTheMessageIsBounded: past the first few
// problems the message counts them, and a huge answer or schema keeps it
// short.
func TestManyProblemsAreCountedAndTheMessageIsBounded(t *testing.T) {
	var props, vals []string
	for i := range 20 {
		props = append(props, fmt.Sprintf(`"p%02d":{"type":"integer"}`, i))
		vals = append(vals, fmt.Sprintf(`"p%02d":"%s"`, i, strings.Repeat("x", 300)))
	}
	schema := `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
	msg := retryMessage(t, answer(t, outputRun(t, schema, 4), `{`+strings.Join(vals, ",")+`}`))
	if !strings.Contains(msg, "at /p00: got string, want integer") || !strings.Contains(msg, "and 12 more problem(s)") {
		t.Errorf("the message does not list the first problems and count the rest: %s", msg)
	}
	big := `{"type":"object","description":"` + strings.Repeat("d", 8000) + `"}`
	msg = retryMessage(t, answer(t, outputRun(t, big, 4), strings.Repeat("not json ", 10000)))
	if len(msg) > maxOutputWhy+512 || strings.Contains(msg, "The output schema:") {
		t.Errorf("the message is %d bytes (quoting the schema: %v), want it bounded and the large schema left out",
			len(msg), strings.Contains(msg, "The output schema:"))
	}
}

// TestAnInvalidLastAnswerFailsTheRunSayingWhy: when max_steps leaves no
// step to ask again, the Run fails as limit_exceeded, naming the output
// schema and what was wrong.
func TestAnInvalidLastAnswerFailsTheRunSayingWhy(t *testing.T) {
	for _, steps := range []int{1, 2} {
		r := outputRun(t, weatherSchema, steps)
		for i := 0; i < steps; i++ {
			r = answer(t, r, `{"city":"Paris"}`)
		}
		v := r.Verdict
		if v == nil || v.Status != StatusFailed || v.Failure.Class != abi.ClassLimitExceeded {
			t.Fatalf("max_steps %d: verdict %+v, want failed as limit_exceeded", steps, v)
		}
		for _, want := range []string{fmt.Sprintf("max_steps %d reached", steps), "before an answer that matches the agent's output_schema", "step " + fmt.Sprint(steps) + ") was refused", "missing property 'temp'"} {
			if !strings.Contains(v.Failure.Message, want) {
				t.Errorf("max_steps %d: the failure %q does not say %q", steps, v.Failure.Message, want)
			}
		}
		if acts := Decide(r); len(acts) != 1 || acts[0].Type != ActionFail {
			t.Fatalf("Decide: %+v", acts)
		}
	}
}

// TestWithoutAnOutputSchemaAnyAnswerCompletes: an agent without an output
// schema, and a Run without an agent, complete with any text; a question
// for the user or tool calls are not final answers and are not checked.
func TestWithoutAnOutputSchemaAnyAnswerCompletes(t *testing.T) {
	for _, r := range []Run{outputRun(t, "", 4), outputRun(t, "null", 4), mustApply(t, Run{}, RunCreated(baseSpec(), 1), Event{Type: EventRunStarted, At: 2})} {
		if r = answer(t, r, "plain text"); r.Verdict == nil || r.Verdict.Status != StatusCompleted || r.Verdict.Result != "plain text" {
			t.Fatalf("verdict %+v", r.Verdict)
		}
	}
	r := outputRun(t, weatherSchema, 4)
	r = mustApply(t, r,
		Event{Type: EventModelStepPlanned, At: 10, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 11, EffectID: "run_1.m1", Attempt: 1, Epoch: 1},
		Settled("run_1.m1", 1, Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{
			Message: abi.Message{Content: "Which city?"}, AwaitInput: &abi.AwaitInput{Prompt: "Which city?"}}}, 12))
	if r.Status != StatusWaiting || r.Verdict != nil || r.Transcript[len(r.Transcript)-1].Role != abi.MessageAssistant {
		t.Fatalf("a question: %s %+v", r.Status, r.Verdict)
	}
}

// TestAnOutputSchemaThatCannotCompileFailsTheRun: a pin whose schema the
// config would have refused fails the Run when it is needed, saying so.
func TestAnOutputSchemaThatCannotCompileFailsTheRun(t *testing.T) {
	r := answer(t, outputRun(t, `{"$ref":"https://example.com/s.json"}`, 4), `{}`)
	if v := r.Verdict; v == nil || v.Status != StatusFailed || v.Failure.Class != abi.ClassPluginProtocol ||
		!strings.Contains(v.Failure.Message, "output_schema cannot check answers") {
		t.Fatalf("verdict %+v", r.Verdict)
	}
}

// TestTheOutputCheckIsDeterministic: the same answer gives the same
// snapshot, from a fresh compile or the cache, and after the snapshot's
// JSON round trip (which changes the schema's bytes).
func TestTheOutputCheckIsDeterministic(t *testing.T) {
	schema := " {\n \"type\": \"object\", \"properties\": {\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"string\"}}, \"additionalProperties\": false }"
	r := outputRun(t, schema, 4)
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if string(back.Agent.OutputSchema) == string(r.Agent.OutputSchema) {
		t.Fatal("the round trip kept the schema's bytes; the test needs them to change")
	}
	const bad = `{"c":1,"b":2,"a":3,"z":0,"y":0,"x":0,"w":0}`
	first, _ := json.Marshal(answer(t, r, bad))
	for i := range 30 {
		if i%2 == 0 {
			schemaCache.Lock()
			schemaCache.m = nil // a fresh compile
			schemaCache.Unlock()
		}
		for _, from := range []Run{r, back} {
			got, _ := json.Marshal(answer(t, from, bad))
			if string(got) != string(first) {
				t.Fatalf("the snapshot changed:\n%s\n%s", first, got)
			}
		}
	}
	if msg := retryMessage(t, answer(t, r, bad)); !strings.Contains(msg, "additional properties 'w', 'x', 'y', 'z'") {
		t.Fatalf("the message %q does not list the additional properties in order", msg)
	}
}

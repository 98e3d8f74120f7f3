package loop

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

const calcSchema = `{"type":"object","properties":{"expression":{"type":"string","minLength":1}},"required":["expression"],"additionalProperties":false}`

func mustCompile(t *testing.T, schema string) *ToolSchema {
	t.Helper()
	s, err := CompileToolSchema(json.RawMessage(schema))
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	return s
}

func TestArgumentsThatMatchTheSchemaPass(t *testing.T) {
	s := mustCompile(t, calcSchema)
	for _, args := range []string{`{"expression":"1+2"}`, ` {"expression":"é"} `} {
		if err := s.Check(json.RawMessage(args)); err != nil {
			t.Errorf("%s: %v", args, err)
		}
	}
	// No arguments read as {}, which an empty schema accepts.
	for _, args := range []string{``, `null`, `{}`} {
		if err := mustCompile(t, `{"type":"object"}`).Check(json.RawMessage(args)); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

func TestInvalidArgumentsNameThePathAndTheRule(t *testing.T) {
	s := mustCompile(t, `{"type":"object","properties":{
		"n":{"type":"integer","maximum":10},
		"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]+$"}},
		"mode":{"enum":["fast","slow"]},
		"a/b":{"type":"boolean"}},
		"required":["n"]}`)
	for _, c := range []struct{ args, path, rule, problem string }{
		{`{"n":"7"}`, "/n", "#/properties/n/type", "want integer"},
		{`{"n":11}`, "/n", "#/properties/n/maximum", "maximum"},
		{`{}`, "", "#/required", "missing property 'n'"},
		{`{"n":1,"tags":["ok","NO"]}`, "/tags/1", "#/properties/tags/items/pattern", "does not match pattern"},
		{`{"n":1,"mode":"medium"}`, "/mode", "#/properties/mode/enum", "one of 'fast', 'slow'"},
		{`{"n":1,"a/b":3}`, "/a~1b", "#/properties/a~1b/type", "want boolean"},
	} {
		err := s.Check(json.RawMessage(c.args))
		var ae *ArgumentsError
		if !errors.As(err, &ae) {
			t.Errorf("%s: got %v, want an *ArgumentsError", c.args, err)
			continue
		}
		if ae.Path != c.path || ae.Keyword != c.rule || !strings.Contains(ae.Problem, c.problem) {
			t.Errorf("%s: got path %q rule %q problem %q, want %q %q …%s…", c.args, ae.Path, ae.Keyword, ae.Problem, c.path, c.rule, c.problem)
		}
		if msg := err.Error(); !strings.Contains(msg, c.rule) {
			t.Errorf("%s: the message %q does not name the rule", c.args, msg)
		}
	}
}

func TestHostileSchemasAreRefusedWhenCompiled(t *testing.T) {
	for name, c := range map[string]struct{ schema, want string }{
		"not JSON":                  {`{"type":`, "not JSON"},
		"not a schema":              {`{"type":5}`, "type"},
		"a bad regular expression":  {`{"type":"object","properties":{"a":{"pattern":"("}}}`, "pattern"},
		"a file reference":          {`{"$ref":"file:///etc/passwd"}`, "outside the schema"},
		"a remote reference":        {`{"$ref":"https://example.com/s.json"}`, "outside the schema"},
		"a relative reference":      {`{"$ref":"other.json"}`, "outside the schema"},
		"a remote metaschema":       {`{"$schema":"https://example.com/meta","type":"object"}`, "outside the schema"},
		"a dynamic reference":       {`{"$dynamicAnchor":"a","$dynamicRef":"#a"}`, "$dynamicRef"},
		"a cycle on one value":      {`{"$defs":{"a":{"allOf":[{"$ref":"#/$defs/b"}]},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`, "cycle"},
		"a reference to a missing":  {`{"$ref":"#/$defs/nope"}`, "nope"},
		"a self reference at once:": {`{"$ref":"#"}`, "cycle"},
		"too deep":                  {strings.Repeat(`{"not":`, 65) + `{}` + strings.Repeat(`}`, 65), "nests 66 levels deep, over the limit of 64"},
		"too large":                 {`{"type":"object","description":"` + strings.Repeat("x", 64<<10) + `"}`, "over the limit of 65536"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := CompileToolSchema(json.RawMessage(c.schema))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error about %q", err, c.want)
			}
		})
	}
}

func TestSchemaDepthIsCountedOutsideStrings(t *testing.T) {
	for _, c := range []struct {
		json string
		want int
	}{{`{}`, 1}, {`{"a":[{"b":"[[[{{{"}]}`, 3}, {`{"a":"\"{"}`, 1}, {`"x"`, 0}} {
		if got := jsonDepth([]byte(c.json)); got != c.want {
			t.Errorf("%s: depth %d, want %d", c.json, got, c.want)
		}
	}
	// The deepest schema allowed compiles.
	mustCompile(t, strings.Repeat(`{"not":`, 63)+`{}`+strings.Repeat(`}`, 63))
}

func TestARecursiveSchemaThatDescendsIsAccepted(t *testing.T) {
	s := mustCompile(t, `{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"}`)
	if err := s.Check(json.RawMessage(`{"v":1,"kids":[{"v":2,"kids":[{"v":3}]}]}`)); err != nil {
		t.Fatal(err)
	}
	err := s.Check(json.RawMessage(`{"v":1,"kids":[{"v":2,"kids":[{"v":"x"}]}]}`))
	var ae *ArgumentsError
	if !errors.As(err, &ae) || ae.Path != "/kids/0/kids/0/v" {
		t.Fatalf("got %v", err)
	}
}

// exponentialSchema doubles the work at each of n levels of allOf: a
// schema of a few hundred bytes that would take 2^n evaluations.
func exponentialSchema(n int) string {
	var defs []string
	for i := 0; i < n; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, fmt.Sprintf(`"d%d":{"type":"object"}`, n))
	return `{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/d0"}`
}

func TestWorkIsBoundedBeforeValidating(t *testing.T) {
	// 2^60 evaluations: refused from the bound, without running.
	s := mustCompile(t, exponentialSchema(60))
	err := s.Check(json.RawMessage(`{}`))
	if err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("got %v, want a refusal from the bound", err)
	}
	// The same shape, small, runs.
	if err := mustCompile(t, exponentialSchema(4)).Check(json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	// Doubling at every level of the arguments: bounded by their depth.
	deep := mustCompile(t, `{"$defs":{"a":{"allOf":[{"properties":{"x":{"$ref":"#/$defs/a"}}},{"properties":{"x":{"$ref":"#/$defs/a"}}}]}},"$ref":"#/$defs/a"}`)
	nest := func(n int) string { return strings.Repeat(`{"x":`, n) + `{}` + strings.Repeat(`}`, n) }
	if err := deep.Check(json.RawMessage(nest(5))); err != nil {
		t.Fatalf("shallow: %v", err)
	}
	if err := deep.Check(json.RawMessage(nest(40))); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("deep: got %v, want a refusal from the bound", err)
	}
	// A long string against a long pattern, and long keys against
	// patternProperties.
	long := `"` + strings.Repeat("a", 1<<20) + `"`
	pat := mustCompile(t, `{"type":"object","properties":{"s":{"type":"string","pattern":"^(`+strings.Repeat("a", 100)+`)*$"}}}`)
	if err := pat.Check(json.RawMessage(`{"s":` + long + `}`)); err == nil || !strings.Contains(err.Error(), "send shorter strings") {
		t.Fatalf("pattern: got %v, want a refusal from the bound", err)
	}
	if err := pat.Check(json.RawMessage(`{"s":"` + strings.Repeat("a", 1000) + `"}`)); err != nil {
		t.Fatalf("pattern, short: %v", err)
	}
	keys := mustCompile(t, `{"type":"object","patternProperties":{"^(`+strings.Repeat("b", 100)+`)*$":{}}}`)
	if err := keys.Check(json.RawMessage(`{` + long + `:1}`)); err == nil || !strings.Contains(err.Error(), "send shorter strings") {
		t.Fatalf("keys: got %v, want a refusal from the bound", err)
	}
	// Many values times a wide schema.
	wide := mustCompile(t, `{"type":"object","properties":{"a":{"type":"array","items":{"enum":[`+strings.Repeat(`1,`, 999)+`1]}}}}`)
	if err := wide.Check(json.RawMessage(`{"a":[` + strings.Repeat(`1,`, 999) + `1]}`)); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("wide: got %v, want a refusal from the bound", err)
	}
}

func TestHostileArgumentsAreRefused(t *testing.T) {
	s := mustCompile(t, `{"type":"object"}`)
	for name, c := range map[string]struct{ args, want string }{
		"an array":            {`[1]`, "must be a JSON object"},
		"a string":            {`"x"`, "must be a JSON object"},
		"not JSON":            {`{"a":}`, "not valid JSON"},
		"trailing bytes":      {`{} {}`, "not one JSON value"},
		"a key twice":         {`{"a":1,"a":"x"}`, `"a" appears twice`},
		"nested too deep":     {strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100), "deeper than 64"},
		"a deep array":        {`{"a":` + strings.Repeat(`[`, 1000) + strings.Repeat(`]`, 1000) + `}`, "deeper than 64"},
		"unterminated object": {`{"a":1`, "not valid JSON"},
	} {
		t.Run(name, func(t *testing.T) {
			err := s.Check(json.RawMessage(c.args))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	// Numbers keep their precision.
	big := mustCompile(t, `{"type":"object","properties":{"n":{"maximum":9007199254740993}}}`)
	if err := big.Check(json.RawMessage(`{"n":9007199254740993}`)); err != nil {
		t.Fatal(err)
	}
	if err := big.Check(json.RawMessage(`{"n":9007199254740994}`)); err == nil {
		t.Fatal("a number one over the maximum passed")
	}
	if err := big.Check(json.RawMessage(`{"n":1e400}`)); err == nil {
		t.Fatal("1e400 passed a maximum")
	}
}

func TestTheMessageDoesNotDependOnMapOrder(t *testing.T) {
	s := mustCompile(t, `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"}},"additionalProperties":false}`)
	args := json.RawMessage(`{"c":1,"b":2,"a":3,"z":0,"y":0,"x":0}`)
	first := s.Check(args).Error()
	for range 50 {
		// A fresh compile each time too: the cache holds no state that matters.
		fresh, err := compileToolSchema(json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"}},"additionalProperties":false}`))
		if err != nil {
			t.Fatal(err)
		}
		for _, sch := range []*ToolSchema{s, fresh} {
			if got := sch.Check(args).Error(); got != first {
				t.Fatalf("the message changed:\n%s\n%s", first, got)
			}
		}
	}
	if !strings.Contains(first, "additional properties 'x', 'y', 'z'") && !strings.HasPrefix(first, "at /a") {
		t.Fatalf("unexpected first problem: %s", first)
	}
}

func TestCompiledSchemasAreSafeForConcurrentUse(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				schema := fmt.Sprintf(`{"type":"object","properties":{"n":{"maximum":%d}}}`, (i+j)%5)
				s, err := CompileToolSchema(json.RawMessage(schema))
				if err != nil {
					t.Error(err)
					return
				}
				if err := s.Check(json.RawMessage(`{"n":100}`)); err == nil {
					t.Error("100 passed a maximum under 5")
				}
			}
		}()
	}
	wg.Wait()
}

// toolCallRun returns a Run with tool calc (input_schema calcSchema) whose
// model step has just answered with the given tool calls.
func toolCallRun(t *testing.T, approval bool, calls ...abi.ToolCall) Run {
	t.Helper()
	spec := baseSpec()
	spec.Tools[0].InputSchema = json.RawMessage(calcSchema)
	spec.Tools[0].Approval = approval
	r := mustApply(t, Run{},
		RunCreated(spec, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1, Epoch: 7},
	)
	return mustApply(t, r, Event{Type: EventEffectSettled, At: 5, EffectID: "run_1.m1", Attempt: 1,
		Outcome: &Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant, ToolCalls: calls}}}})
}

func TestACallWithInvalidArgumentsSettlesAtOnceAndIsNeverDispatched(t *testing.T) {
	for _, approval := range []bool{false, true} {
		r := toolCallRun(t, approval,
			abi.ToolCall{ID: "good", Name: "calc", Arguments: json.RawMessage(`{"expression":"1+1"}`)},
			abi.ToolCall{ID: "bad", Name: "calc", Arguments: json.RawMessage(`{"expression":7}`)})
		bad := r.Effects[2]
		if bad.State != EffectSettled || bad.Outcome.Error == nil || bad.Outcome.Error.Class != abi.ClassInvalidArguments {
			t.Fatalf("approval %v: the bad call is %+v", approval, bad)
		}
		msg := bad.Outcome.Error.Message
		for _, want := range []string{"tool calc was not called", "at /expression", "#/properties/expression/type", "input_schema"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the message %q does not say %q", msg, want)
			}
		}
		for _, a := range Decide(r) {
			if a.EffectID == bad.ID || (a.Type == ActionAwaitApproval && strings.Contains(strings.Join(a.ToolCallIDs, ","), "bad")) {
				t.Fatalf("approval %v: Decide acts on the bad call: %+v", approval, a)
			}
		}
		want := EffectReady
		if approval {
			want = EffectAwaitingApproval
		}
		if r.Effects[1].State != want {
			t.Fatalf("approval %v: the good call is %s, want %s", approval, r.Effects[1].State, want)
		}
	}
}

func TestTheModelSeesTheArgumentErrorAsAToolResult(t *testing.T) {
	r := toolCallRun(t, false, abi.ToolCall{ID: "bad", Name: "calc", Arguments: json.RawMessage(`{"expr":"1"}`)})
	// The only call settled at once, so the step closed and the model is
	// asked again with the error in the transcript.
	last := r.Transcript[len(r.Transcript)-1]
	if last.Role != abi.MessageTool || last.ToolCallID != "bad" || !last.IsError ||
		!strings.HasPrefix(last.Content, "error (invalid_arguments): ") || !strings.Contains(last.Content, "#/") {
		t.Fatalf("the tool message is %+v", last)
	}
	if acts := Decide(r); len(acts) != 1 || acts[0].Type != ActionPlanModelStep {
		t.Fatalf("Decide: %+v", acts)
	}
}

func TestArgumentCheckIsDeterministicAcrossASnapshotRoundTrip(t *testing.T) {
	spec := baseSpec()
	spec.Tools[0].InputSchema = json.RawMessage(" {\n \"type\": \"object\", \"properties\": {\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}}, \"additionalProperties\": false }")
	r := mustApply(t, Run{},
		RunCreated(spec, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1, Epoch: 7},
	)
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if string(back.Tools[0].InputSchema) == string(r.Tools[0].InputSchema) {
		t.Fatal("the round trip kept the schema's bytes; the test needs them to change")
	}
	ev := Event{Type: EventEffectSettled, At: 5, EffectID: "run_1.m1", Attempt: 1,
		Outcome: &Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{
			{Name: "calc", Arguments: json.RawMessage(`{"b":1,"a":2,"c":3,"d":4}`)}}}}}}
	a, b := mustApply(t, r, ev), mustApply(t, back, ev)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("the snapshots differ:\n%s\n%s", ja, jb)
	}
	if a.Transcript[len(a.Transcript)-1].Content == "" || !a.Transcript[len(a.Transcript)-1].IsError {
		t.Fatalf("no tool error: %+v", a.Transcript)
	}
}

func TestAToolWithoutASchemaTakesAnyObject(t *testing.T) {
	spec := baseSpec() // calc has no input_schema
	r := mustApply(t, Run{},
		RunCreated(spec, 1),
		Event{Type: EventRunStarted, At: 2},
		Event{Type: EventModelStepPlanned, At: 3, Step: 1, Request: json.RawMessage(`{"messages":[]}`)},
		Event{Type: EventEffectDispatched, At: 4, EffectID: "run_1.m1", Attempt: 1, Epoch: 7},
		Event{Type: EventEffectSettled, At: 5, EffectID: "run_1.m1", Attempt: 1,
			Outcome: &Outcome{State: OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{ToolCalls: []abi.ToolCall{
				{Name: "calc", Arguments: json.RawMessage(`{"anything":[1,2,3]}`)}}}}}},
	)
	if r.Effects[1].State != EffectReady {
		t.Fatalf("the call is %s", r.Effects[1].State)
	}
}

func TestASchemaThatDoesNotCompileFailsTheCallWithoutCallingThePlugin(t *testing.T) {
	f := checkArguments(ToolSpec{Name: "calc", InputSchema: json.RawMessage(`{"$ref":"https://example.com/x"}`)}, json.RawMessage(`{}`))
	if f == nil || f.Class != abi.ClassPluginProtocol || !strings.Contains(f.Message, "describe reply must be fixed") {
		t.Fatalf("got %+v", f)
	}
}

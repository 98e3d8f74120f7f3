package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

const scriptedModelC = "scripted-model-c"

// The C scripted model passes the Go model's own tests, with the C
// calculator: the pair `make run` loads.
func TestScriptedModelC(t *testing.T) { testScriptedModel(t, scriptedModelC, calculatorC) }

// TestScriptedModelCMatchesGo sends the Go and the C scripted models the
// same calls, thousands of model requests made at random from the rules'
// own edges, and wants the same replies: the same outcome JSON (usage
// included), or the same failure. The one place the two may word a reply
// differently is a syntax error in the use form's JSON arguments
// (README.md of scripted-model-c): there both must say that they are not
// JSON, in the same sentence.
func TestScriptedModelCMatchesGo(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	g, c := e.executor(t, "scripted-model", nil), e.executor(t, scriptedModelC, nil)
	gp, cp := e.load(t, "scripted-model", abi.RoleExecutor, func(s *host.PluginSpec) { s.Name = "go-describe" }),
		e.load(t, scriptedModelC, abi.RoleExecutor, func(s *host.PluginSpec) { s.Name = "c-describe" })
	if gd, cd := gp.Describe(), cp.Describe(); !reflect.DeepEqual(gd, cd) {
		t.Fatalf("describe differs:\n Go %+v\n  C %+v", gd, cd)
	}

	same := func(what string, call runtime.EffectCall, start func(*host.Executor) (abi.EffectReply, error)) {
		t.Helper()
		want, werr := start(g)
		got, gerr := start(c)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: errors differ:\n Go %v\n  C %v\ninput %s", what, werr, gerr, mustJSON(t, call.Input))
		}
		if werr != nil {
			if classOf(t, werr) != classOf(t, gerr) {
				t.Fatalf("%s: error classes differ:\n Go %v\n  C %v", what, werr, gerr)
			}
			return
		}
		if !sameReply(t, want, got) {
			t.Fatalf("%s: replies differ:\n Go %s\n  C %s\ninput %s", what, mustJSON(t, want), mustJSON(t, got), mustJSON(t, call.Input))
		}
	}
	rng := rand.New(rand.NewSource(1))
	reached := map[string]int{}
	for i := 0; i < 3000; i++ {
		call := modelCall(fmt.Sprintf("run_1.m%d", i), randomModelRequest(rng))
		same(fmt.Sprintf("request %d", i), call, func(x *host.Executor) (abi.EffectReply, error) {
			r, err := x.Start(ctx, call)
			if x == g && err == nil && r.State == abi.StateDone {
				reached[replyKind(t, r)]++
			}
			return r, err
		})
	}
	// The requests reach every rule and every way of answering.
	for _, kind := range replyKinds {
		if reached[kind] == 0 {
			t.Errorf("no request got a reply of the kind %q: %v", kind, reached)
		}
	}
	// The exports and inputs that are not a model request.
	for i, raw := range []string{`[1,2]`, `"x"`, `{"messages":{}}`, `{"messages":[{"role":1}]}`, `{"tools":[{"name":2}]}`, `{"params":[]}`, `null`} {
		call := modelCall("run_1.bad", abi.ModelRequest{})
		call.Input.Effect.Request = json.RawMessage(raw)
		same(fmt.Sprintf("bad request %d %s", i, raw), call, func(x *host.Executor) (abi.EffectReply, error) { return x.Start(ctx, call) })
	}
	for _, kind := range []abi.EffectKind{abi.KindTool, "", "mo\"del"} {
		call := modelCall("run_1.kind", abi.ModelRequest{})
		call.Input.Effect.Kind = kind
		same("kind "+string(kind), call, func(x *host.Executor) (abi.EffectReply, error) { return x.Start(ctx, call) })
	}
	call := modelCall("run_1.m1", abi.ModelRequest{})
	same("poll", call, func(x *host.Executor) (abi.EffectReply, error) { return x.Poll(ctx, call) })
	same("attach", call, func(x *host.Executor) (abi.EffectReply, error) { return x.Attach(ctx, call) })
	same("cancel", call, func(x *host.Executor) (abi.EffectReply, error) {
		r, err := x.Cancel(ctx, call)
		return abi.EffectReply{State: r.State}, err
	})
	noAttempt := call
	noAttempt.Input.Effect.Attempt = 0
	same("no attempt", noAttempt, func(x *host.Executor) (abi.EffectReply, error) { return x.Start(ctx, noAttempt) })
}

// notJSON is where a use form's reply about arguments that are not JSON
// goes on in each build's own words.
const notJSON = ": they are not JSON"

// sameReply compares two replies, their outcomes as JSON values; a reply
// about use arguments that are not JSON is compared up to notJSON.
func sameReply(t *testing.T, a, b abi.EffectReply) bool {
	t.Helper()
	if a.State != b.State || !reflect.DeepEqual(a.Error, b.Error) {
		return a.State == b.State && a.State == abi.StateFailed && a.Error != nil && b.Error != nil &&
			strings.Contains(a.Error.Message, "request is not a model request: ") &&
			upTo(a.Error.Message, "request is not a model request: ") == upTo(b.Error.Message, "request is not a model request: ")
	}
	if len(a.Outcome) == 0 || len(b.Outcome) == 0 {
		return len(a.Outcome) == len(b.Outcome)
	}
	var oa, ob abi.ModelOutcome
	if json.Unmarshal(a.Outcome, &oa) != nil || json.Unmarshal(b.Outcome, &ob) != nil {
		return false
	}
	if i := strings.Index(oa.Message.Content, notJSON); i >= 0 && strings.HasPrefix(oa.Message.Content, "I could not read the arguments for ") {
		if upTo(ob.Message.Content, notJSON) != oa.Message.Content[:i] {
			return false
		}
		oa.Message.Content, ob.Message.Content = "", ""
		oa.Usage.OutputTokens, ob.Usage.OutputTokens = 0, 0
	}
	if len(oa.Message.ToolCalls) != len(ob.Message.ToolCalls) {
		return false
	}
	for i := range oa.Message.ToolCalls {
		if !bytes.Equal(asWritten(t, oa.Message.ToolCalls[i].Arguments), asWritten(t, ob.Message.ToolCalls[i].Arguments)) {
			return false
		}
	}
	return reflect.DeepEqual(jsonValue(t, oa), jsonValue(t, ob))
}

// asWritten is raw JSON without white space between tokens and with
// the characters Go's encoder escapes escaped: what differs between two
// writings of one value other than how its numbers, strings and keys are
// written, which must be the same.
func asWritten(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	var c, h bytes.Buffer
	if len(raw) == 0 {
		return nil
	}
	if err := json.Compact(&c, raw); err != nil {
		t.Fatalf("arguments %s: %v", raw, err)
	}
	json.HTMLEscape(&h, c.Bytes())
	return h.Bytes()
}

// upTo is s up to sep, or s when sep is not in it.
func upTo(s, sep string) string {
	if i := strings.Index(s, sep); i >= 0 {
		return s[:i]
	}
	return s
}

func jsonValue(t *testing.T, v any) any {
	t.Helper()
	var out any
	if err := json.Unmarshal(mustJSON(t, v), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// questions are user messages that reach each rule, its edges, and text
// the rules must leave alone.
var questions = []string{
	"What is (2+3)*4?", "What is 2+3 and 4*5?", "what is -3?", "1/0 + 2", "2 ^ 10.", "1.5*2", "3 . 4 + 1", "12.5.3+1",
	"((1+2)*(3+4))/5 and also 7%3", "  7 - - 2  ", "(((1)))+1", "2+", "9**2", "6 / 3 . ", "1e3+1", "+5", "4-", "5 -3",
	strings.Repeat("1+", 2100) + "1", strings.Repeat("(", 70) + "1+1" + strings.Repeat(")", 70),
	"run a slow job for 3 seconds", "SLOW JOB 2.5s", "slow_job 0.0000001 s", "slow-job 1000000000000000000000 secs",
	"slow job 12secondsx", "slow job for 0 s", "slow job 3 sec 4 s", "slow job  7\tseconds", "a slow job, 2.5.5 seconds",
	"slow job " + strings.Repeat("9", 400) + "s", "slow job 0." + strings.Repeat("0", 400) + "1s", "slow job 1.s", "slow job 3_s 4s",
	"slow job x1s", "\u0130 SLOW JOB 4 SECONDS", "slow job 3 \u212Aseconds 5 s", "slow job 10.25 second", "slow job 1 secs!",
	"What time is it?", "what's the time", "WHAT DAY is today", "hi", "this", "Hey!", "HELLO there", "hello123", "hi_there",
	"thanks", "thank you!", "help", "helpful", "what can you do?", "what do you do", "Good Morning",
	`use word_count {"text": "héllo wörld ☃"}`, `USE calculate {"expression":"1+1"}`, "use calculate", `use calculate  {"expression": "2"} trailing`,
	`use calculate {"a":`, `use calculate [1]`, `use weather {"city":"x"}`, "use weather please", "uſe calculate {}", "use \u212Aelvin {}",
	"  use\tcalculate\n{ \"a\" : [1, 2, {\"b\": null}], \"c\": \"x y\" }  ", `use calculate {"a":"<&>` + "\u2028" + `"}`,
	"use " + strings.Repeat("n", 70) + " {}", "use calculate {} {}", `use calculate {"a":1}}`, "use\vcalculate {}", "use calculate{}",
	`use calculate {"a":01}`, `use calculate {"a" 1}`, `use calculate {"a":tru}`, "use calculate {\"a\":\"\x01\"}", `use calculate {"a":"\u00"}`,
	"use slow_job", "use", "use  ", "used calculate {}", "use calculate " + strings.Repeat("é", 60),
	"use calculate {\"a\": 1} " + strings.Repeat("ü", 50), "\u3000use calculate {}", "\u00a0hi",
	"Tell me about the French revolution", "", "   ", "é ✓ 日本 😀 " + strings.Repeat("ab ", 40), "\x00 nul \x00", "tab\there\x01\x7f",
	"\u212Ahi there", "help\u0130", "\u0130hello", "What is 2+2..?", "use " + strings.Repeat("n", 65) + " {}",
	strings.Repeat("z", 79) + "é", strings.Repeat("z", 80) + "é", " \u2028quote\" back\\slash\u200b\ufeff ", "\U0001F600\u0085",
}

// expressionArgs are arguments of a calculate call the model asked for,
// as the next request carries them back.
var expressionArgs = []json.RawMessage{
	json.RawMessage(`{"expression":"2+3"}`), json.RawMessage(`{"Expression":"x*y"}`), json.RawMessage(`{"EXPRESSION":"1","expression":"2"}`),
	json.RawMessage(`{"expression":1}`), json.RawMessage(`null`), nil, json.RawMessage(`[1]`), json.RawMessage(`{"expression":""}`),
	json.RawMessage(`{"expression":"é+1"}`), json.RawMessage(`{"expression":null}`), json.RawMessage(`{"expression":"a","expression":null}`),
	json.RawMessage(`{"other":{"expression":"no"},"expression":"1/3"}`), json.RawMessage(`"s"`), json.RawMessage(`{"expression":"\u0000x"}`),
	json.RawMessage(`{"expression":"tail."}`),
}

var toolSets = [][]abi.Tool{
	nil, {calculateTool}, {calculateTool, {Name: "slow_job", Description: "waits", InputSchema: json.RawMessage(`{"type":"object"}`)}},
	{{Name: "word_count", Description: "counts words: \"a, b\" {x}"}}, {{Name: "\u212Aelvin"}, {Name: "calculate"}}, {{Name: ""}},
	{{Name: "weather", Description: "tab\tnew\nline", Idempotent: true, Approval: "never"}, calculateTool},
	{{Name: strings.Repeat("n", 64)}, {Name: "slow_job"}},
}

var toolResults = []string{"5", " 20.\n", "error: division by zero", "errors are fine", "", "3.", "..", "ä", "result with \"quotes\" and, commas: {x}", "\x00"}

// randomModelRequest makes a conversation that ends in one of the ways
// the model reads: a question, or the results of the calls it asked for
// (some missing, some failed, some for calls not asked), around system
// messages, earlier turns and tool messages that do not count.
func randomModelRequest(rng *rand.Rand) abi.ModelRequest {
	pick := func(s []string) string { return s[rng.Intn(len(s))] }
	req := abi.ModelRequest{Tools: toolSets[rng.Intn(len(toolSets))]}
	if rng.Intn(3) == 0 {
		req.Messages = append(req.Messages, abi.Message{Role: abi.MessageSystem, Content: "You are careful: " + pick(questions)})
	}
	for n := rng.Intn(3); n > 0; n-- {
		req.Messages = append(req.Messages, abi.Message{Role: abi.MessageUser, Content: pick(questions)},
			abi.Message{Role: abi.MessageAssistant, Content: pick(toolResults)})
	}
	if rng.Intn(12) != 0 {
		req.Messages = append(req.Messages, abi.Message{Role: abi.MessageUser, Content: pick(questions)})
	}
	names := []string{"calculate", "calculate", "slow_job", "word_count", "", "é"}
	for turns := rng.Intn(4); turns > 0; turns-- {
		asked := abi.Message{Role: abi.MessageAssistant, Content: pick(toolResults)}
		for k := rng.Intn(4); k > 0; k-- {
			asked.ToolCalls = append(asked.ToolCalls, abi.ToolCall{ID: fmt.Sprintf("call_%d", rng.Intn(4)), Name: names[rng.Intn(len(names))],
				Arguments: expressionArgs[rng.Intn(len(expressionArgs))]})
		}
		req.Messages = append(req.Messages, asked)
		for k := rng.Intn(5); k > 0; k-- {
			req.Messages = append(req.Messages, abi.Message{Role: abi.MessageTool, ToolCallID: fmt.Sprintf("call_%d", rng.Intn(5)),
				Content: pick(toolResults), IsError: rng.Intn(4) == 0})
		}
		if rng.Intn(5) == 0 {
			req.Messages = append(req.Messages, abi.Message{Role: abi.MessageSystem, Content: "note"})
		}
	}
	if rng.Intn(20) == 0 {
		req.Messages = nil
	}
	return req
}

// replyKinds are the ways the scripted model answers, as replyKind
// names them.
var replyKinds = []string{
	"call calculate", "call slow_job", "call word_count", "call other", "summary", "summary: could not compute", "summary: failed",
	"summary: answered", "summary: no result", "use: not offered", "use: arguments", "use: not JSON", "no calculator", "no slow_job",
	"time", "capabilities", "greeting", "thanks", "fallback", "no user message",
}

// replyKind says which way a done reply of the Go model answers.
func replyKind(t *testing.T, r abi.EffectReply) string {
	t.Helper()
	var o abi.ModelOutcome
	if err := json.Unmarshal(r.Outcome, &o); err != nil {
		t.Fatal(err)
	}
	m := o.Message
	if len(m.ToolCalls) > 0 {
		switch n := m.ToolCalls[0].Name; n {
		case "calculate", "slow_job", "word_count":
			return "call " + n
		default:
			return "call other"
		}
	}
	for _, k := range []struct{ prefix, kind string }{
		{"I could not compute", "summary: could not compute"}, {"The word_count tool failed", "summary: failed"},
		{"The slow_job tool answered", "summary: answered"}, {"The calculate call", "summary: no result"},
		{"I would call the tool", "use: not offered"}, {"I could not read the arguments", "use: arguments"},
		{"I would use the calculate tool", "no calculator"}, {"I would start a slow job", "no slow_job"},
		{"I can't know the time", "time"}, {"I am agenthost's scripted demo model. I can:", "capabilities"},
		{"Hello!", "greeting"}, {"You're welcome.", "thanks"}, {"I am agenthost's scripted demo model: I follow", "fallback"},
		{"I was given no user message", "no user message"},
	} {
		if strings.HasPrefix(m.Content, k.prefix) {
			if k.kind == "use: arguments" && strings.Contains(m.Content, notJSON) {
				return "use: not JSON"
			}
			return k.kind
		}
	}
	if strings.Contains(m.Content, " = ") {
		return "summary"
	}
	return "other: " + m.Content
}

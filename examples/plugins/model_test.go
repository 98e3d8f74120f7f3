package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

var calculateTool = abi.Tool{Name: "calculate", Description: "Evaluate an arithmetic expression",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`)}

func expressionArg(t *testing.T, c abi.ToolCall) string {
	t.Helper()
	var a struct {
		Expression string `json:"expression"`
	}
	if err := json.Unmarshal(c.Arguments, &a); err != nil {
		t.Fatalf("arguments %s: %v", c.Arguments, err)
	}
	return a.Expression
}

// The scripted model and the calculator together, as make run uses them
// (their C builds; TestScriptedModelC).
func TestScriptedModel(t *testing.T) { testScriptedModel(t, "scripted-model", "calculator") }

// testScriptedModel checks the scripted model built from modelDir with
// the calculator built from calcDir. One host serves every case: loading
// a plugin is the slow part under -race.
func testScriptedModel(t *testing.T, modelDir, calcDir string) {
	e := newEnv(t)
	m := e.executor(t, modelDir, nil)
	calc := e.executor(t, calcDir, nil)
	t.Run("arithmetic: one call, then the answer", func(t *testing.T) { testArithmetic(t, m, calc) })
	t.Run("two sums: two calls in one message", func(t *testing.T) { testTwoSums(t, m, calc) })
	// How each build says that a request is not a model request.
	how := []string{"cannot unmarshal", "abi.ModelRequest"} // Go's decoder
	if modelDir == scriptedModelC {
		how = []string{"it is not a JSON object"}
	}
	t.Run("rules and fallback", func(t *testing.T) { testRules(t, m, how) })
	t.Run("use TOOL {JSON}: any offered tool", func(t *testing.T) { testUse(t, m) })
}

// `use TOOL {JSON arguments}` makes the model plugin call any tool the
// request offers with those arguments, and answer with its result; a tool
// it does not offer gets a text, not a call.
func testUse(t *testing.T, m *host.Executor) {
	ctx := context.Background()
	wordCount := abi.Tool{Name: "word_count", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)}
	req := abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: `use word_count {"text": "héllo wörld ☃"}`}}, Tools: []abi.Tool{calculateTool, wordCount}}
	out := model(t)(m.Start(ctx, modelCall("run_u.m1", req)))
	calls := out.Message.ToolCalls
	if len(calls) != 1 || calls[0].Name != "word_count" || string(calls[0].Arguments) != `{"text":"héllo wörld ☃"}` {
		t.Fatalf("step 1: %+v", out.Message)
	}
	req.Messages = append(req.Messages, out.Message, abi.Message{Role: "tool", ToolCallID: calls[0].ID, Content: "3"})
	if final := model(t)(m.Start(ctx, modelCall("run_u.m2", req))).Message; len(final.ToolCalls) != 0 || final.Content != "The word_count tool answered: 3." {
		t.Errorf("final: %+v", final)
	}
	req.Messages = []abi.Message{{Role: "user", Content: `use weather {"city":"Paris"}`}}
	if got := model(t)(m.Start(ctx, modelCall("run_u.m3", req))).Message; len(got.ToolCalls) != 0 || !strings.Contains(got.Content, "does not offer it. It offers: calculate, word_count.") {
		t.Errorf("a tool not offered: %+v", got)
	}
}

// The model asks for the call, the calculator answers it, and the model
// answers with the result.
func testArithmetic(t *testing.T, m, calc *host.Executor) {
	ctx := context.Background()

	req := abi.ModelRequest{Messages: []abi.Message{
		{Role: "system", Content: "You are careful."},
		{Role: "user", Content: "What is (2+3)*4?"},
	}, Tools: []abi.Tool{calculateTool}}
	out := model(t)(m.Start(ctx, modelCall("run_1.m1", req)))
	calls := out.Message.ToolCalls
	if len(calls) != 1 || calls[0].Name != "calculate" || expressionArg(t, calls[0]) != "(2+3)*4" || calls[0].ID == "" {
		t.Fatalf("step 1: %+v", out.Message)
	}
	if out.Usage.InputTokens <= 0 || out.Usage.OutputTokens <= 0 {
		t.Errorf("usage %+v", out.Usage)
	}
	res := tool(t)(calc.Start(ctx, toolCall("run_1.t1.0", 1, "calculate", json.RawMessage(calls[0].Arguments))))
	req.Messages = append(req.Messages, out.Message, abi.Message{Role: "tool", ToolCallID: calls[0].ID, Content: res.Content})
	final := model(t)(m.Start(ctx, modelCall("run_1.m2", req))).Message
	if len(final.ToolCalls) != 0 || !strings.Contains(final.Content, "20") || !strings.Contains(final.Content, "(2+3)*4") {
		t.Fatalf("final answer: %+v", final)
	}
}

func testTwoSums(t *testing.T, m, calc *host.Executor) {
	ctx := context.Background()

	req := abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: "What is 2+3 and 4*5?"}}, Tools: []abi.Tool{calculateTool}}
	msg := model(t)(m.Start(ctx, modelCall("run_1.m1", req))).Message
	if len(msg.ToolCalls) != 2 || msg.ToolCalls[0].ID == msg.ToolCalls[1].ID ||
		expressionArg(t, msg.ToolCalls[0]) != "2+3" || expressionArg(t, msg.ToolCalls[1]) != "4*5" {
		t.Fatalf("step 1: want two calls in one message: %+v", msg)
	}
	req.Messages = append(req.Messages, msg)
	for i, c := range msg.ToolCalls {
		res := tool(t)(calc.Start(ctx, toolCall(fmt.Sprintf("run_1.t1.%d", i), 1, "calculate", json.RawMessage(c.Arguments))))
		req.Messages = append(req.Messages, abi.Message{Role: "tool", ToolCallID: c.ID, Content: res.Content})
	}
	final := model(t)(m.Start(ctx, modelCall("run_1.m2", req))).Message
	if final.Content != "2+3 = 5 and 4*5 = 20." {
		t.Fatalf("final answer: %q", final.Content)
	}
}

func testRules(t *testing.T, m *host.Executor, how []string) {
	ctx := context.Background()
	ask := func(text string, tools ...abi.Tool) abi.Message {
		return model(t)(m.Start(ctx, modelCall("run_1.m1", abi.ModelRequest{Messages: []abi.Message{{Role: "user", Content: text}}, Tools: tools}))).Message
	}
	if got := ask("What time is it?"); !strings.Contains(got.Content, "can't know the time") {
		t.Errorf("time: %q", got.Content)
	}
	if got := ask("hi!"); !strings.HasPrefix(got.Content, "Hello!") {
		t.Errorf("greeting: %q", got.Content)
	}
	got := ask("run a slow job for 2 seconds", calculateTool, abi.Tool{Name: "slow_job"})
	if len(got.ToolCalls) != 1 || got.ToolCalls[0].Name != "slow_job" || string(got.ToolCalls[0].Arguments) != `{"label":"demo","seconds":2}` {
		t.Errorf("slow job: %+v", got)
	}
	fb := ask("Tell me about the French revolution")
	if len(fb.ToolCalls) != 0 || !strings.Contains(fb.Content, "scripted demo model") || !strings.Contains(fb.Content, "base_url") {
		t.Errorf("fallback: %q", fb.Content)
	}
	// Not a model effect: failed, not retriable.
	r, err := m.Start(ctx, toolCall("run_1.t1.0", 1, "calculate", nil))
	if err != nil || r.State != abi.StateFailed || r.Error.Retriable {
		t.Errorf("tool effect: %+v %v", r, err)
	}
	// A request that is not a model request: failed, never a trap.
	c := modelCall("run_1.m3", abi.ModelRequest{})
	c.Input.Effect.Request = json.RawMessage(`[1,2]`)
	if r, err := m.Start(ctx, c); err != nil || r.State != abi.StateFailed {
		t.Errorf("bad request: %+v %v", r, err)
	} else if msg := r.Error.Message; !strings.Contains(msg, "effect run_1.m3: request is not a model request: ") || !containsAll(msg, how...) {
		t.Errorf("bad request: the error %q does not say which effect's request is wrong, and how (%q)", msg, how)
	}
}

func TestPromptBuilder(t *testing.T) { testPromptBuilder(t, "prompt-builder") }

// testPromptBuilder checks the prompt builder built from dir.
func testPromptBuilder(t *testing.T, dir string) {
	e := newEnv(t)
	ctx := context.Background()
	history := []abi.Message{
		{Role: "user", Content: "h1"}, {Role: "assistant", Content: "h2"},
		{Role: "user", Content: "h3"}, {Role: "assistant", Content: "h4"},
	}
	in := abi.BuildInput{
		Run:        abi.RunView{ID: "run_2", Tenant: "acme", Session: "s1", Step: 1, Input: "What is 2+3?"},
		History:    history,
		Transcript: []abi.Message{{Role: "user", Content: "What is 2+3?"}},
		Tools:      []abi.Tool{calculateTool},
	}
	build := func(cfg map[string]string) (abi.BuildOutput, error) {
		b, err := e.load(t, dir, abi.RoleBuilder, func(s *host.PluginSpec) {
			s.Name = "prompt-builder-" + cfg["history_window"] + cfg["system_prompt"]
			s.Sandbox.Config = cfg
		}).Builder()
		if err != nil {
			t.Fatal(err)
		}
		return b.Build(ctx, "acme", in)
	}
	contents := func(out abi.BuildOutput) string {
		var s []string
		for _, m := range out.Request.Messages {
			s = append(s, m.Role+":"+m.Content)
		}
		return strings.Join(s, " | ")
	}

	out, err := build(nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := out.Request.Messages; len(m) != 6 || m[0].Role != "system" || !strings.Contains(m[0].Content, "calculate") {
		t.Fatalf("defaults: %s", contents(out))
	}
	if len(out.Request.Tools) != 1 || out.Request.Tools[0].Name != "calculate" {
		t.Fatalf("tools: %+v", out.Request.Tools)
	}
	out, err = build(map[string]string{"system_prompt": "Answer in French.", "history_window": "2"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := contents(out), "system:Answer in French. | user:h3 | assistant:h4 | user:What is 2+3?"; got != want {
		t.Fatalf("window 2:\n got %s\nwant %s", got, want)
	}
	// A config value that is not a number is an error that names the key.
	_, err = build(map[string]string{"history_window": "lots"})
	if classOf(t, err) != abi.ClassPluginProtocol || !strings.Contains(err.Error(), "history_window") {
		t.Fatalf("bad history_window: %v", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

package model

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/plugins/abi"
)

var calculate = abi.Tool{Name: ToolCalculate, Description: "Evaluate an arithmetic expression"}

func user(s string) abi.Message { return abi.Message{Role: abi.MessageUser, Content: s} }

func args(t *testing.T, c abi.ToolCall) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(c.Arguments, &m); err != nil {
		t.Fatalf("arguments %s: %v", c.Arguments, err)
	}
	return m
}

func TestExpressions(t *testing.T) {
	cases := map[string][]string{
		"What is (2+3)*4?":            {"(2+3)*4"},
		"What is 2+3 and 4*5?":        {"2+3", "4*5"},
		"what is 2 + 3.":              {"2 + 3"},
		"compute 1.5*2, then 7 % 4!":  {"1.5*2", "7 % 4"},
		"I have 3 apples":             nil,
		"-3 is negative":              nil,
		"run a slow job for 3s":       nil,
		"What is (2+3?":               nil,
		"10 - 4 - 3 and -(2^3) twice": {"10 - 4 - 3", "-(2^3)"},
	}
	for text, want := range cases {
		if got := Expressions(text); !reflect.DeepEqual(got, want) {
			t.Errorf("Expressions(%q) = %q, want %q", text, got, want)
		}
	}
}

func TestArithmeticAsksForOneCallThenAnswers(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{{Role: abi.MessageSystem, Content: "be careful"}, user("What is (2+3)*4?")}, Tools: []abi.Tool{calculate}}
	out := Respond(req)
	m := out.Message
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != ToolCalculate || args(t, m.ToolCalls[0])["expression"] != "(2+3)*4" {
		t.Fatalf("first step: %+v", m)
	}
	if err := abi.ValidateModelOutcome(out); err != nil {
		t.Fatal(err)
	}
	if out.Usage.InputTokens <= 0 || out.Usage.OutputTokens <= 0 {
		t.Errorf("usage %+v", out.Usage)
	}
	req.Messages = append(req.Messages, m, abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[0].ID, Content: "20"})
	final := Respond(req).Message
	if len(final.ToolCalls) != 0 || final.Content != "(2+3)*4 = 20." {
		t.Fatalf("final: %+v", final)
	}
}

func TestTwoSumsAreTwoCallsInOneMessage(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{user("What is 2+3 and 4*5?")}, Tools: []abi.Tool{calculate}}
	m := Respond(req).Message
	if len(m.ToolCalls) != 2 || m.ToolCalls[0].ID == m.ToolCalls[1].ID {
		t.Fatalf("calls: %+v", m.ToolCalls)
	}
	if args(t, m.ToolCalls[0])["expression"] != "2+3" || args(t, m.ToolCalls[1])["expression"] != "4*5" {
		t.Fatalf("calls: %+v", m.ToolCalls)
	}
	// Results may come in any order in the transcript; the answer follows the calls.
	req.Messages = append(req.Messages, m,
		abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[1].ID, Content: "20"},
		abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[0].ID, Content: "5"})
	if got := Respond(req).Message.Content; got != "2+3 = 5 and 4*5 = 20." {
		t.Fatalf("final: %q", got)
	}
}

func TestToolErrorIsReported(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{user("What is 1/0 + 1?")}, Tools: []abi.Tool{calculate}}
	m := Respond(req).Message
	req.Messages = append(req.Messages, m, abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[0].ID, Content: "error: division by zero at position 2", IsError: true})
	if got := Respond(req).Message.Content; !strings.Contains(got, "could not compute 1/0 + 1") || !strings.Contains(got, "division by zero") {
		t.Fatalf("final: %q", got)
	}
}

func TestArithmeticWithoutTheTool(t *testing.T) {
	m := Respond(abi.ModelRequest{Messages: []abi.Message{user("What is 2+3?")}}).Message
	if len(m.ToolCalls) != 0 || !strings.Contains(m.Content, "does not offer it") {
		t.Fatalf("%+v", m)
	}
}

func TestRules(t *testing.T) {
	slow := abi.Tool{Name: ToolSlowJob}
	cases := []struct {
		name, text string
		tools      []abi.Tool
		want       string // in the content; "" for a tool call
	}{
		{"greeting", "Hello there", nil, "Hello!"},
		{"not a greeting inside a word", "this is odd", nil, FallbackText},
		{"capabilities list the offered tools", "What can you do?", []abi.Tool{calculate, slow}, "tools: calculate, slow_job"},
		{"time without a clock", "What time is it?", nil, "can't know the time"},
		{"thanks", "thanks!", nil, "welcome"},
		{"slow job without the tool", "run a slow job", nil, "does not offer it"},
		{"fallback", "Write me a poem about the sea", nil, FallbackText},
	}
	for _, c := range cases {
		m := Respond(abi.ModelRequest{Messages: []abi.Message{user(c.text)}, Tools: c.tools}).Message
		if !strings.Contains(m.Content, c.want) || len(m.ToolCalls) != 0 {
			t.Errorf("%s: %q → %+v, want content with %q", c.name, c.text, m, c.want)
		}
	}
	if m := Respond(abi.ModelRequest{Messages: []abi.Message{user("Write a poem")}}).Message; !strings.Contains(m.Content, "openai") {
		t.Errorf("the fallback does not say how to configure a real model: %q", m.Content)
	}
}

func TestSlowJobCall(t *testing.T) {
	tools := []abi.Tool{calculate, {Name: ToolSlowJob}}
	m := Respond(abi.ModelRequest{Messages: []abi.Message{user("Please run a slow job for 3 seconds")}, Tools: tools}).Message
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != ToolSlowJob || args(t, m.ToolCalls[0])["seconds"] != 3.0 {
		t.Fatalf("%+v", m)
	}
	m = Respond(abi.ModelRequest{Messages: []abi.Message{user("slow job")}, Tools: tools}).Message
	if len(m.ToolCalls) != 1 || args(t, m.ToolCalls[0])["seconds"] != float64(DefaultSlowJobSeconds) {
		t.Fatalf("%+v", m)
	}
}

func TestNoUserMessage(t *testing.T) {
	out := Respond(abi.ModelRequest{Messages: []abi.Message{{Role: abi.MessageSystem, Content: "x"}}})
	if out.Message.Content == "" || abi.ValidateModelOutcome(out) != nil {
		t.Fatalf("%+v", out)
	}
}

func TestDeterministic(t *testing.T) {
	req := abi.ModelRequest{Messages: []abi.Message{user("What is 2+3 and 4*5?")}, Tools: []abi.Tool{calculate}}
	a, _ := json.Marshal(Respond(req))
	b, _ := json.Marshal(Respond(req))
	if string(a) != string(b) {
		t.Fatalf("two replies differ:\n%s\n%s", a, b)
	}
}

var wordCount = abi.Tool{Name: "word_count", Description: "Count the words of a text"}

// `use TOOL {JSON}` calls any tool the Run offers with those arguments,
// then answers with its result; the other rules never see the message.
func TestUseCallsAnyOfferedToolThenAnswers(t *testing.T) {
	tools := []abi.Tool{calculate, wordCount, {Name: ToolSlowJob}}
	for _, c := range []struct {
		text, tool, args string
	}{
		{`use word_count {"text": "one two three"}`, "word_count", `{"text":"one two three"}`},
		{"  USE word_count\n{\"text\":\n \"a b\"}  ", "word_count", `{"text":"a b"}`},
		{`use calculate {"expression":"2+3"}`, ToolCalculate, `{"expression":"2+3"}`},
		{`use slow_job {"seconds": 1, "label": "x"}`, ToolSlowJob, `{"seconds":1,"label":"x"}`},
		{`use word_count`, "word_count", `{}`},
		{`use word_count {"text": "é ☃ \u00e9"}`, "word_count", `{"text":"é ☃ \u00e9"}`},
	} {
		out := Respond(abi.ModelRequest{Messages: []abi.Message{user(c.text)}, Tools: tools})
		m := out.Message
		if len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != c.tool || string(m.ToolCalls[0].Arguments) != c.args || m.ToolCalls[0].ID != "call_1_1" {
			t.Errorf("%q: %+v, want one %s call with %s", c.text, m, c.tool, c.args)
			continue
		}
		if err := abi.ValidateModelOutcome(out); err != nil {
			t.Errorf("%q: %v", c.text, err)
		}
	}

	req := abi.ModelRequest{Messages: []abi.Message{user(`use word_count {"text":"one two three"}`)}, Tools: tools}
	m := Respond(req).Message
	req.Messages = append(req.Messages, m, abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[0].ID, Content: "3"})
	if final := Respond(req).Message; len(final.ToolCalls) != 0 || final.Content != "The word_count tool answered: 3." {
		t.Errorf("final: %+v", final)
	}
	req.Messages[len(req.Messages)-1].Content = "(2+3)*4 = 20."
	if final := Respond(req).Message; final.Content != "The word_count tool answered: (2+3)*4 = 20." {
		t.Errorf("a result that ends its own sentence: %q, want one full stop", final.Content)
	}
	req.Messages[len(req.Messages)-1] = abi.Message{Role: abi.MessageTool, ToolCallID: m.ToolCalls[0].ID, Content: `error: the argument "text" is missing`, IsError: true}
	if final := Respond(req).Message; final.Content != `The word_count tool failed: error: the argument "text" is missing.` {
		t.Errorf("final after a tool error: %+v", final)
	}
}

// A tool the Run does not offer, or arguments that are not one JSON
// object, get a text that says what is wrong; text that only starts with
// "use" goes on to the other rules.
func TestUseRefusesClearly(t *testing.T) {
	tools := []abi.Tool{calculate, wordCount}
	for _, c := range []struct {
		text string
		want []string
	}{
		{`use weather {"city":"Paris"}`, []string{"tool weather", "does not offer it", "It offers: calculate, word_count."}},
		{`use word_count {"text": "a"`, []string{"could not read the arguments for word_count", "not JSON", `use word_count {"key": "value"}`}},
		{`use word_count {"text": 'a'}`, []string{"could not read the arguments for word_count", "invalid character"}},
		{`use word_count text=hello`, []string{"could not read the arguments for word_count", `"text=hello" is not a JSON object`}},
		{`use word_count {"text":"a"} please`, []string{"could not read the arguments for word_count", `"please" follows the JSON object`}},
		{`use word_count ["a"]`, []string{`"[\"a\"]" is not a JSON object`}},
	} {
		m := Respond(abi.ModelRequest{Messages: []abi.Message{user(c.text)}, Tools: tools}).Message
		if len(m.ToolCalls) != 0 {
			t.Errorf("%q: calls %+v, want a text", c.text, m.ToolCalls)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(m.Content, w) {
				t.Errorf("%q: %q lacks %q", c.text, m.Content, w)
			}
		}
	}
	if m := Respond(abi.ModelRequest{Messages: []abi.Message{user(`use weather {}`)}}).Message; !strings.Contains(m.Content, "It offers no tools.") {
		t.Errorf("no tools: %q", m.Content)
	}
	// Not the form: the arithmetic rule answers, as before.
	m := Respond(abi.ModelRequest{Messages: []abi.Message{user("use the calculator for 2+3")}, Tools: tools}).Message
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != ToolCalculate || args(t, m.ToolCalls[0])["expression"] != "2+3" {
		t.Errorf("use the calculator for 2+3: %+v", m)
	}
	if m := Respond(abi.ModelRequest{Messages: []abi.Message{user("use it wisely")}, Tools: tools}).Message; !strings.HasPrefix(m.Content, FallbackText) {
		t.Errorf("use it wisely: %+v", m)
	}
}

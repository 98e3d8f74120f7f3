// Package model is the decision logic of the scripted-model example: a
// deterministic model that reads the request's messages and tools and
// answers from a rules table. It is plain Go, so its tests run on the
// host; the plugin (package main, built for wasip1) only wraps it.
//
// # How it answers
//
// It looks at the conversation since the last user message.
//
//  1. If tool results came back for the tool calls it asked for, it
//     answers with them: "(2+3)*4 = 20", or "2+3 = 5 and 4*5 = 20".
//  2. Otherwise it takes the last user message and tries the rules of
//     Rules, in order; the first that matches answers. The first rule is
//     the explicit form `use TOOL {JSON arguments}`, which calls any tool
//     the Run offers.
//  3. When none matches, it says plainly that it is a scripted demo model
//     and how to configure a real one.
//
// It has no clock and no randomness: the same request always gets the
// same reply. Usage is estimated from words (4 tokens per 3 words).
package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins/calculator/expr"
	"github.com/agenthost/agenthost/plugins/abi"
	fastjson "github.com/segmentio/encoding/json"
)

// The JSON of a call's answer goes through fastjson, the examples' codec
// (examples/plugins/internal/guest): encoding/json compiled to Wasm took
// about a third of a model call that answers with tool results. The use
// form keeps encoding/json, whose decoder reports where a syntax error is.

// Tool names the rules call, when the request offers them.
const (
	ToolCalculate = "calculate"
	ToolSlowJob   = "slow_job"
)

// DefaultSlowJobSeconds is the length of a slow job when the question
// gives none.
const DefaultSlowJobSeconds = 5

// FallbackText opens the reply to a question no rule matches.
const FallbackText = "I am agenthost's scripted demo model: I follow a small rules table and do not understand free text."

// Rule is one row of the rules table.
type Rule struct {
	// Name identifies the rule (documented in the plugin's README).
	Name string
	// Answer returns the reply to text (the last user message, as
	// written) and true, or false when the rule does not apply.
	Answer func(text string, tools []abi.Tool, turn int) (abi.Message, bool)
}

// Rules is the rules table, tried in order.
var Rules = []Rule{
	{Name: "use", Answer: useRule},
	{Name: "slow_job", Answer: slowJobRule},
	{Name: "arithmetic", Answer: arithmeticRule},
	{Name: "time", Answer: keywordRule(
		[]string{"what time", "what's the time", "the time now", "what day", "today's date", "what date"},
		"I can't know the time: I am a scripted demo model with no clock, and I answer the same way every time. Your computer's clock knows.")},
	{Name: "capabilities", Answer: capabilitiesRule},
	{Name: "greeting", Answer: keywordRule(
		[]string{"hello", "hi", "hey", "good morning", "good afternoon", "good evening"},
		"Hello! I am agenthost's scripted demo model. Ask me an arithmetic question such as \"What is (2+3)*4?\", or ask what I can do.")},
	{Name: "thanks", Answer: keywordRule([]string{"thanks", "thank you"}, "You're welcome.")},
}

// Respond returns the model's outcome for a request.
func Respond(req abi.ModelRequest) abi.ModelOutcome {
	msg := decide(req)
	msg.Role = abi.MessageAssistant
	return abi.ModelOutcome{Message: msg, Usage: estimateUsage(req, msg)}
}

func decide(req abi.ModelRequest) abi.Message {
	last := -1
	for i, m := range req.Messages {
		if m.Role == abi.MessageUser {
			last = i
		}
	}
	if last < 0 {
		return abi.Message{Content: "I was given no user message to answer. " + configureHint}
	}
	// turn counts the assistant messages since the question, so that tool
	// call IDs differ from one step to the next.
	turn := 1
	var asked *abi.Message
	results := map[string]abi.Message{}
	for i := last + 1; i < len(req.Messages); i++ {
		m := req.Messages[i]
		switch m.Role {
		case abi.MessageAssistant:
			turn++
			if len(m.ToolCalls) > 0 {
				asked = &req.Messages[i]
				results = map[string]abi.Message{}
			}
		case abi.MessageTool:
			results[m.ToolCallID] = m
		}
	}
	if asked != nil && len(results) > 0 {
		return abi.Message{Content: summarize(*asked, results)}
	}
	text := req.Messages[last].Content
	for _, r := range Rules {
		if m, ok := r.Answer(text, req.Tools, turn); ok {
			return m
		}
	}
	return abi.Message{Content: fmt.Sprintf("%s I have no rule for %q. Try \"What is (2+3)*4?\", \"What is 2+3 and 4*5?\", \"run a slow job\" or \"what can you do\". %s",
		FallbackText, clip(text, 80), configureHint)}
}

const configureHint = "For real answers, configure a real model: load the openai example plugin (examples/plugins/openai) as the tenant's model executor, with base_url, model and api_key in its config; it speaks to OpenAI, Ollama or vLLM. For Anthropic's Messages API, load the anthropic one (examples/plugins/anthropic) the same way."

// summarize answers from the results of the calls the model asked for, in
// the order it asked.
func summarize(asked abi.Message, results map[string]abi.Message) string {
	var parts []string
	for _, c := range asked.ToolCalls {
		r, ok := results[c.ID]
		content := strings.TrimSpace(r.Content)
		switch {
		case !ok:
			parts = append(parts, fmt.Sprintf("the %s call %s has no result", c.Name, c.ID))
		case c.Name == ToolCalculate && !r.IsError && !strings.HasPrefix(content, "error"):
			parts = append(parts, fmt.Sprintf("%s = %s", expressionOf(c), content))
		case c.Name == ToolCalculate:
			parts = append(parts, fmt.Sprintf("I could not compute %s (%s)", expressionOf(c), content))
		case r.IsError:
			parts = append(parts, fmt.Sprintf("the %s tool failed: %s", c.Name, content))
		default:
			parts = append(parts, fmt.Sprintf("the %s tool answered: %s", c.Name, content))
		}
	}
	s := strings.Join(parts, " and ")
	// A result that ends a sentence of its own ("(2+3)*4 = 20.") ends
	// the answer's too.
	return strings.ToUpper(s[:1]) + strings.TrimRight(s[1:], ".") + "."
}

func expressionOf(c abi.ToolCall) string {
	var a struct {
		Expression string `json:"expression"`
	}
	if fastjson.Unmarshal(c.Arguments, &a) != nil || a.Expression == "" {
		return "the expression"
	}
	return a.Expression
}

// candidates returns the runs of characters that can make up an
// expression (the characters of exprChars), in order: what the regular
// expression `[-+*/%^().0-9 \t]+` finds, without the cost of a regular
// expression compiled to Wasm, which was most of a model call.
func candidates(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		if !isExprChar(text[i]) {
			i++
			continue
		}
		j := i + 1
		for j < len(text) && isExprChar(text[j]) {
			j++
		}
		out = append(out, text[i:j])
		i = j
	}
	return out
}

// isExprChar reports whether c can be part of an expression: a digit, an
// operator, a parenthesis, a decimal point, a space or a tab.
func isExprChar(c byte) bool {
	return c >= '0' && c <= '9' || strings.IndexByte("-+*/%^(). \t", c) >= 0
}

// Expressions returns the arithmetic expressions in text, in order: the
// runs of digits, operators and parentheses that parse (package expr) and
// hold at least one binary operator. "What is 2+3 and 4*5?" has two.
func Expressions(text string) []string {
	var out []string
	for _, s := range candidates(text) {
		s = strings.TrimSpace(s)
		s = strings.TrimRight(s, ".") // a sentence's full stop
		s = strings.TrimSpace(s)
		if !hasBinaryOp(s) || expr.Check(s) != nil {
			continue
		}
		out = append(out, s)
	}
	return out
}

// hasBinaryOp reports whether s applies an operator to two operands: "-3"
// alone is a number, not a question.
func hasBinaryOp(s string) bool {
	operand := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9' || c == ')':
			operand = true
		case strings.IndexByte("+-*/%^", c) >= 0 && operand:
			return true
		case c == ' ' || c == '\t' || c == '.':
		default:
			operand = false
		}
	}
	return false
}

func offers(tools []abi.Tool, name string) bool {
	for _, t := range tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

func arithmeticRule(text string, tools []abi.Tool, turn int) (abi.Message, bool) {
	exprs := Expressions(text)
	if len(exprs) == 0 {
		return abi.Message{}, false
	}
	if !offers(tools, ToolCalculate) {
		return abi.Message{Content: fmt.Sprintf("I would use the calculate tool for %s, but this Run does not offer it, and a scripted model does no arithmetic of its own. Add the calculator plugin to the tenant's tools.",
			strings.Join(exprs, " and "))}, true
	}
	m := abi.Message{}
	for i, e := range exprs {
		args, _ := fastjson.Marshal(map[string]string{"expression": e})
		m.ToolCalls = append(m.ToolCalls, abi.ToolCall{ID: callID(turn, i), Name: ToolCalculate, Arguments: args})
	}
	return m, true
}

// useForm matches the explicit form "use TOOL {JSON arguments}": "use"
// (any case) and a tool name at the start of the message, then the rest.
var useForm = regexp.MustCompile(`(?is)^\s*use\s+([A-Za-z0-9_-]{1,64})(.*)$`)

// useRule calls any tool the Run offers, with the arguments written after
// its name: `use word_count {"text": "one two"}` is one word_count call
// with {"text": "one two"}; `use TOOL` alone calls it with {}. Text that
// only looks like the form ("use the calculator for 2+3": no JSON object
// after a tool the Run does not offer) is left to the other rules. A tool
// the Run does not offer, or arguments that are not one JSON object, get
// a reply that says so.
func useRule(text string, tools []abi.Tool, turn int) (abi.Message, bool) {
	if !mayUse(text) {
		return abi.Message{}, false
	}
	m := useForm.FindStringSubmatch(text)
	if m == nil {
		return abi.Message{}, false
	}
	name, rest := m[1], strings.TrimSpace(m[2])
	offered := offers(tools, name)
	if !offered && !strings.HasPrefix(rest, "{") {
		return abi.Message{}, false
	}
	if !offered {
		return abi.Message{Content: fmt.Sprintf("I would call the tool %s, but this Run does not offer it. %s Write `use TOOL {JSON arguments}` with one of those, or add the plugin that offers %s to the tenant's tool_executors.",
			name, offeredTools(tools), name)}, true
	}
	args, err := useArguments(rest)
	if err != nil {
		return abi.Message{Content: fmt.Sprintf("I could not read the arguments for %s: %v. Write them as one JSON object after the tool's name, e.g. use %s {\"key\": \"value\"}.", name, err, name)}, true
	}
	return abi.Message{ToolCalls: []abi.ToolCall{{ID: callID(turn, 0), Name: name, Arguments: args}}}, true
}

// mayUse reports whether text can match useForm: whether its first
// character after leading white space (\s: space, \t, \n, \f, \r) is a
// u, which the form's "use" begins with in either case (no other
// character folds to u). Most messages do not, and skip the regular
// expression, which is slow compiled to Wasm.
func mayUse(text string) bool {
	t := strings.TrimLeft(text, " \t\n\f\r")
	return t != "" && (t[0] == 'u' || t[0] == 'U')
}

// useArguments reads the arguments of the use form: one JSON object and
// nothing after it, or nothing at all ({}).
func useArguments(rest string) (json.RawMessage, error) {
	if rest == "" {
		return json.RawMessage(`{}`), nil
	}
	if !strings.HasPrefix(rest, "{") {
		return nil, fmt.Errorf("%q is not a JSON object", clip(rest, 40))
	}
	dec := json.NewDecoder(strings.NewReader(rest))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("they are not JSON: %v at byte %d", se, se.Offset)
		}
		return nil, fmt.Errorf("they are not JSON: %v", err)
	}
	if tail := strings.TrimSpace(rest[dec.InputOffset():]); tail != "" {
		return nil, fmt.Errorf("%q follows the JSON object", clip(tail, 40))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("they are not JSON: %v", err)
	}
	return compact.Bytes(), nil
}

// offeredTools says which tools the Run offers.
func offeredTools(tools []abi.Tool) string {
	if len(tools) == 0 {
		return "It offers no tools."
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	return "It offers: " + strings.Join(names, ", ") + "."
}

// seconds matches "for 3 seconds", "3s", "3 sec".
var seconds = regexp.MustCompile(`(\d+(?:\.\d+)?)\s*(?:seconds?|secs?|s)\b`)

func slowJobRule(text string, tools []abi.Tool, turn int) (abi.Message, bool) {
	lower := strings.ToLower(text)
	if !strings.Contains(lower, "slow job") && !strings.Contains(lower, "slow_job") && !strings.Contains(lower, "slow-job") {
		return abi.Message{}, false
	}
	if !offers(tools, ToolSlowJob) {
		return abi.Message{Content: "I would start a slow job with the slow_job tool, but this Run does not offer it. Add the slow-job plugin to the tenant's tools."}, true
	}
	secs := float64(DefaultSlowJobSeconds)
	if m := seconds.FindStringSubmatch(lower); m != nil {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil && v > 0 {
			secs = v
		}
	}
	args, _ := fastjson.Marshal(map[string]any{"seconds": secs, "label": "demo"})
	return abi.Message{ToolCalls: []abi.ToolCall{{ID: callID(turn, 0), Name: ToolSlowJob, Arguments: args}}}, true
}

func capabilitiesRule(text string, tools []abi.Tool, _ int) (abi.Message, bool) {
	lower := strings.ToLower(text)
	if !containsAny(lower, "what can you do", "what do you do", "help") {
		return abi.Message{}, false
	}
	var names []string
	for _, t := range tools {
		names = append(names, t.Name)
	}
	offered := "This Run offers no tools."
	if len(names) > 0 {
		offered = "This Run offers the tools: " + strings.Join(names, ", ") + "."
	}
	return abi.Message{Content: "I am agenthost's scripted demo model. I can: answer arithmetic questions with the calculate tool (\"What is (2+3)*4?\", or two at once: \"What is 2+3 and 4*5?\"); start a slow job with the slow_job tool (\"run a slow job for 3 seconds\"); greet you; tell you that I cannot know the time; and call any tool the Run offers when you write use TOOL {JSON arguments} (use calculate {\"expression\": \"2^10\"}). " + offered}, true
}

// keywordRule answers reply when text holds one of the phrases as whole
// words.
func keywordRule(phrases []string, reply string) func(string, []abi.Tool, int) (abi.Message, bool) {
	return func(text string, _ []abi.Tool, _ int) (abi.Message, bool) {
		if !containsAny(strings.ToLower(text), phrases...) {
			return abi.Message{}, false
		}
		return abi.Message{Content: reply}, true
	}
}

// containsAny reports whether s holds one of the phrases, bounded by
// non-letters on both sides ("hi" is not in "this").
func containsAny(s string, phrases ...string) bool {
	for _, p := range phrases {
		for i := 0; ; {
			j := strings.Index(s[i:], p)
			if j < 0 {
				break
			}
			j += i
			end := j + len(p)
			if (j == 0 || !isLetter(s[j-1])) && (end == len(s) || !isLetter(s[end])) {
				return true
			}
			i = j + 1
		}
	}
	return false
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// callID names tool call i of the model's turn-th message since the
// question: unique within the message, and across the Run's steps.
func callID(turn, i int) string { return fmt.Sprintf("call_%d_%d", turn, i+1) }

func clip(s string, n int) string {
	r := []rune(strings.TrimSpace(s))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n]) + "…"
}

// estimateUsage counts words: the request's messages and tool
// descriptions in, the reply's content and tool calls out, at 4 tokens per
// 3 words (rounded up).
func estimateUsage(req abi.ModelRequest, out abi.Message) abi.Usage {
	in := 0
	for _, m := range req.Messages {
		in += words(m.Content)
		for _, c := range m.ToolCalls {
			in += words(c.Name) + words(string(c.Arguments))
		}
	}
	for _, t := range req.Tools {
		in += words(t.Name) + words(t.Description) + words(string(t.InputSchema))
	}
	o := words(out.Content)
	for _, c := range out.ToolCalls {
		o += words(c.Name) + words(string(c.Arguments))
	}
	return abi.Usage{InputTokens: tokens(in), OutputTokens: tokens(o)}
}

// words counts the runs of text between separators (space, newline, tab,
// and the JSON punctuation " , : { }). It counts what strings.FieldsFunc
// would split out, without building the fields: every separator is ASCII,
// so the bytes of a multi-byte character are never one.
func words(s string) int {
	n, inWord := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\n', '\t', '"', ',', ':', '{', '}':
			inWord = false
		default:
			if !inWord {
				n++
				inWord = true
			}
		}
	}
	return n
}

func tokens(words int) int64 { return int64((words*4 + 2) / 3) }

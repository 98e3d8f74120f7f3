// Package script is the protocol of the scripted test model: a model that
// reads its behaviour from the Run's input, so that a test can write a
// whole Run as one string. The Go fake (conformance.ScriptedModel) and the
// Wasm test plugin share this code, so both behave the same.
//
// A script is steps separated by '|'. Model step n follows step n of the
// script; each step is one of:
//
//	call:TOOL(JSON-ARGS),TOOL(JSON-ARGS)   ask for these tool calls, in parallel
//	ask:PROMPT                             ask the user a question (await_input)
//	answer:TEXT                            give the final answer; "$results"
//	                                       in TEXT is replaced by the tool
//	                                       results of the Run so far, joined by ","
//
// Every model step reports usage of 10 input and 5 output tokens. A Run
// whose script has run out answers "script exhausted". For tests; not a
// stable API.
package script

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// StepUsage is the usage every scripted model step reports.
var StepUsage = abi.Usage{InputTokens: 10, OutputTokens: 5}

// Reply computes the scripted model's outcome for a request. The script is
// the first user message; the step is one more than the number of
// assistant messages after it.
func Reply(req abi.ModelRequest) (abi.ModelOutcome, error) {
	script, step, results := "", 0, []string{}
	found := false
	for _, m := range req.Messages {
		switch {
		case m.Role == abi.MessageUser && !found:
			script, found = m.Content, true
		case m.Role == abi.MessageAssistant && found:
			step++
		case m.Role == abi.MessageTool && found:
			results = append(results, m.Content)
		}
	}
	if !found {
		return abi.ModelOutcome{}, fmt.Errorf("script: the request has no user message")
	}
	steps := strings.Split(script, "|")
	out := abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant}, Usage: StepUsage}
	if step >= len(steps) {
		out.Message.Content = "script exhausted"
		return out, nil
	}
	verb, arg, _ := strings.Cut(strings.TrimSpace(steps[step]), ":")
	switch verb {
	case "call":
		calls, err := parseCalls(arg)
		if err != nil {
			return abi.ModelOutcome{}, err
		}
		for i, c := range calls {
			c.ID = fmt.Sprintf("call_%d_%d", step+1, i+1)
			out.Message.ToolCalls = append(out.Message.ToolCalls, c)
		}
	case "ask":
		out.Message.Content = arg
		out.AwaitInput = &abi.AwaitInput{Prompt: arg}
	case "answer":
		out.Message.Content = strings.ReplaceAll(arg, "$results", strings.Join(results, ","))
	default:
		return abi.ModelOutcome{}, fmt.Errorf("script: step %d: unknown verb %q (want call, ask or answer)", step+1, verb)
	}
	return out, nil
}

// parseCalls parses "a({...}),b({...})", where arguments may contain commas.
func parseCalls(s string) ([]abi.ToolCall, error) {
	var calls []abi.ToolCall
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(strings.TrimSpace(s), ",") {
		open := strings.IndexByte(s, '(')
		if open <= 0 {
			return nil, fmt.Errorf("script: bad call list %q: want TOOL(ARGS)", s)
		}
		depth, end := 0, -1
		for i := open; i < len(s) && end < 0; i++ {
			switch s[i] {
			case '(':
				depth++
			case ')':
				if depth--; depth == 0 {
					end = i
				}
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("script: unbalanced parentheses in %q", s)
		}
		args := strings.TrimSpace(s[open+1 : end])
		if args == "" {
			args = "{}"
		}
		if !json.Valid([]byte(args)) {
			return nil, fmt.Errorf("script: arguments of %s are not JSON: %s", s[:open], args)
		}
		calls = append(calls, abi.ToolCall{Name: strings.TrimSpace(s[:open]), Arguments: json.RawMessage(args)})
		s = s[end+1:]
	}
	return calls, nil
}

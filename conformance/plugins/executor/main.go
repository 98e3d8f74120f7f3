//go:build wasip1

// Command executor is a well-behaved conformance executor that carries out
// model and tool effects at once, deterministically.
//
// The model: when the last message of the request is a user message whose
// text contains "add A B", it asks for the tool call add{a:A, b:B} (id
// "call_1"); when the last message is a tool result, it answers
// "result: CONTENT"; otherwise it echoes the last message's content. Usage
// counts the request's messages as input tokens and 1 as output.
//
// The tools: echo{text} returns text; add{a, b} returns a+b; clock returns
// agenthost_now_ms; abi returns the input's abi field; kv_roundtrip writes, reads back and deletes a key.
// A model request whose last message contains "stream" streams its echo
// first, as model_delta emits of one word each (with the spaces after
// it); the tool model_delta tries to emit one from a tool call and
// answers the status. Every call emits one progress event. The export "empty" does nothing; it
// is the floor of the host's per-call benchmarks.
package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport empty
func empty() int32 { return 0 }

//go:wasmexport describe
func describe() int32 {
	obj := json.RawMessage(`{"type":"object"}`)
	return kit.Describe(abi.Describe{
		Name: "conformance-executor", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindModel, abi.KindTool},
		Tools: []abi.Tool{
			{Name: "echo", Description: "Return the text argument", InputSchema: obj, Idempotent: true, Approval: abi.ApprovalNever},
			{Name: "add", Description: "Add a and b", InputSchema: obj, Idempotent: true, Approval: abi.ApprovalNever},
			{Name: "clock", Description: "The host clock in Unix ms", InputSchema: obj, Idempotent: true, Approval: abi.ApprovalNever},
			{Name: "abi", Description: "The abi field of the input", InputSchema: obj, Idempotent: true, Approval: abi.ApprovalNever},
			{Name: "kv_roundtrip", Description: "Write, read and delete a KV key", InputSchema: obj, Approval: abi.ApprovalNever},
			{Name: "model_delta", Description: "Emit a model_delta from a tool call; answers the status", InputSchema: obj, Approval: abi.ApprovalNever},
		},
	})
}

//go:wasmexport start
func start() int32 {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil {
		return kit.Fail("start: bad input: " + err.Error())
	}
	kit.Emit("start " + in.Effect.ID)
	switch in.Effect.Kind {
	case abi.KindModel:
		return model(in)
	case abi.KindTool:
		return tool(in)
	}
	return kit.Failed(fmt.Sprintf("unknown effect kind %q", in.Effect.Kind), false)
}

func model(in abi.EffectInput) int32 {
	var req abi.ModelRequest
	if err := json.Unmarshal(in.Effect.Request, &req); err != nil || len(req.Messages) == 0 {
		return kit.Failed("model: request has no messages", false)
	}
	last := req.Messages[len(req.Messages)-1]
	msg := abi.Message{Role: abi.MessageAssistant}
	switch {
	case last.Role == abi.MessageUser && strings.Contains(last.Content, "add "):
		f := strings.Fields(last.Content[strings.Index(last.Content, "add "):])
		a, b := "0", "0"
		if len(f) >= 3 {
			a, b = f[1], f[2]
		}
		msg.ToolCalls = []abi.ToolCall{{ID: "call_1", Name: "add", Arguments: json.RawMessage(`{"a":` + a + `,"b":` + b + `}`)}}
	case last.Role == abi.MessageTool:
		msg.Content = "result: " + last.Content
	default:
		msg.Content = last.Content
		if strings.Contains(last.Content, "stream") {
			streamText(last.Content)
		}
	}
	out, _ := json.Marshal(abi.ModelOutcome{Message: msg, Usage: abi.Usage{InputTokens: int64(len(req.Messages)), OutputTokens: 1}})
	return kit.Reply(abi.EffectReply{State: abi.StateDone, Outcome: out})
}

// streamText emits text as model_delta pieces of one word each, with
// the spaces after it: concatenated, they are text.
func streamText(text string) {
	for len(text) > 0 {
		end := strings.IndexByte(text, ' ')
		if end < 0 {
			end = len(text)
		}
		for end < len(text) && text[end] == ' ' {
			end++
		}
		kit.EmitEvent(abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{Text: text[:end]}})
		text = text[end:]
	}
}

func tool(in abi.EffectInput) int32 {
	var req abi.ToolRequest
	_ = json.Unmarshal(in.Effect.Request, &req)
	var args struct {
		Text string  `json:"text"`
		A    float64 `json:"a"`
		B    float64 `json:"b"`
	}
	_ = json.Unmarshal(req.Arguments, &args)
	switch in.Effect.Tool {
	case "echo":
		return kit.Done(args.Text)
	case "add":
		return kit.Done(strconv.FormatFloat(args.A+args.B, 'f', -1, 64))
	case "clock":
		return kit.Done(strconv.FormatInt(kit.NowMS(), 10))
	case "abi":
		return kit.Done(strconv.Itoa(in.ABI))
	case "model_delta":
		st := kit.EmitEvent(abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{Text: "not a model"}})
		return kit.Done(strconv.Itoa(int(st)))
	case "kv_roundtrip":
		key := "rt/" + in.Effect.ID
		if st := kit.KVSet(key, []byte(args.Text)); st != abi.StatusOK {
			return kit.Failed(fmt.Sprintf("kv_set: status %d", st), true)
		}
		v, ok := kit.KVGet(key)
		if !ok {
			return kit.Failed("kv_get: written key is missing", true)
		}
		kit.KVDelete(key)
		if _, still := kit.KVGet(key); still {
			return kit.Failed("kv_delete: key still there", false)
		}
		return kit.Done(string(v))
	}
	return kit.Failed(fmt.Sprintf("unknown tool %q", in.Effect.Tool), false)
}

//go:wasmexport poll
func poll() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport attach
func attach() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport cancel
func cancel() int32 { return kit.Reply(abi.CancelReply{State: abi.StateUnknown}) }

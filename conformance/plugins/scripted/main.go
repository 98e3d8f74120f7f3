//go:build wasip1

// Command scripted is the Wasm twin of conformance.ScriptedModel and
// conformance.ScriptedTools, so that RuntimeSuite runs through the real
// plugin host with the same behaviours as with the Go fakes:
//
//   - a model effect follows the script in the Run's input (package
//     conformance/script);
//   - a tool effect behaves by its tool's name: echo and wire answer at
//     once; slow answers pending, keeps its record in host KV keyed by
//     (effect id, attempt), and is done at the first poll; fail fails;
//     flaky fails as retriable on attempt 1; block spins until the KV key
//     "release" is set (or the call is stopped); lost answers pending, then
//     unknown.
//
// attach answers from the KV record (pending or done), unknown without one.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/conformance/script"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

var toolNames = []string{"echo", "wire", "slow", "fail", "flaky", "block", "lost"}

//go:wasmexport describe
func describe() int32 {
	d := abi.Describe{Name: "conformance-scripted", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindModel, abi.KindTool}, Attach: true}
	for _, n := range toolNames {
		d.Tools = append(d.Tools, abi.Tool{Name: n, Description: "scripted test tool " + n,
			InputSchema: json.RawMessage(`{"type":"object"}`), Approval: abi.ApprovalNever})
	}
	return kit.Describe(d)
}

type record struct {
	Polls   int    `json:"polls"`
	Content string `json:"content"`
	Tool    string `json:"tool"`
}

func jobKey(e abi.Effect) string { return fmt.Sprintf("job/%s#%d", e.ID, e.Attempt) }

func load(e abi.Effect) (record, bool) {
	b, ok := kit.KVGet(jobKey(e))
	if !ok {
		return record{}, false
	}
	var r record
	return r, json.Unmarshal(b, &r) == nil
}

func save(e abi.Effect, r record) abi.Status {
	b, _ := json.Marshal(r)
	return kit.KVSet(jobKey(e), b)
}

func input() (abi.EffectInput, bool) {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil || in.Effect.ID == "" || in.Effect.Attempt < 1 {
		return in, false
	}
	return in, true
}

// content is the "text" argument of a tool call, or all its arguments.
func content(e abi.Effect) string {
	var req struct {
		Arguments map[string]any `json:"arguments"`
	}
	_ = json.Unmarshal(e.Request, &req)
	if t, ok := req.Arguments["text"].(string); ok {
		return t
	}
	raw, _ := json.Marshal(req.Arguments)
	return string(raw)
}

func pending(e abi.Effect) int32 {
	return kit.Reply(abi.EffectReply{State: abi.StatePending, Handle: "job-" + fmt.Sprintf("%s#%d", e.ID, e.Attempt)})
}

//go:wasmexport start
func start() int32 {
	in, ok := input()
	if !ok {
		return kit.Fail("start: bad input: effect.id and effect.attempt are required")
	}
	e := in.Effect
	if e.Kind == abi.KindModel {
		var req abi.ModelRequest
		if err := json.Unmarshal(e.Request, &req); err != nil {
			return kit.Failed("model request: "+err.Error(), false)
		}
		out, err := script.Reply(req)
		if err != nil {
			return kit.Failed(err.Error(), false)
		}
		raw, _ := json.Marshal(out)
		return kit.Reply(abi.EffectReply{State: abi.StateDone, Outcome: raw})
	}
	switch e.Tool {
	case "echo", "wire":
		return kit.Done(content(e))
	case "slow", "lost":
		if _, found := load(e); !found {
			if st := save(e, record{Content: "slow:" + content(e), Tool: e.Tool}); st != abi.StatusOK {
				return kit.Failed(fmt.Sprintf("kv_set: status %d", st), true)
			}
		}
		return pending(e)
	case "fail":
		return kit.Failed("tool failed on purpose", false)
	case "flaky":
		if e.Attempt == 1 {
			return kit.Failed("flaky: first attempt fails", true)
		}
		return kit.Done(fmt.Sprintf("flaky ok on attempt %d", e.Attempt))
	case "block":
		for {
			if _, released := kit.KVGet("release"); released {
				return kit.Done("unblocked")
			}
		}
	}
	return kit.Failed(fmt.Sprintf("unknown tool %q", e.Tool), false)
}

// state answers poll (which counts) and attach (which does not).
func state(poll bool) int32 {
	in, ok := input()
	if !ok {
		return kit.Fail("bad input: effect.id and effect.attempt are required")
	}
	r, found := load(in.Effect)
	if !found || r.Tool == "lost" {
		return kit.Reply(abi.EffectReply{State: abi.StateUnknown})
	}
	if poll {
		r.Polls++
		if st := save(in.Effect, r); st != abi.StatusOK {
			return kit.Failed(fmt.Sprintf("kv_set: status %d", st), true)
		}
	}
	if r.Polls >= 1 {
		return kit.Done(r.Content)
	}
	return pending(in.Effect)
}

//go:wasmexport poll
func poll() int32 { return state(true) }

//go:wasmexport attach
func attach() int32 { return state(false) }

//go:wasmexport cancel
func cancel() int32 {
	in, ok := input()
	if !ok {
		return kit.Fail("cancel: bad input")
	}
	r, found := load(in.Effect)
	if !found {
		return kit.Reply(abi.CancelReply{State: abi.StateUnknown})
	}
	if r.Polls >= 1 {
		out, _ := json.Marshal(abi.ToolOutcome{Content: r.Content})
		return kit.Reply(abi.CancelReply{State: abi.StateDone, Outcome: out})
	}
	kit.KVDelete(jobKey(in.Effect))
	return kit.Reply(abi.CancelReply{State: abi.StateCancelled})
}

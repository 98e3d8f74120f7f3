//go:build wasip1

// Command logflood is the test plugin of `agenthost plugin call`'s bounds
// (plugincall_bounds_test.go): an executor whose tool flood logs
// argument lines lines and emits argument emits progress events in a
// loop, then answers done. Each line and event is a few dozen bytes; the
// host bounds each one, not how many a call makes.
package main

import (
	"encoding/json"
	"strconv"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	var in abi.DescribeInput
	if err := pdk.InputJSON(&in); err != nil {
		pdk.SetErrorString("describe: bad input: " + err.Error())
		return 1
	}
	return reply(abi.Describe{ABI: abi.Version, Name: "logflood", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{{Name: "flood", Description: "Log and emit in a loop",
			InputSchema: json.RawMessage(`{"type":"object"}`), Idempotent: true, Approval: abi.ApprovalNever}}})
}

//go:wasmimport extism:host/user agenthost_emit
func hostEmit(event uint64) uint64

//go:wasmexport start
func start() int32 {
	var in abi.EffectInput
	if err := pdk.InputJSON(&in); err != nil {
		pdk.SetErrorString("start: bad input: " + err.Error())
		return 1
	}
	var req abi.ToolRequest
	_ = json.Unmarshal(in.Effect.Request, &req)
	var args struct {
		Lines int `json:"lines"`
		Emits int `json:"emits"`
	}
	_ = json.Unmarshal(req.Arguments, &args)
	for i := 0; i < args.Lines; i++ {
		pdk.Log(pdk.LogInfo, "flood line "+strconv.Itoa(i)+" of "+strconv.Itoa(args.Lines))
	}
	for i := 0; i < args.Emits; i++ {
		b, _ := json.Marshal(abi.EmitEvent{Type: "progress", Message: "flood event " + strconv.Itoa(i)})
		m := pdk.AllocateBytes(b)
		hostEmit(m.Offset())
		m.Free()
	}
	out, _ := json.Marshal(abi.ToolOutcome{Content: "flooded"})
	return reply(abi.EffectReply{State: abi.StateDone, Outcome: out})
}

//go:wasmexport poll
func poll() int32 { return reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport attach
func attach() int32 { return reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport cancel
func cancel() int32 { return reply(abi.CancelReply{State: abi.StateUnknown}) }

func reply(v any) int32 {
	if err := pdk.OutputJSON(v); err != nil {
		pdk.SetErrorString(err.Error())
		return 1
	}
	return 0
}

//go:build wasip1

// Command broken is a deliberately broken conformance executor: its
// describe is valid, so the host loads it, but it breaks the ABI in the
// ways the plugin suite must catch.
//
//   - start on tool "explode" traps (a Go panic);
//   - start on tool "counter" answers a count that goes up on every call,
//     so replaying the same (effect.id, attempt) gets another reply;
//   - start on input that is not JSON returns 0 with output that is not
//     JSON;
//   - attach answers pending for any effect, even one never started;
//   - cancel traps.
//
// For tests; not a stable API.
package main

import (
	"strconv"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return kit.Describe(abi.Describe{
		Name: "conformance-broken", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{
			{Name: "explode", Description: "Traps", Approval: abi.ApprovalNever},
			{Name: "counter", Description: "Counts its calls", Idempotent: true, Approval: abi.ApprovalNever},
		},
		Attach: true,
	})
}

var calls int

//go:wasmexport start
func start() int32 {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil {
		pdk.Output([]byte("{not json"))
		return 0
	}
	switch in.Effect.Tool {
	case "explode":
		panic("broken: explode")
	case "counter":
		calls++
		return kit.Done(strconv.Itoa(calls))
	}
	return kit.Failed("unknown tool "+in.Effect.Tool, false)
}

//go:wasmexport poll
func poll() int32 { return kit.Reply(abi.Unknown()) }

//go:wasmexport attach
func attach() int32 { return kit.Reply(abi.Pending("made-up", 1000)) }

//go:wasmexport cancel
func cancel() int32 { panic("broken: cancel") }

//go:build wasip1

// Command calculator is an example tool executor: the tool "calculate"
// evaluates an arithmetic expression (package expr: + - * / % ^,
// parentheses, unary minus, decimals). A malformed expression or a
// division by zero is a tool result with is_error true, which the model
// reads and can correct; it is never a trap and never a failed effect.
//
// It works in one call: start answers done. Evaluating twice does no harm,
// so the tool is idempotent and keeps no records: poll and attach answer
// unknown (the host never holds a pending attempt of it), cancel answers
// cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o calculator.wasm ./examples/plugins/calculator
package main

import (
	"encoding/json"
	"fmt"

	"github.com/agenthost/agenthost/examples/plugins/calculator/expr"
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

// marker says the plugin speaks ABI v1. The host reads it from the
// module's exports and never calls it.
//
//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return guest.Describe(abi.Describe{
		Name:    "calculator",
		Version: "1.0.0",
		Role:    abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{{
			Name:        "calculate",
			Description: "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus and decimals. Example: (2+3)*4",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string","description":"the expression, e.g. (2+3)*4"}},"required":["expression"]}`),
			Idempotent:  true,
			Approval:    abi.ApprovalNever,
		}},
		Attach: false,
	})
}

//go:wasmexport start
func start() int32 {
	in, rc, ok := guest.EffectInput()
	if !ok {
		return rc
	}
	if in.Effect.Kind != abi.KindTool || in.Effect.Tool != "calculate" {
		return guest.Reply(abi.Failed(fmt.Sprintf("calculator: no tool %q of kind %q here; this plugin offers the tool \"calculate\"", in.Effect.Tool, in.Effect.Kind), false))
	}
	var args struct {
		Expression *string `json:"expression"`
	}
	if err := guest.ToolArguments(in.Effect, &args); err != nil {
		return guest.Reply(guest.DoneTool("error: the arguments must be {\"expression\": \"...\"}: "+err.Error(), true))
	}
	if args.Expression == nil {
		return guest.Reply(guest.DoneTool("error: the argument \"expression\" is missing; pass {\"expression\": \"(2+3)*4\"}", true))
	}
	v, err := expr.Eval(*args.Expression)
	if err != nil {
		return guest.Reply(guest.DoneTool("error: "+err.Error(), true))
	}
	return guest.Reply(guest.DoneTool(expr.Format(v), false))
}

// poll and attach: the calculator never answers pending, so it holds no
// record of any attempt.
//
//go:wasmexport poll
func poll() int32 { return noRecord() }

//go:wasmexport attach
func attach() int32 { return noRecord() }

func noRecord() int32 {
	if _, rc, ok := guest.EffectInput(); !ok {
		return rc
	}
	return guest.Reply(abi.Unknown())
}

//go:wasmexport cancel
func cancel() int32 {
	if _, rc, ok := guest.EffectInput(); !ok {
		return rc
	}
	return guest.Reply(abi.Cancelled())
}

//go:build wasip1

// Command anthropic is an example model executor for Anthropic's Messages
// API. It sends the builder's request to {base_url}/v1/messages through
// agenthost_http (so only the operator's allowed hosts are reachable),
// maps the messages, tools and tool calls both ways, and reports the
// usage the server counted. Package messages has the mapping.
//
// It answers in one call: start answers done or failed; poll and attach
// answer unknown (nothing is ever pending), cancel answers cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o anthropic.wasm ./examples/plugins/anthropic
package main

import (
	"fmt"

	"github.com/agenthost/agenthost/examples/plugins/anthropic/messages"
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return guest.Describe(abi.Describe{
		Name:    "anthropic",
		Version: "1.0.0",
		Role:    abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindModel},
		Attach:  false,
	})
}

//go:wasmexport start
func start() int32 {
	in, rc, ok := guest.EffectInput()
	if !ok {
		return rc
	}
	if in.Effect.Kind != abi.KindModel {
		return guest.Reply(abi.Failed(fmt.Sprintf("anthropic: effect %s is of kind %q; this plugin carries out model effects only", in.Effect.ID, in.Effect.Kind), false))
	}
	cfg, err := messages.ParseConfig(guest.Config)
	if err != nil {
		return guest.Reply(abi.Failed(err.Error(), false))
	}
	req, err := guest.ModelRequest(in.Effect)
	if err != nil {
		return guest.Reply(abi.Failed("anthropic: "+err.Error(), false))
	}
	httpReq, err := messages.HTTPRequest(cfg, req)
	if err != nil {
		return guest.Reply(abi.Failed("anthropic: cannot encode the request: "+err.Error(), false))
	}
	return guest.Reply(messages.Decode(guest.HTTP(httpReq)))
}

//go:wasmexport poll
func poll() int32 { return noRecord() }

//go:wasmexport attach
func attach() int32 { return noRecord() }

// noRecord answers poll and attach: nothing is ever left pending, so the
// plugin holds no record of any attempt.
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

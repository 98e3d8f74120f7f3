//go:build wasip1

// Command openai is an example model executor for any OpenAI-compatible
// chat-completions endpoint: OpenAI, Ollama, vLLM and the like. It sends
// the builder's request to {base_url}/chat/completions through
// agenthost_http (so only the operator's allowed hosts are reachable),
// maps the tools and tool calls both ways, and reports the usage the
// server counted. Package chat has the mapping.
//
// It answers in one call: start answers done or failed (rate_limited,
// with the wait the server asked for, on a 429); poll and attach answer
// unknown (nothing is ever pending), cancel answers cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o openai.wasm ./examples/plugins/openai
package main

import (
	"fmt"
	"time"

	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/openai/chat"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return guest.Describe(abi.Describe{
		Name:    "openai",
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
		return guest.Reply(abi.Failed(fmt.Sprintf("openai: effect %s is of kind %q; this plugin carries out model effects only", in.Effect.ID, in.Effect.Kind), false))
	}
	cfg, err := chat.ParseConfig(guest.Config)
	if err != nil {
		return guest.Reply(abi.Failed(err.Error(), false))
	}
	req, err := in.Effect.ModelRequest()
	if err != nil {
		return guest.Reply(abi.Failed("openai: "+err.Error(), false))
	}
	httpReq, err := chat.HTTPRequest(cfg, req)
	if err != nil {
		return guest.Reply(abi.Failed("openai: cannot encode the request: "+err.Error(), false))
	}
	resp := guest.HTTP(httpReq)
	return guest.Reply(chat.Decode(resp, time.UnixMilli(guest.NowMS())))
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

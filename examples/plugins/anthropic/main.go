//go:build wasip1

// Command anthropic is an example model executor for Anthropic's Messages
// API. It sends the builder's request to {base_url}/v1/messages through
// the host (so only the operator's allowed hosts are reachable), streamed
// unless the config says stream: false, emits the answer's pieces as they
// arrive, maps the messages, tools and tool calls both ways, and reports
// the usage the server counted. Package messages has the mapping, package
// modelcall the call, package guest the exports every example model
// executor answers alike.
//
// It answers in one call: start answers done or failed; poll and attach
// answer unknown (nothing is ever pending), cancel answers cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o anthropic.wasm ./examples/plugins/anthropic
package main

import (
	"github.com/agenthost/agenthost/examples/plugins/anthropic/messages"
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/plugins/abi"
)

var executor = guest.ModelExecutor{Name: "anthropic", Version: "1.1.0", Call: call}

// call reads the config and carries out the request.
func call(req abi.ModelRequest) abi.EffectReply {
	cfg, err := messages.ParseConfig(guest.Config)
	if err != nil {
		return abi.Failed(err.Error(), false)
	}
	return messages.Call(guest.Host{}, cfg, req)
}

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 { return executor.Describe() }

//go:wasmexport start
func start() int32 { return executor.Start() }

//go:wasmexport poll
func poll() int32 { return executor.NoRecord() }

//go:wasmexport attach
func attach() int32 { return executor.NoRecord() }

//go:wasmexport cancel
func cancel() int32 { return executor.Cancel() }

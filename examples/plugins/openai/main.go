//go:build wasip1

// Command openai is an example model executor for any OpenAI-compatible
// chat-completions endpoint: OpenAI, Ollama, vLLM and the like. It sends
// the builder's request to {base_url}/chat/completions through the host
// (so only the operator's allowed hosts are reachable), streamed unless
// the config says stream: false, emits the answer's pieces as they
// arrive, maps the tools and tool calls both ways, and reports the usage
// the server counted. Package chat has the mapping, package modelcall
// the call, package guest the exports every example model executor
// answers alike.
//
// It answers in one call: start answers done or failed (rate_limited,
// with the wait the server asked for, on a 429); poll and attach answer
// unknown (nothing is ever pending), cancel answers cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o openai.wasm ./examples/plugins/openai
package main

import (
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/openai/chat"
	"github.com/agenthost/agenthost/plugins/abi"
)

var executor = guest.ModelExecutor{Name: "openai", Version: "1.1.0", Call: call}

// call reads the config and carries out the request.
func call(req abi.ModelRequest) abi.EffectReply {
	cfg, err := chat.ParseConfig(guest.Config)
	if err != nil {
		return abi.Failed(err.Error(), false)
	}
	return chat.Call(guest.Host{}, cfg, req)
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

//go:build wasip1

// Command scripted-model is the embedded default model executor: a
// deterministic model that needs no network, so that `make run` works
// anywhere. It reads the request's messages and tools and decides from a
// rules table (package model; the table is in README.md): arithmetic goes
// to the calculate tool, one call per expression in one message, and the
// results come back as the answer.
//
// It answers in one call: start answers done; poll and attach answer
// unknown (it never leaves an attempt pending), cancel answers cancelled.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o scripted-model.wasm ./examples/plugins/scripted-model
package main

import (
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/scripted-model/model"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

// scripted is the model executor: every export but the marker is one of
// its methods (guest.ModelExecutor), which decodes a start's input and
// its model request in one pass.
var scripted = guest.ModelExecutor{
	Name:    "scripted-model",
	Version: "1.0.0",
	Call:    func(req abi.ModelRequest) abi.EffectReply { return guest.DoneModel(model.Respond(req)) },
}

//go:wasmexport describe
func describe() int32 { return scripted.Describe() }

//go:wasmexport start
func start() int32 { return scripted.Start() }

//go:wasmexport poll
func poll() int32 { return scripted.NoRecord() }

//go:wasmexport attach
func attach() int32 { return scripted.NoRecord() }

//go:wasmexport cancel
func cancel() int32 { return scripted.Cancel() }

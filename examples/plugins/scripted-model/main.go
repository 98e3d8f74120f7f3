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
	"fmt"

	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/scripted-model/model"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return guest.Describe(abi.Describe{
		Name:    "scripted-model",
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
		return guest.Reply(abi.Failed(fmt.Sprintf("scripted-model: effect %s is of kind %q; this plugin carries out model effects only", in.Effect.ID, in.Effect.Kind), false))
	}
	req, err := guest.ModelRequest(in.Effect)
	if err != nil {
		return guest.Reply(abi.Failed("scripted-model: "+err.Error(), false))
	}
	return guest.Reply(abi.DoneModel(model.Respond(req)))
}

//go:wasmexport poll
func poll() int32 { return noRecord() }

//go:wasmexport attach
func attach() int32 { return noRecord() }

// noRecord answers poll and attach: the model never answers pending, so it
// holds no record of any attempt.
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

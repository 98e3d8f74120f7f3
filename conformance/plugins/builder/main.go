//go:build wasip1

// Command builder is a well-behaved conformance builder: it turns a Run
// view into a model request, deterministically. The request starts with a
// fixed system message, then the session's history, then the Run's
// transcript; when the transcript is empty it ends with the Run's input as
// a user message. The tools pass through unchanged, and params carry the
// step, so a test can see which step a request belongs to.
package main

import (
	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
)

// SystemPrompt is the first message of every request.
const SystemPrompt = "You are the agenthost conformance model."

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return kit.Describe(abi.Describe{Name: "conformance-builder", Version: "1.0.0", Role: abi.RoleBuilder})
}

//go:wasmexport build
func build() int32 {
	var in abi.BuildInput
	if err := kit.Input(&in); err != nil {
		return kit.Fail("build: bad input: " + err.Error())
	}
	if in.Run.ID == "" {
		return kit.Fail("build: run.id is missing")
	}
	msgs := []abi.Message{{Role: abi.MessageSystem, Content: SystemPrompt}}
	msgs = append(msgs, in.History...)
	if len(in.Transcript) == 0 {
		msgs = append(msgs, abi.Message{Role: abi.MessageUser, Content: in.Run.Input})
	} else {
		msgs = append(msgs, in.Transcript...)
	}
	return kit.Reply(abi.BuildOutput{Request: abi.ModelRequest{
		Messages: msgs,
		Tools:    in.Tools,
		Params:   map[string]any{"step": in.Run.Step},
	}})
}

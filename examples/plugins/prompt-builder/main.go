//go:build wasip1

// Command prompt-builder is an example builder. For each model step it
// makes the request: a system message from its config (system_prompt),
// the session's history cut to the last history_window messages, the
// Run's transcript, and the Run's tools (package prompt).
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o prompt-builder.wasm ./examples/plugins/prompt-builder
package main

import (
	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/prompt-builder/prompt"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return guest.Describe(abi.Describe{Name: "prompt-builder", Version: "1.0.0", Role: abi.RoleBuilder})
}

// build has no side effects: the host stores its output in the step's
// durable record and never calls it again for that step.
//
//go:wasmexport build
func build() int32 {
	var in abi.BuildInput
	if err := guest.Input(&in); err != nil {
		return guest.Fail("prompt-builder: the input is not a build input: " + err.Error())
	}
	cfg, err := config()
	if err != nil {
		return guest.Fail(err.Error())
	}
	return guest.Reply(prompt.Build(cfg, in))
}

// parsed is the config as the first build read it: an instance's config
// never changes (the host makes new instances when it does), so later
// builds skip the host calls that read it.
var parsed struct {
	done bool
	cfg  prompt.Config
	err  error
}

// config is the plugin's config, parsed.
func config() (prompt.Config, error) {
	if !parsed.done {
		parsed.cfg, parsed.err = prompt.ParseConfig(guest.Config)
		parsed.done = true
	}
	return parsed.cfg, parsed.err
}

//go:build wasip1

// Command slow-job is an example tool executor whose tool, slow_job, runs
// for a given number of seconds on the host clock. It is the recovery
// demonstration: start answers pending and keeps the job in the host KV,
// keyed by (effect id, attempt); poll and attach answer from that record
// in any instance, after any restart, with or without the handle; attach
// with no record answers unknown. Package job has the logic and documents
// the KV keys.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o slow-job.wasm ./examples/plugins/slow-job
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins/internal/guest"
	"github.com/agenthost/agenthost/examples/plugins/slow-job/job"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

var jobs = job.Jobs{KV: guest.KV{}, Now: guest.NowMS}

//go:wasmexport describe
func describe() int32 {
	// The version and attaches_from come from the config, so that plugin
	// upgrades (docs/OPERATIONS.md, "Rolling changes") can be shown with
	// one file: a real plugin declares its own.
	version := "1.0.0"
	if v, ok := guest.Config("version"); ok && v != "" {
		version = v
	}
	var attachesFrom []string
	if v, ok := guest.Config("attaches_from"); ok && v != "" {
		attachesFrom = strings.Split(v, ",")
	}
	return guest.Describe(abi.Describe{
		Name:    "slow-job",
		Version: version,
		Role:    abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{{
			Name:        job.Tool,
			Description: "Run a job that takes the given number of seconds, then report that it finished. For demonstrations of long-running work.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"seconds":{"type":"number","description":"how long the job runs, in seconds"},"label":{"type":"string","description":"a name for the job"}},"required":["seconds"]}`),
			Idempotent:  false,
			Approval:    abi.ApprovalNever,
		}},
		Attach:       true,
		AttachesFrom: attachesFrom,
	})
}

//go:wasmexport start
func start() int32 {
	in, rc, ok := guest.EffectInput()
	if !ok {
		return rc
	}
	reply := jobs.Start(in.Effect)
	if reply.State == abi.StatePending {
		guest.Progress(fmt.Sprintf("slow job %s#%d running", in.Effect.ID, in.Effect.Attempt))
	}
	return guest.Reply(reply)
}

//go:wasmexport poll
func poll() int32 { return lookup() }

//go:wasmexport attach
func attach() int32 { return lookup() }

func lookup() int32 {
	in, rc, ok := guest.EffectInput()
	if !ok {
		return rc
	}
	return guest.Reply(jobs.Poll(in.Effect))
}

//go:wasmexport cancel
func cancel() int32 {
	in, rc, ok := guest.EffectInput()
	if !ok {
		return rc
	}
	reply, err := jobs.Cancel(in.Effect)
	if err != nil {
		return guest.Fail(err.Error())
	}
	return guest.Reply(reply)
}

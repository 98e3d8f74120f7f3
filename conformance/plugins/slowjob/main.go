//go:build wasip1

// Command slowjob is a conformance executor whose tool "slow" takes time:
// start answers pending and keeps the job's record in the host KV, keyed by
// (effect id, attempt), never by the handle alone. poll and attach answer
// from that record, so they work after the instance is gone, and attach
// works with an empty handle. With no record, poll and attach answer
// unknown.
//
// A job is done once the host clock (agenthost_now_ms) has moved
// duration_ms past its start (argument duration_ms, default 1000). Its
// outcome content is "slow:EFFECT#ATTEMPT". cancel deletes the record.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func marker() {}

//go:wasmexport describe
func describe() int32 {
	return kit.Describe(abi.Describe{
		Name: "conformance-slowjob", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool},
		Tools: []abi.Tool{{Name: "slow", Description: "A job that finishes after duration_ms",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"duration_ms":{"type":"integer"}}}`),
			Idempotent:  true, Approval: abi.ApprovalNever}},
		Attach: true,
	})
}

type record struct {
	StartedMS  int64 `json:"started_ms"`
	DurationMS int64 `json:"duration_ms"`
	Polls      int   `json:"polls"`
}

func key(e abi.Effect) string { return fmt.Sprintf("job/%s#%d", e.ID, e.Attempt) }

func input() (abi.EffectInput, int32, bool) {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil {
		return in, kit.Fail("bad input: " + err.Error()), false
	}
	if in.Effect.ID == "" || in.Effect.Attempt < 1 {
		return in, kit.Fail("effect.id and effect.attempt are required"), false
	}
	return in, 0, true
}

func load(e abi.Effect) (record, bool) {
	b, ok := kit.KVGet(key(e))
	if !ok {
		return record{}, false
	}
	var r record
	if json.Unmarshal(b, &r) != nil {
		return record{}, false
	}
	return r, true
}

func save(e abi.Effect, r record) abi.Status {
	b, _ := json.Marshal(r)
	return kit.KVSet(key(e), b)
}

// answer reports the job's state from its record.
func answer(e abi.Effect, r record) int32 {
	if kit.NowMS()-r.StartedMS >= r.DurationMS {
		return kit.Done(fmt.Sprintf("slow:%s#%d", e.ID, e.Attempt))
	}
	return kit.Reply(abi.EffectReply{State: abi.StatePending, Handle: key(e), PollAfterMS: 100})
}

//go:wasmexport start
func start() int32 {
	in, rc, ok := input()
	if !ok {
		return rc
	}
	if in.Effect.Tool != "slow" {
		return kit.Failed(fmt.Sprintf("unknown tool %q", in.Effect.Tool), false)
	}
	if r, found := load(in.Effect); found { // the same attempt again: idempotent
		return answer(in.Effect, r)
	}
	var req abi.ToolRequest
	_ = json.Unmarshal(in.Effect.Request, &req)
	var args struct {
		DurationMS int64 `json:"duration_ms"`
	}
	_ = json.Unmarshal(req.Arguments, &args)
	if args.DurationMS <= 0 {
		args.DurationMS = 1000
	}
	r := record{StartedMS: kit.NowMS(), DurationMS: args.DurationMS}
	if st := save(in.Effect, r); st != abi.StatusOK {
		return kit.Failed(fmt.Sprintf("kv_set: status %d", st), true)
	}
	return kit.Reply(abi.EffectReply{State: abi.StatePending, Handle: key(in.Effect), PollAfterMS: 100})
}

func lookup() int32 {
	in, rc, ok := input()
	if !ok {
		return rc
	}
	r, found := load(in.Effect)
	if !found {
		return kit.Reply(abi.EffectReply{State: abi.StateUnknown})
	}
	r.Polls++
	save(in.Effect, r)
	return answer(in.Effect, r)
}

//go:wasmexport poll
func poll() int32 { return lookup() }

//go:wasmexport attach
func attach() int32 { return lookup() }

//go:wasmexport cancel
func cancel() int32 {
	in, rc, ok := input()
	if !ok {
		return rc
	}
	if _, found := load(in.Effect); !found {
		return kit.Reply(abi.CancelReply{State: abi.StateUnknown})
	}
	if st := kit.KVDelete(key(in.Effect)); st != abi.StatusOK {
		return kit.Fail(fmt.Sprintf("kv_delete: status %d", st))
	}
	return kit.Reply(abi.CancelReply{State: abi.StateCancelled})
}

//go:build wasip1

// Package kit is the small plugin-side helper the conformance plugins share:
// typed wrappers over the agenthost host functions (extism:host/user) and
// the Extism input/output calls, so that each plugin reads like the ABI.
//
// For tests; not a stable API.
package kit

import (
	"encoding/json"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/extism/go-pdk"
)

//go:wasmimport extism:host/user agenthost_kv_get
func hostKVGet(key uint64) uint64

//go:wasmimport extism:host/user agenthost_kv_set
func hostKVSet(key, value uint64) uint64

//go:wasmimport extism:host/user agenthost_kv_delete
func hostKVDelete(key uint64) uint64

//go:wasmimport extism:host/user agenthost_now_ms
func hostNowMS() uint64

//go:wasmimport extism:host/user agenthost_emit
func hostEmit(event uint64) uint64

//go:wasmimport extism:host/user agenthost_http
func hostHTTP(request uint64) uint64

// KVGet reads a key from the plugin's KV space; ok is false when it is
// missing.
func KVGet(key string) ([]byte, bool) {
	k := pdk.AllocateString(key)
	defer k.Free()
	off := hostKVGet(k.Offset())
	if off == 0 {
		return nil, false
	}
	m := pdk.FindMemory(off)
	defer m.Free()
	return m.ReadBytes(), true
}

// KVSet writes a key durably; an empty value deletes it.
func KVSet(key string, value []byte) abi.Status {
	k := pdk.AllocateString(key)
	defer k.Free()
	v := pdk.AllocateBytes(value)
	defer v.Free()
	return abi.Status(hostKVSet(k.Offset(), v.Offset()))
}

// KVDelete removes a key.
func KVDelete(key string) abi.Status {
	k := pdk.AllocateString(key)
	defer k.Free()
	return abi.Status(hostKVDelete(k.Offset()))
}

// NowMS is the host clock in Unix milliseconds.
func NowMS() int64 { return int64(hostNowMS()) }

// Emit sends a progress event to the Run's stream.
func Emit(message string) abi.Status {
	return EmitEvent(abi.EmitEvent{Type: abi.EmitProgress, Message: message})
}

// EmitEvent sends ev with agenthost_emit.
func EmitEvent(ev abi.EmitEvent) abi.Status {
	b, _ := json.Marshal(ev)
	m := pdk.AllocateBytes(b)
	defer m.Free()
	return abi.Status(hostEmit(m.Offset()))
}

// HTTP sends a request through agenthost_http.
func HTTP(req abi.HTTPRequest) abi.HTTPResponse {
	b, _ := json.Marshal(req)
	m := pdk.AllocateBytes(b)
	defer m.Free()
	off := hostHTTP(m.Offset())
	if off == 0 {
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "no response"}}
	}
	r := pdk.FindMemory(off)
	defer r.Free()
	var resp abi.HTTPResponse
	if err := json.Unmarshal(r.ReadBytes(), &resp); err != nil {
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: err.Error()}}
	}
	return resp
}

// Input decodes the call's JSON input into v.
func Input(v any) error { return pdk.InputJSON(v) }

// Reply writes v as the call's JSON output and returns the ok status.
func Reply(v any) int32 {
	if err := pdk.OutputJSON(v); err != nil {
		return Fail(err.Error())
	}
	return 0
}

// Fail reports a protocol error through error_set and returns non-zero.
func Fail(msg string) int32 {
	pdk.SetErrorString(msg)
	return 1
}

// Done replies done with a tool outcome.
func Done(content string) int32 {
	out, _ := json.Marshal(abi.ToolOutcome{Content: content})
	return Reply(abi.EffectReply{State: abi.StateDone, Outcome: out})
}

// Failed replies failed with a message.
func Failed(msg string, retriable bool) int32 {
	return Reply(abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: msg, Retriable: retriable}})
}

// Describe answers describe with d, stamped with the ABI version the host
// chose.
func Describe(d abi.Describe) int32 {
	var in abi.DescribeInput
	if err := Input(&in); err != nil {
		return Fail("describe: bad input: " + err.Error())
	}
	d.ABI = abi.Version
	return Reply(d)
}

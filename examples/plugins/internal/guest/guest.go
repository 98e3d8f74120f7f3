//go:build wasip1

// Package guest is the plugin side of ABI v1 that the example plugins
// share: the call's input and output (one host call each, through
// agenthost_input_read and agenthost_output_set), the plugin's config,
// typed wrappers over the agenthost host functions (module
// extism:host/user), and the exports every example model executor
// answers alike (ModelExecutor). Each wrapper is a few lines over go-pdk
// or a host function; copy them into your own plugin freely (docs/ABI.md,
// "Writing a plugin", shows them in full).
//
// The JSON codec is github.com/segmentio/encoding/json, a drop-in for
// encoding/json (the same API, struct tags and decoding rules; a few error
// messages are worded differently). Compiled to Wasm it handles the ABI's
// payloads in about half the time, and JSON is most of a Go plugin's call
// (docs/BENCHMARKS.md, "What a recovered Run's guests cost"). A plugin of
// your own may use either.
//
// It builds only for GOOS=wasip1, like every plugin source.
package guest

import (
	"bytes"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/extism/go-pdk"
	"github.com/segmentio/encoding/json"
)

//go:wasmimport extism:host/user agenthost_kv_get
func hostKVGet(key uint64) uint64

//go:wasmimport extism:host/user agenthost_kv_set
func hostKVSet(key, value uint64) uint64

//go:wasmimport extism:host/user agenthost_now_ms
func hostNowMS() uint64

//go:wasmimport extism:host/user agenthost_emit
func hostEmit(event uint64) uint64

//go:wasmimport extism:host/user agenthost_http
func hostHTTP(request uint64) uint64

//go:wasmimport extism:host/user agenthost_http_open
func hostHTTPOpen(request uint64) uint64

//go:wasmimport extism:host/user agenthost_http_read
func hostHTTPRead(stream, max uint64) uint64

//go:wasmimport extism:host/user agenthost_http_close
func hostHTTPClose(stream uint64) uint64

//go:wasmimport extism:host/user agenthost_input_read
func hostInputRead(ptr, n uint64) uint64

//go:wasmimport extism:host/user agenthost_output_set
func hostOutputSet(ptr, n uint64)

// The call's input and output move between the host and this module's
// memory in one host call each (agenthost_input_read and
// agenthost_output_set), not through the Extism kernel 8 bytes a call as
// go-pdk's Input and Output move them: for a builder's input, which
// repeats the Run's transcript, that is hundreds of host calls a call
// (docs/BENCHMARKS.md, "Leaner guests"). Both buffers are kept from one
// call to the next: the decoder copies what it keeps (no ZeroCopy flag),
// and the host copies the output before agenthost_output_set returns.
var inputBuf, outputBuf []byte

// input is the call's input, in inputBuf: valid until the next call.
func input() []byte {
	n := hostInputRead(ptrOf(inputBuf), uint64(cap(inputBuf)))
	if n > uint64(cap(inputBuf)) {
		inputBuf = make([]byte, n)
		n = hostInputRead(ptrOf(inputBuf), n)
	}
	inputBuf = inputBuf[:n]
	return inputBuf
}

// ptrOf is the address of b's first element in this module's memory (0
// when it has none): what a host function takes as a pointer.
func ptrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b[:cap(b)])))) }

// Input decodes the call's JSON input into v.
func Input(v any) error { return json.Unmarshal(input(), v) }

// ModelRequest is abi.Effect.ModelRequest on this package's codec: the
// request of a model effect, or an error that names the effect.
func ModelRequest(e abi.Effect) (abi.ModelRequest, error) {
	var req abi.ModelRequest
	if err := json.Unmarshal(e.Request, &req); err != nil {
		return abi.ModelRequest{}, fmt.Errorf("abi: effect %s: request is not a model request: %w", e.ID, err)
	}
	return req, nil
}

// Done is abi.Done on this package's codec: a done reply with outcome
// as its JSON (the same bytes), or a failed one when it cannot be
// encoded.
func Done(outcome any) abi.EffectReply {
	raw, err := json.Marshal(outcome)
	if err != nil {
		return abi.Failed(fmt.Sprintf("abi: cannot encode the outcome: %v", err), false)
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}
}

// DoneModel is abi.DoneModel on this package's codec.
func DoneModel(m abi.ModelOutcome) abi.EffectReply { return Done(m) }

// DoneTool is abi.DoneTool on this package's codec.
func DoneTool(content string, isError bool) abi.EffectReply {
	return Done(abi.ToolOutcome{Content: content, IsError: isError})
}

// ToolArguments is abi.Effect.ToolArguments on this package's codec: it
// decodes the arguments of a tool effect's request into v ({} when the
// request or its arguments are absent or null), or returns an error that
// names the effect, in the same words.
func ToolArguments(e abi.Effect, v any) error {
	var req abi.ToolRequest
	if !absent(e.Request) {
		if err := json.Unmarshal(e.Request, &req); err != nil {
			return fmt.Errorf("abi: effect %s: request is not {\"arguments\": {…}}: %w", e.ID, err)
		}
	}
	args := req.Arguments
	if absent(args) {
		args = []byte("{}")
	}
	if err := json.Unmarshal(args, v); err != nil {
		return fmt.Errorf("abi: effect %s: arguments: %w", e.ID, err)
	}
	return nil
}

// absent reports whether raw JSON is no value: empty, or null, with JSON
// white space around it.
func absent(raw []byte) bool {
	t := bytes.Trim(raw, " \t\r\n")
	return len(t) == 0 || string(t) == "null"
}

// Reply writes v as the call's JSON output and returns 0, the ok status.
// It encodes v as json.Marshal does.
func Reply(v any) int32 {
	b, err := json.Append(outputBuf[:0], v, json.EscapeHTML|json.SortMapKeys)
	if err != nil {
		return Fail("cannot encode the reply: " + err.Error())
	}
	outputBuf = b
	hostOutputSet(ptrOf(b), uint64(len(b)))
	runtime.KeepAlive(b)
	return 0
}

// Fail reports a protocol error through error_set and returns 1: the host
// fails the call with class plugin_protocol and this message.
func Fail(msg string) int32 {
	pdk.SetErrorString(msg)
	return 1
}

// Config reads the plugin's config value for key (lower case: the
// operator's YAML loader lowercases keys); ok is false when it is unset.
func Config(key string) (string, bool) { return pdk.GetConfig(key) }

// Describe answers describe with d, stamped with ABI v1.
func Describe(d abi.Describe) int32 {
	var in abi.DescribeInput
	if err := Input(&in); err != nil {
		return Fail("describe: the input is not JSON: " + err.Error())
	}
	d.ABI = abi.Version
	return Reply(d)
}

// EffectInput decodes the input of start, poll, attach or cancel, and
// checks that it names an effect attempt. On a bad input it returns the
// protocol-error status to return, and false.
func EffectInput() (abi.EffectInput, int32, bool) {
	var in abi.EffectInput
	if err := Input(&in); err != nil {
		return in, Fail("the input is not an effect input: " + err.Error()), false
	}
	if in.Effect.ID == "" || in.Effect.Attempt < 1 {
		return in, Fail("the input names no effect attempt: effect.id and effect.attempt (from 1) are required"), false
	}
	return in, 0, true
}

// KV is the plugin's durable key-value space in the host
// (agenthost_kv_get/set), scoped to the tenant and the plugin.
type KV struct{}

// Get reads key; ok is false when it is missing. When the store fails, the
// host aborts the call instead of answering: a missing key is really
// missing.
func (KV) Get(key string) ([]byte, bool) {
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

// Set writes key durably before it returns; an empty value deletes it.
func (KV) Set(key string, value []byte) abi.Status {
	k := pdk.AllocateString(key)
	defer k.Free()
	v := pdk.AllocateBytes(value)
	defer v.Free()
	return abi.Status(hostKVSet(k.Offset(), v.Offset()))
}

// NowMS is the host clock in Unix milliseconds (fake under test).
func NowMS() int64 { return int64(hostNowMS()) }

// Progress puts a progress event on the Run's event stream. It is for
// people watching; a failure to emit changes nothing.
func Progress(message string) abi.Status {
	return emit(abi.EmitEvent{Type: abi.EmitProgress, Message: message})
}

// EmitDelta puts a model_delta event on the Run's event stream: the next
// pieces of the model's answer, while it streams in. The host takes it
// only during a model effect's call; the status is ignored, since the
// reply, not the pieces, is the answer.
func EmitDelta(d abi.ModelDelta) {
	_ = emit(abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &d})
}

// emit calls agenthost_emit with ev.
func emit(ev abi.EmitEvent) abi.Status {
	b, err := json.Marshal(ev)
	if err != nil {
		return abi.StatusRefused
	}
	m := pdk.AllocateBytes(b)
	defer m.Free()
	return abi.Status(hostEmit(m.Offset()))
}

// HTTP sends req through agenthost_http, to the plugin's allowed hosts
// only. A refused or failed request comes back with Error set.
func HTTP(req abi.HTTPRequest) abi.HTTPResponse {
	b, err := json.Marshal(req)
	if err != nil {
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "cannot encode the request: " + err.Error()}}
	}
	m := pdk.AllocateBytes(b)
	defer m.Free()
	off := hostHTTP(m.Offset())
	if off == 0 {
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http returned no response"}}
	}
	r := pdk.FindMemory(off)
	defer r.Free()
	var resp abi.HTTPResponse
	if err := json.Unmarshal(r.ReadBytes(), &resp); err != nil {
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http response is not JSON: " + err.Error()}}
	}
	return resp
}

// HTTPOpen sends req through agenthost_http_open, to the plugin's allowed
// hosts only, and returns the response's head: its status, its headers
// and the stream to read its body from with HTTPRead, to release with
// HTTPClose. A refused or failed request comes back with Error set and
// no stream.
func HTTPOpen(req abi.HTTPRequest) abi.HTTPStreamHead {
	b, err := json.Marshal(req)
	if err != nil {
		return abi.HTTPStreamHead{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "cannot encode the request: " + err.Error()}}
	}
	m := pdk.AllocateBytes(b)
	defer m.Free()
	off := hostHTTPOpen(m.Offset())
	if off == 0 {
		return abi.HTTPStreamHead{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http_open returned no head"}}
	}
	r := pdk.FindMemory(off)
	defer r.Free()
	var head abi.HTTPStreamHead
	if err := json.Unmarshal(r.ReadBytes(), &head); err != nil {
		return abi.HTTPStreamHead{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http_open head is not JSON: " + err.Error()}}
	}
	return head
}

// HTTPRead waits for the next bytes of a stream's body and returns 1 to
// max of them (max <= 0: as many as the host gives at once, at most its
// chunk cap). It returns nil at the end of the body, and when reading it
// failed: HTTPClose then says which.
func HTTPRead(stream int64, max int) []byte {
	off := hostHTTPRead(uint64(stream), uint64(int64(max)))
	if off == 0 {
		return nil
	}
	r := pdk.FindMemory(off)
	defer r.Free()
	return r.ReadBytes()
}

// HTTPClose releases a stream, read to its end or not, and says how
// reading it ended: Error is set when it failed (timeout, too_large,
// failed), not when it was read to its end or closed early by choice.
func HTTPClose(stream int64) abi.HTTPStreamEnd {
	off := hostHTTPClose(uint64(stream))
	if off == 0 {
		return abi.HTTPStreamEnd{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http_close returned no result"}}
	}
	r := pdk.FindMemory(off)
	defer r.Free()
	var end abi.HTTPStreamEnd
	if err := json.Unmarshal(r.ReadBytes(), &end); err != nil {
		return abi.HTTPStreamEnd{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "agenthost_http_close result is not JSON: " + err.Error()}}
	}
	return end
}

package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tetratelabs/wazero/api"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// maxEmitBytes bounds one agenthost_emit event.
const maxEmitBytes = 64 << 10

// maxDeltaToolCalls bounds a model_delta's tool call index: no answer
// calls more tools at once.
const maxDeltaToolCalls = 1024

// errHostAbort is the panic value a host function unwinds the guest with
// after it recorded why in the call scope.
var errHostAbort = errors.New("host: call aborted by a host function")

// hostFunc is one extism:host/user function of ABI v1, on either call
// path: s is the call's scope (nil outside every call) and m the plugin's
// Extism memory.
type hostFunc func(ctx context.Context, s *callScope, m guestMemory, stack []uint64)

// abiFunc is a host function with its exact wasm types (abi.HostFuncs)
// and whether it does I/O, which a native call bounds by the call's
// deadline.
type abiFunc struct {
	name    string
	fn      hostFunc
	params  []api.ValueType
	results []api.ValueType
	io      bool
}

// abiFunctions are the extism:host/user functions of ABI v1. Each finds
// its tenant, plugin and Run in the call's scope. None traps the plugin
// for a failure it can report with a status; only kv_get aborts the call
// when the store fails, so that a store outage never looks like a missing
// key.
func (h *Host) abiFunctions() []abiFunc {
	i64 := api.ValueTypeI64
	return []abiFunc{
		{abi.HostKVGet, h.kvGet, []api.ValueType{i64}, []api.ValueType{i64}, true},
		{abi.HostKVSet, h.kvSet, []api.ValueType{i64, i64}, []api.ValueType{i64}, true},
		{abi.HostKVDel, h.kvDelete, []api.ValueType{i64}, []api.ValueType{i64}, true},
		{abi.HostNowMS, h.nowMS, nil, []api.ValueType{i64}, false},
		{abi.HostEmit, h.emit, []api.ValueType{i64}, []api.ValueType{i64}, true},
		{abi.HostHTTP, h.httpCall, []api.ValueType{i64}, []api.ValueType{i64}, true},
		{abi.HostHTTPOpen, h.httpOpen, []api.ValueType{i64}, []api.ValueType{i64}, true},
		{abi.HostHTTPRead, h.httpRead, []api.ValueType{i64, i64}, []api.ValueType{i64}, true},
		{abi.HostHTTPClose, h.httpClose, []api.ValueType{i64}, []api.ValueType{i64}, false},
		{abi.HostInputRead, inputRead, []api.ValueType{i64, i64}, []api.ValueType{i64}, false},
		{abi.HostOutputSet, outputSet, []api.ValueType{i64, i64}, nil, false},
	}
}

// guestMemory is the plugin's Extism memory as a host function reaches
// it: the native kernel, or the go-sdk's kernel module.
type guestMemory interface {
	// readBlock copies the block at off, as go-sdk's ReadBytes does: its
	// length by the allocator's walk, then that many bytes.
	readBlock(off uint64) ([]byte, bool)
	// freeBlock is the kernel's free.
	freeBlock(off uint64)
	// allocBlock is the kernel's alloc: 0 when there is no room.
	allocBlock(n uint64) uint64
	// write copies b to off; false when it does not fit.
	write(off uint32, b []byte) bool
	// setOutput is the kernel's output_set: the call's output is the n
	// bytes of the block at off.
	setOutput(off, n uint64)
	// plugin is the plugin module's own linear memory (its export
	// "memory"), which agenthost_input_read and agenthost_output_set
	// reach by pointer; nil when it has none.
	plugin() api.Memory
}

// readArg reads an Extism memory block the guest passed, and frees it.
func readArg(m guestMemory, off uint64) ([]byte, bool) {
	if off == 0 {
		return nil, false
	}
	b, ok := m.readBlock(off)
	if !ok {
		return nil, false
	}
	m.freeBlock(off)
	return b, true
}

// writeResult copies b into the guest's Extism memory and returns its
// offset; ok is false when the kernel has no room left.
func writeResult(m guestMemory, b []byte) (uint64, bool) {
	off := m.allocBlock(uint64(len(b)))
	if off == 0 || !m.write(uint32(off), b) {
		return 0, false
	}
	return off, true
}

// pluginBytes is the n bytes at ptr in the plugin's own memory, as a view
// (writing to it writes the plugin's memory): what fn was handed. A range
// that is not all inside that memory traps the call with an error that
// says so; a plugin is untrusted, so its pointer and length are checked
// before anything is read, written or allocated.
func pluginBytes(m guestMemory, fn string, ptr, n uint64) []byte {
	mem := m.plugin()
	if mem == nil {
		trapf("%s: the plugin exports no memory to read or write", fn)
	}
	size := uint64(mem.Size())
	if ptr > size || n > size-ptr {
		trapf("%s: the range of %d bytes at %d is outside the plugin's memory of %d bytes", fn, n, ptr, size)
	}
	b, ok := mem.Read(uint32(ptr), uint32(n))
	if !ok {
		trapf("%s: the range of %d bytes at %d is outside the plugin's memory of %d bytes", fn, n, ptr, size)
	}
	return b
}

// inputRead is agenthost_input_read(ptr, len) -> i64: it copies the first
// len bytes of the call's input (all of it, when it is shorter) to ptr in
// the plugin's own memory, and returns the input's whole length. Outside
// a call the input is empty.
func inputRead(_ context.Context, s *callScope, m guestMemory, stack []uint64) {
	var input []byte
	if s != nil {
		input = s.input
	}
	n := min(stack[1], uint64(len(input)))
	copy(pluginBytes(m, abi.HostInputRead, stack[0], n), input)
	stack[0] = uint64(len(input))
}

// outputSet is agenthost_output_set(ptr, len): the len bytes at ptr in
// the plugin's own memory become the call's output, as Extism's
// output_set makes a block of the kernel's: they are copied into a block
// of the kernel's, which output_set then names, so that the last of the
// two the plugin calls sets the output. A kernel with no room left fails
// the call plugin_oom, as agenthost_kv_get does.
func outputSet(_ context.Context, s *callScope, m guestMemory, stack []uint64) {
	b := pluginBytes(m, abi.HostOutputSet, stack[0], stack[1])
	if len(b) == 0 {
		m.setOutput(0, 0)
		return
	}
	off, ok := writeResult(m, b)
	if !ok {
		err := fmt.Errorf("%s: no room in the plugin's memory for a %d-byte output", abi.HostOutputSet, len(b))
		if s == nil {
			panic(err)
		}
		s.abortCall(abi.ClassPluginOOM, err)
		panic(errHostAbort)
	}
	m.setOutput(off, uint64(len(b)))
}

func (h *Host) kvGet(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	key, ok := readArg(m, stack[0])
	stack[0] = 0
	if s == nil || s.tenant == "" || !ok || len(key) == 0 {
		return // no such key can exist
	}
	if h.cfg.KV == nil {
		s.abortCall(abi.ClassExecutorUnavailable, fmt.Errorf("agenthost_kv_get: no KV store is configured: %w", runtime.ErrExecutorUnavailable))
		panic(errHostAbort)
	}
	val, err := h.cfg.KV.KVGet(ctx, s.tenant, s.plugin.name, key)
	if err != nil {
		s.abortCall(abi.ClassExecutorUnavailable, fmt.Errorf("agenthost_kv_get: the store failed, so the call was aborted rather than answer \"missing\": %w (%w)", err, runtime.ErrExecutorUnavailable))
		panic(errHostAbort)
	}
	if len(val) == 0 {
		return
	}
	off, ok := writeResult(m, val)
	if !ok {
		s.abortCall(abi.ClassPluginOOM, fmt.Errorf("agenthost_kv_get: no room in the plugin's memory for a %d-byte value", len(val)))
		panic(errHostAbort)
	}
	stack[0] = off
}

func kvStatus(err error) abi.Status {
	switch {
	case err == nil:
		return abi.StatusOK
	case errors.Is(err, runtime.ErrKVTooLarge), errors.Is(err, runtime.ErrKVQuota):
		return abi.StatusTooLarge
	default:
		return abi.StatusStoreUnavailable
	}
}

func (h *Host) kvSet(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	key, okKey := readArg(m, stack[0])
	val, _ := readArg(m, stack[1])
	switch {
	case s == nil || s.tenant == "" || !okKey || len(key) == 0:
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.KV == nil:
		stack[0] = uint64(abi.StatusStoreUnavailable)
	default:
		stack[0] = uint64(kvStatus(h.cfg.KV.KVSet(ctx, s.tenant, s.plugin.name, key, val)))
	}
}

func (h *Host) kvDelete(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	key, ok := readArg(m, stack[0])
	switch {
	case s == nil || s.tenant == "" || !ok || len(key) == 0:
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.KV == nil:
		stack[0] = uint64(abi.StatusStoreUnavailable)
	default:
		stack[0] = uint64(kvStatus(h.cfg.KV.KVDelete(ctx, s.tenant, s.plugin.name, key)))
	}
}

func (h *Host) nowMS(_ context.Context, _ *callScope, _ guestMemory, stack []uint64) {
	stack[0] = uint64(h.clock.Now().UnixMilli())
}

func (h *Host) emit(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	b, ok := readArg(m, stack[0])
	var ev abi.EmitEvent
	switch {
	case s == nil || s.tenant == "" || !ok:
		stack[0] = uint64(abi.StatusRefused)
	case len(b) > maxEmitBytes:
		stack[0] = uint64(abi.StatusTooLarge)
	case json.Unmarshal(b, &ev) != nil || ev.Type == "" || !s.mayEmit(ev):
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.Events == nil:
		stack[0] = uint64(abi.StatusOK) // no sink: dropped, as documented
	default:
		scope := runtime.EmitScope{Tenant: s.tenant, Session: s.session, RunID: s.runID, EffectID: s.effectID, Plugin: s.plugin.name, Attempt: s.attempt}
		if ev.Type == abi.EmitModelDelta {
			scope.DeltaSeq = s.deltas.Add(1)
		}
		if err := h.cfg.Events.Emit(ctx, scope, ev); err != nil {
			stack[0] = uint64(abi.StatusStoreUnavailable)
			return
		}
		stack[0] = uint64(abi.StatusOK)
	}
}

// mayEmit reports whether the call may emit ev: a model_delta carries a
// delta and comes from a model effect's call; no other type carries one.
func (s *callScope) mayEmit(ev abi.EmitEvent) bool {
	if ev.Type != abi.EmitModelDelta {
		return ev.Delta == nil
	}
	if s.kind != abi.KindModel || ev.Delta == nil || (ev.Delta.Text == "" && len(ev.Delta.ToolCalls) == 0) {
		return false
	}
	for _, tc := range ev.Delta.ToolCalls {
		if tc.Index < 0 || tc.Index >= maxDeltaToolCalls {
			return false
		}
	}
	return true
}

package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	extism "github.com/extism/go-sdk"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// maxEmitBytes bounds one agenthost_emit event.
const maxEmitBytes = 64 << 10

// errHostAbort is the panic value a host function unwinds the guest with
// after it recorded why in the call scope.
var errHostAbort = errors.New("host: call aborted by a host function")

// hostFunctions are the extism:host/user functions of ABI v1, with the
// exact wasm types of abi.HostFuncs. Each finds its tenant, plugin and Run
// in the call's scope. None traps the plugin for a failure it can report
// with a status; only kv_get aborts the call when the store fails, so that
// a store outage never looks like a missing key.
func (h *Host) hostFunctions() []extism.HostFunction {
	ptr := []extism.ValueType{extism.ValueTypePTR}
	i64 := []extism.ValueType{extism.ValueTypeI64}
	return []extism.HostFunction{
		extism.NewHostFunctionWithStack(abi.HostKVGet, h.kvGet, ptr, ptr),
		extism.NewHostFunctionWithStack(abi.HostKVSet, h.kvSet, []extism.ValueType{extism.ValueTypePTR, extism.ValueTypePTR}, i64),
		extism.NewHostFunctionWithStack(abi.HostKVDel, h.kvDelete, ptr, i64),
		extism.NewHostFunctionWithStack(abi.HostNowMS, h.nowMS, nil, i64),
		extism.NewHostFunctionWithStack(abi.HostEmit, h.emit, ptr, i64),
		extism.NewHostFunctionWithStack(abi.HostHTTP, h.httpCall, ptr, ptr),
	}
}

// readArg reads an Extism memory block the guest passed, and frees it.
func readArg(ctx context.Context, p *extism.CurrentPlugin, off uint64) ([]byte, bool) {
	if off == 0 {
		return nil, false
	}
	b, err := p.ReadBytes(off)
	if err != nil {
		return nil, false
	}
	_ = p.FreeWithContext(ctx, off)
	return b, true
}

// writeResult copies b into the guest's Extism memory and returns its
// offset; ok is false when the kernel has no room left.
func writeResult(ctx context.Context, p *extism.CurrentPlugin, b []byte) (uint64, bool) {
	off, err := p.AllocWithContext(ctx, uint64(len(b)))
	if err != nil || off == 0 {
		return 0, false
	}
	if !p.Memory().Write(uint32(off), b) {
		return 0, false
	}
	return off, true
}

func (h *Host) kvGet(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
	s := scopeFrom(ctx)
	key, ok := readArg(ctx, p, stack[0])
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
	off, ok := writeResult(ctx, p, val)
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

func (h *Host) kvSet(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
	s := scopeFrom(ctx)
	key, okKey := readArg(ctx, p, stack[0])
	val, _ := readArg(ctx, p, stack[1])
	switch {
	case s == nil || s.tenant == "" || !okKey || len(key) == 0:
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.KV == nil:
		stack[0] = uint64(abi.StatusStoreUnavailable)
	default:
		stack[0] = uint64(kvStatus(h.cfg.KV.KVSet(ctx, s.tenant, s.plugin.name, key, val)))
	}
}

func (h *Host) kvDelete(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
	s := scopeFrom(ctx)
	key, ok := readArg(ctx, p, stack[0])
	switch {
	case s == nil || s.tenant == "" || !ok || len(key) == 0:
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.KV == nil:
		stack[0] = uint64(abi.StatusStoreUnavailable)
	default:
		stack[0] = uint64(kvStatus(h.cfg.KV.KVDelete(ctx, s.tenant, s.plugin.name, key)))
	}
}

func (h *Host) nowMS(_ context.Context, _ *extism.CurrentPlugin, stack []uint64) {
	stack[0] = uint64(h.clock.Now().UnixMilli())
}

func (h *Host) emit(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
	s := scopeFrom(ctx)
	b, ok := readArg(ctx, p, stack[0])
	var ev abi.EmitEvent
	switch {
	case s == nil || s.tenant == "" || !ok:
		stack[0] = uint64(abi.StatusRefused)
	case len(b) > maxEmitBytes:
		stack[0] = uint64(abi.StatusTooLarge)
	case json.Unmarshal(b, &ev) != nil || ev.Type == "":
		stack[0] = uint64(abi.StatusRefused)
	case h.cfg.Events == nil:
		stack[0] = uint64(abi.StatusOK) // no sink: dropped, as documented
	default:
		scope := runtime.EmitScope{Tenant: s.tenant, Session: s.session, RunID: s.runID, EffectID: s.effectID, Plugin: s.plugin.name}
		if err := h.cfg.Events.Emit(ctx, scope, ev); err != nil {
			stack[0] = uint64(abi.StatusStoreUnavailable)
			return
		}
		stack[0] = uint64(abi.StatusOK)
	}
}

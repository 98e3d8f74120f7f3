package host

import (
	"context"
	"fmt"

	"github.com/agenthost/agenthost/internal/hostlink"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

func init() {
	hostlink.ExtismBaseline = func(ctx context.Context, h any, wasm []byte, timeoutMS uint64) (*extism.CompiledPlugin, error) {
		return h.(*Host).extismBaseline(ctx, wasm, timeoutMS)
	}
	hostlink.WazeroBaseline = func(ctx context.Context, h any, wasm []byte) (api.Module, func(context.Context) error, error) {
		return h.(*Host).wazeroBaseline(ctx, wasm)
	}
}

// The baselines below let a benchmark measure the host's call path against
// the layers under it, in the same process and through the same
// compilation cache (docs/DESIGN.md §9): a direct extism go-sdk call, and a raw
// wazero call. They are for benchmarks only, reached through internal/hostlink
// and not part of host's API; Runs go through Load,
// Executor and Builder, never through a baseline, which has no pool, no
// scope, no limits and no classification.

// extismBaseline compiles wasm with the extism go-sdk directly, as Load
// does (the host's wazero RuntimeConfig and compilation cache, WASI, the
// same manifest memory settings and a call timeout of timeoutMS, which
// must be > 0), with the host's real ABI host functions. Calls on its
// instances see no call scope: a host function the guest calls answers as
// it does for a call that has none. The caller closes the plugin.
func (h *Host) extismBaseline(ctx context.Context, wasm []byte, timeoutMS uint64) (*extism.CompiledPlugin, error) {
	if timeoutMS == 0 {
		return nil, fmt.Errorf("host: extism baseline: a timeout of 0 ms would compile under another RuntimeConfig than Load's: give one > 0")
	}
	compiled, err := h.compileExtism(ctx, wasm, Sandbox{}, timeoutMS)
	if err != nil {
		return nil, fmt.Errorf("host: extism baseline: compiling: %w", err)
	}
	return compiled, nil
}

// wazeroBaseline instantiates wasm in a bare wazero runtime under the
// host's RuntimeConfig and compilation cache, with WASI, runs its
// _initialize (when it exports one) and returns the module: the floor a
// call of one of its exports can cost. Every other import (the Extism
// kernel's and the ABI's) is a stub that panics when called, so only
// exports that call no host function can run. The returned func closes
// the runtime.
func (h *Host) wazeroBaseline(ctx context.Context, wasm []byte) (api.Module, func(context.Context) error, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, h.runtimeConfig())
	fail := func(err error) (api.Module, func(context.Context) error, error) {
		_ = rt.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("host: wazero baseline: %w", err)
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return fail(err)
	}
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return fail(fmt.Errorf("not a valid WebAssembly module: %w", err))
	}
	builders := map[string]wazero.HostModuleBuilder{}
	for _, def := range cm.ImportedFunctions() {
		mod, name, _ := def.Import()
		if mod == wasi_snapshot_preview1.ModuleName {
			continue
		}
		hb, ok := builders[mod]
		if !ok {
			hb = rt.NewHostModuleBuilder(mod)
			builders[mod] = hb
		}
		hb.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(context.Context, api.Module, []uint64) {
			panic("host: wazero baseline: the stub import " + mod + "." + name + " was called")
		}), def.ParamTypes(), def.ResultTypes()).Export(name)
	}
	for mod, hb := range builders {
		if _, err := hb.Instantiate(ctx); err != nil {
			return fail(fmt.Errorf("stubbing the imports of %s: %w", mod, err))
		}
	}
	mc := wazero.NewModuleConfig()
	if _, ok := cm.ExportedFunctions()["_initialize"]; ok {
		mc = mc.WithStartFunctions("_initialize")
	}
	mod, err := rt.InstantiateModule(ctx, cm, mc)
	if err != nil {
		return fail(fmt.Errorf("instantiating: %w", err))
	}
	return mod, rt.Close, nil
}

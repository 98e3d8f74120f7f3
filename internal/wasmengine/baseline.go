package wasmengine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/agenthost/agenthost/plugins/abi"
)

// The baselines below let a benchmark measure the host's call path against
// the layers under it, in the same process and through the same
// compilation cache (docs/DESIGN.md §9): a direct extism go-sdk call, and
// a raw wazero call. They are for benchmarks only: Runs go through
// host.Load, Executor and Builder, never through a baseline, which has no
// pool, no scope, no limits and no classification.

// WazeroBaseline instantiates wasm in a bare wazero runtime under
// RuntimeConfig(cache), with WASI, runs its _initialize (when it exports
// one) and returns the module: the floor a call of one of its exports can
// cost. Every other import (the Extism kernel's and the ABI's) is a stub
// that panics with its name when called, so only exports that call no
// host function can run. The returned func closes the runtime.
func WazeroBaseline(ctx context.Context, cache wazero.CompilationCache, wasm []byte) (api.Module, func(context.Context) error, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, RuntimeConfig(cache))
	fail := func(err error) (api.Module, func(context.Context) error, error) {
		_ = rt.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("wasmengine: wazero baseline: %w", err)
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return fail(err)
	}
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return fail(fmt.Errorf("not a valid WebAssembly module: %w", err))
	}
	builders := map[string]wazero.HostModuleBuilder{}
	for _, def := range stubbedImports(cm, wasi_snapshot_preview1.ModuleName) {
		mod, name, _ := def.Import()
		hb, ok := builders[mod]
		if !ok {
			hb = rt.NewHostModuleBuilder(mod)
			builders[mod] = hb
		}
		hb.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(context.Context, api.Module, []uint64) {
			stubCalled("wazero", mod, name)
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

// ExtismBaseline compiles wasm with the extism go-sdk directly, exactly as
// the host's reference call path does (CompileExtism: RuntimeConfig(cache),
// WASI, the same manifest memory settings), with no config, no allowed
// paths, a call timeout of timeoutMS (> 0) and fns as the host functions:
// the host's real ones, or StubHostFunctions when only exports that call
// none will run. The caller closes the plugin.
func ExtismBaseline(ctx context.Context, cache wazero.CompilationCache, wasm []byte, timeoutMS uint64, fns []extism.HostFunction) (*extism.CompiledPlugin, error) {
	if timeoutMS == 0 {
		return nil, errors.New("wasmengine: extism baseline: a timeout of 0 ms would compile under another RuntimeConfig than the host's: give one > 0")
	}
	compiled, err := CompileExtism(ctx, cache, ExtismPlugin{Wasm: wasm, TimeoutMS: timeoutMS}, fns)
	if err != nil {
		return nil, fmt.Errorf("wasmengine: extism baseline: compiling: %w", err)
	}
	return compiled, nil
}

// StubHostFunctions are go-sdk host functions for every function wasm
// imports from a module go-sdk does not provide itself (every one but
// WASI's and extism:host/env's, so the ABI's extism:host/user), each a
// stub that panics with its name when called: what ExtismBaseline needs
// to instantiate a plugin of which only exports that call no host
// function will run. wasm is compiled under RuntimeConfig(cache) to read
// its imports, the cache entry ExtismBaseline then finds.
func StubHostFunctions(ctx context.Context, cache wazero.CompilationCache, wasm []byte) ([]extism.HostFunction, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, RuntimeConfig(cache))
	defer rt.Close(context.WithoutCancel(ctx))
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("wasmengine: stub host functions: not a valid WebAssembly module: %w", err)
	}
	var fns []extism.HostFunction
	for _, def := range stubbedImports(cm, wasi_snapshot_preview1.ModuleName, abi.ExtismEnv) {
		mod, name, _ := def.Import()
		f := extism.NewHostFunctionWithStack(name, func(context.Context, *extism.CurrentPlugin, []uint64) {
			stubCalled("extism", mod, name)
		}, def.ParamTypes(), def.ResultTypes())
		f.SetNamespace(mod)
		fns = append(fns, f)
	}
	return fns, nil
}

// stubbedImports are cm's function imports from any module but provided.
func stubbedImports(cm wazero.CompiledModule, provided ...string) []api.FunctionDefinition {
	var out []api.FunctionDefinition
	for _, def := range cm.ImportedFunctions() {
		if mod, _, _ := def.Import(); !slices.Contains(provided, mod) {
			out = append(out, def)
		}
	}
	return out
}

// stubCalled is the body of every stub: the call fails, naming the import.
func stubCalled(baseline, mod, name string) {
	panic(fmt.Sprintf("wasmengine: %s baseline: the stub import %s.%s was called: a baseline runs only exports that call no host function", baseline, mod, name))
}

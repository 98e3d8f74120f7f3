// Package wasmengine is how this module compiles and runs a plugin's
// WebAssembly: the one wazero RuntimeConfig every plugin runtime is made
// with, the one extism go-sdk compile of the host's reference call path,
// and the baselines the benchmarks measure the host's call path against
// (a raw wazero call and a direct go-sdk call, docs/BENCHMARKS.md).
//
// Package host builds every plugin runtime through it, and the benchmarks
// (host's and `agenthost bench plugin`) build their baselines through it,
// so a baseline runs under exactly the config and cache entry a loaded
// plugin does. It holds no state: the caller owns the compilation cache.
package wasmengine

import (
	"context"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
)

// MaxVarBytes bounds an instance's Extism vars (var_set) on both call
// paths: the manifest's on the go-sdk one, the native kernel's own check
// on the other.
const MaxVarBytes = 64 << 10

// RuntimeConfig is the one wazero RuntimeConfig of every plugin runtime
// and of the inspection at load, on both call paths, over cache. It must
// equal what go-sdk ends with, so that every path compiles to the same
// cache entry: the shared cache, and CloseOnContextDone, which go-sdk
// turns on because Manifest.Timeout > 0 (and which changes the module's
// cache key; TestCompileExtismFindsTheCacheEntryOfRuntimeConfig checks
// it). Its termination checks are also what lets the native path
// stop a spinning guest at its timeout. No memory limit pages: the host
// caps memory with its instance memory allocator (host/memory.go).
func RuntimeConfig(cache wazero.CompilationCache) wazero.RuntimeConfig {
	return wazero.NewRuntimeConfig().WithCompilationCache(cache).WithCloseOnContextDone(true)
}

// ExtismPlugin is what the reference call path compiles a plugin from,
// besides the compilation cache and the host functions.
type ExtismPlugin struct {
	Wasm []byte
	// Config is what the guest's config_get reads.
	Config map[string]string
	// AllowedPaths maps host directories to the guest paths WASI
	// preopens them at.
	AllowedPaths map[string]string
	// TimeoutMS is go-sdk's call timeout. It must be > 0: go-sdk turns
	// CloseOnContextDone on only then, and RuntimeConfig assumes it.
	TimeoutMS uint64
}

// CompileExtism compiles p with the extism go-sdk as the host's reference
// call path compiles every plugin: under RuntimeConfig(cache), with WASI,
// fns as the host functions, MaxVarBytes of vars and no extism
// http_request. The caller closes the plugin.
func CompileExtism(ctx context.Context, cache wazero.CompilationCache, p ExtismPlugin, fns []extism.HostFunction) (*extism.CompiledPlugin, error) {
	manifest := extism.Manifest{
		Wasm: []extism.Wasm{extism.WasmData{Data: p.Wasm, Name: "main"}},
		// Set explicitly: built in Go, both default to 0, not to extism's
		// JSON defaults (docs/DESIGN.md §10). Vars are host memory; extism's own
		// http_request is never granted, so it may buffer nothing.
		Memory:       &extism.ManifestMemory{MaxPages: 0, MaxVarBytes: MaxVarBytes, MaxHttpResponseBytes: 0},
		Config:       p.Config,
		AllowedPaths: p.AllowedPaths,
		AllowedHosts: nil, // never: see RATIONALE.md, "Why our own agenthost_http?"
		Timeout:      p.TimeoutMS,
	}
	return extism.NewCompiledPlugin(ctx, manifest, extism.PluginConfig{
		RuntimeConfig: RuntimeConfig(cache),
		EnableWasi:    true,
	}, fns)
}

package host

import (
	"context"
	"time"

	extism "github.com/extism/go-sdk"
)

// The reference call path: extism go-sdk. The host ran every call through
// it until the native path (native.go) replaced it; it stays as the
// baseline `agenthost bench plugin` measures against, as the reference
// of the differential test (TestCallPathsAgree), and as the fallback
// Config.CallPath selects (RATIONALE.md, "Why a native Extism kernel?").

// compileExtism compiles wasm with the extism go-sdk as the reference path
// compiles every plugin: under the host's RuntimeConfig and compilation
// cache, with WASI, the host functions, the sandbox's config and paths, a
// call timeout of timeoutMS, and no extism http_request.
func (h *Host) compileExtism(ctx context.Context, wasm []byte, sb Sandbox, timeoutMS uint64) (*extism.CompiledPlugin, error) {
	manifest := extism.Manifest{
		Wasm: []extism.Wasm{extism.WasmData{Data: wasm, Name: "main"}},
		// Set explicitly: built in Go, both default to 0, not to extism's
		// JSON defaults (docs/DESIGN.md §10). Vars are host memory; extism's own
		// http_request is never granted, so it may buffer nothing.
		Memory:       &extism.ManifestMemory{MaxPages: 0, MaxVarBytes: maxVarBytes, MaxHttpResponseBytes: 0},
		Config:       sb.Config,
		AllowedPaths: sb.AllowedPaths,
		AllowedHosts: nil, // never: see RATIONALE.md, "Why our own agenthost_http?"
		Timeout:      timeoutMS,
	}
	return extism.NewCompiledPlugin(ctx, manifest, extism.PluginConfig{
		RuntimeConfig: h.runtimeConfig(),
		EnableWasi:    true,
	}, h.sdkHostFunctions())
}

// sdkHostFunctions are the ABI's host functions as go-sdk host functions:
// the scope comes in the call's context.
func (h *Host) sdkHostFunctions() []extism.HostFunction {
	fns := h.abiFunctions()
	out := make([]extism.HostFunction, 0, len(fns))
	for _, f := range fns {
		fn := f.fn
		out = append(out, extism.NewHostFunctionWithStack(f.name, func(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
			fn(ctx, scopeFrom(ctx), sdkMemory{ctx: ctx, p: p}, stack)
		}, f.params, f.results))
	}
	return out
}

// sdkMemory is go-sdk's kernel memory as a guestMemory.
type sdkMemory struct {
	ctx context.Context
	p   *extism.CurrentPlugin
}

func (m sdkMemory) readBlock(off uint64) ([]byte, bool) {
	b, err := m.p.ReadBytes(off)
	return b, err == nil
}

func (m sdkMemory) freeBlock(off uint64) { _ = m.p.FreeWithContext(m.ctx, off) }

func (m sdkMemory) allocBlock(n uint64) uint64 {
	off, err := m.p.AllocWithContext(m.ctx, n)
	if err != nil {
		return 0
	}
	return off
}

func (m sdkMemory) write(off uint32, b []byte) bool { return m.p.Memory().Write(off, b) }

// sdkGuest is an instance on the reference path.
type sdkGuest struct{ ext *extism.Plugin }

func (g *sdkGuest) call(ctx context.Context, s *callScope, export string, input []byte, timeout time.Duration) guestResult {
	callCtx, cancel := context.WithTimeoutCause(ctx, timeout, errCallTimeout)
	defer cancel()
	rc, out, err := g.ext.CallWithContext(withScope(callCtx, s), export, input)
	return guestResult{rc: rc, out: out, err: err, timedOut: context.Cause(callCtx) == errCallTimeout}
}

func (g *sdkGuest) errorMessage(ctx context.Context) string { return g.ext.GetErrorWithContext(ctx) }

func (g *sdkGuest) close(ctx context.Context) { _ = g.ext.Close(ctx) }

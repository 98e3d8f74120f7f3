package host

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"
	"unsafe"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/agenthost/agenthost/internal/wasmengine"
)

// The reference call path: extism go-sdk. The host ran every call through
// it until the native path (native.go) replaced it; it stays as the
// baseline `agenthost bench plugin` measures against, as the reference
// of the differential test (TestCallPathsAgree), and as the fallback
// Config.CallPath selects (RATIONALE.md, "Why a native Extism kernel?").

// compileExtism compiles wasm with the extism go-sdk as the reference path
// compiles every plugin (wasmengine.CompileExtism: the host's
// RuntimeConfig and compilation cache, WASI, no extism http_request), with
// the host functions, the sandbox's config and paths and a call timeout
// of timeoutMS.
func (h *Host) compileExtism(ctx context.Context, wasm []byte, sb Sandbox, timeoutMS uint64) (*extism.CompiledPlugin, error) {
	return wasmengine.CompileExtism(ctx, h.cache, wasmengine.ExtismPlugin{
		Wasm:         wasm,
		Config:       sb.Config,
		AllowedPaths: sb.AllowedPaths,
		TimeoutMS:    timeoutMS,
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

// The kernel calls below take the call's context, so that a walk over
// blocks a guest corrupted into a cycle ends at the call's timeout
// (go-sdk's ReadBytes would walk under context.Background(), for ever).
// A call that ended so (a *sys.ExitError) ends the host function too,
// with that exit, so that the call is classified by its timeout and not
// as a failed read or a full memory; a kernel trap fails the operation,
// as on the native path.

func (m sdkMemory) readBlock(off uint64) ([]byte, bool) {
	n, err := m.p.LengthWithContext(m.ctx, off)
	if err != nil {
		exitOnly(err)
		return nil, false
	}
	b, ok := m.p.Memory().Read(uint32(off), uint32(n))
	if !ok {
		return nil, false
	}
	return append([]byte{}, b...), true
}

func (m sdkMemory) freeBlock(off uint64) { exitOnly(m.p.FreeWithContext(m.ctx, off)) }

func (m sdkMemory) allocBlock(n uint64) uint64 {
	off, err := m.p.AllocWithContext(m.ctx, n)
	if err != nil {
		exitOnly(err)
		return 0
	}
	return off
}

// exitOnly panics with err when it is the exit of the call (its timeout
// or its caller), which unwinds the guest as that exit.
func exitOnly(err error) {
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		panic(exit)
	}
}

func (m sdkMemory) write(off uint32, b []byte) bool { return m.p.Memory().Write(off, b) }

// setOutput calls the kernel module's output_set, as the plugin's own
// import of it does; its trap traps the call.
func (m sdkMemory) setOutput(off, n uint64) {
	kernel, _ := m.ctx.Value(extism.PluginCtxKey("extism")).(api.Module)
	if kernel == nil {
		trapf("output_set: no Extism kernel in the call's context")
	}
	if _, err := kernel.ExportedFunction("output_set").Call(m.ctx, off, n); err != nil {
		exitOnly(err)
		panic(err)
	}
}

// plugin is the plugin module's memory, which sdkGuest.call puts in the
// call's context (go-sdk hands a host function only its own kernel's).
func (m sdkMemory) plugin() api.Memory {
	mem, _ := m.ctx.Value(pluginMemoryKey{}).(api.Memory)
	return mem
}

// pluginMemoryKey is the context key of the plugin module's memory during
// a call on the reference path.
type pluginMemoryKey struct{}

// sdkGuest is an instance on the reference path.
type sdkGuest struct {
	ext  *extism.Plugin
	init sdkInit // go-sdk's guest initialisation in ext
}

// initialise runs go-sdk's own guest runtime initialisation of the
// instance, before its first call and under a bound of its own, as the
// native path does (nativeGuest.initialise). go-sdk would run it lazily,
// at the start of the first CallWithContext and within that call's
// timeout, so that whether a short call timeout also covered a Go
// guest's runtime start would depend on the machine's speed.
//
// go-sdk has no API for this: sdkInitOf reaches the initialiser it
// detected and its done flag. The context is the one CallWithContext
// gives the initialiser (the plugin, its kernel module and an input,
// empty here), so that go-sdk's host functions work in it as in a call.
func (g *sdkGuest) initialise(ctx context.Context, timeout time.Duration) guestResult {
	if g.init.done.Bool() {
		return guestResult{}
	}
	initCtx, cancel := context.WithTimeoutCause(ctx, timeout, errCallTimeout)
	defer cancel()
	c := context.WithValue(initCtx, extism.PluginCtxKey("extism"), g.init.kernel)
	c = context.WithValue(c, extism.PluginCtxKey("plugin"), g.ext)
	off, err := g.ext.SetInputWithContext(c, nil)
	if err == nil {
		err = g.init.run(context.WithValue(c, extism.InputOffsetKey("inputOffset"), off))
	}
	if err != nil {
		return guestResult{rc: 1, err: err, timedOut: context.Cause(initCtx) == errCallTimeout, spent: true}
	}
	g.init.done.SetBool(true)
	return guestResult{}
}

// sdkInit is go-sdk v1.7.1's lazy guest initialisation in one
// *extism.Plugin: Plugin.guestRuntime.init and .initialized, and the
// kernel module (Plugin.extism) its host functions find in the context;
// and the plugin module's memory (Plugin.mainModule's), which go-sdk
// offers a host function no way to reach.
type sdkInit struct {
	run    func(context.Context) error
	done   reflect.Value // a settable bool
	kernel api.Module
	// memory is the plugin module's own memory (Plugin.mainModule's
	// export "memory"), which agenthost_input_read and
	// agenthost_output_set reach; nil when it exports none.
	memory api.Memory
}

// sdkInitOf reaches sdkInit's unexported fields in ext. A go-sdk whose
// Plugin no longer has them, with those types, fails every instance with
// an error that says so rather than being initialised some other way.
func sdkInitOf(ext *extism.Plugin) (sdkInit, error) {
	// field is v's field name, made readable and settable; want nil
	// takes any struct.
	field := func(v reflect.Value, name string, want reflect.Type) (reflect.Value, error) {
		f := v.FieldByName(name)
		if !f.IsValid() || (want == nil && f.Kind() != reflect.Struct) || (want != nil && f.Type() != want) {
			kind := "a struct"
			if want != nil {
				kind = want.String()
			}
			return reflect.Value{}, fmt.Errorf("host: extism go-sdk's %s has no field %s of type %s, which the reference path runs the guest's initialisation through (sdkpath.go): update sdkInitOf for this go-sdk version",
				v.Type(), name, kind)
		}
		return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), nil
	}
	p := reflect.ValueOf(ext).Elem()
	rt, err := field(p, "guestRuntime", nil)
	if err != nil {
		return sdkInit{}, err
	}
	run, err := field(rt, "init", reflect.TypeFor[func(context.Context) error]())
	if err != nil {
		return sdkInit{}, err
	}
	done, err := field(rt, "initialized", reflect.TypeFor[bool]())
	if err != nil {
		return sdkInit{}, err
	}
	kernel, err := field(p, "extism", reflect.TypeFor[api.Module]())
	if err != nil {
		return sdkInit{}, err
	}
	main, err := field(p, "mainModule", reflect.TypeFor[api.Module]())
	if err != nil {
		return sdkInit{}, err
	}
	out := sdkInit{done: done}
	if m, _ := main.Interface().(api.Module); m != nil {
		out.memory = m.ExportedMemory("memory")
	}
	out.run, _ = run.Interface().(func(context.Context) error)
	out.kernel, _ = kernel.Interface().(api.Module)
	if out.run == nil || out.kernel == nil {
		return sdkInit{}, errors.New("host: extism go-sdk's instance has no guest initialiser or no kernel module: update sdkInitOf for this go-sdk version")
	}
	return out, nil
}

func (g *sdkGuest) call(ctx context.Context, s *callScope, export string, input []byte, timeout time.Duration) guestResult {
	callCtx, cancel := context.WithTimeoutCause(ctx, timeout, errCallTimeout)
	defer cancel()
	callCtx = context.WithValue(withScope(callCtx, s), pluginMemoryKey{}, g.init.memory)
	rc, out, err := g.ext.CallWithContext(callCtx, export, input)
	return guestResult{rc: rc, out: out, err: err, timedOut: context.Cause(callCtx) == errCallTimeout}
}

func (g *sdkGuest) errorMessage(ctx context.Context) string { return g.ext.GetErrorWithContext(ctx) }

func (g *sdkGuest) close(ctx context.Context) { _ = g.ext.Close(ctx) }

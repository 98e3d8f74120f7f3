package host

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/agenthost/agenthost/internal/wasmengine"
	"github.com/agenthost/agenthost/plugins/abi"
)

// The native call path: the Extism plugin ABI implemented in Go on
// wazero, without extism go-sdk and without the kernel module. A plugin
// gets the extism:host/env functions of go-sdk v1.7.1 (the kernel's, and
// go-sdk's own) with the same semantics, over a kernel in Go (kernel.go);
// a call is one Wasm entry, with the exports looked up once, a reused
// parameter stack and no context, timer or goroutine of the host's per
// call (docs/DESIGN.md §7.6).

// maxVarBytes bounds an instance's Extism vars (var_set), as the
// reference path's manifest does: one limit for both.
const maxVarBytes = wasmengine.MaxVarBytes

// nativeCode is a plugin compiled for the native path: a wazero runtime
// of its own (the host's compilation cache) with WASI and the two host
// modules, and the guest module, with interrupt checks of its own
// (interrupt.go) or, when the module cannot be rewritten, with wazero's
// (checked).
type nativeCode struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	checked  bool          // compiled with wazero's termination checks
	count    atomic.Uint64 // instances so far, for unique module names

	// Shared code (Host.codes): its host, the sha256 of its file, and the
	// loads holding it, guarded by h.mu. h is nil for code of its own.
	h    *Host
	sum  [sha256.Size]byte
	refs int
}

// errInvalidModule marks a module wazero refuses to compile.
type errInvalidModule struct{ err error }

func (e *errInvalidModule) Error() string { return "not a valid WebAssembly module: " + e.err.Error() }
func (e *errInvalidModule) Unwrap() error { return e.err }

// compileNative compiles wasm for the native path: rewritten with
// interrupt checks when it can be, under wazero's termination checks
// otherwise (a module the rewrite does not cover, logged). sum is wasm's
// sha256, the key of its rewrite in the rewrite cache (rewritecache.go)
// and of its code in Host.codes: the code of a file a loaded plugin was
// compiled from is shared, not compiled again.
func (h *Host) compileNative(ctx context.Context, name string, wasm []byte, sum [sha256.Size]byte) (*nativeCode, error) {
	if c := h.holdCode(sum); c != nil {
		return c, nil
	}
	c, err := h.compileNativeOf(ctx, name, wasm, sum)
	if err != nil {
		return nil, err
	}
	return h.shareCode(ctx, sum, c), nil
}

// holdCode is the shared code of the file of sha256 sum, held once more,
// or nil.
func (h *Host) holdCode(sum [sha256.Size]byte) *nativeCode {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.codes[sum]
	if c != nil {
		c.refs++
	}
	return c
}

// shareCode makes c, just compiled from the file of sha256 sum, the
// shared code of that file, held once; when a load that raced this one
// shared its own first, c is closed and that one is held instead.
func (h *Host) shareCode(ctx context.Context, sum [sha256.Size]byte, c *nativeCode) *nativeCode {
	h.mu.Lock()
	if other := h.codes[sum]; other != nil {
		other.refs++
		h.mu.Unlock()
		_ = c.rt.Close(context.WithoutCancel(ctx))
		return other
	}
	c.h, c.sum, c.refs = h, sum, 1
	h.codes[sum] = c
	h.mu.Unlock()
	return c
}

// compileNativeOf compiles wasm for the native path, with interrupt
// checks when it can (compileNative).
func (h *Host) compileNativeOf(ctx context.Context, name string, wasm []byte, sum [sha256.Size]byte) (*nativeCode, error) {
	if h.cfg.wazeroChecks {
		// as a module the rewrite does not cover
	} else if rewritten, err := h.instrumentLoopsCached(name, wasm, sum); err == nil {
		c, err := h.compileNativeWith(ctx, rewritten, h.runtimeConfig().WithCloseOnContextDone(false))
		if err == nil {
			return c, nil
		}
		h.log.Debug("plugin: the module with interrupt checks does not compile; using wazero's checks", "plugin", name, "error", err)
	} else {
		h.log.Debug("plugin: interrupt checks cannot be added; using wazero's", "plugin", name, "error", err)
	}
	c, err := h.compileNativeWith(ctx, wasm, h.runtimeConfig())
	if err != nil {
		return nil, err
	}
	c.checked = true
	return c, nil
}

func (h *Host) compileNativeWith(ctx context.Context, wasm []byte, cfg wazero.RuntimeConfig) (*nativeCode, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	fail := func(err error) (*nativeCode, error) {
		_ = rt.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return fail(fmt.Errorf("WASI: %w", err))
	}
	if _, err := h.envModule(rt).Instantiate(ctx); err != nil {
		return fail(fmt.Errorf("the %s module: %w", abi.ExtismEnv, err))
	}
	user := rt.NewHostModuleBuilder(abi.HostModule)
	for _, f := range h.abiFunctions() {
		fn, io := f.fn, f.io
		user.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			g := nativeFrom(ctx)
			if !io {
				fn(ctx, g.scope.Load(), g.memory(), stack)
				return
			}
			c, cancel := context.WithDeadline(g.callerCtx(), g.deadline)
			defer cancel()
			fn(c, g.scope.Load(), g.memory(), stack)
		}), f.params, f.results).Export(f.name)
	}
	if _, err := user.Instantiate(ctx); err != nil {
		return fail(fmt.Errorf("the %s module: %w", abi.HostModule, err))
	}
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return fail(&errInvalidModule{err})
	}
	return &nativeCode{rt: rt, compiled: cm}, nil
}

// close lets go of the code: shared code is closed when the last load
// that holds it lets go.
func (c *nativeCode) close(ctx context.Context) error {
	if h := c.h; h != nil {
		h.mu.Lock()
		c.refs--
		last := c.refs == 0
		if last && h.codes[c.sum] == c {
			delete(h.codes, c.sum)
		}
		h.mu.Unlock()
		if !last {
			return nil
		}
	}
	return c.rt.Close(ctx)
}

// instantiate makes a native instance of the plugin for in. ctx carries
// in's memory allocator; mc is the sandbox's module config.
func (c *nativeCode) instantiate(ctx context.Context, p *Plugin, in *instance, mc wazero.ModuleConfig) (guest, error) {
	g := &nativeGuest{log: p.h.log, plugin: p.name, vars: map[string][]byte{}, done: make(chan struct{}), scope: &in.scope}
	g.ctx = nativeContext{g: g}
	g.kmem = in.mem.Allocate(kernelMinPages*kernelPage, kernelMaxPages*kernelPage)
	k, ok := newKernel(g.kmem.Reallocate, g.stopCode)
	if !ok {
		g.kmem.Free()
		return nil, errors.New("the kernel's memory was refused")
	}
	g.k = k
	// As go-sdk: no start function (the guest runtime is initialised by
	// initialise, under a bound of its own), the sandbox's mounts when
	// paths are granted, and a name of its own for each instance.
	mc = mc.WithStartFunctions().WithName(fmt.Sprintf("main_%d", c.count.Add(1)))
	if paths := p.spec.Sandbox.AllowedPaths; len(paths) > 0 {
		fs := wazero.NewFSConfig()
		for hostDir, guestDir := range paths {
			if d, ro := strings.CutPrefix(hostDir, "ro:"); ro {
				fs = fs.WithReadOnlyDirMount(d, guestDir)
			} else {
				fs = fs.WithDirMount(hostDir, guestDir)
			}
		}
		mc = mc.WithFSConfig(fs)
	}
	mod, err := c.rt.InstantiateModule(ctx, c.compiled, mc)
	if err != nil {
		g.kmem.Free()
		return nil, err
	}
	g.mod = mod
	g.own = mod.ExportedMemory("memory")
	if !c.checked {
		ig, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
		if !ok {
			_ = mod.Close(ctx)
			g.kmem.Free()
			return nil, errors.New("the module's interrupt global is missing")
		}
		g.interrupt = ig
	}
	g.config = p.spec.Sandbox.Config
	g.exports = map[string]api.Function{}
	g.init = detectGuestInit(mod)
	g.timer = time.AfterFunc(time.Hour, func() { g.halt(sys.ExitCodeDeadlineExceeded, true) })
	g.timer.Stop()
	g.onCancel = func() {
		code := uint32(sys.ExitCodeContextCanceled)
		g.mu.Lock()
		if g.caller != nil && errors.Is(g.caller.Err(), context.DeadlineExceeded) {
			code = sys.ExitCodeDeadlineExceeded
		}
		g.mu.Unlock()
		g.halt(code, false)
	}
	return g, nil
}

// detectGuestInit returns the guest runtime's initialiser
// (guestInitExport) as go-sdk runs it: hs_init with the arguments 0, 0
// after the reactor's _initialize, whose failure go-sdk only logs; the
// others without arguments. nil when there is none.
func detectGuestInit(mod api.Module) func(ctx context.Context) error {
	switch name := guestInitExport(mod.ExportedFunctionDefinitions()); name {
	case "":
		return nil
	case "hs_init":
		hs, reactor := mod.ExportedFunction(name), mod.ExportedFunction("_initialize")
		return func(ctx context.Context) error {
			if reactor != nil {
				_, _ = reactor.Call(ctx) // go-sdk logs this error and goes on
			}
			_, err := hs.Call(ctx, 0, 0)
			return err
		}
	default:
		f := mod.ExportedFunction(name)
		return func(ctx context.Context) error {
			_, err := f.Call(ctx)
			return err
		}
	}
}

// nativeGuest is one instance on the native path.
type nativeGuest struct {
	mod     api.Module
	k       *kernel
	exports map[string]api.Function // looked up on first use, nil included
	stack   [1]uint64               // an export's result
	init    func(context.Context) error
	kmem    experimental.LinearMemory // the kernel's, charged to the instance
	own     api.Memory                // the module's exported "memory", or nil
	log     *slog.Logger
	plugin  string
	// interrupt is the module's interrupt global (interrupt.go); nil when
	// the module has wazero's termination checks, which watch ctx instead.
	interrupt api.MutableGlobal
	config    map[string]string
	vars      map[string][]byte

	// ctx is what wazero and the host functions get: it finds this guest,
	// and its Done channel closes when the call must stop (halt), which
	// wazero's termination check, in a module that has it, turns into the
	// call's exit.
	ctx      nativeContext
	done     chan struct{} // closed by halt
	stop     atomic.Uint64 // set once by halt: the exit code, and haltedByTimeout
	timer    *time.Timer   // the call timeout, reset for each call
	onCancel func()        // halts the call when its caller's context ends

	// scope is the call in progress's: the instance's own (instance.scope),
	// which (*Plugin).run sets around every call.
	scope *atomic.Pointer[callScope]

	// The call in progress. deadline and inputOffset belong to the
	// goroutine of the call; caller is also read by onCancel, under mu.
	deadline    time.Time
	inputOffset uint64
	mu          sync.Mutex
	caller      context.Context
}

// haltedByTimeout marks, in nativeGuest.stop, a halt by the call's own
// timeout rather than by its caller.
const haltedByTimeout = 1 << 32

// nativeContext is the context of a native guest's calls: no deadline
// and no values but the guest, and a Done channel that halt closes.
type nativeContext struct{ g *nativeGuest }

type nativeKey struct{}

func (c nativeContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c nativeContext) Done() <-chan struct{}       { return c.g.done }

func (c nativeContext) Err() error {
	switch uint32(c.g.stop.Load()) {
	case 0:
		return nil
	case sys.ExitCodeDeadlineExceeded:
		return context.DeadlineExceeded
	default:
		return context.Canceled
	}
}

func (c nativeContext) Value(key any) any {
	if key == (nativeKey{}) {
		return c.g
	}
	return nil
}

func nativeFrom(ctx context.Context) *nativeGuest {
	g, _ := ctx.Value(nativeKey{}).(*nativeGuest)
	if g == nil {
		panic(errors.New("host: a native host function was called outside a native call"))
	}
	return g
}

// halt stops the call in progress, once in the instance's life: the
// guest traps at its next safepoint (interrupt.go), or, in a module with
// wazero's checks, wazero's watcher sees Done and closes the
// module with the code (ExitCodeDeadlineExceeded maps to
// context.DeadlineExceeded in Err); a kernel walk sees stop either way.
func (g *nativeGuest) halt(code uint32, byTimeout bool) {
	v := uint64(code)
	if byTimeout {
		v |= haltedByTimeout
	}
	if g.stop.CompareAndSwap(0, v) {
		if g.interrupt != nil {
			g.interrupt.Set(1)
		}
		close(g.done)
	}
}

// stopCode is the exit code of a halt, 0 while the instance runs: what a
// kernel walk looks at.
func (g *nativeGuest) stopCode() uint32 { return uint32(g.stop.Load()) }

// callerCtx is the caller's context during a call, for a host function's
// I/O.
func (g *nativeGuest) callerCtx() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.caller == nil {
		return context.Background()
	}
	return g.caller
}

func (g *nativeGuest) memory() guestMemory { return nativeMemory{k: g.k, own: g.own} }

func (g *nativeGuest) export(name string) api.Function {
	f, ok := g.exports[name]
	if !ok {
		f = g.mod.ExportedFunction(name)
		g.exports[name] = f
	}
	return f
}

// initialise runs the guest runtime's initialiser, once, before the
// instance serves any call: an entry of its own into the guest, bounded
// by timeout and by ctx as a call is.
func (g *nativeGuest) initialise(ctx context.Context, timeout time.Duration) guestResult {
	if g.init == nil {
		return guestResult{}
	}
	res := g.enter(ctx, timeout, func() guestResult {
		if err := g.init(g.ctx); err != nil {
			return guestResult{rc: 1, err: g.haltedErr(err)}
		}
		return guestResult{}
	})
	if res.err == nil && res.spent {
		// Halted just as the initialisation ended, by its bound or by the
		// caller (which the caller's context tells apart): the instance
		// cannot serve.
		code := g.stopCode()
		if code == 0 { // the halt is on its way
			code = sys.ExitCodeDeadlineExceeded
		}
		res.rc, res.err = 1, sys.NewExitError(code)
	}
	return res
}

// call is go-sdk's Plugin.CallWithContext on the native kernel: the same
// steps, the same return values, except that the guest runtime was
// initialised when the instance was created (initialise). The host
// functions find the call's scope in the instance (g.scope), where
// (*Plugin).run put it.
func (g *nativeGuest) call(ctx context.Context, _ *callScope, export string, input []byte, timeout time.Duration) guestResult {
	return g.enter(ctx, timeout, func() guestResult { return g.callExport(export, input) })
}

// enter runs f, which enters the guest, as one bounded entry: the guest
// is halted when timeout passes or ctx ends; an instance halted (or about
// to be) comes back spent.
func (g *nativeGuest) enter(ctx context.Context, timeout time.Duration, f func() guestResult) (res guestResult) {
	if g.mod.IsClosed() || g.stop.Load() != 0 {
		return guestResult{err: errors.New("module is closed"), spent: true}
	}
	if err := ctx.Err(); err != nil {
		code := uint32(sys.ExitCodeContextCanceled)
		if errors.Is(err, context.DeadlineExceeded) {
			code = sys.ExitCodeDeadlineExceeded
		}
		return guestResult{rc: code, err: sys.NewExitError(code), spent: true}
	}
	g.deadline = time.Now().Add(timeout)
	g.mu.Lock()
	g.caller = ctx
	g.mu.Unlock()
	g.timer.Reset(timeout)
	var stopCancel func() bool
	if ctx.Done() != nil {
		stopCancel = context.AfterFunc(ctx, g.onCancel)
	}
	defer func() {
		if !g.timer.Stop() || (stopCancel != nil && !stopCancel()) || g.stop.Load() != 0 {
			res.spent = true // halted, or about to be: never reused
		}
		res.timedOut = g.stop.Load()&haltedByTimeout != 0
		g.mu.Lock()
		g.caller = nil
		g.mu.Unlock()
	}()
	return f()
}

// haltedErr is err, the error of an entry into the guest, or the exit of
// the halt that ended it: the trap at a loop header (or wherever the
// guest was) is the exit of the timeout or of the caller, as wazero's own
// check reports it.
func (g *nativeGuest) haltedErr(err error) error {
	if code := g.stopCode(); code != 0 && err != nil {
		return sys.NewExitError(code)
	}
	return err
}

// callExport is the body of call, inside its bounds.
func (g *nativeGuest) callExport(export string, input []byte) guestResult {
	if err := kernelOp(func() { g.inputOffset = g.k.setInput(input) }); err != nil {
		return guestResult{rc: 1, err: fmt.Errorf("reset: %w", err)}
	}
	fn := g.export(export)
	if fn == nil {
		return guestResult{rc: 1, err: fmt.Errorf("unknown function: %s", export)}
	}
	results := fn.Definition().ResultTypes()
	if len(results) > 1 {
		return guestResult{rc: 1, err: fmt.Errorf("function %s has %v results, expected 0 or 1", export, len(results))}
	}
	if len(fn.Definition().ParamTypes()) > len(g.stack) {
		return guestResult{rc: 1, err: fmt.Errorf("function %s takes parameters; an Extism export takes none", export)}
	}
	g.stack[0] = 0
	err := g.haltedErr(fn.CallWithStack(g.ctx, g.stack[:]))

	hasResult := len(results) == 1 && err == nil
	rc := uint32(0)
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		if exit.ExitCode() == 0 {
			err = nil
		}
		if !hasResult {
			hasResult, g.stack[0] = true, uint64(exit.ExitCode())
		}
	}
	switch {
	case hasResult:
		rc = api.DecodeU32(g.stack[0])
	case err != nil:
		rc = 1
	}
	if err != nil {
		return guestResult{rc: rc, out: []byte{}, err: err}
	}
	var msg string
	var out []byte
	if kerr := kernelOp(func() { msg = g.k.errorMessage() }); kerr != nil {
		msg = ""
	}
	if kerr := kernelOp(func() { out = g.k.output() }); kerr != nil {
		return guestResult{rc: rc, out: []byte{}, err: fmt.Errorf("failed to get output: %v", kerr)}
	}
	if msg != "" {
		return guestResult{rc: rc, out: out, err: errors.New(msg)}
	}
	return guestResult{rc: rc, out: out}
}

func (g *nativeGuest) errorMessage(context.Context) string {
	var msg string
	if kernelOp(func() { msg = g.k.errorMessage() }) != nil {
		return ""
	}
	return msg
}

func (g *nativeGuest) close(ctx context.Context) {
	g.timer.Stop()
	_ = g.mod.Close(ctx)
	g.kmem.Free()
}

// kernelOp runs a kernel operation of the host's own (not a guest's
// import) and returns its trap as an error.
func kernelOp(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			t, ok := r.(*kernelTrap)
			if !ok {
				panic(r)
			}
			err = t
		}
	}()
	f()
	return nil
}

// nativeMemory is the native kernel, and the plugin module's own memory,
// as a guestMemory: a trap of the kernel (a corrupted allocator) fails
// the operation, as a failed kernel call does on go-sdk.
type nativeMemory struct {
	k   *kernel
	own api.Memory // the plugin module's own, or nil
}

func (m nativeMemory) readBlock(off uint64) (b []byte, ok bool) {
	if kernelOp(func() { b, ok = m.k.readBlock(off) }) != nil {
		return nil, false
	}
	return b, ok
}

func (m nativeMemory) freeBlock(off uint64) { _ = kernelOp(func() { m.k.free(off) }) }

func (m nativeMemory) allocBlock(n uint64) (off uint64) {
	if kernelOp(func() { off = m.k.alloc(n) }) != nil {
		return 0
	}
	return off
}

func (m nativeMemory) write(off uint32, b []byte) bool { return m.k.write(off, b) }

// setOutput is the kernel's output_set, which traps the call on a range
// outside the kernel's memory, as the export does.
func (m nativeMemory) setOutput(off, n uint64) { m.k.outputSet(off, n) }

func (m nativeMemory) plugin() api.Memory { return m.own }

// envModule is extism:host/env as go-sdk v1.7.1 defines it: every name,
// with its wasm types, over the native kernel. http_request is refused
// (RATIONALE.md, "Why our own agenthost_http?").
func (h *Host) envModule(rt wazero.Runtime) wazero.HostModuleBuilder {
	b := rt.NewHostModuleBuilder(abi.ExtismEnv)
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	fn := func(name string, params, results []api.ValueType, f func(g *nativeGuest, stack []uint64)) {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			f(nativeFrom(ctx), stack)
		}), params, results).Export(name)
	}
	p1 := []api.ValueType{i64}
	p2 := []api.ValueType{i64, i64}
	r64 := []api.ValueType{i64}
	r32 := []api.ValueType{i32}
	fn("alloc", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.alloc(s[0]) })
	fn("free", p1, nil, func(g *nativeGuest, s []uint64) { g.k.free(s[0]) })
	fn("load_u8", p1, r32, func(g *nativeGuest, s []uint64) { s[0] = uint64(g.k.loadU8(s[0])) })
	fn("input_load_u8", p1, r32, func(g *nativeGuest, s []uint64) { s[0] = uint64(g.k.inputLoadU8(s[0])) })
	fn("store_u64", p2, nil, func(g *nativeGuest, s []uint64) { g.k.storeU64(s[0], s[1]) })
	fn("store_u8", []api.ValueType{i64, i32}, nil, func(g *nativeGuest, s []uint64) { g.k.storeU8(s[0], uint32(s[1])) })
	fn("input_set", p2, nil, func(g *nativeGuest, s []uint64) { g.k.inputSet(s[0], s[1]) })
	fn("output_set", p2, nil, func(g *nativeGuest, s []uint64) { g.k.outputSet(s[0], s[1]) })
	fn("input_length", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offInputLength) })
	fn("input_offset", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offInputOffset) })
	fn("output_length", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offOutputLength) })
	fn("output_offset", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offOutputOffset) })
	fn("length", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.length(s[0]) })
	fn("length_unsafe", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.lengthUnsafe(s[0]) })
	fn("reset", nil, nil, func(g *nativeGuest, _ []uint64) { g.k.reset() })
	fn("error_set", p1, nil, func(g *nativeGuest, s []uint64) { g.k.errorSet(s[0]) })
	fn("error_get", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offError) })
	fn("memory_bytes", nil, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.register(offLength) })
	fn("input_load_u64", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.inputLoadU64(g.inputOffset, s[0]) })
	fn("load_u64", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.k.loadU64(s[0]) })
	fn("config_get", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.configGet(s[0]) })
	fn("var_get", p1, r64, func(g *nativeGuest, s []uint64) { s[0] = g.varGet(s[0]) })
	fn("var_set", p2, nil, func(g *nativeGuest, s []uint64) { g.varSet(s[0], s[1]) })
	fn("http_request", p2, r64, func(g *nativeGuest, s []uint64) { g.httpRequest(s[0]) })
	fn("http_status_code", nil, r32, func(_ *nativeGuest, s []uint64) { s[0] = 0 })
	fn("http_headers", nil, r64, func(_ *nativeGuest, s []uint64) { s[0] = 0 })
	fn("get_log_level", nil, r32, func(g *nativeGuest, s []uint64) { s[0] = uint64(uint32(h.pluginLogLevel())) })
	for _, l := range []struct {
		name  string
		level int32
	}{{"log_trace", 0}, {"log_debug", 1}, {"log_info", 2}, {"log_warn", 3}, {"log_error", 4}} {
		fn(l.name, p1, nil, func(g *nativeGuest, s []uint64) { g.logMessage(l.level, s[0], h.pluginLogLevel()) })
	}
	return b
}

// Extism log levels as get_log_level answers them (go-sdk's ExtismCompat),
// and "off".
const (
	extismLogDebug = 1
	extismLogOff   = int32(^uint32(0) >> 1)
)

// pluginLogLevel is what get_log_level answers: debug when the host logs
// at debug (plugin logs are then written to the host's log), else off,
// which is what go-sdk answers unless its process-wide level is set.
func (h *Host) pluginLogLevel() int32 {
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		return extismLogDebug
	}
	return extismLogOff
}

// mustRead is go-sdk's ReadString/ReadBytes in a host function: a block
// that is not one traps the call.
func (g *nativeGuest) mustRead(off uint64, what string) []byte {
	b, ok := g.k.readBlock(off)
	if !ok {
		trapf("failed to read %s from memory: invalid memory block", what)
	}
	return b
}

func (g *nativeGuest) mustWrite(b []byte, what string) uint64 {
	off, ok := g.k.writeBlock(b)
	if !ok {
		trapf("failed to write %s to memory", what)
	}
	return off
}

func (g *nativeGuest) configGet(off uint64) uint64 {
	name := g.mustRead(off, "config name")
	v, ok := g.config[string(name)]
	if !ok {
		return 0
	}
	return g.mustWrite([]byte(v), "config value")
}

func (g *nativeGuest) varGet(off uint64) uint64 {
	name := g.mustRead(off, "var name")
	g.k.free(off)
	v, ok := g.vars[string(name)]
	if !ok {
		return 0
	}
	return g.mustWrite(v, "var value")
}

// varSet is go-sdk's, with its size accounting: 40 bytes of headers per
// var (a slice and a string) on top of every name and value, the one
// being set included, against maxVarBytes.
func (g *nativeGuest) varSet(nameOff, valueOff uint64) {
	name := string(g.mustRead(nameOff, "var name"))
	g.k.free(nameOff)
	if valueOff == 0 {
		delete(g.vars, name)
		return
	}
	value := g.mustRead(valueOff, "var value")
	g.k.free(valueOff)
	const header = 24 + 16
	size := header + len(name) + len(value)
	for k, v := range g.vars {
		size += len(k) + len(v) + header
	}
	if size >= maxVarBytes {
		trapf("Variable store is full")
	}
	g.vars[name] = value
}

// httpRequest is Extism's http_request, which no plugin is granted: it
// traps, as go-sdk does for a host off its (empty) allowed list, after
// reading the request as go-sdk does.
func (g *nativeGuest) httpRequest(reqOff uint64) {
	g.mustRead(reqOff, "http request")
	g.k.free(reqOff)
	trapf("extism's http_request is not available to plugins on this host: use agenthost_http (docs/ABI.md)")
}

// logMessage is log_* as go-sdk runs it with its level at threshold: a
// message under a set level is only freed; any other is read (a block
// that is not one traps), written to the host's log at debug when the
// level is on, and freed.
func (g *nativeGuest) logMessage(level int32, off uint64, threshold int32) {
	if threshold != extismLogOff && level < threshold {
		g.k.free(off)
		return
	}
	msg := g.mustRead(off, "log message")
	if level >= threshold {
		g.log.Debug("plugin log", "plugin", g.plugin, "level", extismLevelName(level), "message", string(msg))
	}
	g.k.free(off)
}

func extismLevelName(l int32) string {
	switch l {
	case 0:
		return "TRACE"
	case 1:
		return "DEBUG"
	case 2:
		return "INFO"
	case 3:
		return "WARN"
	default:
		return "ERROR"
	}
}

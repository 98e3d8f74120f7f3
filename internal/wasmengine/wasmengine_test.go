package wasmengine

import (
	"context"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/plugins/abi"
)

// The imports of testModule, as the stubs must name them.
const (
	userImport = abi.HostModule + ".agenthost_now_ms"
	envImport  = abi.ExtismEnv + ".input_length"
)

// testModule is a module shaped like a plugin, encoded by hand so that
// this package's tests need no toolchain: it imports one ABI host
// function (extism:host/user) and one go-sdk kernel function
// (extism:host/env); its _initialize sets a global to 7, which
// "initialised" returns; "empty" returns 0; "call_user" and "call_env"
// call the user and the env import, then return 0.
func testModule() []byte {
	uleb := func(n int) []byte {
		var b []byte
		for {
			c := byte(n & 0x7f)
			n >>= 7
			if n == 0 {
				return append(b, c)
			}
			b = append(b, c|0x80)
		}
	}
	name := func(s string) []byte { return append(uleb(len(s)), s...) }
	vec := func(items ...[]byte) []byte {
		out := uleb(len(items))
		for _, it := range items {
			out = append(out, it...)
		}
		return out
	}
	section := func(id byte, body []byte) []byte { return append(append([]byte{id}, uleb(len(body))...), body...) }
	body := func(code ...byte) []byte {
		b := append([]byte{0}, code...) // no locals
		return append(uleb(len(b)), b...)
	}
	const (
		typeI64  = iota // () -> i64
		typeI32         // () -> i32
		typeNone        // () -> ()
	)
	const (
		funcUser = iota // the imports first
		funcEnv
		funcInitialize
		funcInitialised
		funcEmpty
		funcCallUser
		funcCallEnv
	)
	const (
		i32Const  = 0x41
		call      = 0x10
		drop      = 0x1a
		globalGet = 0x23
		globalSet = 0x24
		end       = 0x0b
	)
	export := func(s string, fn byte) []byte { return append(name(s), 0x00, fn) }
	var m []byte
	m = append(m, 0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00)
	m = append(m, section(1, vec(
		[]byte{0x60, 0x00, 0x01, 0x7e},
		[]byte{0x60, 0x00, 0x01, 0x7f},
		[]byte{0x60, 0x00, 0x00},
	))...)
	m = append(m, section(2, vec(
		append(append(name(abi.HostModule), name("agenthost_now_ms")...), 0x00, typeI64),
		append(append(name(abi.ExtismEnv), name("input_length")...), 0x00, typeI64),
	))...)
	m = append(m, section(3, vec([]byte{typeNone}, []byte{typeI32}, []byte{typeI32}, []byte{typeI32}, []byte{typeI32}))...)
	m = append(m, section(6, vec([]byte{0x7f, 0x01, i32Const, 0x00, end}))...) // a mutable i32, 0
	m = append(m, section(7, vec(
		export("_initialize", funcInitialize),
		export("initialised", funcInitialised),
		export("empty", funcEmpty),
		export("call_user", funcCallUser),
		export("call_env", funcCallEnv),
	))...)
	m = append(m, section(10, vec(
		body(i32Const, 7, globalSet, 0, end),
		body(globalGet, 0, end),
		body(i32Const, 0, end),
		body(call, funcUser, drop, i32Const, 0, end),
		body(call, funcEnv, drop, i32Const, 0, end),
	))...)
	return m
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one that says %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not say %q", err, p)
		}
	}
}

// TestBaselinesRefuseANonWasmFile: each way in names what it was doing and
// that the bytes are not WebAssembly, and compiles nothing.
func TestBaselinesRefuseANonWasmFile(t *testing.T) {
	ctx := context.Background()
	cache := wazero.NewCompilationCache()
	notWasm := []byte("#!/bin/sh\necho not a plugin\n")

	mod, closeRT, err := WazeroBaseline(ctx, cache, notWasm)
	mustContain(t, err, "wasmengine: wazero baseline: not a valid WebAssembly module")
	if mod != nil || closeRT != nil {
		t.Fatalf("a module (%v) or a close func (%t) with the error", mod, closeRT != nil)
	}
	_, err = StubHostFunctions(ctx, cache, notWasm)
	mustContain(t, err, "wasmengine: stub host functions: not a valid WebAssembly module")
	_, err = ExtismBaseline(ctx, cache, notWasm, 1000, nil)
	mustContain(t, err, "wasmengine: extism baseline: compiling")
	_, err = ExtismBaseline(ctx, cache, testModule(), 0, nil)
	mustContain(t, err, "a timeout of 0 ms", "give one > 0")
}

// TestWazeroBaselineRunsInitializeAndStubsEveryOtherImport: the module is
// initialised, an export that calls no host function runs, and one that
// calls any import but WASI's fails, naming it.
func TestWazeroBaselineRunsInitializeAndStubsEveryOtherImport(t *testing.T) {
	ctx := context.Background()
	mod, closeRT, err := WazeroBaseline(ctx, wazero.NewCompilationCache(), testModule())
	if err != nil {
		t.Fatal(err)
	}
	defer closeRT(ctx)
	if got, err := mod.ExportedFunction("initialised").Call(ctx); err != nil || got[0] != 7 {
		t.Fatalf("initialised = %v, %v: want 7, as _initialize sets it", got, err)
	}
	if got, err := mod.ExportedFunction("empty").Call(ctx); err != nil || got[0] != 0 {
		t.Fatalf("empty = %v, %v: want 0", got, err)
	}
	_, err = mod.ExportedFunction("call_user").Call(ctx)
	mustContain(t, err, "wazero baseline: the stub import "+userImport+" was called")
	_, err = mod.ExportedFunction("call_env").Call(ctx)
	mustContain(t, err, "wazero baseline: the stub import "+envImport+" was called")
}

// TestExtismBaselineRunsOnStubsOfTheUserImports: StubHostFunctions stubs
// the ABI's imports and leaves go-sdk's own kernel functions to go-sdk,
// so the plugin instantiates, a call of a kernel function works, and a
// call of a stub fails, naming it.
func TestExtismBaselineRunsOnStubsOfTheUserImports(t *testing.T) {
	ctx := context.Background()
	cache := wazero.NewCompilationCache()
	wasm := testModule()
	stubs, err := StubHostFunctions(ctx, cache, wasm)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range stubs {
		names = append(names, f.Namespace+"."+f.Name)
	}
	if !slices.Equal(names, []string{userImport}) {
		t.Fatalf("stubs %q, want only %q (go-sdk provides %s and WASI itself)", names, userImport, abi.ExtismEnv)
	}
	compiled, err := ExtismBaseline(ctx, cache, wasm, 10000, stubs)
	if err != nil {
		t.Fatal(err)
	}
	defer compiled.Close(ctx)
	inst, err := compiled.Instance(ctx, extism.PluginInstanceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	for _, export := range []string{"empty", "call_env"} {
		if rc, _, err := inst.Call(export, nil); rc != 0 || err != nil {
			t.Fatalf("%s: rc %d, %v: want 0, no error", export, rc, err)
		}
	}
	_, _, err = inst.Call("call_user", nil)
	mustContain(t, err, "extism baseline: the stub import "+userImport+" was called")
}

// TestCompileExtismFindsTheCacheEntryOfRuntimeConfig: a module go-sdk
// compiled (CompileExtism) is the cache entry a wazero runtime under
// RuntimeConfig finds, so the host's inspection at load and its call
// paths share one compile (docs/DESIGN.md §7.1, §10).
func TestCompileExtismFindsTheCacheEntryOfRuntimeConfig(t *testing.T) {
	ctx := context.Background()
	wasm := testModule()
	dir := t.TempDir()
	entries := func() []string {
		var files []string
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}

	// The stubs read the imports through a cache of their own, so that
	// the directory gets go-sdk's compile first.
	stubs, err := StubHostFunctions(ctx, wazero.NewCompilationCache(), wasm)
	if err != nil {
		t.Fatal(err)
	}
	sdkCache, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	compiled, err := CompileExtism(ctx, sdkCache, ExtismPlugin{Wasm: wasm, TimeoutMS: 1000}, stubs)
	if err != nil {
		t.Fatal(err)
	}
	if err := compiled.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sdkCache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	afterSDK := entries()
	if len(afterSDK) == 0 {
		t.Fatalf("go-sdk's compile left no entry in %s: the on-disk cache was not used", dir)
	}

	// A fresh cache on the same directory: only the files can hit.
	cache, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close(ctx)
	rt := wazero.NewRuntimeWithConfig(ctx, RuntimeConfig(cache))
	defer rt.Close(ctx)
	if _, err := rt.CompileModule(ctx, wasm); err != nil {
		t.Fatal(err)
	}
	if got := entries(); !slices.Equal(got, afterSDK) {
		t.Fatalf("compiling under RuntimeConfig added cache entries %q to go-sdk's %q: the two configs differ, so each plugin would be compiled twice",
			got, afterSDK)
	}
}

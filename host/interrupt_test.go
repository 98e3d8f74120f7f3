package host

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	goruntime "runtime"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// spinModule is
//
//	(module
//	  (import "env" "started" (func $started))
//	  (memory 1)
//	  (func (export "spin") call $started (loop $l br $l)))
//
// a loop that touches neither memory nor a local, so that nothing but
// the interrupt check can end it.
var spinModule = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type 0: () -> ()
	0x02, 0x0f, 0x01, 0x03, 'e', 'n', 'v', 0x07, 's', 't', 'a', 'r', 't', 'e', 'd', 0x00, 0x00,
	0x03, 0x02, 0x01, 0x00, // func 1: type 0
	0x05, 0x03, 0x01, 0x00, 0x01, // memory 0: 1 page
	0x07, 0x08, 0x01, 0x04, 's', 'p', 'i', 'n', 0x00, 0x01,
	0x0a, 0x0b, 0x01, 0x09, 0x00, 0x10, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b,
}

// Setting the interrupt global from another goroutine ends a loop that is
// already running (the check is not hoisted out of it), and while it runs
// the garbage collector can still stop the world: the loop reaches a
// safepoint in Go (without one, runtime.GC below never returns, and
// neither does anything else in the process).
func TestInterruptStopsARunningLoop(t *testing.T) {
	ctx := context.Background()
	rewritten, err := instrumentLoops(spinModule)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig())
	defer rt.Close(ctx)
	started := make(chan struct{})
	if _, err := rt.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithGoFunction(api.GoFunc(func(context.Context, []uint64) { close(started) }), nil, nil).
		Export("started").Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	mod, err := rt.Instantiate(ctx, rewritten)
	if err != nil {
		t.Fatalf("the rewritten module does not instantiate: %v", err)
	}
	g, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
	if !ok {
		t.Fatalf("no mutable global %q", interruptExport)
	}
	done := make(chan error, 1)
	go func() {
		_, err := mod.ExportedFunction("spin").Call(ctx)
		done <- err
	}()
	<-started
	gcDone := make(chan struct{})
	go func() { goruntime.GC(); close(gcDone) }()
	select {
	case <-gcDone:
	case <-testDeadline(t):
		t.Fatal("a garbage collection did not finish while the guest looped: the loop has no safepoint")
	}
	g.Set(1)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("want the interrupt's trap, got %v", err)
		}
	case <-testDeadline(t):
		t.Fatal("the loop did not stop when the interrupt global was set")
	}
}

// The rewrite adds exactly one check per loop, two globals and the
// safepoint function, and keeps every other byte of the function bodies.
func TestInstrumentLoopsOnAHandMadeModule(t *testing.T) {
	got, err := instrumentLoops(spinModule)
	if err != nil {
		t.Fatal(err)
	}
	// if $budget (global 1) == 0: call $safepoint (func 2); $budget -= 1
	check := []byte{0x23, 0x01, 0x45, 0x04, 0x40, 0x10, 0x02, 0x0b, 0x23, 0x01, 0x41, 0x01, 0x6b, 0x24, 0x01}
	wantCode := append([]byte{0x00, 0x10, 0x00, 0x03, 0x40}, append(check, 0x0c, 0x00, 0x0b, 0x0b)...)
	if !bytes.Contains(got, wantCode) {
		t.Fatalf("the loop's body is not the check then the original:\n% x", got)
	}
	if !bytes.Contains(got, []byte{0x06, 0x0c, 0x02, 0x7f, 0x01, 0x41, 0x00, 0x0b, 0x7f, 0x01, 0x41, 0x80, 0x08, 0x0b}) {
		t.Fatalf("no global section with $stop = 0 and $budget = 1024:\n% x", got)
	}
	if !bytes.Contains(got, []byte{0x01, 0x07, 0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x00}) {
		t.Fatalf("the safepoint's type () -> () is not appended:\n% x", got)
	}
	if !bytes.Contains(got, append([]byte{byte(len(interruptExport))}, interruptExport...)) {
		t.Fatalf("the global is not exported:\n% x", got)
	}
	if _, err := wazero.NewRuntime(context.Background()).CompileModule(context.Background(), got); err != nil {
		t.Fatalf("the rewritten module does not compile: %v", err)
	}
}

// Every plugin in the repository is rewritten, not left to wazero's
// checks: the rewrite knows every instruction they use.
func TestInstrumentLoopsCoversEveryPlugin(t *testing.T) {
	var paths []string
	for _, name := range []string{conformance.PluginBuilder, conformance.PluginExecutor, conformance.PluginHostile,
		conformance.PluginScripted, conformance.PluginBroken} {
		paths = append(paths, pluginPath(t, name))
	}
	for _, dir := range []string{"calculator", "calculator-c", "calculator-as", "prompt-builder", "scripted-model", "slow-job", "openai", "anthropic"} {
		p := conformance.ExampleWasm(t, dir)
		paths = append(paths, p)
	}
	for _, p := range paths {
		wasm, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := instrumentLoops(wasm)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if len(got) <= len(wasm) {
			t.Errorf("%s: the rewrite added nothing (%d bytes, was %d)", p, len(got), len(wasm))
		}
	}
}

// A plugin loaded on the native path runs with interrupt checks; with
// wazero's checks instead (the fallback for a module the rewrite does not
// cover) an endless loop still ends at its timeout as plugin_timeout.
func TestNativeTimeoutOnBothKindsOfChecks(t *testing.T) {
	for _, wazeroChecks := range []bool{false, true} {
		e := newEnv(t, Config{wazeroChecks: wazeroChecks})
		p := e.load(t, conformance.PluginHostile, abi.RoleExecutor, func(s *PluginSpec) { s.Limits.CallTimeout = 300 * time.Millisecond })
		if got := p.code.(*nativeCode).checked; got != wazeroChecks {
			t.Fatalf("wazeroChecks %v: the module was compiled with wazero's checks: %v", wazeroChecks, got)
		}
		x, err := p.Executor()
		if err != nil {
			t.Fatal(err)
		}
		_, err = x.Start(context.Background(), toolCall("acme", "r.t1.0", 1, "loop", nil))
		var pe *runtime.PluginError
		if !errors.As(err, &pe) || pe.Class != abi.ClassPluginTimeout {
			t.Fatalf("wazeroChecks %v: want plugin_timeout, got %v", wazeroChecks, err)
		}
	}
}

// The rewrite never panics, and what it returns for a module wazero
// compiles, wazero compiles too.
func FuzzInstrumentLoops(f *testing.F) {
	f.Add(spinModule)
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add(append(append([]byte{}, spinModule[:len(spinModule)-2]...), 0x06, 0x0b)) // a legacy try
	f.Add(spinModule[:len(spinModule)-13])                                         // no code section
	f.Fuzz(func(t *testing.T, wasm []byte) {
		got, err := instrumentLoops(wasm)
		if err != nil {
			if !isUninstrumentable(err) {
				t.Fatalf("an error of another kind: %v", err)
			}
			return
		}
		ctx := context.Background()
		rt := wazero.NewRuntime(ctx)
		defer rt.Close(ctx)
		if _, err := rt.CompileModule(ctx, wasm); err != nil {
			return // not a module wazero takes: nothing to compare
		}
		if _, err := rt.CompileModule(ctx, got); err != nil {
			t.Fatalf("the module compiles, its rewrite does not: %v", err)
		}
	})
}

// isUninstrumentable reports an error of instrumentLoops.
func isUninstrumentable(err error) bool {
	var u *errUninstrumentable
	return errors.As(err, &u)
}

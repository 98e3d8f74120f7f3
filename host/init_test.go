package host

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The guest runtime's one-time initialisation (_initialize here) runs
// when an instance is created, under Limits.InitTimeout, on both call
// paths: never inside a call's timeout, where whether a short timeout
// also covered a Go guest's runtime start would depend on the machine's
// speed.

// initDescribe is a valid describe reply of the hand-made executors below.
const initDescribe = `{"abi":1,"name":"init","role":"executor","effects":["tool"],"tools":[{"name":"t","input_schema":{"type":"object"}}]}`

// initModule is a complete executor whose describe answers initDescribe
// and whose _initialize has the body init (its locals, instructions and
// final end). It imports replyImports and, as function 3,
// agenthost_now_ms; memory pages are its 1 and what init grows.
func initModule(init []byte) []byte {
	ex := executorExports(abi.Marker)
	for i := range ex {
		if ex[i].name == abi.ExportDescribe {
			ex[i].code = replyBody([]byte(initDescribe))
		}
	}
	ex = append(ex, wExport{name: "_initialize", typ: sigMarker, code: init})
	imports := append(append([]wImport(nil), replyImports...), wImport{abi.HostModule, abi.HostNowMS, wFuncType{results: []byte{wI64}}})
	return tinyModule(imports, ex)
}

// initWhileClockAt is an _initialize body that spins for as long as
// agenthost_now_ms answers ms: it returns at once at any other time, and
// waits for the test's clock to move at ms.
func initWhileClockAt(ms int64) []byte {
	b := []byte{0x00, 0x02, 0x40, 0x03, 0x40, 0x10, 0x03, 0x42} // block; loop; call now_ms; i64.const
	b = appendSLEB(b, ms)
	return append(b, 0x52, 0x0d, 0x01, 0x0c, 0x00, 0x0b, 0x0b, 0x0b) // i64.ne; br_if 1; br 0; end; end; end
}

var (
	// initForever never returns: only a bound stops it.
	initForever = []byte{0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b} // loop; br 0; end; end
	// initTraps traps at once.
	initTraps = []byte{0x00, 0x00, 0x0b} // unreachable; end
	// initGrowsPastTheCap asks for 100 more pages, is refused, and traps.
	initGrowsPastTheCap = []byte{0x00, 0x41, 0xe4, 0x00, 0x40, 0x00, 0x1a, 0x00, 0x0b} // i32.const 100; memory.grow 0; drop; unreachable; end
)

var bothPaths = []CallPath{CallPathNative, CallPathSDK}

// TestGuestInitialisationRunsOutsideTheCallTimeout holds a new instance's
// initialisation for three times the call timeout, then lets it finish:
// the call that needed the instance still answers, on both paths.
func TestGuestInitialisationRunsOutsideTheCallTimeout(t *testing.T) {
	const callTimeout = 500 * time.Millisecond
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			e := newEnv(t, Config{CallPath: path})
			gate := e.clock.Now().Add(time.Hour)
			p, err := e.h.Load(context.Background(), PluginSpec{
				Name: "init", Path: writeModule(t, initModule(initWhileClockAt(gate.UnixMilli()))), Role: abi.RoleExecutor,
				Limits: Limits{CallTimeout: callTimeout},
			})
			if err != nil {
				t.Fatal(err)
			}
			e.clock.Set(gate) // the next instance's initialisation waits
			done := make(chan error, 1)
			go func() {
				_, err := p.CallRaw(context.Background(), "acme", abi.ExportDescribe, []byte(`{"abi":1}`))
				done <- err
			}()
			// Nothing to wait for here: the point is that the
			// initialisation outlasts the call timeout, by a margin no
			// scheduling delay can eat.
			select {
			case err := <-done:
				t.Fatalf("the call ended while its instance was still initialising: %v", err)
			case <-time.After(3 * callTimeout):
			}
			e.clock.Advance(time.Millisecond)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("after an initialisation longer than the call timeout of %s: %v; want the call to answer", callTimeout, err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the call did not end within a minute of its instance's initialisation")
			}
		})
	}
}

// TestGuestInitialisationFailuresAreClassified loads plugins whose
// _initialize never ends, traps, or runs out of memory: each load is
// refused with the class a call would earn, a message that names the
// initialisation, and the same class on both paths. A never-ending one
// stops at InitTimeout, whatever the call timeout.
func TestGuestInitialisationFailuresAreClassified(t *testing.T) {
	for _, c := range []struct {
		name  string
		init  []byte
		class abi.ErrorClass
		want  string
	}{
		{"never ends", initForever, abi.ClassPluginTimeout,
			"describe refused: the guest runtime's initialisation (_initialize) ran past its bound of 200ms and was stopped; the instance is discarded: fix the plugin's start-up, or raise init_timeout"},
		{"traps", initTraps, abi.ClassPluginTrap,
			"describe refused: the guest runtime's initialisation (_initialize) failed: wasm error: unreachable"},
		{"runs out of memory", initGrowsPastTheCap, abi.ClassPluginOOM,
			"describe refused: the guest runtime's initialisation (_initialize) ran out of memory (a memory.grow past the cap of 40 pages"},
	} {
		for _, path := range bothPaths {
			t.Run(c.name+"/"+string(path), func(t *testing.T) {
				e := newEnv(t, Config{CallPath: path})
				_, err := e.h.Load(context.Background(), PluginSpec{
					Name: "init", Path: writeModule(t, initModule(c.init)), Role: abi.RoleExecutor,
					Limits: Limits{CallTimeout: time.Hour, InitTimeout: 200 * time.Millisecond, MemoryPages: 40},
				})
				var pe *runtime.PluginError
				if !errors.As(err, &pe) || pe.Class != c.class || !errors.Is(err, ErrDescribe) {
					t.Fatalf("load: %v; want %s, refused at describe", err, c.class)
				}
				if msg := err.Error(); !strings.HasPrefix(msg, "host: plugin[init] export[describe]: "+string(c.class)+": ") || !strings.Contains(msg, c.want) || strings.Count(msg, "host: ") != 1 {
					t.Fatalf("load: %q; want one prefix and %q", msg, c.want)
				}
			})
		}
	}
}

// TestGuestInitialisationFailureFailsTheCallThatNeededTheInstance: an
// instance created for a call whose initialisation never ends fails that
// call as plugin_timeout, by InitTimeout, naming the call's export.
func TestGuestInitialisationFailureFailsTheCallThatNeededTheInstance(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			e := newEnv(t, Config{CallPath: path})
			gate := e.clock.Now().Add(time.Hour)
			p, err := e.h.Load(context.Background(), PluginSpec{
				Name: "init", Path: writeModule(t, initModule(initWhileClockAt(gate.UnixMilli()))), Role: abi.RoleExecutor,
				Limits: Limits{CallTimeout: time.Hour, InitTimeout: 200 * time.Millisecond},
			})
			if err != nil {
				t.Fatal(err)
			}
			e.clock.Set(gate) // the clock stays there: the initialisation never ends
			_, err = p.CallRaw(context.Background(), "acme", abi.ExportStart, []byte(`{"abi":1}`))
			var pe *runtime.PluginError
			if !errors.As(err, &pe) || pe.Class != abi.ClassPluginTimeout || pe.Export != abi.ExportStart {
				t.Fatalf("call: %v; want plugin_timeout of export start", err)
			}
			if msg := err.Error(); strings.Count(msg, "host: ") != 1 || !strings.Contains(msg, "initialisation (_initialize) ran past its bound of 200ms") {
				t.Fatalf("call: %q; want one prefix, naming the initialisation and its bound", msg)
			}
			if s := p.Stats("acme"); s.InUse != 0 || s.Idle != 0 {
				t.Fatalf("pool after the failed initialisation: %+v; want no instance kept", s)
			}
		})
	}
}

// TestCallerGivingUpDuringGuestInitialisationIsNotThePluginsFault: the
// caller's context ending while a new instance initialises fails the call
// with the caller's error, not with a class of the plugin's.
func TestCallerGivingUpDuringGuestInitialisationIsNotThePluginsFault(t *testing.T) {
	for _, path := range bothPaths {
		t.Run(string(path), func(t *testing.T) {
			e := newEnv(t, Config{CallPath: path})
			gate := e.clock.Now().Add(time.Hour)
			p, err := e.h.Load(context.Background(), PluginSpec{
				Name: "init", Path: writeModule(t, initModule(initWhileClockAt(gate.UnixMilli()))), Role: abi.RoleExecutor,
			})
			if err != nil {
				t.Fatal(err)
			}
			e.clock.Set(gate)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := p.CallRaw(ctx, "acme", abi.ExportStart, []byte(`{"abi":1}`))
				done <- err
			}()
			waitFor(t, "the call to take an instance", time.Minute, func() bool { return p.Stats("acme").InUse == 1 })
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the call did not end within a minute of its caller giving up")
			}
			var pe *runtime.PluginError
			if errors.As(err, &pe) || !errors.Is(err, context.Canceled) {
				t.Fatalf("call: %v; want the caller's context.Canceled, not a plugin's class", err)
			}
		})
	}
}

// TestSDKPathInitialisesTheGuestWhenTheInstanceIsCreated: on the
// reference path, go-sdk's own lazy initialisation is done (and marked
// done) before the instance serves, so that no call runs it again.
func TestSDKPathInitialisesTheGuestWhenTheInstanceIsCreated(t *testing.T) {
	e := newEnv(t, Config{CallPath: CallPathSDK})
	p := e.load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	in, err := p.newInstance(context.Background(), abi.ExportStart)
	if err != nil {
		t.Fatal(err)
	}
	defer in.close(context.Background())
	if !in.g.(*sdkGuest).init.done.Bool() {
		t.Fatal("a new instance on the reference path is not initialised: its first call would initialise it within its own timeout")
	}
}

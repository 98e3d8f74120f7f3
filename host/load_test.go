package host

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestWarmPluginCache builds every conformance plugin and compiles it into
// the on-disk wazero cache. `make warm-cache` runs it without -race before
// the race-enabled tests (docs/DESIGN.md §9); on its own it is an ordinary test.
func TestWarmPluginCache(t *testing.T) {
	// Each call path compiles its own module (the native one with its
	// interrupt checks), and the fallback to wazero's checks a third.
	for _, cfg := range []Config{{}, {CallPath: CallPathSDK}, {wazeroChecks: true}} {
		e := newEnv(t, cfg)
		for _, name := range conformance.Plugins {
			role := abi.RoleExecutor
			if name == conformance.PluginBuilder {
				role = abi.RoleBuilder
			}
			p := e.load(t, name, role, nil)
			if p.ABIVersion() != abi.Version {
				t.Errorf("%s: ABI v%d, want v%d", name, p.ABIVersion(), abi.Version)
			}
		}
	}
}

func writeModule(t *testing.T, wasm []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.wasm")
	if err := os.WriteFile(p, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRefusals(t *testing.T) {
	i64 := wFuncType{params: []byte{wI64}, results: []byte{wI64}}
	cases := []struct {
		name     string
		wasm     []byte
		sentinel error
		want     []string // every fragment must be in the error
	}{
		{"no marker", tinyModule(nil, executorExports()), ErrABIMismatch,
			[]string{`"agenthost_abi_v1"`, "does not export the marker"}},
		{"only a future marker", tinyModule(nil, executorExports("agenthost_abi_v2")), ErrABIMismatch,
			[]string{"speaks ABI v2", "agenthost_abi_v2", "supports ABI v1", "agenthost_abi_v1"}},
		{"marker with a type", tinyModule(nil, executorExports("agenthost_abi_v1")[1:]), ErrABIMismatch, nil},
		{"unknown host/user import", tinyModule([]wImport{{"extism:host/user", "agenthost_teleport", i64}}, executorExports("agenthost_abi_v1")), ErrImportRefused,
			[]string{"extism:host/user.agenthost_teleport", "(i64) -> i64", "not a function this host offers"}},
		{"wrong signature", tinyModule([]wImport{{"extism:host/user", "agenthost_kv_get", wFuncType{params: []byte{wI32}, results: []byte{wI32}}}}, executorExports("agenthost_abi_v1")), ErrImportRefused,
			[]string{"extism:host/user.agenthost_kv_get", "(i32) -> i32", "(i64) -> i64"}},
		{"unknown module", tinyModule([]wImport{{"env", "abort", wFuncType{}}}, executorExports("agenthost_abi_v1")), ErrImportRefused,
			[]string{"env.abort", `module "env"`}},
		{"missing export", tinyModule(nil, executorExports("agenthost_abi_v1")[:3]), ErrExportMissing,
			[]string{`"poll"`, "loaded as executor"}},
	}
	// The "marker with a type" case: a marker that takes a parameter.
	cases[2].wasm = tinyModule(nil, append([]wExport{{name: "agenthost_abi_v1", typ: wFuncType{params: []byte{wI32}}}}, executorExports()...))
	cases[2].want = []string{"agenthost_abi_v1", "no parameters and no results", "(i32) -> ()"}

	e := newEnv(t, Config{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.h.Load(context.Background(), PluginSpec{Name: "tiny", Path: writeModule(t, c.wasm), Role: abi.RoleExecutor})
			if err == nil {
				t.Fatal("loaded; want a refusal")
			}
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("error %v does not wrap %v", err, c.sentinel)
			}
			if !strings.HasPrefix(err.Error(), "host: plugin[tiny] export[-]: load ") {
				t.Errorf("error %q lacks the host: plugin[...] prefix", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if len(e.h.Plugins()) != 0 {
				t.Errorf("a refused plugin is registered: %v", e.h.Plugins())
			}
		})
	}
}

func TestImportCheckAllowsExtismEnvAndWASI(t *testing.T) {
	wasm := tinyModule([]wImport{
		{"extism:host/env", "output_set", wFuncType{params: []byte{wI64, wI64}}},
		{"extism:host/env", "input_load_u64", wFuncType{params: []byte{wI64}, results: []byte{wI64}}},
		{"extism:host/env", "http_request", wFuncType{params: []byte{wI64, wI64}, results: []byte{wI64}}},
		{"wasi_snapshot_preview1", "fd_write", wFuncType{params: []byte{wI32, wI32, wI32, wI32}, results: []byte{wI32}}},
		{"extism:host/user", "agenthost_now_ms", wFuncType{results: []byte{wI64}}},
		{"extism:host/user", "agenthost_kv_set", wFuncType{params: []byte{wI64, wI64}, results: []byte{wI64}}},
	}, executorExports("agenthost_abi_v1", "agenthost_abi_v2", "agenthost_abi_v7"))
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	info, err := inspectModule(cm, abi.RoleExecutor)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if info.abiVersion != 1 || len(info.markers) != 3 {
		t.Fatalf("picked v%d of %v; want v1 of [1 2 7]", info.abiVersion, info.markers)
	}
}

func TestLoadPicksHighestSupportedMarker(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.load(t, conformance.PluginHostile, abi.RoleExecutor, nil) // exports v1 and v2
	if p.ABIVersion() != 1 || len(p.info.markers) != 2 {
		t.Fatalf("ABI v%d from markers %v; want v1 from [1 2]", p.ABIVersion(), p.info.markers)
	}
}

func TestLoadSHA256Pin(t *testing.T) {
	e := newEnv(t, Config{})
	path := pluginPath(t, conformance.PluginExecutor)
	wrong := strings.Repeat("ab", 32)
	_, err := e.h.Load(context.Background(), PluginSpec{Name: "pinned", Path: path, Role: abi.RoleExecutor, SHA256: wrong})
	if !errors.Is(err, ErrHashMismatch) || !strings.Contains(err.Error(), wrong) {
		t.Fatalf("error %v: want ErrHashMismatch showing the pin", err)
	}
	p := e.load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	if !strings.Contains(err.Error(), p.SHA256()) {
		t.Fatalf("error %v does not show the file's hash %s", err, p.SHA256())
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.load(t, conformance.PluginExecutor, abi.RoleExecutor, func(s *PluginSpec) { s.SHA256 = strings.ToUpper(p.SHA256()) })
}

func TestLoadRoleMismatch(t *testing.T) {
	e := newEnv(t, Config{})
	// The builder has no start export: refused before any instance.
	_, err := e.h.Load(context.Background(), PluginSpec{Name: "b", Path: pluginPath(t, conformance.PluginBuilder), Role: abi.RoleExecutor})
	if !errors.Is(err, ErrExportMissing) {
		t.Fatalf("builder loaded as executor: %v; want ErrExportMissing", err)
	}
	// The executor has no build export: refused as a builder too. A role
	// that describe contradicts is checked by abi.ValidateDescribe.
	_, err = e.h.Load(context.Background(), PluginSpec{Name: "x", Path: pluginPath(t, conformance.PluginExecutor), Role: abi.RoleBuilder})
	if !errors.Is(err, ErrExportMissing) || !strings.Contains(err.Error(), `"build"`) {
		t.Fatalf("executor loaded as builder: %v; want ErrExportMissing naming build", err)
	}
	if err := abi.ValidateDescribe(abi.Describe{ABI: 1, Name: "n", Role: abi.RoleBuilder}, abi.RoleExecutor); !errors.Is(err, abi.ErrRoleMismatch) {
		t.Fatalf("ValidateDescribe: %v", err)
	}
}

func TestLoadDuplicateNameAndClosedHost(t *testing.T) {
	e := newEnv(t, Config{})
	e.load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	_, err := e.h.Load(context.Background(), PluginSpec{Name: conformance.PluginExecutor, Path: pluginPath(t, conformance.PluginExecutor), Role: abi.RoleExecutor})
	if err == nil || !strings.Contains(err.Error(), "loaded already") {
		t.Fatalf("duplicate load: %v", err)
	}
	if err := e.h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = e.h.Load(context.Background(), PluginSpec{Name: "late", Path: pluginPath(t, conformance.PluginExecutor), Role: abi.RoleExecutor})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("load after close: %v", err)
	}
}

func TestLimitsMustFitMemory(t *testing.T) {
	e := newEnv(t, Config{})
	_, err := e.h.Load(context.Background(), PluginSpec{Name: "x", Path: pluginPath(t, conformance.PluginExecutor), Role: abi.RoleExecutor,
		Limits: Limits{MemoryPages: 16, MaxInputBytes: 1 << 20}})
	if err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("limits: %v", err)
	}
}

// TestLoadBesideKeepsEveryVersionTheHosts checks that versions loaded
// beside each other (a config reload) stay the host's until each is
// closed: a refused reload (the new version loaded, then closed) gives
// the name back to the version in force, whose idle instances the memory
// cap still evicts and Close still closes; an old version that drains
// after a reload is closed by Close too.
func TestLoadBesideKeepsEveryVersionTheHosts(t *testing.T) {
	ctx := context.Background()
	name := conformance.PluginExecutor
	spec := PluginSpec{Name: name, Path: pluginPath(t, name), Role: abi.RoleExecutor}
	call := func(t *testing.T, p *Plugin, tenant string) {
		t.Helper()
		x, err := p.Executor()
		if err != nil {
			t.Fatal(err)
		}
		doneIn(t)(x.Start(ctx, toolCall(tenant, "r", 1, "echo", map[string]string{"text": "x"})))
	}
	probe := newEnv(t, Config{})
	call(t, probe.load(t, name, abi.RoleExecutor, nil), "acme")
	one := probe.h.MemoryInUse()

	t.Run("refused reload", func(t *testing.T) {
		// Room for one instance and a half, as in TestHostMemoryCapEvictsIdle.
		e := newEnv(t, Config{MaxInstanceMemory: one + one/2})
		inForce := e.load(t, name, abi.RoleExecutor, nil)
		call(t, inForce, "acme")
		refused, err := e.h.LoadBeside(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := refused.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if p, ok := e.h.Plugin(name); !ok || p != inForce {
			t.Fatalf("Plugin(%q) after the refused reload = %p, %v; want the version in force %p", name, p, ok, inForce)
		}
		// Another plugin's instance fits only once the version in force's
		// idle one is evicted.
		other := e.load(t, name, abi.RoleExecutor, func(s *PluginSpec) { s.Name = "other" })
		call(t, other, "globex")
		if st := inForce.Stats("acme"); st.Evicted != 1 {
			t.Fatalf("the version in force's idle instance was not evicted under the memory cap: %+v", st)
		}
		call(t, inForce, "acme")
		if err := e.h.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if m := e.h.MemoryInUse(); m != 0 {
			t.Fatalf("after Close, %d bytes of instances are still live; want 0", m)
		}
	})

	t.Run("drained old version", func(t *testing.T) {
		e := newEnv(t, Config{})
		old := e.load(t, name, abi.RoleExecutor, nil)
		call(t, old, "acme")
		current, err := e.h.LoadBeside(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := e.h.Plugin(name); p != current {
			t.Fatalf("Plugin(%q) after LoadBeside = %p; want the new version %p", name, p, current)
		}
		if got := e.h.Plugins(); len(got) != 1 || got[0] != name {
			t.Fatalf("Plugins() = %v; want [%s]", got, name)
		}
		if err := e.h.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if m := e.h.MemoryInUse(); m != 0 {
			t.Fatalf("after Close, the old version's %d bytes of instances are still live; want 0", m)
		}
	})
}

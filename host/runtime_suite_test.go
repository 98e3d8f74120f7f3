package host

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// TestRuntimeSuiteWithWasmPlugins runs the runtime's conformance suite with
// real Wasm plugins through this host: the conformance builder, and the
// scripted executor (the Wasm twin of the suite's Go fakes) as both the
// model and the tool executor, its slow jobs kept in the store's plugin KV.
func TestRuntimeSuiteWithWasmPlugins(t *testing.T) {
	conformance.RuntimeSuite(t, conformance.RuntimeHarness{
		NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s := conformance.NewMemStore(clock, conformance.KVLimits{})
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		NewPlugins: func(t *testing.T, store runtime.Store, clock runtime.Clock) conformance.RuntimePlugins {
			h, err := New(Config{CacheDir: conformance.WazeroCacheDir(), KV: store, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close(context.Background()) })
			ctx := context.Background()
			bp, err := h.Load(ctx, PluginSpec{Name: "builder", Path: pluginPath(t, conformance.PluginBuilder), Role: abi.RoleBuilder})
			if err != nil {
				t.Fatal(err)
			}
			xp, err := h.Load(ctx, PluginSpec{Name: "scripted", Path: pluginPath(t, conformance.PluginScripted), Role: abi.RoleExecutor,
				Limits: Limits{CallTimeout: 30 * time.Second, PoolSize: 8}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := bp.Builder()
			if err != nil {
				t.Fatal(err)
			}
			x, err := xp.Executor()
			if err != nil {
				t.Fatal(err)
			}
			return conformance.RuntimePlugins{Builder: b, Model: x, Tools: x, Release: func() {
				if err := store.KVSet(context.Background(), "acme", "scripted", []byte("release"), []byte("1")); err != nil {
					t.Errorf("release: %v", err)
				}
			}}
		},
	})
}

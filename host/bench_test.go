package host

import (
	"context"
	"os"
	"testing"

	extism "github.com/extism/go-sdk"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/wasmengine"
	"github.com/agenthost/agenthost/plugins/abi"
)

// BenchmarkCallEmpty measures one call of the executor plugin's empty
// export three ways, in one run: a raw wazero call (the floor), a direct
// extism Plugin.Call, and the host's call path (pool, scope, timeout,
// classification). docs/BENCHMARKS.md reports the ratios.
func BenchmarkCallEmpty(b *testing.B) {
	ctx := context.Background()
	path := pluginPath(b, conformance.PluginExecutor)
	wasm, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}

	b.Run("wazero", func(b *testing.B) {
		e := newEnv(b, Config{})
		mod, closeRT, err := wasmengine.WazeroBaseline(ctx, e.h.cache, wasm)
		if err != nil {
			b.Fatal(err)
		}
		defer closeRT(ctx)
		f := mod.ExportedFunction("empty")
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := f.Call(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("extism", func(b *testing.B) {
		e := newEnv(b, Config{})
		compiled, err := wasmengine.ExtismBaseline(ctx, e.h.cache, wasm, 10000, e.h.sdkHostFunctions())
		if err != nil {
			b.Fatal(err)
		}
		defer compiled.Close(ctx)
		inst, err := compiled.Instance(ctx, extism.PluginInstanceConfig{})
		if err != nil {
			b.Fatal(err)
		}
		if rc, _, err := inst.Call("empty", nil); err != nil || rc != 0 { // runs _initialize
			b.Fatal(rc, err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if rc, _, err := inst.Call("empty", nil); err != nil || rc != 0 {
				b.Fatal(rc, err)
			}
		}
	})

	for _, path := range []CallPath{CallPathSDK, CallPathNative} {
		b.Run("host-"+string(path), func(b *testing.B) { benchHostEmpty(b, path) })
	}
}

func benchHostEmpty(b *testing.B, path CallPath) {
	ctx := context.Background()
	{
		e := newEnv(b, Config{CallPath: path})
		p := e.load(b, conformance.PluginExecutor, abi.RoleExecutor, nil)
		call := func() {
			s := &callScope{plugin: p, export: "empty", tenant: "acme"}
			if _, err := p.call(ctx, s, nil); err != nil {
				b.Fatal(err)
			}
		}
		call() // instance and guest runtime init
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			call()
		}
	}
}

// BenchmarkExecutorStart is a whole Executor.Start of the echo tool: JSON
// in, one emit, JSON out, one decode and validation.
func BenchmarkExecutorStart(b *testing.B) {
	for _, path := range []CallPath{CallPathSDK, CallPathNative} {
		b.Run(string(path), func(b *testing.B) {
			e := newEnv(b, Config{CallPath: path})
			x := e.executor(b, conformance.PluginExecutor, nil)
			c := toolCall("acme", "r.t1.0", 1, "echo", map[string]string{"text": "hello"})
			doneIn(b)(x.Start(context.Background(), c))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := x.Start(context.Background(), c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad is a cold Load of the executor plugin (a new Host each
// time): with an empty compilation cache, and with the warm on-disk one.
func BenchmarkLoad(b *testing.B) {
	path := pluginPath(b, conformance.PluginExecutor)
	run := func(b *testing.B, dir func() string) {
		for i := 0; i < b.N; i++ {
			h, err := New(Config{CacheDir: dir(), KV: newMemKV()})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := h.Load(context.Background(), PluginSpec{Name: "x", Path: path, Role: abi.RoleExecutor}); err != nil {
				b.Fatal(err)
			}
			h.Close(context.Background())
		}
	}
	b.Run("uncached", func(b *testing.B) { run(b, func() string { return b.TempDir() }) })
	b.Run("cached", func(b *testing.B) { run(b, conformance.WazeroCacheDir) })
}

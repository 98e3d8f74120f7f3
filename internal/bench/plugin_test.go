package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/plugincatalog"
)

// decodeBenchPlugin decodes the --json output of bench plugin.
func decodeBenchPlugin(t *testing.T, out string) (benchPluginParams, benchPluginResult) {
	t.Helper()
	var got struct {
		Bench  string            `json:"bench"`
		Params benchPluginParams `json:"params"`
		Result benchPluginResult `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("the --json output does not decode: %v\n%s", err, out)
	}
	if got.Bench != "plugin" {
		t.Fatalf("bench %q, want plugin", got.Bench)
	}
	return got.Params, got.Result
}

// TestBenchPluginReportsEveryPathAgainstItsBaselines runs `agenthost bench
// plugin` with small numbers and checks that every figure is there, real
// and consistent with the others. It asserts no speed: that is for
// benchmarks. The loads use the warm shared cache only (--uncached=false):
// a full compile takes about 45 s under -race; see the test below.
func TestBenchPluginReportsEveryPathAgainstItsBaselines(t *testing.T) {
	out, err := runBench(t, benchPluginsDir(t), "plugin",
		"--calls", "200", "--warmup", "20", "--starts", "20", "--rounds", "2", "--loads", "1", "--uncached=false", "--json")
	if err != nil {
		t.Fatal(err)
	}
	p, r := decodeBenchPlugin(t, out)
	if p.Calls != 200 || p.Rounds != 2 || p.Starts != 20 || p.Loads != 1 || p.Uncached {
		t.Fatalf("params %+v: not what was asked", p)
	}

	// Each path: 2 rounds, a median inside them, heap figures.
	checkFigure := func(f callFigure, path string, calls int) {
		t.Helper()
		if f.Path != path || f.Calls != calls || len(f.RoundsNs) != 2 {
			t.Fatalf("figure %+v: want path %q, %d calls a round, 2 rounds", f, path, calls)
		}
		lo, hi := math.Min(f.RoundsNs[0], f.RoundsNs[1]), math.Max(f.RoundsNs[0], f.RoundsNs[1])
		if lo <= 0 || f.NsPerOp < lo || f.NsPerOp > hi {
			t.Fatalf("%s: ns/op %v is not the median of its rounds %v", path, f.NsPerOp, f.RoundsNs)
		}
		if f.AllocsPerOp < 0 || f.BytesPerOp < 0 {
			t.Fatalf("%s: negative allocations %+v", path, f)
		}
	}
	if len(r.Calls) != 4 {
		t.Fatalf("want the wazero, extism, host and host-extism-sdk paths, got %+v", r.Calls)
	}
	for i, path := range []string{"wazero", "extism", "host", "host-extism-sdk"} {
		checkFigure(r.Calls[i], path, 200)
	}
	// Every host call allocates (its scope, its context): a figure of 0
	// would mean nothing was counted.
	for _, f := range r.Calls[1:] {
		if f.AllocsPerOp < 1 || f.BytesPerOp < 1 {
			t.Fatalf("%s: %v allocs/op, %v B/op: the heap was not measured", f.Path, f.AllocsPerOp, f.BytesPerOp)
		}
	}
	w, e, h, sdk := r.Calls[0].NsPerOp, r.Calls[1].NsPerOp, r.Calls[2].NsPerOp, r.Calls[3].NsPerOp
	ratios := []struct {
		name      string
		got, want float64
	}{
		{"host/extism", r.HostOverExtism, h / e},
		{"host/wazero", r.HostOverWazero, h / w},
		{"extism/wazero", r.ExtismOverWazero, e / w},
		{"host-extism-sdk/host", r.SDKHostOverNative, sdk / h},
		{"extism/host", r.ExtismOverHost, e / h},
	}

	// Each start plugin on each call path, native first, and the ratio of
	// the two for each plugin.
	if len(r.Starts) != 4 {
		t.Fatalf("want 4 Executor.Start figures (calculator, calculator-c; native, extism-sdk), got %+v", r.Starts)
	}
	for i, want := range []struct{ plugin, callPath, path string }{
		{"calculator", "native", "host"}, {"calculator", "extism-sdk", "host-extism-sdk"},
		{"calculator-c", "native", "host"}, {"calculator-c", "extism-sdk", "host-extism-sdk"},
	} {
		f := r.Starts[i]
		if f.Plugin != want.plugin || f.CallPath != want.callPath {
			t.Fatalf("start %d: %s on %s, want %s on %s", i, f.Plugin, f.CallPath, want.plugin, want.callPath)
		}
		checkFigure(f.callFigure, want.path, 20)
	}
	if len(r.StartSDKOverNative) != 2 {
		t.Fatalf("start ratios %v: want one for each plugin", r.StartSDKOverNative)
	}
	for i, plugin := range []string{"calculator", "calculator-c"} {
		n, s := r.Starts[2*i].NsPerOp, r.Starts[2*i+1].NsPerOp
		ratios = append(ratios, struct {
			name      string
			got, want float64
		}{plugin + " start extism-sdk/native", r.StartSDKOverNative[plugin], s / n})
	}
	for _, c := range ratios {
		if c.got <= 0 || math.Abs(c.got-c.want) > 1e-9*c.want {
			t.Fatalf("%s is %v, but the figures give %v", c.name, c.got, c.want)
		}
	}

	// executor_start is still the Go calculator's, on the native path.
	if r.Start == nil {
		t.Fatal("no Executor.Start figure")
	}
	checkFigure(*r.Start, "executor start", 20)
	if p.StartPlugin != "calculator" || r.Start.NsPerOp != r.Starts[0].NsPerOp || !slices.Equal(r.Start.RoundsNs, r.Starts[0].RoundsNs) {
		t.Fatalf("executor_start %+v (of %q) is not the native start of the calculator %+v", r.Start, p.StartPlugin, r.Starts[0])
	}

	l := r.Load
	if l.Plugin != "calculator" || l.WasmBytes <= 0 || len(l.CachedRunsMS) != 1 || l.CachedMS <= 0 || l.CachedMS != l.CachedRunsMS[0] {
		t.Fatalf("load %+v: want one cached load of the calculator, its median its figure", l)
	}
	if l.UncachedMS != 0 || len(l.UncachedRunsMS) != 0 || l.UncachedOverCached != 0 {
		t.Fatalf("load %+v: uncached figures with --uncached=false", l)
	}
	// The cached load against the wazero baseline of the same rounds, and
	// its target.
	if len(l.WazeroCachedRunsMS) != 1 || l.WazeroCachedMS <= 0 || l.WazeroCachedMS != l.WazeroCachedRunsMS[0] {
		t.Fatalf("load %+v: want one wazero baseline load, its median its figure", l)
	}
	if math.Abs(l.CachedOverWazero-l.CachedMS/l.WazeroCachedMS) > 1e-9*l.CachedOverWazero {
		t.Fatalf("cached/wazero is %v, but the figures give %v", l.CachedOverWazero, l.CachedMS/l.WazeroCachedMS)
	}
	if len(l.CachedCPURunsMS) != 1 || len(l.WazeroCachedCPURunsMS) != 1 || l.CachedCPUMS <= 0 || l.WazeroCachedCPUMS <= 0 ||
		l.CachedCPUMS != l.CachedCPURunsMS[0] || l.WazeroCachedCPUMS != l.WazeroCachedCPURunsMS[0] ||
		math.Abs(l.CachedCPUOverWazero-l.CachedCPUMS/l.WazeroCachedCPUMS) > 1e-9*l.CachedCPUOverWazero {
		t.Fatalf("load %+v: want the CPU time of one cached load and of one baseline load, and their ratio", l)
	}
	if len(l.LoadedRunsMS) != 1 || len(l.LoadedCPURunsMS) != 1 || l.LoadedMS <= 0 || l.LoadedMS != l.LoadedRunsMS[0] || l.LoadedCPUMS != l.LoadedCPURunsMS[0] {
		t.Fatalf("load %+v: want one load of the file loaded already, its median its figure", l)
	}
	if l.TargetCachedMS != targetCachedLoadMS || l.CachedTargetMet != (l.CachedMS < targetCachedLoadMS) {
		t.Fatalf("load %+v: the target is %v ms, and met is %v for %v ms", l, l.TargetCachedMS, l.CachedTargetMet, l.CachedMS)
	}
}

// TestBenchPluginLoadsThePluginItIsGiven times the loads of the C
// calculator by name and of a .wasm file by path, not of the Go
// calculator.
func TestBenchPluginLoadsThePluginItIsGiven(t *testing.T) {
	dir := benchPluginsDir(t)
	file := plugincatalog.Path(dir, plugincatalog.CalculatorC)
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, plugin := range []string{plugincatalog.CalculatorC, file} {
		out, err := runBench(t, dir, "plugin", "--calls", "1", "--warmup", "0", "--starts", "0", "--rounds", "1", "--loads", "1",
			"--uncached=false", "--load-plugin", plugin, "--json")
		if err != nil {
			t.Fatal(err)
		}
		p, r := decodeBenchPlugin(t, out)
		if p.LoadPlugin != plugin || r.Load.Plugin != plugin || r.Load.WasmBytes != st.Size() || r.Load.CachedMS <= 0 || r.Load.WazeroCachedMS <= 0 {
			t.Fatalf("--load-plugin %s: params %+v, load %+v: want the loads of %s (%d bytes)", plugin, p, r.Load, file, st.Size())
		}
	}
	_, err = runBench(t, dir, "plugin", "--quiet", "--calls", "1", "--rounds", "1", "--starts", "0", "--loads", "1", "--uncached=false",
		"--load-plugin", filepath.Join(dir, "missing.wasm"))
	if err == nil || !strings.Contains(err.Error(), "missing.wasm") {
		t.Fatalf("a missing --load-plugin file: want an error naming it, got %v", err)
	}
}

// TestBenchPluginTimesALoadWithAnEmptyCache checks the uncached load: a
// full compile of a 3 MB plugin, about 4 s, but about 45 s under -race
// (docs/DESIGN.md §9), so it is opt-in: AGENTHOST_BENCH_UNCACHED=1.
func TestBenchPluginTimesALoadWithAnEmptyCache(t *testing.T) {
	if os.Getenv("AGENTHOST_BENCH_UNCACHED") == "" {
		t.Skip("a full compile; set AGENTHOST_BENCH_UNCACHED=1 to run it")
	}
	out, err := runBench(t, benchPluginsDir(t), "plugin", "--calls", "1", "--warmup", "0", "--starts", "0", "--rounds", "1", "--loads", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	p, r := decodeBenchPlugin(t, out)
	if !p.Uncached || r.Start != nil || r.Starts != nil {
		t.Fatalf("params %+v, start %+v: want uncached loads and no Executor.Start", p, r.Start)
	}
	l := r.Load
	if len(l.UncachedRunsMS) != 1 || len(l.CachedRunsMS) != 1 || l.UncachedMS <= 0 || l.CachedMS <= 0 ||
		l.UncachedMS != l.UncachedRunsMS[0] || l.CachedMS != l.CachedRunsMS[0] {
		t.Fatalf("load %+v: want one uncached and one cached load, each its median", l)
	}
	if math.Abs(l.UncachedOverCached-l.UncachedMS/l.CachedMS) > 1e-9*l.UncachedOverCached {
		t.Fatalf("uncached/cached is %v, but the figures give %v", l.UncachedOverCached, l.UncachedMS/l.CachedMS)
	}
}

// TestBenchPluginWithoutThePluginsSaysHowToBuildThem runs the bench
// against an empty --plugins directory.
func TestBenchPluginWithoutThePluginsSaysHowToBuildThem(t *testing.T) {
	_, err := runBench(t, t.TempDir(), "plugin", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "conformance/executor") || !strings.Contains(err.Error(), "make plugins") {
		t.Fatalf("want an error naming the missing plugin and `make plugins`, got %v", err)
	}
}

// TestBenchPluginWithoutTheCCalculatorSaysHowToBuildIt runs the bench
// against a --plugins directory that `make plugins` filled but `make
// plugins-c` did not; without the C calculator it starts the Go one alone.
func TestBenchPluginWithoutTheCCalculatorSaysHowToBuildIt(t *testing.T) {
	dir := benchPluginsDir(t)
	if err := os.Remove(plugincatalog.Path(dir, plugincatalog.CalculatorC)); err != nil {
		t.Fatal(err)
	}
	_, err := runBench(t, dir, "plugin", "--quiet", "--calls", "1", "--rounds", "1", "--starts", "1", "--loads", "1", "--uncached=false")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "calculator-c.wasm")) || !strings.Contains(err.Error(), "make plugins-c") ||
		!strings.Contains(err.Error(), "--start-plugins calculator") {
		t.Fatalf("want an error naming the missing calculator-c.wasm, `make plugins-c` and --start-plugins calculator, got %v", err)
	}
	out, err := runBench(t, dir, "plugin", "--calls", "1", "--warmup", "0", "--rounds", "1", "--starts", "1", "--loads", "1", "--uncached=false",
		"--start-plugins", "calculator", "--json")
	if err != nil {
		t.Fatal(err)
	}
	p, r := decodeBenchPlugin(t, out)
	if !slices.Equal(p.StartPlugins, []string{"calculator"}) || len(r.Starts) != 2 || r.Starts[0].Plugin != "calculator" || r.Starts[1].Plugin != "calculator" {
		t.Fatalf("params %+v, starts %+v: want the Go calculator alone, on both paths", p, r.Starts)
	}
}

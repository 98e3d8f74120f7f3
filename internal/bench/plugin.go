package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/spf13/cobra"
	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/internal/wasmengine"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The plugins bench plugin loads, under --plugins.
const (
	benchCallPlugin = plugincatalog.ConformanceDir + plugincatalog.Executor // exports "empty", a no-op
	benchLoadPlugin = plugincatalog.Calculator
)

// benchStartPlugins are the plugins whose tool "calculate" bench plugin
// starts by default: the Go calculator (`make plugins`) and the C one
// (`make plugins-c`).
var benchStartPlugins = []string{plugincatalog.Calculator, plugincatalog.CalculatorC}

// benchCallPaths are the host's call paths bench plugin measures, each
// under the name its figures carry: "host" is the native path (the
// default), "host-extism-sdk" the extism go-sdk one.
var benchCallPaths = []host.CallPath{host.CallPathNative, host.CallPathSDK}

// hostPathName is the name of the figures of a host on call path cp.
func hostPathName(cp host.CallPath) string {
	if cp == host.CallPathNative {
		return "host"
	}
	return "host-" + string(cp)
}

// The targets of the native call path, against the baselines measured in
// the same rounds; the bench reports whether each is met.
const (
	targetEmptyExtismOverHost = 10   // go-sdk bare ÷ native host, the empty call
	targetEmptyNs             = 3000 // the native host's empty call, ns
	targetEmptyBytes          = 1024 // the native host's empty call, Go heap B/op
	targetCStartSDKOverNative = 8    // the C calculator's Executor.Start, extism-sdk ÷ native
)

// benchPluginParams are the parameters of a bench plugin run.
type benchPluginParams struct {
	Calls      int    `json:"calls"`
	Warmup     int    `json:"warmup"`
	Starts     int    `json:"starts"`
	Rounds     int    `json:"rounds"`
	Loads      int    `json:"loads"`
	Uncached   bool   `json:"uncached"`
	CallPlugin string `json:"call_plugin"`
	// StartPlugin is the plugin of executor_start: the first of
	// StartPlugins.
	StartPlugin  string   `json:"start_plugin"`
	StartPlugins []string `json:"start_plugins"`
	LoadPlugin   string   `json:"load_plugin"`
	CacheDir     string   `json:"cache_dir"`
}

// callFigure is one call path's cost: the median over the rounds, each
// round's figure, and the Go heap allocations of the median round.
type callFigure struct {
	Path        string    `json:"path"`
	Calls       int       `json:"calls_per_round"`
	NsPerOp     float64   `json:"ns_per_op"`
	RoundsNs    []float64 `json:"rounds_ns_per_op"`
	AllocsPerOp float64   `json:"allocs_per_op"`
	BytesPerOp  float64   `json:"bytes_per_op"`
}

// startFigure is the cost of an Executor.Start of one plugin's tool on
// one call path; Path is the host's name as in the calls ("host",
// "host-extism-sdk"), CallPath the host.Config.CallPath.
type startFigure struct {
	Plugin   string `json:"plugin"`
	CallPath string `json:"call_path"`
	callFigure
}

// loadFigure is the cost of host.New plus Load of one plugin: with a fresh,
// empty compilation cache each time (cold), and with the warm on-disk one
// (cached), against the baseline of the same rounds: a bare wazero
// runtime that reads the file and compiles it through a compilation cache
// newly opened on the same warm directory, then instantiates it and runs
// its _initialize (wasmengine.WazeroBaseline), what any wazero embedder
// pays to load the plugin from a warm cache.
type loadFigure struct {
	Plugin         string    `json:"plugin"`
	WasmBytes      int64     `json:"wasm_bytes"`
	UncachedMS     float64   `json:"uncached_ms,omitempty"`
	UncachedRunsMS []float64 `json:"uncached_runs_ms,omitempty"`
	CachedMS       float64   `json:"cached_ms"`
	CachedRunsMS   []float64 `json:"cached_runs_ms"`
	// UncachedOverCached is 0 when the uncached loads were skipped.
	UncachedOverCached float64 `json:"uncached_over_cached,omitempty"`
	// WazeroCachedMS is the baseline's median, WazeroCachedRunsMS its
	// loads, and CachedOverWazero the host's cached load ÷ the baseline.
	WazeroCachedMS     float64   `json:"wazero_cached_ms"`
	WazeroCachedRunsMS []float64 `json:"wazero_cached_runs_ms"`
	CachedOverWazero   float64   `json:"cached_over_wazero"`
	// The CPU time of the same loads (the process's, user and system: on
	// a shared machine a steadier figure than the wall time), their
	// medians, and the host's cached load ÷ the baseline's.
	CachedCPURunsMS       []float64 `json:"cached_cpu_runs_ms"`
	CachedCPUMS           float64   `json:"cached_cpu_ms"`
	WazeroCachedCPURunsMS []float64 `json:"wazero_cached_cpu_runs_ms"`
	WazeroCachedCPUMS     float64   `json:"wazero_cached_cpu_ms"`
	CachedCPUOverWazero   float64   `json:"cached_cpu_over_wazero"`
	// Loaded is a Load of the same file into the host of a cached load,
	// under another name, while the first is loaded: what a reload that
	// loads a plugin of an unchanged file beside the old one pays (the
	// compiled code is shared; describe runs again). Its medians, wall
	// and CPU.
	LoadedRunsMS    []float64 `json:"loaded_again_runs_ms"`
	LoadedMS        float64   `json:"loaded_again_ms"`
	LoadedCPURunsMS []float64 `json:"loaded_again_cpu_runs_ms"`
	LoadedCPUMS     float64   `json:"loaded_again_cpu_ms"`
	// TargetCachedMS is the target of the host's cached load, and
	// CachedTargetMet whether the median met it.
	TargetCachedMS  float64 `json:"target_cached_ms"`
	CachedTargetMet bool    `json:"cached_target_met"`
}

// targetCachedLoadMS is the target of a cached load of the Go calculator
// (host.New plus Load, warm on-disk cache), in ms.
const targetCachedLoadMS = 50

// benchPluginResult is the result of a bench plugin run.
type benchPluginResult struct {
	// Calls are the empty export's paths, in this order: wazero, extism
	// (go-sdk bare), host (the native call path), host-extism-sdk (the
	// host on the go-sdk call path).
	Calls []callFigure `json:"calls"`
	// The ratios of the empty call's ns/op; "host" is the native path.
	HostOverExtism   float64 `json:"host_over_extism"`
	HostOverWazero   float64 `json:"host_over_wazero"`
	ExtismOverWazero float64 `json:"extism_over_wazero"`
	// SDKHostOverNative is host-extism-sdk ÷ host: how many times cheaper
	// the native call path is than the host's go-sdk one.
	SDKHostOverNative float64 `json:"sdk_host_over_native"`
	// ExtismOverHost is go-sdk bare ÷ the native host (1/HostOverExtism).
	ExtismOverHost float64 `json:"extism_over_host"`
	// Start is a whole Executor.Start of StartPlugin's tool through the
	// host on the native call path (encode, call, decode, validation); nil
	// with --starts 0.
	Start *callFigure `json:"executor_start,omitempty"`
	// Starts is every start plugin on every call path, in the order of
	// --start-plugins, native first; StartSDKOverNative is, by plugin,
	// its extism-sdk ns/op ÷ its native one.
	Starts             []startFigure      `json:"executor_starts,omitempty"`
	StartSDKOverNative map[string]float64 `json:"executor_start_sdk_over_native,omitempty"`
	Load               loadFigure         `json:"load"`
}

func newBenchPluginCmd(bf *benchFlags) *cobra.Command {
	p := benchPluginParams{CallPlugin: benchCallPlugin, LoadPlugin: benchLoadPlugin}
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Per-call cost of the host's native and go-sdk call paths against raw wazero and bare go-sdk, Executor.Start on both, cold and cached loads against raw wazero",
		Long: `plugin measures, in one process:

  - one call of the conformance executor's no-op export "empty" four ways:
    a raw wazero call (the floor), a bare extism go-sdk call ("extism"),
    and the host's call path (pool, scope, timeout, classification;
    Plugin.CallRaw) on each of its two implementations: "host", the native
    one (host.CallPathNative, the default: the Extism ABI in Go, one Wasm
    entry a call), and "host-extism-sdk", the host on extism go-sdk
    (host.CallPathSDK, config plugin_call_path: extism-sdk). The four are
    interleaved in --rounds rounds of --calls calls each, after --warmup
    calls, and the median round is reported, since a shared machine is
    noisy. allocs/op and B/op are the Go heap's, from runtime.MemStats
    around each round;
  - a whole Executor.Start of the "calculate" tool of each --start-plugins
    plugin (default: the Go calculator and the C one) through the host on
    both call paths, in the same rounds (--starts calls a round);
  - host.New plus Load of --load-plugin (default: the Go calculator) on
    the native path: with a fresh, empty compilation cache each time
    (--uncached, the cold load), and with the warm on-disk --cache-dir
    (the cached load), against a wazero
    baseline in the same rounds: the file read, a compilation cache opened
    on the same warm directory, a bare wazero runtime's CompileModule,
    instantiate and _initialize; and a second Load of the file into the
    host of each cached load (its compiled code shared); the median of
    --loads each. The target of the cached load is under 50 ms; the
    baseline shows what wazero itself takes for the same file, which no
    host on wazero can load faster (docs/BENCHMARKS.md, "Plugin load").

The ratios report the native path's targets: its empty call at least 10×
cheaper than a bare go-sdk call, at most 3 µs and 1 KB of Go heap; the C
calculator's Executor.Start at least 8× cheaper than on the go-sdk path.

The C calculator is built by ` + "`make plugins-c`" + ` (clang, lld, wasi-libc) into
build/plugins/calculator-c.wasm; without it the bench stops and says so.
Leave it out with --start-plugins calculator, or skip every Start with
--starts 0.`,
		Example: `  make plugins plugins-c build
  bin/agenthost bench plugin
  bin/agenthost bench plugin --calls 100000 --rounds 9 --json
  bin/agenthost bench plugin --start-plugins calculator   # no C toolchain
  bin/agenthost bench plugin --starts 0 --load-plugin calculator-c`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.Calls < 1 || p.Rounds < 1 || p.Loads < 1 || p.Warmup < 0 || p.Starts < 0 {
				return fmt.Errorf("bench plugin: --calls, --rounds and --loads must be at least 1, --warmup and --starts at least 0")
			}
			if p.Starts > 0 {
				if len(p.StartPlugins) == 0 {
					return fmt.Errorf("bench plugin: --start-plugins is empty: name at least one plugin, or skip the Starts with --starts 0")
				}
				for i, n := range p.StartPlugins {
					if n == "" || slices.Contains(p.StartPlugins[:i], n) {
						return fmt.Errorf("bench plugin: --start-plugins %q: want distinct plugin names", strings.Join(p.StartPlugins, ","))
					}
				}
				p.StartPlugin = p.StartPlugins[0]
			} else {
				p.StartPlugins = nil
			}
			return benchPlugin(cmd, bf, p)
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.Calls, "calls", 20000, "timed calls of each path in each round")
	f.IntVar(&p.Warmup, "warmup", 1000, "untimed calls of each path before each round's timed ones")
	f.IntVar(&p.Starts, "starts", 2000, "timed Executor.Start calls of each plugin on each call path in each round (0: skip)")
	f.StringSliceVar(&p.StartPlugins, "start-plugins", benchStartPlugins,
		"the plugins under --plugins whose tool \"calculate\" is started (calculator-c: make plugins-c)")
	f.IntVar(&p.Rounds, "rounds", 5, "rounds; each path reports its median round")
	f.IntVar(&p.Loads, "loads", 3, "cold loads of each kind; each reports its median")
	f.BoolVar(&p.Uncached, "uncached", true, "also time loads with an empty compilation cache (a full compile each)")
	f.StringVar(&p.LoadPlugin, "load-plugin", benchLoadPlugin,
		"the executor plugin whose loads are timed: a name under --plugins (calculator, the Go one; calculator-c: make plugins-c; calculator-as: make plugins-as) or the path of a .wasm file")
	return cmd
}

func benchPlugin(cmd *cobra.Command, bf *benchFlags, p benchPluginParams) error {
	ctx := benchContext(cmd)
	started := time.Now()
	names := []string{p.CallPlugin}
	if !strings.HasSuffix(p.LoadPlugin, ".wasm") {
		names = append(names, p.LoadPlugin)
	}
	paths, err := bf.pluginPaths(names...)
	if err != nil {
		return err
	}
	if len(names) == 1 {
		// A file of the user's own: the floor of a Go guest, say
		// (docs/BENCHMARKS.md, "Loading a plugin, cold and cached").
		if paths[p.LoadPlugin], err = filepath.Abs(p.LoadPlugin); err != nil {
			return fmt.Errorf("bench plugin: --load-plugin %s: %w", p.LoadPlugin, err)
		}
	}
	if err := startPluginPaths(bf, p.StartPlugins, paths); err != nil {
		return err
	}
	work, cleanup, err := bf.tempDir("plugin")
	if err != nil {
		return err
	}
	defer cleanup()
	cache, err := bf.cachePath()
	if err != nil {
		return err
	}
	if cache == "" {
		// No shared cache: the warm paths get one of their own, filled by
		// their first load.
		cache = work + "/cache"
	}
	p.CacheDir = cache

	var res benchPluginResult
	if err := benchPluginCalls(ctx, cmd, bf, p, paths, &res); err != nil {
		return err
	}
	if err := benchPluginLoads(ctx, cmd, bf, p, paths[p.LoadPlugin], work, &res); err != nil {
		return err
	}
	return bf.emit(cmd.OutOrStdout(), benchOutput{Bench: "plugin", Started: started, Machine: bf.thisMachine(), Params: p, Result: res},
		benchPluginTables(p, res)...)
}

// startPluginPaths adds the start plugins' paths to paths, or says how
// to build the missing ones (the C calculator has a make target of its
// own) and how to leave them out.
func startPluginPaths(bf *benchFlags, names []string, paths map[string]string) error {
	var missing []string
	for _, n := range names {
		p, err := filepath.Abs(plugincatalog.Path(bf.plugins, n))
		if err == nil {
			_, err = os.Stat(p)
		}
		if err == nil {
			paths[n] = p
			continue
		}
		build := "build it with `make plugins`, or point --plugins at the directory that holds it"
		if n == plugincatalog.CalculatorC {
			build = "build it with `make plugins-c` (clang, lld, wasi-libc)"
		}
		leaveOut := "--starts 0"
		if others := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == n }); len(others) > 0 {
			leaveOut = "--start-plugins " + strings.Join(others, ",")
		}
		missing = append(missing, fmt.Sprintf("bench plugin: start plugin %s: %v: %s, or leave it out with %s", n, err, build, leaveOut))
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "\n"))
	}
	return nil
}

// callPath is one way of calling; call runs it n times.
type callPath struct {
	name string
	call func(n int) error
}

// startKey is the name of the samples of plugin's Executor.Start on the
// host named path.
func startKey(plugin, path string) string { return "start " + plugin + " " + path }

// benchPluginCalls times the call paths, interleaved in rounds.
func benchPluginCalls(ctx context.Context, cmd *cobra.Command, bf *benchFlags, p benchPluginParams, paths map[string]string, res *benchPluginResult) error {
	wasm, err := os.ReadFile(paths[p.CallPlugin])
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	hosts := map[host.CallPath]*host.Host{}
	for _, cp := range benchCallPaths {
		h, err := host.New(host.Config{CacheDir: p.CacheDir, CallPath: cp})
		if err != nil {
			return fmt.Errorf("bench plugin: %s: %w", hostPathName(cp), err)
		}
		defer h.Close(context.WithoutCancel(ctx))
		hosts[cp] = h
	}
	bf.progressf(cmd, "loading %s four ways (raw wazero, extism go-sdk, host on each call path)", p.CallPlugin)

	// The baselines compile through a compilation cache of their own on
	// the hosts' directory, as host.New opens it, so they find the hosts'
	// cache entries; they run under the hosts' RuntimeConfig by
	// construction (wasmengine).
	cache := wazero.NewCompilationCache()
	if p.CacheDir != "" {
		if cache, err = wazero.NewCompilationCacheWithDir(p.CacheDir); err != nil {
			return fmt.Errorf("bench plugin: compilation cache %s: %w (set a writable --cache-dir)", p.CacheDir, err)
		}
	}
	defer cache.Close(context.WithoutCancel(ctx))
	mod, closeRT, err := wasmengine.WazeroBaseline(ctx, cache, wasm)
	if err != nil {
		return fmt.Errorf("bench plugin: %s: %w", paths[p.CallPlugin], err)
	}
	defer closeRT(context.WithoutCancel(ctx))
	empty := mod.ExportedFunction("empty")
	if empty == nil {
		return fmt.Errorf("bench plugin: %s exports no \"empty\": rebuild the plugins with `make plugins`", paths[p.CallPlugin])
	}

	// "empty" calls no host function: stubs of the plugin's imports stand
	// in for the host's.
	stubs, err := wasmengine.StubHostFunctions(ctx, cache, wasm)
	if err != nil {
		return fmt.Errorf("bench plugin: %s: %w", paths[p.CallPlugin], err)
	}
	compiled, err := wasmengine.ExtismBaseline(ctx, cache, wasm, uint64(host.DefaultCallTimeout.Milliseconds()), stubs)
	if err != nil {
		return fmt.Errorf("bench plugin: %s: %w", paths[p.CallPlugin], err)
	}
	defer compiled.Close(context.WithoutCancel(ctx))
	inst, err := compiled.Instance(ctx, extism.PluginInstanceConfig{})
	if err != nil {
		return fmt.Errorf("bench plugin: extism instance: %w", err)
	}
	defer inst.Close(context.WithoutCancel(ctx))

	calls := []callPath{
		{"wazero", func(n int) error {
			for i := 0; i < n; i++ {
				if _, err := empty.Call(ctx); err != nil {
					return err
				}
			}
			return nil
		}},
		{"extism", func(n int) error {
			for i := 0; i < n; i++ {
				if rc, _, err := inst.Call("empty", nil); err != nil || rc != 0 {
					return fmt.Errorf("rc %d: %v", rc, err)
				}
			}
			return nil
		}},
	}
	// The host's paths in the order of res.Calls: native ("host"), then
	// extism-sdk.
	for _, cp := range benchCallPaths {
		plug, err := hosts[cp].Load(ctx, host.PluginSpec{Name: "executor", Path: paths[p.CallPlugin], Role: abi.RoleExecutor})
		if err != nil {
			return fmt.Errorf("bench plugin: %s: %w", hostPathName(cp), err)
		}
		calls = append(calls, callPath{hostPathName(cp), func(n int) error {
			for i := 0; i < n; i++ {
				if _, err := plug.CallRaw(ctx, benchTenant, "empty", nil); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	perRound := map[string]int{}
	for _, c := range calls {
		perRound[c.name] = p.Calls
	}
	for _, plugin := range p.StartPlugins {
		for _, cp := range benchCallPaths {
			start, err := benchStartPath(ctx, hosts[cp], plugin, paths[plugin], startKey(plugin, hostPathName(cp)))
			if err != nil {
				return fmt.Errorf("bench plugin: %s on %s: %w", plugin, hostPathName(cp), err)
			}
			calls = append(calls, start)
			perRound[start.name] = p.Starts
		}
	}
	// The first call of each path instantiates and runs the guest's
	// runtime init; it is not part of any figure.
	for _, c := range calls {
		if err := c.call(1); err != nil {
			return fmt.Errorf("bench plugin: %s: first call: %w", c.name, err)
		}
	}

	var done counter
	var total int64
	for _, c := range calls {
		total += int64(p.Rounds) * int64(perRound[c.name]+min(p.Warmup, perRound[c.name]))
	}
	m := bf.startMeter(cmd, "calls", total, done.get)
	defer m.Stop()
	samples := map[string][]callSample{}
	for r := 0; r < p.Rounds; r++ {
		for i := range calls {
			// Rotate the order so that no path always runs first.
			c := calls[(i+r)%len(calls)]
			n := perRound[c.name]
			warm := min(p.Warmup, n)
			if err := c.call(warm); err != nil {
				return fmt.Errorf("bench plugin: %s: %w", c.name, err)
			}
			done.Add(int64(warm))
			var before, after goruntime.MemStats
			goruntime.ReadMemStats(&before)
			t0 := time.Now()
			err := c.call(n)
			elapsed := time.Since(t0)
			goruntime.ReadMemStats(&after)
			if err != nil {
				return fmt.Errorf("bench plugin: %s: %w", c.name, err)
			}
			done.Add(int64(n))
			samples[c.name] = append(samples[c.name], callSample{
				ns:     float64(elapsed.Nanoseconds()) / float64(n),
				allocs: float64(after.Mallocs-before.Mallocs) / float64(n),
				bytes:  float64(after.TotalAlloc-before.TotalAlloc) / float64(n),
			})
		}
		bf.progressf(cmd, "round %d/%d: %s", r+1, p.Rounds, roundLine(calls, samples, r))
	}

	figure := func(name, path string) callFigure {
		ss := samples[name]
		f := callFigure{Path: path, Calls: perRound[name]}
		for _, s := range ss {
			f.RoundsNs = append(f.RoundsNs, s.ns)
		}
		// The median round by time, with its allocations.
		sorted := append([]callSample(nil), ss...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].ns < sorted[j].ns })
		med := sorted[len(sorted)/2]
		f.NsPerOp = median(f.RoundsNs)
		f.AllocsPerOp, f.BytesPerOp = med.allocs, med.bytes
		return f
	}
	for _, c := range calls[:2+len(benchCallPaths)] {
		res.Calls = append(res.Calls, figure(c.name, c.name))
	}
	w, e, ho, sdk := res.Calls[0].NsPerOp, res.Calls[1].NsPerOp, res.Calls[2].NsPerOp, res.Calls[3].NsPerOp
	res.HostOverExtism, res.HostOverWazero, res.ExtismOverWazero = ho/e, ho/w, e/w
	res.SDKHostOverNative, res.ExtismOverHost = sdk/ho, e/ho
	for _, plugin := range p.StartPlugins {
		var ns [2]float64
		for i, cp := range benchCallPaths {
			name := hostPathName(cp)
			f := startFigure{Plugin: plugin, CallPath: string(cp), callFigure: figure(startKey(plugin, name), name)}
			res.Starts = append(res.Starts, f)
			ns[i] = f.NsPerOp
			if plugin == p.StartPlugin && cp == host.CallPathNative {
				s := f.callFigure
				s.Path = "executor start"
				res.Start = &s
			}
		}
		if res.StartSDKOverNative == nil {
			res.StartSDKOverNative = map[string]float64{}
		}
		res.StartSDKOverNative[plugin] = ns[1] / ns[0]
	}
	return nil
}

// benchStartPath loads plugin (a calculator) as an executor on h and
// returns a path named name that runs a whole Executor.Start of its tool
// "calculate", checking every reply.
func benchStartPath(ctx context.Context, h *host.Host, plugin, path, name string) (callPath, error) {
	plug, err := h.Load(ctx, host.PluginSpec{Name: plugin, Path: path, Role: abi.RoleExecutor})
	if err != nil {
		return callPath{}, err
	}
	x, err := plug.Executor()
	if err != nil {
		return callPath{}, err
	}
	req, err := json.Marshal(abi.ToolRequest{Arguments: json.RawMessage(`{"expression":"(2+3)*4"}`)})
	if err != nil {
		return callPath{}, err
	}
	c := runtime.EffectCall{Tenant: benchTenant, Session: "s1", RunID: "run1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: "run1.t1.0", AssignmentKey: benchTenant + "/s1/run1.t1.0#1", Attempt: 1, Kind: abi.KindTool, Tool: "calculate", Request: req},
	}}
	return callPath{name, func(n int) error {
		for i := 0; i < n; i++ {
			r, err := x.Start(ctx, c)
			if err != nil {
				return err
			}
			if r.State != abi.StateDone {
				return fmt.Errorf("%s replied %q, not done: %+v", plugin, r.State, r.Error)
			}
		}
		return nil
	}}, nil
}

// benchPluginLoads times host.New plus Load of one plugin, uncached and
// cached, and the wazero baseline's load from the same warm cache,
// alternating.
func benchPluginLoads(ctx context.Context, cmd *cobra.Command, bf *benchFlags, p benchPluginParams, path, work string, res *benchPluginResult) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	res.Load = loadFigure{Plugin: p.LoadPlugin, WasmBytes: st.Size(), TargetCachedMS: targetCachedLoadMS}
	// baseline is the wazero baseline's load: the file read, a cache opened
	// on the warm directory as host.New opens it, compiled, instantiated
	// and initialised.
	baseline := func() (loadTime, error) {
		since := startLoadClock()
		wasm, err := os.ReadFile(path)
		if err != nil {
			return loadTime{}, err
		}
		cache, err := wazero.NewCompilationCacheWithDir(p.CacheDir)
		if err != nil {
			return loadTime{}, fmt.Errorf("compilation cache %s: %w (set a writable --cache-dir)", p.CacheDir, err)
		}
		defer cache.Close(context.WithoutCancel(ctx))
		_, closeRT, err := wasmengine.WazeroBaseline(ctx, cache, wasm)
		if err != nil {
			return loadTime{}, fmt.Errorf("%s: %w", path, err)
		}
		t := since()
		return t, closeRT(context.WithoutCancel(ctx))
	}
	// load is a host's load of the file; again, when not nil, gets the
	// time of a second load of the file into the same host.
	load := func(cacheDir string, again *loadTime) (loadTime, error) {
		since := startLoadClock()
		h, err := host.New(host.Config{CacheDir: cacheDir})
		if err != nil {
			return loadTime{}, err
		}
		defer h.Close(context.WithoutCancel(ctx))
		if _, err := h.Load(ctx, host.PluginSpec{Name: "load", Path: path, Role: abi.RoleExecutor}); err != nil {
			return loadTime{}, err
		}
		t := since()
		if again != nil {
			since = startLoadClock()
			if _, err := h.Load(ctx, host.PluginSpec{Name: "load-again", Path: path, Role: abi.RoleExecutor}); err != nil {
				return loadTime{}, err
			}
			*again = since()
		}
		return t, nil
	}
	// Fill the warm cache (it may be empty: a new --cache-dir), for the
	// host and for the baseline, whose module has its own cache entry.
	if _, err := load(p.CacheDir, nil); err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	if _, err := baseline(); err != nil {
		return fmt.Errorf("bench plugin: wazero baseline: %w", err)
	}
	l := &res.Load
	for i := 0; i < p.Loads; i++ {
		if p.Uncached {
			dir, err := os.MkdirTemp(work, "cold-cache-")
			if err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
			t, err := load(dir, nil)
			_ = os.RemoveAll(dir)
			if err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
			l.UncachedRunsMS = append(l.UncachedRunsMS, msf(t.wall))
			bf.progressf(cmd, "load %d/%d of %s, empty cache: %s ms", i+1, p.Loads, p.LoadPlugin, ms(t.wall))
		}
		var again loadTime
		t, err := load(p.CacheDir, &again)
		if err != nil {
			return fmt.Errorf("bench plugin: %w", err)
		}
		l.CachedRunsMS = append(l.CachedRunsMS, msf(t.wall))
		l.CachedCPURunsMS = append(l.CachedCPURunsMS, msf(t.cpu))
		l.LoadedRunsMS = append(l.LoadedRunsMS, msf(again.wall))
		l.LoadedCPURunsMS = append(l.LoadedCPURunsMS, msf(again.cpu))
		bf.progressf(cmd, "load %d/%d of %s, warm cache: %s ms (CPU %s ms); again in the same host: %s ms", i+1, p.Loads, p.LoadPlugin,
			ms(t.wall), ms(t.cpu), ms(again.wall))
		if t, err = baseline(); err != nil {
			return fmt.Errorf("bench plugin: wazero baseline: %w", err)
		}
		l.WazeroCachedRunsMS = append(l.WazeroCachedRunsMS, msf(t.wall))
		l.WazeroCachedCPURunsMS = append(l.WazeroCachedCPURunsMS, msf(t.cpu))
		bf.progressf(cmd, "load %d/%d of %s, wazero baseline, warm cache: %s ms (CPU %s ms)", i+1, p.Loads, p.LoadPlugin, ms(t.wall), ms(t.cpu))
	}
	l.CachedMS, l.CachedCPUMS = median(l.CachedRunsMS), median(l.CachedCPURunsMS)
	l.WazeroCachedMS, l.WazeroCachedCPUMS = median(l.WazeroCachedRunsMS), median(l.WazeroCachedCPURunsMS)
	l.LoadedMS, l.LoadedCPUMS = median(l.LoadedRunsMS), median(l.LoadedCPURunsMS)
	if l.WazeroCachedMS > 0 {
		l.CachedOverWazero = l.CachedMS / l.WazeroCachedMS
	}
	if l.WazeroCachedCPUMS > 0 {
		l.CachedCPUOverWazero = l.CachedCPUMS / l.WazeroCachedCPUMS
	}
	res.Load.CachedTargetMet = res.Load.CachedMS < targetCachedLoadMS
	if p.Uncached {
		res.Load.UncachedMS = median(res.Load.UncachedRunsMS)
		if res.Load.CachedMS > 0 {
			res.Load.UncachedOverCached = res.Load.UncachedMS / res.Load.CachedMS
		}
	}
	return nil
}

// loadTime is what one load took: wall time, and the process's CPU time
// (user and system, every thread).
type loadTime struct{ wall, cpu time.Duration }

// startLoadClock starts timing a load; the func it returns is the time
// since.
func startLoadClock() func() loadTime {
	t0, c0 := time.Now(), processCPU()
	return func() loadTime { return loadTime{wall: time.Since(t0), cpu: processCPU() - c0} }
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPluginTables renders the result.
func benchPluginTables(p benchPluginParams, res benchPluginResult) []table {
	roundsOf := func(v []float64) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprintf("%.0f", x)
		}
		return strings.Join(s, " ")
	}
	w := res.Calls[0].NsPerOp
	row := func(f callFigure, lead ...string) []string {
		return append(lead, f.Path, fmt.Sprintf("%.0f", f.NsPerOp), fmt.Sprintf("%.1f", f.AllocsPerOp), fmt.Sprintf("%.0f", f.BytesPerOp),
			fmt.Sprintf("%.1f", f.NsPerOp/w), roundsOf(f.RoundsNs))
	}
	calls := table{
		Title:  fmt.Sprintf("One call of %s's no-op export \"empty\" (median of %d rounds of %d calls)", p.CallPlugin, p.Rounds, p.Calls),
		Header: []string{"path", "ns/op", "allocs/op", "B/op", "× wazero", "rounds ns/op"},
	}
	// From the floor up: wazero, extism, host-extism-sdk, host.
	for _, i := range []int{0, 1, 3, 2} {
		calls.Rows = append(calls.Rows, row(res.Calls[i]))
	}
	calls.Notes = []string{
		fmt.Sprintf("host/extism %.2f, host/wazero %.1f, extism/wazero %.1f; host-extism-sdk/host %.1f, extism/host %.1f",
			res.HostOverExtism, res.HostOverWazero, res.ExtismOverWazero, res.SDKHostOverNative, res.ExtismOverHost),
		"wazero: a raw exported-function call; extism: a bare go-sdk CompiledPlugin instance .Call; host: Plugin.CallRaw (pool, scope,",
		"timeout, classification) on the native call path (the default); host-extism-sdk: the same on the go-sdk path (plugin_call_path: extism-sdk)",
	}
	tables := []table{calls}
	if len(res.Starts) > 0 {
		starts := table{
			Title:  fmt.Sprintf("A whole Executor.Start of the tool \"calculate\" (median of %d rounds of %d)", p.Rounds, p.Starts),
			Header: []string{"plugin", "path", "ns/op", "allocs/op", "B/op", "× wazero", "rounds ns/op"},
		}
		var ratios []string
		for _, f := range res.Starts {
			starts.Rows = append(starts.Rows, row(f.callFigure, f.Plugin))
		}
		for _, plugin := range p.StartPlugins {
			ratios = append(ratios, fmt.Sprintf("%s %.1f", plugin, res.StartSDKOverNative[plugin]))
		}
		starts.Notes = []string{
			"host-extism-sdk/host: " + strings.Join(ratios, ", "),
			"× wazero is against the raw wazero call of \"empty\" above",
		}
		tables = append(tables, starts)
	}
	tables = append(tables, targetsTable(res))
	l := res.Load
	loads := table{
		Title:  fmt.Sprintf("host.New + Load of %s on the native call path (%.1f MB; median of %d)", l.Plugin, float64(l.WasmBytes)/(1<<20), p.Loads),
		Header: []string{"load", "compilation cache", "ms", "× wazero", "CPU ms", "CPU × wazero", "runs ms"},
	}
	runs := func(v []float64) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprintf("%.1f", x)
		}
		return strings.Join(s, " ")
	}
	overWazero := func(v float64) string { return fmt.Sprintf("%.2f", v/l.WazeroCachedMS) }
	loads.Rows = append(loads.Rows, []string{"wazero baseline", "warm on disk", fmt.Sprintf("%.1f", l.WazeroCachedMS), "1",
		fmt.Sprintf("%.1f", l.WazeroCachedCPUMS), "1", runs(l.WazeroCachedRunsMS)})
	if p.Uncached {
		loads.Rows = append(loads.Rows, []string{"host (cold)", "empty (full compile)", fmt.Sprintf("%.1f", l.UncachedMS), overWazero(l.UncachedMS), "", "", runs(l.UncachedRunsMS)})
	}
	loads.Rows = append(loads.Rows, []string{"host (cached)", "warm on disk", fmt.Sprintf("%.1f", l.CachedMS), overWazero(l.CachedMS),
		fmt.Sprintf("%.1f", l.CachedCPUMS), fmt.Sprintf("%.2f", l.CachedCPUOverWazero), runs(l.CachedRunsMS)})
	loads.Rows = append(loads.Rows, []string{"host, the file loaded already", "(shared code)", fmt.Sprintf("%.1f", l.LoadedMS), overWazero(l.LoadedMS),
		fmt.Sprintf("%.1f", l.LoadedCPUMS), fmt.Sprintf("%.2f", l.LoadedCPUMS/l.WazeroCachedCPUMS), runs(l.LoadedRunsMS)})
	met := "met"
	if !l.CachedTargetMet {
		met = "NOT met"
	}
	loads.Notes = []string{
		fmt.Sprintf("cached host/wazero %.2f (CPU %.2f); the target of a cached load, < %.0f ms: %s", l.CachedOverWazero, l.CachedCPUOverWazero, l.TargetCachedMS, met),
		"CPU ms: the process's CPU time (user and system) over the load, steadier than the wall time on a shared machine",
		"the file loaded already: a second Load of the file, under another name, into the host of a cached load (a reload beside the old version of an unchanged file)",
		"wazero baseline: the file read, a compilation cache opened on the same warm directory, a bare runtime's CompileModule, instantiate, _initialize",
	}
	if p.Uncached {
		loads.Notes = append(loads.Notes, fmt.Sprintf("uncached/cached %.1f", l.UncachedOverCached))
	}
	return append(tables, loads)
}

// targetsTable is the native call path's figures against its targets,
// each against the baseline measured in the same rounds.
func targetsTable(res benchPluginResult) table {
	t := table{
		Title:  "The native call path's targets (same rounds)",
		Header: []string{"figure", "measured", "target", "met"},
	}
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	native := res.Calls[2]
	t.Rows = append(t.Rows,
		[]string{"empty call: extism (go-sdk bare) ÷ host", fmt.Sprintf("%.1f×", res.ExtismOverHost), fmt.Sprintf("≥ %d×", targetEmptyExtismOverHost),
			met(res.ExtismOverHost >= targetEmptyExtismOverHost)},
		[]string{"empty call: host ns/op", fmt.Sprintf("%.2f µs", native.NsPerOp/1000), fmt.Sprintf("≤ %d µs", targetEmptyNs/1000),
			met(native.NsPerOp <= targetEmptyNs)},
		[]string{"empty call: host B/op", fmt.Sprintf("%.0f B", native.BytesPerOp), fmt.Sprintf("≤ %d B", targetEmptyBytes),
			met(native.BytesPerOp <= targetEmptyBytes)},
	)
	if r, ok := res.StartSDKOverNative[plugincatalog.CalculatorC]; ok {
		t.Rows = append(t.Rows, []string{"calculator-c Executor.Start: host-extism-sdk ÷ host", fmt.Sprintf("%.1f×", r),
			fmt.Sprintf("≥ %d×", targetCStartSDKOverNative), met(r >= targetCStartSDKOverNative)})
	} else {
		t.Notes = append(t.Notes, "calculator-c was not started (--start-plugins, --starts 0): its target is not measured")
	}
	return t
}

// callSample is one round of one call path, per call.
type callSample struct {
	ns, allocs, bytes float64
}

// roundLine is round r's figures, for the progress line.
func roundLine(calls []callPath, samples map[string][]callSample, r int) string {
	s := ""
	for i, c := range calls {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %.0f ns/op", c.name, samples[c.name][r].ns)
	}
	return s
}

// median of a non-empty slice (the mean of the middle two for an even
// length); it does not reorder v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

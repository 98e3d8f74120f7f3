package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	goruntime "runtime"
	"sort"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/hostlink"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The plugins bench plugin loads, under --plugins.
const (
	benchCallPlugin  = plugincatalog.ConformanceDir + plugincatalog.Executor // exports "empty", a no-op
	benchStartPlugin = plugincatalog.Calculator                              // the tool "calculate"
	benchLoadPlugin  = plugincatalog.Calculator
)

// benchPluginParams are the parameters of a bench plugin run.
type benchPluginParams struct {
	Calls       int    `json:"calls"`
	Warmup      int    `json:"warmup"`
	Starts      int    `json:"starts"`
	Rounds      int    `json:"rounds"`
	Loads       int    `json:"loads"`
	Uncached    bool   `json:"uncached"`
	CallPlugin  string `json:"call_plugin"`
	StartPlugin string `json:"start_plugin"`
	LoadPlugin  string `json:"load_plugin"`
	CacheDir    string `json:"cache_dir"`
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

// loadFigure is the cost of host.New plus Load of one plugin: with a fresh,
// empty compilation cache each time, and with the warm on-disk one.
type loadFigure struct {
	Plugin         string    `json:"plugin"`
	WasmBytes      int64     `json:"wasm_bytes"`
	UncachedMS     float64   `json:"uncached_ms,omitempty"`
	UncachedRunsMS []float64 `json:"uncached_runs_ms,omitempty"`
	CachedMS       float64   `json:"cached_ms"`
	CachedRunsMS   []float64 `json:"cached_runs_ms"`
	// UncachedOverCached is 0 when the uncached loads were skipped.
	UncachedOverCached float64 `json:"uncached_over_cached,omitempty"`
}

// benchPluginResult is the result of a bench plugin run.
type benchPluginResult struct {
	// Calls are the empty export's paths: wazero, extism, host.
	Calls            []callFigure `json:"calls"`
	HostOverExtism   float64      `json:"host_over_extism"`
	HostOverWazero   float64      `json:"host_over_wazero"`
	ExtismOverWazero float64      `json:"extism_over_wazero"`
	// Start is a whole Executor.Start of the calculator's tool through the
	// host (encode, call, decode, validation); nil with --starts 0.
	Start *callFigure `json:"executor_start,omitempty"`
	Load  loadFigure  `json:"load"`
}

func newBenchPluginCmd(bf *benchFlags) *cobra.Command {
	p := benchPluginParams{CallPlugin: benchCallPlugin, StartPlugin: benchStartPlugin, LoadPlugin: benchLoadPlugin}
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Per-call overhead of the host against raw wazero and the extism go-sdk, Executor.Start, cold load",
		Long: `plugin measures, in one process:

  - one call of the conformance executor's no-op export "empty" three ways:
    a raw wazero call (the floor), a direct extism go-sdk call, and the
    host's call path (pool, scope, timeout, classification; Plugin.CallRaw).
    The three are interleaved in --rounds rounds of --calls calls each,
    after --warmup calls, and the median round is reported, since a shared
    machine is noisy. allocs/op and B/op are the Go heap's, from
    runtime.MemStats around each round;
  - a whole Executor.Start of the calculator's "calculate" tool through the
    host, in the same rounds (--starts calls a round);
  - host.New plus Load of the calculator: with a fresh, empty compilation
    cache each time (--uncached), and with the warm on-disk --cache-dir;
    the median of --loads each.`,
		Example: `  make plugins build
  bin/agenthost bench plugin
  bin/agenthost bench plugin --calls 100000 --rounds 9 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.Calls < 1 || p.Rounds < 1 || p.Loads < 1 || p.Warmup < 0 || p.Starts < 0 {
				return fmt.Errorf("bench plugin: --calls, --rounds and --loads must be at least 1, --warmup and --starts at least 0")
			}
			return benchPlugin(cmd, bf, p)
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.Calls, "calls", 20000, "timed calls of each path in each round")
	f.IntVar(&p.Warmup, "warmup", 1000, "untimed calls of each path before each round's timed ones")
	f.IntVar(&p.Starts, "starts", 2000, "timed Executor.Start calls in each round (0: skip)")
	f.IntVar(&p.Rounds, "rounds", 5, "rounds; each path reports its median round")
	f.IntVar(&p.Loads, "loads", 3, "cold loads of each kind; each reports its median")
	f.BoolVar(&p.Uncached, "uncached", true, "also time loads with an empty compilation cache (a full compile each)")
	return cmd
}

func benchPlugin(cmd *cobra.Command, bf *benchFlags, p benchPluginParams) error {
	ctx := benchContext(cmd)
	started := time.Now()
	names := []string{p.CallPlugin, p.StartPlugin}
	if p.LoadPlugin != p.StartPlugin {
		names = append(names, p.LoadPlugin)
	}
	paths, err := bf.pluginPaths(names...)
	if err != nil {
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

// callPath is one way of calling; call runs it n times.
type callPath struct {
	name string
	call func(n int) error
}

// benchPluginCalls times the call paths, interleaved in rounds.
func benchPluginCalls(ctx context.Context, cmd *cobra.Command, bf *benchFlags, p benchPluginParams, paths map[string]string, res *benchPluginResult) error {
	wasm, err := os.ReadFile(paths[p.CallPlugin])
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	h, err := host.New(host.Config{CacheDir: p.CacheDir})
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	defer h.Close(context.WithoutCancel(ctx))
	bf.progressf(cmd, "loading %s three ways (raw wazero, extism go-sdk, host)", p.CallPlugin)

	mod, closeRT, err := hostlink.WazeroBaseline(ctx, h, wasm)
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	defer closeRT(context.WithoutCancel(ctx))
	empty := mod.ExportedFunction("empty")
	if empty == nil {
		return fmt.Errorf("bench plugin: %s exports no \"empty\": rebuild the plugins with `make plugins`", paths[p.CallPlugin])
	}

	compiled, err := hostlink.ExtismBaseline(ctx, h, wasm, uint64(host.DefaultCallTimeout.Milliseconds()))
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	defer compiled.Close(context.WithoutCancel(ctx))
	inst, err := compiled.Instance(ctx, extism.PluginInstanceConfig{})
	if err != nil {
		return fmt.Errorf("bench plugin: extism instance: %w", err)
	}
	defer inst.Close(context.WithoutCancel(ctx))

	plug, err := h.Load(ctx, host.PluginSpec{Name: "executor", Path: paths[p.CallPlugin], Role: abi.RoleExecutor})
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}

	var done counter
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
		{"host", func(n int) error {
			for i := 0; i < n; i++ {
				if _, err := plug.CallRaw(ctx, benchTenant, "empty", nil); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	perRound := map[string]int{}
	for _, c := range calls {
		perRound[c.name] = p.Calls
	}
	if p.Starts > 0 {
		start, err := benchStartPath(ctx, h, paths[p.StartPlugin])
		if err != nil {
			return err
		}
		calls = append(calls, start)
		perRound[start.name] = p.Starts
	}
	// The first call of each path instantiates and runs the guest's
	// runtime init; it is not part of any figure.
	for _, c := range calls {
		if err := c.call(1); err != nil {
			return fmt.Errorf("bench plugin: %s: first call: %w", c.name, err)
		}
	}

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

	figure := func(name string) callFigure {
		ss := samples[name]
		f := callFigure{Path: name, Calls: perRound[name]}
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
	res.Calls = []callFigure{figure("wazero"), figure("extism"), figure("host")}
	w, e, ho := res.Calls[0].NsPerOp, res.Calls[1].NsPerOp, res.Calls[2].NsPerOp
	res.HostOverExtism, res.HostOverWazero, res.ExtismOverWazero = ho/e, ho/w, e/w
	if p.Starts > 0 {
		s := figure("executor start")
		res.Start = &s
	}
	return nil
}

// benchStartPath loads the calculator as an executor and returns a path
// that runs a whole Executor.Start of its tool, checking every reply.
func benchStartPath(ctx context.Context, h *host.Host, path string) (callPath, error) {
	plug, err := h.Load(ctx, host.PluginSpec{Name: plugincatalog.Calculator, Path: path, Role: abi.RoleExecutor})
	if err != nil {
		return callPath{}, fmt.Errorf("bench plugin: %w", err)
	}
	x, err := plug.Executor()
	if err != nil {
		return callPath{}, fmt.Errorf("bench plugin: %w", err)
	}
	req, err := json.Marshal(abi.ToolRequest{Arguments: json.RawMessage(`{"expression":"(2+3)*4"}`)})
	if err != nil {
		return callPath{}, err
	}
	c := runtime.EffectCall{Tenant: benchTenant, Session: "s1", RunID: "run1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: "run1.t1.0", AssignmentKey: benchTenant + "/s1/run1.t1.0#1", Attempt: 1, Kind: abi.KindTool, Tool: "calculate", Request: req},
	}}
	return callPath{"executor start", func(n int) error {
		for i := 0; i < n; i++ {
			r, err := x.Start(ctx, c)
			if err != nil {
				return err
			}
			if r.State != abi.StateDone {
				return fmt.Errorf("the calculator replied %q, not done: %+v", r.State, r.Error)
			}
		}
		return nil
	}}, nil
}

// benchPluginLoads times host.New plus Load of one plugin, uncached and
// cached, alternating.
func benchPluginLoads(ctx context.Context, cmd *cobra.Command, bf *benchFlags, p benchPluginParams, path, work string, res *benchPluginResult) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	res.Load = loadFigure{Plugin: p.LoadPlugin, WasmBytes: st.Size()}
	load := func(cacheDir string) (time.Duration, error) {
		t0 := time.Now()
		h, err := host.New(host.Config{CacheDir: cacheDir})
		if err != nil {
			return 0, err
		}
		defer h.Close(context.WithoutCancel(ctx))
		if _, err := h.Load(ctx, host.PluginSpec{Name: "load", Path: path, Role: abi.RoleExecutor}); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	// Fill the warm cache (it may be empty: a new --cache-dir).
	if _, err := load(p.CacheDir); err != nil {
		return fmt.Errorf("bench plugin: %w", err)
	}
	for i := 0; i < p.Loads; i++ {
		if p.Uncached {
			dir, err := os.MkdirTemp(work, "cold-cache-")
			if err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
			d, err := load(dir)
			_ = os.RemoveAll(dir)
			if err != nil {
				return fmt.Errorf("bench plugin: %w", err)
			}
			res.Load.UncachedRunsMS = append(res.Load.UncachedRunsMS, msf(d))
			bf.progressf(cmd, "load %d/%d of %s, empty cache: %s ms", i+1, p.Loads, p.LoadPlugin, ms(d))
		}
		d, err := load(p.CacheDir)
		if err != nil {
			return fmt.Errorf("bench plugin: %w", err)
		}
		res.Load.CachedRunsMS = append(res.Load.CachedRunsMS, msf(d))
		bf.progressf(cmd, "load %d/%d of %s, warm cache: %s ms", i+1, p.Loads, p.LoadPlugin, ms(d))
	}
	res.Load.CachedMS = median(res.Load.CachedRunsMS)
	if p.Uncached {
		res.Load.UncachedMS = median(res.Load.UncachedRunsMS)
		if res.Load.CachedMS > 0 {
			res.Load.UncachedOverCached = res.Load.UncachedMS / res.Load.CachedMS
		}
	}
	return nil
}

// benchPluginTables renders the result.
func benchPluginTables(p benchPluginParams, res benchPluginResult) []table {
	calls := table{
		Title:  fmt.Sprintf("One call of %s's no-op export \"empty\" (median of %d rounds of %d calls)", p.CallPlugin, p.Rounds, p.Calls),
		Header: []string{"path", "ns/op", "allocs/op", "B/op", "× wazero", "rounds ns/op"},
	}
	row := func(f callFigure, base float64) []string {
		rounds := ""
		for i, v := range f.RoundsNs {
			if i > 0 {
				rounds += " "
			}
			rounds += fmt.Sprintf("%.0f", v)
		}
		return []string{f.Path, fmt.Sprintf("%.0f", f.NsPerOp), fmt.Sprintf("%.1f", f.AllocsPerOp), fmt.Sprintf("%.0f", f.BytesPerOp),
			fmt.Sprintf("%.1f", f.NsPerOp/base), rounds}
	}
	w := res.Calls[0].NsPerOp
	for _, f := range res.Calls {
		calls.Rows = append(calls.Rows, row(f, w))
	}
	calls.Notes = []string{
		fmt.Sprintf("host/extism %.2f, host/wazero %.1f, extism/wazero %.1f", res.HostOverExtism, res.HostOverWazero, res.ExtismOverWazero),
		"wazero: a raw exported-function call; extism: CompiledPlugin instance .Call; host: Plugin.CallRaw (pool, scope, timeout, classification)",
	}
	tables := []table{calls}
	if res.Start != nil {
		tables = append(tables, table{
			Title:  fmt.Sprintf("A whole Executor.Start of %s's tool \"calculate\" (median of %d rounds of %d)", p.StartPlugin, p.Rounds, p.Starts),
			Header: []string{"path", "ns/op", "allocs/op", "B/op", "× host empty call"},
			Rows: [][]string{{res.Start.Path, fmt.Sprintf("%.0f", res.Start.NsPerOp), fmt.Sprintf("%.1f", res.Start.AllocsPerOp),
				fmt.Sprintf("%.0f", res.Start.BytesPerOp), fmt.Sprintf("%.1f", res.Start.NsPerOp/res.Calls[2].NsPerOp)}},
		})
	}
	l := res.Load
	loads := table{
		Title:  fmt.Sprintf("host.New + Load of %s (%.1f MB; median of %d)", l.Plugin, float64(l.WasmBytes)/(1<<20), p.Loads),
		Header: []string{"compilation cache", "ms", "runs ms"},
	}
	runs := func(v []float64) string {
		s := ""
		for i, x := range v {
			if i > 0 {
				s += " "
			}
			s += fmt.Sprintf("%.1f", x)
		}
		return s
	}
	if p.Uncached {
		loads.Rows = append(loads.Rows, []string{"empty (full compile)", fmt.Sprintf("%.1f", l.UncachedMS), runs(l.UncachedRunsMS)})
	}
	loads.Rows = append(loads.Rows, []string{"warm on disk", fmt.Sprintf("%.1f", l.CachedMS), runs(l.CachedRunsMS)})
	if p.Uncached {
		loads.Notes = []string{fmt.Sprintf("uncached/cached %.1f", l.UncachedOverCached)}
	}
	return append(tables, loads)
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

// Package bench is `agenthost bench`: it measures the real binary end to
// end, each figure against a baseline measured in the same run (Runs
// through the runtime and through the HTTP API against bare Badger, or
// bare PostgreSQL for pgstore, recovery after kill -9, plugin calls
// against raw wazero and the extism go-sdk), and is the command of the
// chaos harness (internal/chaos), `bench chaos`, which kills and pauses
// serving child processes under load and checks docs/DESIGN.md §9's
// invariants afterwards.
// NewCommand is its cobra command, which package main adds to the CLI.
package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/plugincatalog"
)

// benchFlags are the flags every `agenthost bench` command shares, and
// the version of the binary the benches report.
type benchFlags struct {
	version  string
	json     bool
	quiet    bool
	plugins  string
	cacheDir string
	workDir  string
	bin      string
	cpuprof  string
	trace    string
	// stopProf stops what startProfile started, in reverse order.
	stopProf []func()
	progMu   sync.Mutex
	prog     *progressWriter
}

// NewCommand returns `agenthost bench` and its subcommands; version is
// the binary's, which every result reports.
func NewCommand(version string) *cobra.Command {
	bf := &benchFlags{version: version}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure agenthost end to end: Runs, HTTP, recovery, plugin calls, chaos",
		// An error is no misuse: the usage would only bury it, and after
		// --json it would corrupt the JSON on stdout.
		SilenceUsage: true,
		Long: `bench measures the real binary's figures, each against a baseline measured in
the same run (bare Badger or PostgreSQL, raw wazero, the extism go-sdk), and
prints a table (or JSON with --json). Progress goes to stderr.

The commands need the example and conformance plugins: build them first
with ` + "`make plugins`" + ` (into build/plugins), or point --plugins elsewhere.
Every command works in a fresh temporary directory (--work-dir) and removes
it at the end; none touches the config's data dir. With --store postgres,
runs and recovery start a throwaway PostgreSQL server (fsync on) and stop it,
or use the one --dsn names, in a schema of their own. docs/BENCHMARKS.md
gives the figures and the commands that produced them.`,
		Example: `  make plugins build
  bin/agenthost bench runs --runs 2000 --concurrency 1,16,256
  bin/agenthost bench http --runs 1000 --concurrency 32
  bin/agenthost bench recovery --runs 10000
  bin/agenthost bench runs --store postgres --concurrency 16
  bin/agenthost bench plugin
  bin/agenthost bench chaos --duration 10m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	pf := cmd.PersistentFlags()
	pf.BoolVar(&bf.json, "json", false, "print the result as JSON on stdout instead of a table")
	pf.BoolVarP(&bf.quiet, "quiet", "q", false, "print no progress on stderr")
	pf.StringVar(&bf.plugins, "plugins", "build/plugins", "the `DIR` that make plugins builds the plugins into")
	pf.StringVar(&bf.cacheDir, "cache-dir", ".cache/wazero", "the wazero compilation cache (\"\" for none: every plugin is compiled afresh)")
	pf.StringVar(&bf.workDir, "work-dir", "", "where the temporary stores go (default: the system's temp dir)")
	pf.StringVar(&bf.bin, "agenthost-bin", "", "the agenthost binary child processes run (default: this one)")
	_ = pf.MarkHidden("agenthost-bin")
	pf.StringVar(&bf.cpuprof, "cpuprofile", "", "write this process's CPU profile to `FILE` (go tool pprof FILE)")
	pf.StringVar(&bf.trace, "trace", "", "write this process's execution trace to `FILE` (go tool trace FILE; go tool trace -pprof=net FILE: where its goroutines waited on the network): where the bench waits, not only where it burns CPU")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error { return bf.startProfile() }
	cmd.PersistentPostRun = func(*cobra.Command, []string) { bf.stopProfile() }
	cmd.AddCommand(
		newBenchRunsCmd(bf),
		newBenchHTTPCmd(bf),
		newBenchRecoveryCmd(bf),
		newBenchRecoveryChildCmd(bf), // hidden: the process `bench recovery` kills
		newBenchPluginCmd(bf),
		newBenchChaosCmd(bf),
	)
	return cmd
}

// startProfile starts --cpuprofile and --trace, each to its file.
func (bf *benchFlags) startProfile() error {
	if bf.cpuprof != "" {
		f, err := os.Create(bf.cpuprof)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		bf.stopProf = append(bf.stopProf, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if bf.trace != "" {
		f, err := os.Create(bf.trace)
		if err != nil {
			bf.stopProfile()
			return fmt.Errorf("--trace: %w", err)
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			bf.stopProfile()
			return fmt.Errorf("--trace: %w", err)
		}
		bf.stopProf = append(bf.stopProf, func() { trace.Stop(); f.Close() })
	}
	return nil
}

// stopProfile stops what startProfile started, and writes it out.
func (bf *benchFlags) stopProfile() {
	for i := len(bf.stopProf) - 1; i >= 0; i-- {
		bf.stopProf[i]()
	}
	bf.stopProf = nil
}

// pluginPath returns the path of plugin name (e.g. "calculator" or
// "conformance/hostile") under --plugins, or an error that says how to
// build it.
func (bf *benchFlags) pluginPath(name string) (string, error) {
	p, err := filepath.Abs(filepath.Join(bf.plugins, name+".wasm"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		make := "`make plugins`"
		if strings.HasSuffix(name, "-c") {
			make = "`make plugins-c` (clang, lld, wasi-libc)"
		}
		return "", fmt.Errorf("bench: plugin %s: %w: build the plugins first with %s, or point --plugins at the directory that holds them", name, err, make)
	}
	return p, nil
}

// guestsFlag binds --guests, which build of the example plugins a bench
// loads through guestPaths, to v.
func guestsFlag(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVar(v, "guests", string(plugincatalog.DefaultGuests),
		"which `BUILD` of the example plugins to load: c (make plugins-c: the C builds, which make run loads, of the plugins that have one: prompt-builder, scripted-model, calculator, slow-job) or go (make plugins: the Go builds, same replies at several times the guest's CPU)")
}

// CheckGuests reports a --guests value that names no build.
func CheckGuests(g string) error {
	switch plugincatalog.Guests(g) {
	case plugincatalog.GuestsGo, plugincatalog.GuestsC:
		return nil
	}
	return fmt.Errorf("bench: --guests %q: want %s (the Go example plugins) or %s (their C builds)", g, plugincatalog.GuestsGo, plugincatalog.GuestsC)
}

// GuestsTitle names the build of the example plugins g loads ("" is
// plugincatalog.DefaultGuests), for a table's title.
func GuestsTitle(g string) string {
	if g == "" {
		g = string(plugincatalog.DefaultGuests)
	}
	if plugincatalog.Guests(g) == plugincatalog.GuestsC {
		return "C builds where there are"
	}
	return "Go builds"
}

// guestPaths is pluginPaths over the builds of the example plugins that g
// names (see CheckGuests; "" is plugincatalog.DefaultGuests), keyed by the
// names asked for.
func (bf *benchFlags) guestPaths(g string, names ...string) (map[string]string, error) {
	builds := make([]string, len(names))
	for i, n := range names {
		builds[i] = plugincatalog.Build(n, plugincatalog.Guests(g))
	}
	paths, err := bf.pluginPaths(builds...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for i, n := range names {
		out[n] = paths[builds[i]]
	}
	return out, nil
}

// pluginPaths resolves several plugins at once, reporting every missing one.
func (bf *benchFlags) pluginPaths(names ...string) (map[string]string, error) {
	out := map[string]string{}
	var missing []string
	for _, n := range names {
		p, err := bf.pluginPath(n)
		if err != nil {
			missing = append(missing, err.Error())
			continue
		}
		out[n] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(missing, "\n"))
	}
	return out, nil
}

// cachePath is the absolute --cache-dir, or "" for none.
func (bf *benchFlags) cachePath() (string, error) {
	if bf.cacheDir == "" {
		return "", nil
	}
	return filepath.Abs(bf.cacheDir)
}

// tempDir makes a fresh directory for one bench, under --work-dir; the
// returned func removes it.
func (bf *benchFlags) tempDir(name string) (string, func(), error) {
	if bf.workDir != "" {
		if err := os.MkdirAll(bf.workDir, 0o755); err != nil {
			return "", nil, fmt.Errorf("--work-dir: %w", err)
		}
	}
	dir, err := os.MkdirTemp(bf.workDir, "agenthost-bench-"+name+"-")
	if err != nil {
		return "", nil, fmt.Errorf("bench: temporary directory: %w (set --work-dir to a writable directory)", err)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// binary is the agenthost binary for child processes.
func (bf *benchFlags) binary() (string, error) {
	if bf.bin != "" {
		return filepath.Abs(bf.bin)
	}
	p, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("bench: finding this binary for the child processes: %w", err)
	}
	return p, nil
}

// writeConfig writes a config file into dir and loads it, so that a bench
// wires its system exactly as `run` and `serve` do.
func writeBenchConfig(dir, yaml string) (*config.Config, error) {
	path := filepath.Join(dir, "agenthost.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	return config.Load(path)
}

// progressf prints a line of progress on stderr (nothing with --quiet).
func (bf *benchFlags) progressf(cmd *cobra.Command, format string, args ...any) {
	if bf.quiet {
		return
	}
	bf.progress(cmd).printf("bench: "+format+"\n", args...)
}

// progressWriter serializes the progress lines of a bench's goroutines
// (its meters and its main line) on one writer.
type progressWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *progressWriter) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// progress returns the command's progress writer, made on first use.
func (bf *benchFlags) progress(cmd *cobra.Command) *progressWriter {
	bf.progMu.Lock()
	defer bf.progMu.Unlock()
	if bf.prog == nil {
		bf.prog = &progressWriter{w: cmd.ErrOrStderr()}
	}
	return bf.prog
}

// meter prints count's progress toward total once a second on stderr
// until stopped: "runs 1200/2000 (410/s)".
type meter struct {
	stop chan struct{}
	done sync.WaitGroup
}

func (bf *benchFlags) startMeter(cmd *cobra.Command, label string, total int64, count func() int64) *meter {
	m := &meter{stop: make(chan struct{})}
	if bf.quiet {
		return m
	}
	w := bf.progress(cmd)
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		start := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
				n := count()
				rate := float64(n) / time.Since(start).Seconds()
				if total > 0 {
					w.printf("bench: %s %d/%d (%.0f/s)\n", label, n, total, rate)
				} else {
					w.printf("bench: %s %d (%.0f/s)\n", label, n, rate)
				}
			}
		}
	}()
	return m
}

// Stop stops the meter; safe on a nil-free meter more than once.
func (m *meter) Stop() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.done.Wait()
}

// machine describes where a figure was measured.
type machine struct {
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	Version    string `json:"agenthost"`
}

func (bf *benchFlags) thisMachine() machine {
	return machine{OS: goruntime.GOOS, Arch: goruntime.GOARCH, CPUs: goruntime.NumCPU(),
		GOMAXPROCS: goruntime.GOMAXPROCS(0), Go: goruntime.Version(), Version: bf.version}
}

// table is a bench's human-readable result.
type table struct {
	Title  string
	Header []string
	Rows   [][]string
	Notes  []string
}

// benchOutput is the --json form of every bench: which bench, when, where,
// with what parameters, and its result.
type benchOutput struct {
	Bench   string    `json:"bench"`
	Started time.Time `json:"started"`
	Machine machine   `json:"machine"`
	Params  any       `json:"params"`
	Result  any       `json:"result"`
}

// emit prints a bench's result: JSON with --json, else the tables.
func (bf *benchFlags) emit(w io.Writer, out benchOutput, tables ...table) error {
	if bf.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	m := out.Machine
	fmt.Fprintf(w, "agenthost bench %s — %s/%s, %d CPUs (GOMAXPROCS %d), %s, %s\n",
		out.Bench, m.OS, m.Arch, m.CPUs, m.GOMAXPROCS, m.Go, out.Started.UTC().Format(time.RFC3339))
	for _, t := range tables {
		fmt.Fprintf(w, "\n%s\n", t.Title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		if len(t.Header) > 0 {
			fmt.Fprintln(tw, strings.Join(t.Header, "\t")+"\t")
		}
		for _, r := range t.Rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range t.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	return nil
}

// counter is an atomic count a meter can read.
type counter struct{ atomic.Int64 }

func (c *counter) get() int64 { return c.Load() }

// ms formats a duration in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// msf is a duration in milliseconds, for JSON.
func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

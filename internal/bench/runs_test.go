package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime/trace"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestBenchRunsAndHTTP runs `bench runs` and `bench http` small, and checks
// their JSON: every Run completed with 4 effects and 6 commits, and every
// figure measured (not zero, not invented).
func TestBenchRunsAndHTTP(t *testing.T) {
	t.Parallel()
	plugins := benchPluginsDir(t)
	for _, bench := range []string{"runs", "http"} {
		t.Run(bench, func(t *testing.T) {
			out, err := runBench(t, plugins, bench, "--runs", "12", "--concurrency", "1,4", "--rounds", "2", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Bench   string      `json:"bench"`
				Machine machine     `json:"machine"`
				Params  runsParams  `json:"params"`
				Result  []runsLevel `json:"result"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("--json printed something that is not JSON: %v\n%s", err, out)
			}
			if got.Bench != bench || got.Machine.CPUs < 1 || len(got.Result) != 2 {
				t.Fatalf("unexpected output: %+v", got)
			}
			for i, l := range got.Result {
				if want := []int{1, 4}[i]; l.Concurrency != want || l.Runs != 12 {
					t.Errorf("level %d: concurrency %d, %d Runs; want %d, 12", i, l.Concurrency, l.Runs, want)
				}
				// 2 model steps and 2 tool calls; CreateRun, then one
				// commit per advance: plan, dispatch 2 tools, 2 settles
				// (the second plans step 2), finish.
				if l.EffectsPerRun != 4 {
					t.Errorf("level %d: %.2f effects per Run, want 4 (plugin errors %d, effects not done %v)", i, l.EffectsPerRun, l.PluginErrors, l.FailedEffects)
				}
				if l.CommitsPerRun < 4 || l.CommitsPerRun > 8 {
					t.Errorf("level %d: %.2f commits per Run, want about 6", i, l.CommitsPerRun)
				}
				if l.RunsPerSec <= 0 || l.BareCommitsPerSec <= 0 || l.Ratio <= 0 || l.P50ms <= 0 || l.P99ms < l.P50ms {
					t.Errorf("level %d: figures missing or inconsistent: %+v", i, l)
				}
				if l.BuildMsPerRun <= 0 || l.ModelMsPerRun <= 0 || l.ToolMsPerRun <= 0 || l.CommitMsPerRun <= 0 {
					t.Errorf("level %d: the time split misses a part: %+v", i, l)
				}
				if l.CommitsPerTransaction < 1 {
					t.Errorf("level %d: %.2f Run writes a store transaction; want at least 1 (the store groups them)", i, l.CommitsPerTransaction)
				}
			}
		})
	}
	// Without --json, a table.
	out, err := runBench(t, plugins, "runs", "--runs", "2", "--concurrency", "2", "--rounds", "1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Runs/s") || !strings.Contains(out, "ratio") {
		t.Errorf("the table lacks its header:\n%s", out)
	}
}

// TestBenchMissingPlugins: a --plugins directory without the plugins is a
// clear error that says how to build them.
func TestBenchMissingPlugins(t *testing.T) {
	_, err := runBench(t, t.TempDir(), "runs", "--runs", "1")
	if err == nil || !strings.Contains(err.Error(), "make plugins") || !strings.Contains(err.Error(), "scripted-model") {
		t.Fatalf("err = %v, want one naming the missing plugin and `make plugins`", err)
	}
	_, err = runBench(t, t.TempDir(), "runs", "--concurrency", "0")
	if err == nil || !strings.Contains(err.Error(), "--concurrency") {
		t.Fatalf("err = %v, want one about --concurrency", err)
	}
}

// TestBenchTrace: --trace writes this process's execution trace of the
// bench to its file, and a file it cannot create is an error that names
// the flag, before anything is measured.
func TestBenchTrace(t *testing.T) {
	if trace.IsEnabled() {
		t.Skip("the test binary is writing an execution trace of its own (go test -trace): a process has one at a time")
	}
	plugins := benchPluginsDir(t)
	file := filepath.Join(t.TempDir(), "runs.trace")
	if _, err := runBench(t, plugins, "runs", "--runs", "2", "--concurrency", "1", "--rounds", "1", "--trace", file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil || !bytes.HasPrefix(b, []byte("go 1.")) || len(b) < 1000 {
		t.Fatalf("--trace %s: %d bytes starting %q, %v; want an execution trace of the bench", file, len(b), b[:min(len(b), 16)], err)
	}
	if trace.IsEnabled() {
		t.Fatal("the execution trace is still being written after the bench")
	}
	_, err = runBench(t, plugins, "runs", "--runs", "1", "--trace", filepath.Join(t.TempDir(), "missing", "runs.trace"))
	if err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Fatalf("err = %v, want one about --trace", err)
	}
}

// runsOutput is what `bench runs --json` prints.
type runsOutput struct {
	Bench   string      `json:"bench"`
	Machine machine     `json:"machine"`
	Params  runsParams  `json:"params"`
	Result  []runsLevel `json:"result"`
}

// TestBenchRunsOnPostgres runs `bench runs --store postgres` small: with
// the Wasm plugins and in process, on a database of the shared test
// server (--dsn), and checks the JSON as TestBenchRunsAndHTTP does, with
// bare PostgreSQL as the baseline.
func TestBenchRunsOnPostgres(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	plugins := benchPluginsDir(t)
	for _, mode := range []string{"wasm", "in-process"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"runs", "--store", "postgres", "--dsn", dsn, "--runs", "12", "--concurrency", "1,4", "--rounds", "2", "--json"}
			if mode == "in-process" {
				args = append(args, "--in-process")
			}
			out, err := runBench(t, plugins, args...)
			if err != nil {
				t.Fatal(err)
			}
			var got runsOutput
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("--json printed something that is not JSON: %v\n%s", err, out)
			}
			if got.Params.Store != "postgres" || got.Params.PostgreSQL == "" || got.Params.InProcess != (mode == "in-process") || len(got.Result) != 2 {
				t.Fatalf("unexpected output: %+v", got)
			}
			for i, l := range got.Result {
				if l.Runs != 12 || l.EffectsPerRun != 4 || l.CommitsPerRun < 4 || l.CommitsPerRun > 8 {
					t.Errorf("level %d: %d Runs, %.2f effects and %.2f commits per Run; want 12, 4 and about 6", i, l.Runs, l.EffectsPerRun, l.CommitsPerRun)
				}
				if l.RunsPerSec <= 0 || l.BareCommitsPerSec <= 0 || l.Ratio <= 0 || l.P50ms <= 0 || l.CommitMsPerRun <= 0 {
					t.Errorf("level %d: figures missing: %+v", i, l)
				}
				if l.CommitsPerTransaction < 1 {
					t.Errorf("level %d: %.2f Run writes a transaction; want at least 1 (pgstore groups them)", i, l.CommitsPerTransaction)
				}
			}
		})
	}
	// The bench's schemas on the server --dsn names are dropped.
	conn := pgConn(t, dsn)
	var left int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'agenthost_bench_%'").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d bench schemas left behind (%v)", left, err)
	}
}

// TestBenchRunsStartsItsOwnPostgres: without --dsn, `bench runs --store
// postgres` starts a throwaway server and reports the ratio against bare
// PostgreSQL in its table.
func TestBenchRunsStartsItsOwnPostgres(t *testing.T) {
	conformance.SkipInShort(t, "starting a PostgreSQL server")
	out, err := runBench(t, t.TempDir(), "runs", "--store", "postgres", "--in-process", "--runs", "4", "--concurrency", "2", "--rounds", "1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pgstore on PostgreSQL ", "a throwaway server on a Unix socket, fsync on", "in-process Go twins", "bare PostgreSQL commits/s", "ratio",
		"stmts/Run", "server CPU ms/Run", "PostgreSQL statements per Run, by statement", "FOR UPDATE"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchStoreFlags: the store flags are checked.
func TestBenchStoreFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"runs", "--store", "sqlite"}, `--store "sqlite": want badger or postgres`},
		{[]string{"runs", "--dsn", "host=/tmp"}, "--dsn is for --store postgres"},
		{[]string{"recovery", "--store", "sqlite"}, `--store "sqlite": want badger or postgres`},
	} {
		if _, err := runBench(t, t.TempDir(), tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: err = %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

// pgConn connects to dsn for a test's checks.
func pgConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestBenchRunsOnBothCallPaths runs `bench runs --plugin-call-path both`
// small: each concurrency has a level on native, then one on extism-sdk,
// every Run of both as the bench expects, and the native level carries
// the ratios of the two.
func TestBenchRunsOnBothCallPaths(t *testing.T) {
	t.Parallel()
	plugins := benchPluginsDir(t)
	out, err := runBench(t, plugins, "runs", "--runs", "4", "--concurrency", "1,2", "--rounds", "2", "--plugin-call-path", "both", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got runsOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json printed something that is not JSON: %v\n%s", err, out)
	}
	if got.Params.PluginCallPath != "both" || len(got.Result) != 4 {
		t.Fatalf("params %+v, %d levels: want plugin_call_path both and 4 levels", got.Params, len(got.Result))
	}
	for i, l := range got.Result {
		wantC, wantPath := []int{1, 1, 2, 2}[i], []string{"native", "extism-sdk"}[i%2]
		if l.Concurrency != wantC || l.PluginCallPath != wantPath || l.Runs != 4 || l.EffectsPerRun != 4 {
			t.Errorf("level %d: concurrency %d on %q, %d Runs, %.2f effects a Run; want %d on %q, 4 Runs, 4 effects",
				i, l.Concurrency, l.PluginCallPath, l.Runs, l.EffectsPerRun, wantC, wantPath)
		}
		if l.RunsPerSec <= 0 || l.BareCommitsPerSec <= 0 || l.pluginMsPerRun() <= 0 {
			t.Errorf("level %d: figures missing: %+v", i, l)
		}
		if i%2 == 1 {
			if l.RunsPerSecOverSDK != 0 || l.SDKPluginMsOverNative != 0 {
				t.Errorf("level %d, extism-sdk: ratios %+v, which are the native level's", i, l)
			}
			continue
		}
		sdk := got.Result[i+1]
		if want := l.RunsPerSec / sdk.RunsPerSec; math.Abs(l.RunsPerSecOverSDK-want) > 1e-9*want {
			t.Errorf("level %d: runs_per_sec_over_sdk %v, the figures give %v", i, l.RunsPerSecOverSDK, want)
		}
		if want := sdk.pluginMsPerRun() / l.pluginMsPerRun(); math.Abs(l.SDKPluginMsOverNative-want) > 1e-9*want {
			t.Errorf("level %d: sdk_plugin_ms_over_native %v, the figures give %v", i, l.SDKPluginMsOverNative, want)
		}
	}
	// The table has a path column and the comparison.
	out, err = runBench(t, plugins, "runs", "--runs", "2", "--concurrency", "1", "--rounds", "1", "--plugin-call-path", "both")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"extism-sdk", "The plugin call paths against each other", "native/sdk"} {
		if !strings.Contains(out, want) {
			t.Errorf("the tables lack %q:\n%s", want, out)
		}
	}
}

// TestBenchRunsConfigSetsTheCallPath: the config bench runs generates
// sets plugin_call_path as --plugin-call-path says, and an unknown value
// is refused.
func TestBenchRunsConfigSetsTheCallPath(t *testing.T) {
	bf := &benchFlags{plugins: benchPluginsDir(t)}
	for _, path := range []string{config.PluginCallNative, config.PluginCallSDK} {
		dir := t.TempDir()
		yaml, err := benchRunsConfigOn(bf, dir, &runsParams{PoolSize: 1, PluginCallPath: path}, "", path)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := writeBenchConfig(dir, yaml)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.PluginCallPath != path {
			t.Errorf("--plugin-call-path %s: the config's plugin_call_path is %q", path, cfg.PluginCallPath)
		}
	}
	for _, args := range [][]string{
		{"runs", "--plugin-call-path", "wasmtime"},
		{"runs", "--plugin-call-path", "both", "--in-process"},
		{"recovery", "--plugin-call-path", "both"},
	} {
		if _, err := runBench(t, t.TempDir(), args...); err == nil || !strings.Contains(err.Error(), "--plugin-call-path") {
			t.Errorf("bench %v: err = %v, want one about --plugin-call-path", args, err)
		}
	}
}

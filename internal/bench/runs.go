package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/metrics"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/runtime"
)

// The load of `bench runs` and `bench http`: a question with two sums, so
// that each Run takes 2 model steps (scripted-model asks for two
// calculate calls at once, then answers) and 2 tool calls (calculator).
const (
	benchQuestion = "What is 2+3 and 4+5?"
	benchAnswer   = "2+3 = 5 and 4+5 = 9."
	benchTenant   = "bench"
	benchToken    = "bench-token"
)

// runsParams are the parameters of `bench runs` and `bench http`.
type runsParams struct {
	Runs        int   `json:"runs"`
	Concurrency []int `json:"concurrency"`
	Rounds      int   `json:"rounds"`
	// Warmup is the untimed Runs per client a level starts with
	// (benchkit.WarmupRuns).
	Warmup     int    `json:"warmup_per_client"`
	Question   string `json:"question"`
	PoolSize   int    `json:"pool_size"`
	SyncWrites bool   `json:"sync_writes"`
	// Store is the store the Runs commit to: badger or postgres (whose
	// server is PostgreSQL, with its version).
	Store      string `json:"store"`
	PostgreSQL string `json:"postgresql,omitempty"`
	// InProcess runs the Go twins of the three plugins in process
	// (inproc.go) instead of the Wasm plugins.
	InProcess bool `json:"in_process"`
	// PluginCallPath is the config's plugin_call_path: native or
	// extism-sdk, or both (bench runs alone): a runtime on each, their
	// rounds alternating. Empty for bench http, which runs the default.
	PluginCallPath string `json:"plugin_call_path,omitempty"`
	// Guests is the build of the three Wasm plugins: c or go ("" is
	// plugincatalog.DefaultGuests, c).
	Guests string `json:"guests,omitempty"`

	pg *benchPostgres // with Store postgres
}

// baseline names the bare commits the Runs are compared with.
func (p *runsParams) baseline() string {
	if p.Store == config.DriverPostgres {
		return "bare PostgreSQL"
	}
	return "bare Badger"
}

// storeTitle names the store and the plugins for a table's title.
func (p *runsParams) storeTitle() string {
	store := "badgerstore, sync writes on"
	if p.Store == config.DriverPostgres {
		store = "pgstore on " + p.pg.where()
	}
	plugins := "Wasm prompt-builder, scripted-model, calculator (" + GuestsTitle(p.Guests) + ")"
	if p.InProcess {
		plugins = "in-process Go twins of prompt-builder, scripted-model, calculator"
	} else if p.PluginCallPath == pluginCallBoth {
		plugins += "; plugin_call_path native and extism-sdk, alternating rounds"
	} else if p.PluginCallPath != "" {
		plugins += ", plugin_call_path " + p.PluginCallPath
	}
	return store + "; " + plugins
}

// pluginCallBoth is --plugin-call-path both: the Runs on either call
// path, in alternating rounds.
const pluginCallBoth = "both"

// callPaths are the plugin_call_path values the Runs run on.
func (p *runsParams) callPaths() []string {
	switch p.PluginCallPath {
	case "":
		return []string{config.PluginCallNative}
	case pluginCallBoth:
		return []string{config.PluginCallNative, config.PluginCallSDK}
	}
	return []string{p.PluginCallPath}
}

func (p *runsParams) flags(cmd *cobra.Command, runs int, conc string) *string {
	f := cmd.Flags()
	f.IntVarP(&p.Runs, "runs", "n", runs, "Runs per concurrency level")
	f.IntVar(&p.Rounds, "rounds", 5, "rounds per level, each Runs/rounds Runs then as many bare Badger commits, interleaved so that a noisy machine's drift hits both alike")
	f.IntVar(&p.Warmup, "warmup", benchkit.DefaultWarmupPerClient, "untimed Runs per client (at most "+strconv.Itoa(benchkit.MaxWarmupRuns)+" a level) that start each level, then as many untimed bare commits: fresh connections, their prepared statements and plans, and the plugins' instances are made there, not in the first timed round; 0 for none")
	f.IntVar(&p.PoolSize, "pool-size", 4, "instances per plugin per tenant kept warm (the config's plugins.ID.pool_size; up to max_instances, 64, exist at once)")
	s := f.String("concurrency", conc, "comma-separated numbers of concurrent clients, one level each")
	p.Question = benchQuestion
	p.SyncWrites = true
	return s
}

func (p *runsParams) check(conc string) error {
	for _, f := range strings.Split(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return fmt.Errorf("--concurrency %q: want comma-separated positive numbers, like 1,16,256", conc)
		}
		p.Concurrency = append(p.Concurrency, c)
	}
	if p.Runs < 1 || p.Rounds < 1 {
		return fmt.Errorf("--runs %d --rounds %d: both must be at least 1", p.Runs, p.Rounds)
	}
	if p.Warmup < 0 {
		return fmt.Errorf("--warmup %d: want 0 or more untimed Runs per client", p.Warmup)
	}
	if p.PoolSize < 1 {
		return fmt.Errorf("--pool-size %d: must be at least 1", p.PoolSize)
	}
	return nil
}

// runsLevel is one concurrency level's figures.
type runsLevel struct {
	Concurrency int `json:"concurrency"`
	// PluginCallPath is the plugin_call_path the level ran on (bench runs
	// with the Wasm plugins); with --plugin-call-path both each
	// concurrency has a level on native, then one on extism-sdk.
	PluginCallPath string  `json:"plugin_call_path,omitempty"`
	Runs           int     `json:"runs"`
	Seconds        float64 `json:"seconds"`
	RunsPerSec     float64 `json:"runs_per_sec"`
	EffectsPerSec  float64 `json:"effects_per_sec"`
	EffectsPerRun  float64 `json:"effects_per_run"`
	P50ms          float64 `json:"p50_ms"`
	P95ms          float64 `json:"p95_ms"`
	P99ms          float64 `json:"p99_ms"`
	MaxMs          float64 `json:"max_ms"`
	CommitsPerRun  float64 `json:"commits_per_run"`
	// The baseline, measured in the same rounds at the same concurrency.
	BareCommitsPerSec float64 `json:"bare_commits_per_sec"`
	// BareRunsPerSec is the Runs/s bare Badger would allow at this many
	// commits per Run; Ratio is RunsPerSec over it (the goal is 0.5).
	BareRunsPerSec float64 `json:"bare_runs_per_sec"`
	Ratio          float64 `json:"ratio"`
	// On PostgreSQL: the statements the server executed per Run (from
	// pg_stat_statements: everything the node sent while the Runs ran,
	// the change feed's notifications and the lease renewals too, but
	// the BEGIN and COMMIT of pgx's pipelined batches, which PostgreSQL
	// 15 does not count there), and by statement; and the server's CPU
	// time per Run and per bare commit (from /proc, a server the bench
	// started).
	StatementsPerRun         float64          `json:"statements_per_run,omitempty"`
	ServerCPUMsPerRun        float64          `json:"server_cpu_ms_per_run,omitempty"`
	BareServerCPUMsPerCommit float64          `json:"bare_server_cpu_ms_per_commit,omitempty"`
	Statements               []statementCount `json:"statements,omitempty"`
	// Where a Run's time goes, summed over the concurrent Runs and
	// divided by the Runs: time in the plugins' calls (the builder's
	// build, the model's and the tools' executor calls) and in the
	// store's commits, from the metrics `serve` exports. At one client
	// they add up to most of the latency.
	BuildMsPerRun  float64 `json:"build_ms_per_run"`
	ModelMsPerRun  float64 `json:"model_ms_per_run"`
	ToolMsPerRun   float64 `json:"tool_ms_per_run"`
	CommitMsPerRun float64 `json:"commit_ms_per_run"`
	// CommitsPerTransaction is how many Run writes (creations and
	// commits) the store's transactions carried on average (group
	// commit; from agenthost_store_grouped_commits_total over
	// agenthost_store_commit_groups_total). The bare commits carry one.
	CommitsPerTransaction float64 `json:"commits_per_transaction,omitempty"`
	// Plugin calls that failed, and effect attempts settled other than
	// done (by "kind state class"): retried attempts make more than 4
	// effects a Run. Both are 0 on a healthy machine.
	PluginErrors  int            `json:"plugin_errors"`
	FailedEffects map[string]int `json:"failed_effects,omitempty"`
	// With --plugin-call-path both, on the native level: its Runs/s over
	// the extism-sdk level's at the same concurrency, and the extism-sdk
	// level's plugin time per Run (build, model and tools) over its own,
	// measured in the same rounds.
	RunsPerSecOverSDK     float64 `json:"runs_per_sec_over_sdk,omitempty"`
	SDKPluginMsOverNative float64 `json:"sdk_plugin_ms_over_native,omitempty"`
}

// pluginMsPerRun is the time a Run spent in plugin calls.
func (l runsLevel) pluginMsPerRun() float64 {
	return l.BuildMsPerRun + l.ModelMsPerRun + l.ToolMsPerRun
}

// spent is the time summed in the bench's plugin calls and commits so
// far, read from the metrics.
type spent struct {
	build, model, tool, commit float64
	// groups and grouped: the store's group transactions and the Run
	// writes they carried (RegisterCommitGroups; 0 for a store without).
	groups, grouped float64
	errors          float64            // plugin calls that failed
	failed          map[string]float64 // effects settled failed, by class
}

func spentSoFar(m *metrics.Metrics) (spent, error) {
	s := spent{failed: map[string]float64{}}
	mfs, err := m.Registry().Gather()
	if err != nil {
		return s, err
	}
	for _, mf := range mfs {
		var counter float64 // the family's value summed over its labels, if a counter
		for _, mt := range mf.GetMetric() {
			counter += mt.GetCounter().GetValue()
		}
		switch mf.GetName() {
		case "agenthost_store_commit_duration_seconds":
			for _, mt := range mf.GetMetric() {
				s.commit += mt.GetHistogram().GetSampleSum()
			}
		case "agenthost_store_commit_groups_total":
			s.groups += counter
		case "agenthost_store_grouped_commits_total":
			s.grouped += counter
		case "agenthost_plugin_call_errors_total":
			s.errors += counter
		case "agenthost_effects_settled_total":
			for _, mt := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range mt.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["state"] != "done" {
					s.failed[labels["kind"]+" "+labels["state"]+" "+labels["class"]] += mt.GetCounter().GetValue()
				}
			}
		case "agenthost_plugin_call_duration_seconds":
			for _, mt := range mf.GetMetric() {
				sum := mt.GetHistogram().GetSampleSum()
				for _, l := range mt.GetLabel() {
					if l.GetName() != "plugin" {
						continue
					}
					switch l.GetValue() {
					case plugincatalog.PromptBuilder:
						s.build += sum
					case plugincatalog.ScriptedModel:
						s.model += sum
					default:
						s.tool += sum
					}
				}
			}
		}
	}
	return s, nil
}

func newBenchRunsCmd(bf *benchFlags) *cobra.Command {
	p := &runsParams{}
	var conc *string
	sf := &storeFlags{}
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "Durable Runs per second end to end, against the bare store's commit rate",
		Long: `runs drives Runs through the runtime on badgerstore with sync writes on and the
real Wasm plugins: prompt-builder, scripted-model asked "` + benchQuestion + `"
and calculator, so each Run takes 2 model steps and 2 tool calls, each in its
own session. At every concurrency level it interleaves rounds of Runs with
rounds of bare Badger commits (sync on, 1.5 KB each) from as many
committers, and reports Runs/s, effects/s, Run latency percentiles, commits
per Run, and the ratio of Runs/s to what bare Badger's commit rate would
allow at that many commits per Run.

With --store postgres the Runs commit to pgstore, on a throwaway PostgreSQL
server the bench starts (fsync on) and stops, or on the server --dsn names;
the baseline is then bare PostgreSQL on the same server: one-row INSERT
transactions (synchronous_commit on, 1.5 KB each) from as many connections.

With --in-process the three plugins are Go twins in this process, which
answer at once: what is measured is the runtime and the store alone.

--plugin-call-path sets the config's plugin_call_path: native (the default,
the host's own Extism kernel) or extism-sdk (extism go-sdk). With both, the
bench opens a runtime on each, on stores of their own, and alternates their
rounds (each followed by its round of bare commits), so that both paths see
the same machine; it reports every level for each path, and native's Runs/s
and plugin time per Run against extism-sdk's.`,
		Example: `  bin/agenthost bench runs
  bin/agenthost bench runs --runs 4000 --concurrency 64 --json
  bin/agenthost bench runs --store postgres --concurrency 16
  bin/agenthost bench runs --plugin-call-path both --concurrency 1,16
  bin/agenthost bench runs --store postgres --in-process --concurrency 16
  bin/agenthost bench runs --store postgres --dsn 'postgres://bench@db.internal/bench'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(*conc); err != nil {
				return err
			}
			if err := sf.check(); err != nil {
				return err
			}
			switch p.PluginCallPath {
			case config.PluginCallNative, config.PluginCallSDK:
			case pluginCallBoth:
				if p.InProcess {
					return fmt.Errorf("bench runs: --plugin-call-path both: --in-process calls no plugin")
				}
			default:
				return fmt.Errorf("bench runs: --plugin-call-path %q: want %s, %s or %s", p.PluginCallPath, config.PluginCallNative, config.PluginCallSDK, pluginCallBoth)
			}
			if err := CheckGuests(p.Guests); err != nil {
				return err
			}
			p.Store = sf.store
			return benchRuns(cmd, bf, p, sf.dsn)
		},
	}
	conc = p.flags(cmd, 1000, "1,16,256")
	sf.add(cmd)
	cmd.Flags().BoolVar(&p.InProcess, "in-process", false, "run Go twins of the three plugins in process instead of the Wasm plugins (the runtime and the store alone)")
	cmd.Flags().StringVar(&p.PluginCallPath, "plugin-call-path", config.PluginCallNative,
		"the config's plugin_call_path: native, extism-sdk, or both (a runtime on each, in alternating rounds, with their ratio)")
	guestsFlag(cmd, &p.Guests)
	return cmd
}

// benchLoad is a store, a plugin host and a runtime wired from a config
// as `run` and `serve` wire them, for the Run benches.
type benchLoad struct {
	dir string
	cfg string // the config file
	sys *node.System
}

// benchRunsConfig is the config of the Run benches: the three plugins, one
// tenant with a token and no quotas, on p's plugin_call_path (one path:
// not both).
func benchRunsConfig(bf *benchFlags, dir string, p *runsParams) (string, error) {
	store := ""
	if p.pg != nil {
		store = p.pg.storeYAML()
	}
	return benchRunsConfigOn(bf, dir, p, store, p.PluginCallPath)
}

// benchRunsConfigOn is benchRunsConfig on the store section store, with
// plugin_call_path callPath ("": the default).
func benchRunsConfigOn(bf *benchFlags, dir string, p *runsParams, store, callPath string) (string, error) {
	var paths map[string]string
	var cache string
	var err error
	if p.InProcess {
		// The plugins are Go twins (inproc.go): these files are named for
		// the config's sake and never loaded.
		paths = map[string]string{}
		for _, id := range []string{plugincatalog.PromptBuilder, plugincatalog.ScriptedModel, plugincatalog.Calculator} {
			paths[id] = filepath.Join(dir, "in-process", id+".wasm")
		}
	} else {
		if paths, err = bf.guestPaths(p.Guests, plugincatalog.PromptBuilder, plugincatalog.ScriptedModel, plugincatalog.Calculator); err != nil {
			return "", err
		}
		if cache, err = bf.cachePath(); err != nil {
			return "", err
		}
	}
	if callPath != "" {
		store += "plugin_call_path: " + callPath + "\n"
	}
	plugin := func(id, role string) string {
		return fmt.Sprintf("  %s: {path: %q, role: %s, pool_size: %d}\n", id, paths[id], role, p.PoolSize)
	}
	return store + `data_dir: ` + strconv.Quote(filepath.Join(dir, "data")) + `
sync_writes: ` + strconv.FormatBool(p.SyncWrites) + `
cache_dir: ` + strconv.Quote(cache) + `
log: {level: error}
# The bench's clients all come from one address and are bounded by
# --concurrency: the per-client caps and rates would measure themselves.
http: {max_connections_per_client: 0, unauthenticated_rate: {per_second: 0}}
metrics: {listen: "off"}
plugins:
` + plugin("prompt-builder", "builder") + plugin("scripted-model", "executor") + plugin("calculator", "executor") + `
tenants:
  ` + benchTenant + `:
    tokens_sha256: [` + httpapi.HashToken(benchToken) + `]
    builder: prompt-builder
    model: scripted-model
    tool_executors: [calculator]
    history_runs: 0
    limits: {max_steps: 4, max_tool_calls_per_step: 4, max_parallel_tool_calls: 4, run_timeout: 0, effect_timeout: 0}
    quotas: {max_concurrent_reads: 0}
    rate_limits: {requests: {per_second: 0}, submissions: {per_second: 0}}
`, nil
}

// runsSetup makes the work dir of `bench runs` or `bench http` and its
// config; cleanup removes the dir.
func runsSetup(bf *benchFlags, name string, p *runsParams) (dir string, cfg *config.Config, cleanup func(), err error) {
	dir, cleanup, err = bf.tempDir(name)
	if err != nil {
		return "", nil, nil, err
	}
	yaml, err := benchRunsConfig(bf, dir, p)
	if err == nil {
		cfg, err = writeBenchConfig(dir, yaml)
	}
	if err != nil {
		cleanup()
		return "", nil, nil, err
	}
	return dir, cfg, cleanup, nil
}

// benchContext is the command's context, or the background one.
func benchContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// checkBenchRun checks that a Run did what the bench claims it does.
func checkBenchRun(run loop.Run) error {
	if run.Status != loop.StatusCompleted || run.Result != benchAnswer || run.Step != 2 {
		return fmt.Errorf("bench: the Run %s ended %s after %d model steps with %q; want completed after 2 steps with %q (are these the example plugins?)",
			run.ID, run.Status, run.Step, run.Result, benchAnswer)
	}
	return nil
}

func benchRuns(cmd *cobra.Command, bf *benchFlags, p *runsParams, dsn string) error {
	ctx := benchContext(cmd)
	started := time.Now()
	maxConc := slices.Max(p.Concurrency)
	callPaths := p.callPaths()
	if p.Store == config.DriverPostgres {
		// The server serves each runtime's pool and change feed and, at
		// the most, maxConc connections of the bare baseline.
		pg, err := startBenchPostgres(ctx, cmd, bf, dsn, maxConc+len(callPaths)*(pgstore.DefaultMaxConns+2))
		if err != nil {
			return err
		}
		if len(callPaths) > 1 && !pg.own {
			// The second runtime's schema (sdkSchema), on a server that
			// outlives the bench.
			stop := pg.stop
			pg.stop = func() { dropBenchSchema(dsn, pg.schema+sdkSchemaSuffix); stop() }
		}
		defer pg.stop()
		p.pg, p.PostgreSQL = pg, pg.version
	}
	dir, cleanup, err := bf.tempDir("runs")
	if err != nil {
		return err
	}
	defer cleanup()

	// A runtime on each call path, each on a store of its own: its own
	// directory (Badger) or schema (PostgreSQL).
	var session atomic.Int64
	var targets []levelTarget
	for i, cp := range callPaths {
		sub := dir
		if len(callPaths) > 1 {
			sub = filepath.Join(dir, cp)
			if err := os.Mkdir(sub, 0o755); err != nil {
				return err
			}
		}
		store := ""
		if p.pg != nil {
			schema := p.pg.schema
			if i > 0 {
				schema += sdkSchemaSuffix
			}
			store = "store: {driver: postgres, dsn: " + strconv.Quote(p.pg.dsn) + ", postgres: {schema: " + schema + "}}\n"
		}
		if len(callPaths) > 1 {
			bf.progressf(cmd, "plugin_call_path %s:", cp)
		}
		t, closeTarget, err := openRunsTarget(ctx, cmd, bf, p, sub, store, cp, &session)
		if err != nil {
			return err
		}
		defer closeTarget()
		targets = append(targets, t)
	}
	var bare bareRounds
	if p.pg != nil {
		bare, err = openBarePostgres(ctx, p.pg.dsn, p.pg.schema+"_bare", maxConc)
	} else {
		bare, err = benchkit.OpenBareBadger(filepath.Join(dir, "bare"))
	}
	if err != nil {
		return err
	}
	defer bare.Close()

	var levels []runsLevel
	for _, c := range p.Concurrency {
		bf.progressf(cmd, "concurrency %d: %d Runs in %d rounds, each followed by a round of %s commits", c, p.Runs, p.Rounds, p.baseline())
		lvls, err := runsLevelsOf(cmd, bf, p, c, targets, bare)
		if err != nil {
			return err
		}
		if len(lvls) == 2 {
			native, sdk := &lvls[0], lvls[1]
			native.RunsPerSecOverSDK = native.RunsPerSec / sdk.RunsPerSec
			if n := native.pluginMsPerRun(); n > 0 {
				native.SDKPluginMsOverNative = sdk.pluginMsPerRun() / n
			}
		}
		levels = append(levels, lvls...)
	}
	tables := []table{runsTableOn("Durable Runs end to end ("+p.storeTitle()+")", p.baseline(), levels), spentTable(levels)}
	if slices.ContainsFunc(levels, func(l runsLevel) bool { return len(l.Statements) > 0 }) {
		tables = append(tables, statementsTable(levels))
	}
	if len(callPaths) > 1 {
		tables = append(tables, callPathsTable(levels))
	}
	return bf.emit(cmd.OutOrStdout(), benchOutput{Bench: "runs", Started: started, Machine: bf.thisMachine(), Params: p, Result: levels}, tables...)
}

// openRunsTarget opens the runtime `bench runs` drives on plugin_call_path
// callPath, its config written into dir over the store section store
// ("": Badger in dir), and runs one Run on it first: it checks the plugins
// answer as the bench expects and leaves the instance pools warm. Each Run
// is a new session, numbered by session. The returned func stops the
// runtime.
func openRunsTarget(ctx context.Context, cmd *cobra.Command, bf *benchFlags, p *runsParams, dir, store, callPath string,
	session *atomic.Int64) (levelTarget, func(), error) {
	yaml, err := benchRunsConfigOn(bf, dir, p, store, callPath)
	if err != nil {
		return levelTarget{}, nil, err
	}
	cfg, err := writeBenchConfig(dir, yaml)
	if err != nil {
		return levelTarget{}, nil, err
	}
	m := metrics.New()
	rt, closeRuntime, err := openRunsRuntime(ctx, cmd, bf, cfg, p, m)
	if err != nil {
		return levelTarget{}, nil, err
	}
	execute := func() (loop.Run, error) {
		res, err := rt.Execute(ctx, runtime.Request{Tenant: benchTenant, Session: fmt.Sprintf("s%d", session.Add(1)), Input: p.Question})
		if err != nil {
			return loop.Run{}, err
		}
		return res.Run, checkBenchRun(res.Run)
	}
	if _, err := execute(); err != nil {
		closeRuntime()
		return levelTarget{}, nil, err
	}
	path := callPath
	if p.InProcess {
		path = "" // no plugin is called
	}
	return levelTarget{path: path, rt: rt, m: m, one: func() (time.Duration, error) {
		t0 := time.Now()
		_, err := execute()
		return time.Since(t0), err
	}}, closeRuntime, nil
}

// sdkSchemaSuffix ends the PostgreSQL schema of the extism-sdk runtime of
// --plugin-call-path both.
const sdkSchemaSuffix = "_sdk"

// dropBenchSchema drops a schema the bench made on the server dsn names.
func dropBenchSchema(dsn, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
}

// openRunsRuntime starts the runtime `bench runs` drives: wired from the
// config by node.Open, or, with --in-process, over the config's store
// with the Go twins of the plugins. The returned func stops it.
func openRunsRuntime(ctx context.Context, cmd *cobra.Command, bf *benchFlags, cfg *config.Config, p *runsParams, m *metrics.Metrics) (*runtime.Runtime, func(), error) {
	log := slog.New(slog.DiscardHandler)
	if !p.InProcess {
		bf.progressf(cmd, "loading the plugins (a cold compile takes seconds; --cache-dir keeps it)")
		sys, err := node.Open(ctx, cfg, []string{benchTenant}, log, node.Wiring{Observer: m, Executor: m.Executor, Builder: m.Builder})
		if err != nil {
			return nil, nil, err
		}
		if err := m.RegisterCommitGroups(sys.Store()); err != nil {
			_ = sys.Close(context.WithoutCancel(ctx))
			return nil, nil, err
		}
		return sys.Runtime(), func() { _ = sys.Close(context.WithoutCancel(ctx)) }, nil
	}
	st, err := node.OpenStore(ctx, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	if err := m.RegisterCommitGroups(st); err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	rt, err := runtime.New(runtime.Options{
		Store: st, Tenants: runtime.TenantMap{benchTenant: inProcessTenant(m)}, Clock: runtime.SystemClock{}, Logger: log,
		Observer: m, WatchdogInterval: cfg.WatchdogInterval, LeaseTTL: cfg.LeaseTTL,
	})
	if err == nil {
		err = rt.Start(ctx)
	}
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	return rt, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = rt.Stop(sctx)
		_ = st.Close()
	}, nil
}

// levelTarget is a runtime the Run benches drive: one returns a Run's
// latency; path is its plugin_call_path ("" where it is not reported).
type levelTarget struct {
	path string
	rt   *runtime.Runtime
	m    *metrics.Metrics
	one  func() (time.Duration, error)
}

// runsLevelOf measures one concurrency level: rounds of Runs through one
// (which returns a Run's latency) interleaved with rounds of bare Badger
// commits at the same concurrency, as many as the Runs committed.
func runsLevelOf(cmd *cobra.Command, bf *benchFlags, p *runsParams, c int, rt *runtime.Runtime, m *metrics.Metrics, bare bareRounds,
	one func() (time.Duration, error)) (runsLevel, error) {
	lvls, err := runsLevelsOf(cmd, bf, p, c, []levelTarget{{rt: rt, m: m, one: one}}, bare)
	if err != nil {
		return runsLevel{}, err
	}
	return lvls[0], nil
}

// levelAcc is what one target's rounds of a level have summed so far.
type levelAcc struct {
	t                 levelTarget
	lat               []time.Duration
	runTime, bareTime time.Duration
	bareCommits       int
	commits0          int64
	effects0          int64
	spent0            spent
	// What the PostgreSQL server spent on the Runs, and on the bare
	// commits.
	server, bareServer serverSpent
}

// runsLevelsOf is runsLevelOf on several targets: each round runs every
// target's Runs, each followed by its bare commits, in an order that
// rotates with the round, so that a noisy machine's drift hits them alike.
// It returns a level for each target, in their order.
func runsLevelsOf(cmd *cobra.Command, bf *benchFlags, p *runsParams, c int, targets []levelTarget, bare bareRounds) ([]runsLevel, error) {
	var done counter
	var firstErr atomic.Pointer[error]
	progress := bf.startMeter(cmd, fmt.Sprintf("concurrency %d: Runs", c), int64(p.Runs*len(targets)), done.get)
	defer progress.Stop()
	ctx := benchContext(cmd)
	if err := warmUp(c, p.Warmup, targets, bare); err != nil {
		return nil, err
	}
	accs := make([]*levelAcc, len(targets))
	for i, t := range targets {
		a := &levelAcc{t: t, commits0: t.rt.Stats().Commits, effects0: t.rt.Stats().EffectsSettled}
		var err error
		if a.spent0, err = spentSoFar(t.m); err != nil {
			return nil, err
		}
		accs[i] = a
	}
	for r := 0; r < p.Rounds; r++ {
		n := p.Runs / p.Rounds
		if r < p.Runs%p.Rounds {
			n++
		}
		if n == 0 {
			continue
		}
		for i := range accs {
			a := accs[(i+r)%len(accs)]
			roundLat := make([]time.Duration, n)
			c0 := a.t.rt.Stats().Commits
			err := p.pg.measure(ctx, &a.server, func() error {
				t0 := time.Now()
				benchkit.Parallel(c, n, func(i int) {
					d, err := a.t.one()
					roundLat[i] = d
					if err != nil { // the first failed Run ends the bench, with its error
						firstErr.CompareAndSwap(nil, &err)
					}
					done.Add(1)
				})
				a.runTime += time.Since(t0)
				return nil
			})
			if err != nil {
				return nil, err
			}
			a.lat = append(a.lat, roundLat...)
			if p := firstErr.Load(); p != nil {
				if a.t.path != "" {
					return nil, fmt.Errorf("bench: concurrency %d, plugin_call_path %s: %w", c, a.t.path, *p)
				}
				return nil, fmt.Errorf("bench: concurrency %d: %w", c, *p)
			}
			// As many bare commits as the round's Runs made (CreateRun included).
			k := int(a.t.rt.Stats().Commits-c0) + n
			var d time.Duration
			err = p.pg.measure(ctx, &a.bareServer, func() (err error) {
				d, err = bare.Round(c, k)
				return err
			})
			if err != nil {
				return nil, err
			}
			a.bareTime += d
			a.bareCommits += k
		}
	}
	out := make([]runsLevel, len(accs))
	for i, a := range accs {
		lvl, err := a.level(c)
		if err != nil {
			return nil, err
		}
		out[i] = lvl
	}
	return out, nil
}

// warmUp runs the untimed start of a level at concurrency c: on each
// target, benchkit.WarmupRuns Runs, then as many bare commits. A level
// with more clients than the one before opens connections (and prepares
// its statements, and plans them, on each), and makes plugin instances:
// a cost of its first seconds, which the timed rounds would otherwise
// charge to whichever target ran first, and to its latency percentiles.
func warmUp(c, perClient int, targets []levelTarget, bare bareRounds) error {
	n := benchkit.WarmupRuns(c, perClient)
	if n == 0 {
		return nil
	}
	for _, t := range targets {
		if err := benchkit.WarmUp(c, perClient, func() error { _, err := t.one(); return err }); err != nil {
			return fmt.Errorf("bench: concurrency %d, warming up: %w", c, err)
		}
		if _, err := bare.Round(c, n); err != nil {
			return fmt.Errorf("bench: concurrency %d, warming up the bare commits: %w", c, err)
		}
	}
	return nil
}

// level is the figures of the target's rounds at concurrency c.
func (a *levelAcc) level(c int) (runsLevel, error) {
	rt := a.t.rt
	lvl := runsLevel{Concurrency: c, PluginCallPath: a.t.path}
	lvl.Runs = len(a.lat)
	if lvl.Runs == 0 {
		return lvl, errors.New("bench: no Run was measured")
	}
	lvl.Seconds = a.runTime.Seconds()
	lvl.RunsPerSec = float64(lvl.Runs) / a.runTime.Seconds()
	effects := rt.Stats().EffectsSettled - a.effects0
	lvl.EffectsPerRun = float64(effects) / float64(lvl.Runs)
	lvl.EffectsPerSec = float64(effects) / a.runTime.Seconds()
	// Stats.Commits counts the commits of advances; each Run's CreateRun
	// is one more.
	lvl.CommitsPerRun = float64(rt.Stats().Commits-a.commits0+int64(lvl.Runs)) / float64(lvl.Runs)
	s := benchkit.Summarize(a.lat)
	lvl.P50ms, lvl.P95ms, lvl.P99ms, lvl.MaxMs = msf(s.P50), msf(s.P95), msf(s.P99), msf(s.Max)
	if a.bareTime > 0 {
		lvl.BareCommitsPerSec = float64(a.bareCommits) / a.bareTime.Seconds()
		lvl.BareRunsPerSec = lvl.BareCommitsPerSec / lvl.CommitsPerRun
		lvl.Ratio = lvl.RunsPerSec / lvl.BareRunsPerSec
	}
	a.server.perRun(&lvl, a.bareServer, a.bareCommits)
	spent1, err := spentSoFar(a.t.m)
	if err != nil {
		return lvl, err
	}
	spent0 := a.spent0
	perRun := func(a, b float64) float64 { return (b - a) * 1000 / float64(lvl.Runs) }
	lvl.BuildMsPerRun = perRun(spent0.build, spent1.build)
	lvl.ModelMsPerRun = perRun(spent0.model, spent1.model)
	lvl.ToolMsPerRun = perRun(spent0.tool, spent1.tool)
	lvl.CommitMsPerRun = perRun(spent0.commit, spent1.commit)
	if groups := spent1.groups - spent0.groups; groups > 0 {
		lvl.CommitsPerTransaction = (spent1.grouped - spent0.grouped) / groups
	}
	lvl.PluginErrors = int(spent1.errors - spent0.errors)
	for k, v := range spent1.failed {
		if n := int(v - spent0.failed[k]); n > 0 {
			if lvl.FailedEffects == nil {
				lvl.FailedEffects = map[string]int{}
			}
			lvl.FailedEffects[k] = n
		}
	}
	return lvl, nil
}

func runsTable(title string, levels []runsLevel) table {
	return runsTableOn(title, "bare Badger", levels)
}

// runsTableOn is runsTable against the baseline named (bare Badger, bare
// PostgreSQL).
func runsTableOn(title, baseline string, levels []runsLevel) table {
	byPath := manyCallPaths(levels)
	t := table{Title: title,
		Header: pathHeader(byPath, "clients", "Runs", "Runs/s", "effects/s", "p50 ms", "p95 ms", "p99 ms", "commits/Run", "commits/tx", "bare commits/s", "bare Runs/s", "ratio")}
	for _, l := range levels {
		t.Rows = append(t.Rows, pathRow(byPath, strconv.Itoa(l.Concurrency), l.PluginCallPath, strconv.Itoa(l.Runs),
			fmt.Sprintf("%.0f", l.RunsPerSec), fmt.Sprintf("%.0f", l.EffectsPerSec),
			fmt.Sprintf("%.1f", l.P50ms), fmt.Sprintf("%.1f", l.P95ms), fmt.Sprintf("%.1f", l.P99ms),
			fmt.Sprintf("%.2f", l.CommitsPerRun), orNA(l.CommitsPerTransaction, "%.2f"), fmt.Sprintf("%.0f", l.BareCommitsPerSec),
			fmt.Sprintf("%.0f", l.BareRunsPerSec), fmt.Sprintf("%.2f", l.Ratio)))
	}
	t.Notes = []string{
		"bare Runs/s = " + baseline + " commits/s at the same concurrency ÷ commits/Run; ratio = Runs/s ÷ bare Runs/s (goal: 0.5); commits/tx: the Run writes (creations and commits) a store transaction carried, on average (group commit), against one a bare commit.",
		"effects/s counts settled model and tool effects (4 a Run). Latency is submit to completion of one Run.",
		"Each level starts untimed: --warmup Runs per client (at most " + strconv.Itoa(benchkit.MaxWarmupRuns) + "), then as many bare commits, so that what more clients cost at first (connections opened, statements prepared and planned on each, plugin instances) is not timed.",
	}
	if serverFigures(levels) {
		t.Header = append(t.Header, "stmts/Run", "server CPU ms/Run", "bare server CPU ms/commit")
		for i, l := range levels {
			t.Rows[i] = append(t.Rows[i], orNA(l.StatementsPerRun, "%.1f"), orNA(l.ServerCPUMsPerRun, "%.2f"), orNA(l.BareServerCPUMsPerCommit, "%.3f"))
		}
		t.Notes = append(t.Notes, "stmts/Run: statements the PostgreSQL server executed while the Runs ran, per Run (pg_stat_statements; the BEGIN and COMMIT of pipelined batches are not counted); "+
			"server CPU: user+system time of the server's processes (/proc), per Run and per bare commit; n/a: not known on this server.")
	}
	for _, l := range levels {
		if l.PluginErrors > 0 || len(l.FailedEffects) > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("clients %d: %d plugin calls failed; effect attempts not done: %v (retried by policy; the Runs still completed)",
				l.Concurrency, l.PluginErrors, l.FailedEffects))
		}
	}
	return t
}

// serverFigures tells whether levels have figures of the PostgreSQL
// server: statements or CPU time.
func serverFigures(levels []runsLevel) bool {
	for _, l := range levels {
		if l.StatementsPerRun > 0 || l.ServerCPUMsPerRun > 0 {
			return true
		}
	}
	return false
}

// orNA formats v, or "n/a" when it is 0 (not measured).
func orNA(v float64, format string) string {
	if v == 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

// statementsTable is the statements the PostgreSQL server executed per
// Run, by statement, at each level.
func statementsTable(levels []runsLevel) table {
	byPath := manyCallPaths(levels)
	t := table{Title: "PostgreSQL statements per Run, by statement (pg_stat_statements)",
		Header: pathHeader(byPath, "clients", "per Run", "statement")}
	for _, l := range levels {
		for _, st := range l.Statements {
			t.Rows = append(t.Rows, pathRow(byPath, strconv.Itoa(l.Concurrency), l.PluginCallPath, fmt.Sprintf("%.2f", st.PerRun), st.Statement))
		}
	}
	return t
}

// spentTable is where the Runs' time went, per Run.
func spentTable(levels []runsLevel) table {
	byPath := manyCallPaths(levels)
	t := table{Title: "Where a Run's time goes (ms per Run, summed over concurrent Runs)",
		Header: pathHeader(byPath, "clients", "latency p50", "build", "model", "tools", "commits", "plugins+commits")}
	for _, l := range levels {
		t.Rows = append(t.Rows, pathRow(byPath, strconv.Itoa(l.Concurrency), l.PluginCallPath, fmt.Sprintf("%.1f", l.P50ms),
			fmt.Sprintf("%.2f", l.BuildMsPerRun), fmt.Sprintf("%.2f", l.ModelMsPerRun),
			fmt.Sprintf("%.2f", l.ToolMsPerRun), fmt.Sprintf("%.2f", l.CommitMsPerRun),
			fmt.Sprintf("%.2f", l.BuildMsPerRun+l.ModelMsPerRun+l.ToolMsPerRun+l.CommitMsPerRun)))
	}
	t.Notes = []string{"build: 2 prompt-builder calls; model: 2 scripted-model calls; tools: 2 calculator calls; commits: the runtime's commits after the creation (CreateRun is not timed; on PostgreSQL it writes a new session's first step too, docs/DESIGN.md §5.1)."}
	return t
}

// manyCallPaths tells whether levels ran on more than one plugin call
// path, so that the tables need a column for it.
func manyCallPaths(levels []runsLevel) bool {
	for _, l := range levels {
		if l.PluginCallPath != levels[0].PluginCallPath {
			return true
		}
	}
	return false
}

// pathHeader is a table's header, with a "path" column after the first
// one when byPath.
func pathHeader(byPath bool, first string, rest ...string) []string {
	if byPath {
		return append([]string{first, "path"}, rest...)
	}
	return append([]string{first}, rest...)
}

// pathRow is a table's row, with path after the first column when
// byPath.
func pathRow(byPath bool, first, path string, rest ...string) []string {
	if byPath {
		return append([]string{first, path}, rest...)
	}
	return append([]string{first}, rest...)
}

// callPathsTable is --plugin-call-path both's comparison: at each
// concurrency, the native level against the extism-sdk one, measured in
// the same rounds.
func callPathsTable(levels []runsLevel) table {
	t := table{Title: "The plugin call paths against each other (same rounds)",
		Header: []string{"clients", "native Runs/s", "extism-sdk Runs/s", "native/sdk", "native plugin ms/Run", "extism-sdk plugin ms/Run", "sdk/native"}}
	for i := 0; i+1 < len(levels); i += 2 {
		n, s := levels[i], levels[i+1]
		t.Rows = append(t.Rows, []string{strconv.Itoa(n.Concurrency),
			fmt.Sprintf("%.0f", n.RunsPerSec), fmt.Sprintf("%.0f", s.RunsPerSec), fmt.Sprintf("%.2f", n.RunsPerSecOverSDK),
			fmt.Sprintf("%.2f", n.pluginMsPerRun()), fmt.Sprintf("%.2f", s.pluginMsPerRun()), fmt.Sprintf("%.2f", n.SDKPluginMsOverNative)})
	}
	t.Notes = []string{"plugin ms/Run: the build, model and tool calls of a Run (6 calls), summed over concurrent Runs; native/sdk > 1: native is faster."}
	return t
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// The comparison on a tiny workload: every system at every concurrency
// runs its Runs, each Run commits every step's result (at least the 6
// write transactions of a Run's start, its 4 steps and its end), and the
// ratios are there. It needs PostgreSQL's binaries and make plugins'
// output; make bench-peers runs it.
func TestComparisonOfATinyWorkload(t *testing.T) {
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatal(err)
	}
	cache := "../.cache/wazero"
	if c := os.Getenv("AGENTHOST_TEST_CACHE"); c != "" {
		cache = filepath.Join(c, "wazero")
	}
	cmd := newCommand()
	var out, progress bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&progress)
	cmd.SetArgs([]string{"--runs", "4", "--rounds", "2", "--clients", "1,2", "--json", "--cache-dir", cache, "--work-dir", t.TempDir()})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var got struct {
		Bench  string `json:"bench"`
		Params params `json:"params"`
		Result result `json:"result"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Bench != "peers" || got.Params.PostgreSQL == "" || got.Params.DBOS == "" {
		t.Errorf("bench %q, PostgreSQL %q, DBOS %q; want peers and both versions", got.Bench, got.Params.PostgreSQL, got.Params.DBOS)
	}
	if len(got.Result.Levels) != 6 || len(got.Result.Ratios) != 4 {
		t.Fatalf("%d levels and %d ratios; want 6 (3 systems at 2 concurrencies) and 4: %s", len(got.Result.Levels), len(got.Result.Ratios), out.String())
	}
	for _, l := range got.Result.Levels {
		if l.Runs != 4 || l.RunsPerSec <= 0 || l.P50ms <= 0 || l.ServerCPUMsPerRun < 0 {
			t.Errorf("%s at %d clients: %+v; want 4 Runs, each measured", l.System, l.Concurrency, l)
		}
		// A durable step is a commit. agenthost: the creation with the
		// first step's dispatch (one commit on PostgreSQL for a session's
		// first Run, CreateRun.FirstStep), the model's answer with the
		// tools' dispatch, the tools' results (together, or one commit
		// each) with the second step's dispatch, the answer with the end.
		// DBOS: the workflow's status, its 4 steps, its result.
		floor := 4.0
		if l.System == sysDBOS {
			floor = 6
		}
		if l.WriteTxPerRun < floor || l.WALKBPerRun <= 0 {
			t.Errorf("%s at %d clients: %.2f write transactions and %.1f kB of WAL a Run; want at least %.0f, and WAL: a durable step is a commit",
				l.System, l.Concurrency, l.WriteTxPerRun, l.WALKBPerRun, floor)
		}
	}
	for _, r := range got.Result.Ratios {
		if r.RunsPerSec <= 0 || r.P50 <= 0 {
			t.Errorf("ratio %+v: want positive ratios", r)
		}
	}
}

// agenthost's Wasm plugins are their C builds unless --guests says go:
// from a plugins directory that holds only those builds, the comparison
// runs, and says so. It needs make plugins-c's output (make bench-peers
// builds it).
func TestTheWasmSystemRunsTheCBuildsOfItsPluginsByDefault(t *testing.T) {
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"prompt-builder-c", "calculator-c", "scripted-model-c"} {
		src, err := filepath.Abs(filepath.Join("..", "build", "plugins", name+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(src); err != nil {
			t.Fatalf("%v: run make plugins plugins-c first", err)
		}
		if err := os.Symlink(src, filepath.Join(dir, name+".wasm")); err != nil {
			t.Fatal(err)
		}
	}
	cmd := newCommand()
	var out, progress bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&progress)
	cmd.SetArgs([]string{"--systems", "wasm", "--runs", "2", "--rounds", "1", "--clients", "1", "--warmup", "1",
		"--plugins", dir, "--cache-dir", "", "--work-dir", t.TempDir()})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if !strings.Contains(out.String(), "C builds where there are (--guests)") {
		t.Errorf("the table does not say which build ran:\n%s", out.String())
	}
}

// Every system runs a level's untimed warm-up, per client, before the
// level's rounds; a failed warm-up Run ends the comparison.
func TestEverySystemWarmsUpBeforeALevel(t *testing.T) {
	var ran [2]atomic.Int64
	systems := make([]system, 2)
	for i := range systems {
		systems[i] = system{name: allSystems[i], run: func() (time.Duration, error) { ran[i].Add(1); return time.Millisecond, nil }}
	}
	if err := warmUp(4, 3, systems); err != nil {
		t.Fatal(err)
	}
	for i := range ran {
		if got := ran[i].Load(); got != 12 {
			t.Errorf("%s ran %d warm-up Runs, want 12 (4 clients, 3 each)", systems[i].name, got)
		}
	}
	if err := warmUp(4, 0, systems); err != nil || ran[0].Load() != 12 {
		t.Errorf("--warmup 0: err %v, %d Runs in all, want none more", err, ran[0].Load())
	}
	boom := errors.New("boom")
	failing := []system{{name: sysDBOS, run: func() (time.Duration, error) { return 0, boom }}}
	if err := warmUp(2, 1, failing); !errors.Is(err, boom) {
		t.Errorf("a failed warm-up Run: err = %v, want boom", err)
	}
}

// A DBOS figure too small to measure (the server's CPU over a few Runs,
// read in 10 ms ticks) gives no ratio, not an infinite one, which JSON
// cannot carry: the result still prints, with n/a in the table.
func TestARatioOverNothingIsNone(t *testing.T) {
	levels := []level{
		{System: sysInProcess, Concurrency: 1, RunsPerSec: 300, P50ms: 3, ServerCPUMsPerRun: 1.5},
		{System: sysDBOS, Concurrency: 1, RunsPerSec: 200, P50ms: 4, ServerCPUMsPerRun: 0},
	}
	rs := ratios(levels)
	if len(rs) != 1 || rs[0].RunsPerSec != 1.5 || rs[0].P50 != 0.75 || rs[0].ServerCPUPerRun != 0 {
		t.Fatalf("ratios = %+v; want Runs/s 1.5, p50 0.75 and no CPU ratio (0)", rs)
	}
	if _, err := json.Marshal(result{Levels: levels, Ratios: rs}); err != nil {
		t.Fatalf("the result does not encode: %v", err)
	}
	if row := ratiosTable(rs).Rows[0]; row[4] != "n/a" || row[5] != "n/a" {
		t.Errorf("the CPU ratio's cell is %q and the rounds' %q, want n/a for both (no rounds)", row[4], row[5])
	}
}

// The ratio round by round pairs each agenthost round with DBOS's round
// of the same index and gives the least and the greatest of them.
func TestTheRatiosRoundByRound(t *testing.T) {
	levels := []level{
		{System: sysDBOS, Concurrency: 16, RunsPerSec: 200, RoundRunsPerSec: []float64{200, 100, 250}},
		{System: sysWasm, Concurrency: 16, RunsPerSec: 250, RoundRunsPerSec: []float64{300, 150, 250}},
	}
	rs := ratios(levels)
	if len(rs) != 1 || rs[0].RoundRunsPerSecMin != 1 || rs[0].RoundRunsPerSecMax != 1.5 {
		t.Fatalf("ratios = %+v; want rounds from 1 to 1.5", rs)
	}
	if row := ratiosTable(rs).Rows[0]; row[5] != "1.00–1.50" {
		t.Errorf("the rounds' cell is %q, want 1.00–1.50", row[5])
	}
	levels[0].RoundRunsPerSec[1] = 0
	if rs := ratios(levels); rs[0].RoundRunsPerSecMin != 0 || rs[0].RoundRunsPerSecMax != 0 {
		t.Errorf("a round of DBOS too short to measure: rounds %v–%v, want none (0)", rs[0].RoundRunsPerSecMin, rs[0].RoundRunsPerSecMax)
	}
}

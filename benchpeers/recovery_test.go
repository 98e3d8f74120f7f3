package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestMain lets the test binary stand in for benchpeers when the recovery
// comparison re-executes itself as DBOS's child process.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == dbosChildCommand {
		cmd := newCommand()
		cmd.SetArgs(os.Args[1:])
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The recovery comparison on a small workload: 20 Runs on slow jobs of 2
// s, killed and recovered once on each system; every Run ends completed
// on both, with no violation and no agenthost job run twice, every DBOS
// workflow's step started at least once, and the times and the ratio are
// there. It needs PostgreSQL's binaries, make build's agenthost and make
// plugins' output; make bench-peers runs it.
func TestRecoveryComparisonOfASmallWorkload(t *testing.T) {
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("../bin/agenthost"); err != nil {
		t.Fatalf("%v: build it first with make build", err)
	}
	cache := "../.cache/wazero"
	if c := os.Getenv("AGENTHOST_TEST_CACHE"); c != "" {
		cache = filepath.Join(c, "wazero")
	}
	const runs = 20
	cmd := newCommand()
	var out, progress bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&progress)
	cmd.SetArgs([]string{"recovery", "--runs", "20", "--job-seconds", "2", "--rounds", "1", "--timeout", "2m", "--json", "--cache-dir", cache, "--work-dir", t.TempDir()})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s\n%s", err, progress.String(), out.String())
	}
	var got struct {
		Bench  string         `json:"bench"`
		Params recoveryParams `json:"params"`
		Result recoveryResult `json:"result"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Bench != "peers-recovery" || got.Params.PostgreSQL == "" || got.Params.DBOS == "" || !got.Result.OK {
		t.Errorf("bench %q, PostgreSQL %q, DBOS %q, ok %t; want peers-recovery, both versions and ok", got.Bench, got.Params.PostgreSQL, got.Params.DBOS, got.Result.OK)
	}
	if len(got.Result.Rounds) != 2 || len(got.Result.Ratios) != 2 {
		t.Fatalf("%d rounds and %d ratios; want 2 (agenthost and DBOS) and 2 (the round's and all rounds'): %s", len(got.Result.Rounds), len(got.Result.Ratios), out.String())
	}
	systems := map[string]bool{}
	for _, r := range got.Result.Rounds {
		systems[r.System] = true
		if r.Runs != runs || r.Completed != runs || r.NotCompleted != 0 || r.Violations != 0 {
			t.Errorf("%s: %+v; want %d Runs, every one completed, no violation", r.System, r, runs)
		}
		if r.TerminalMS <= 0 || r.TotalMS < r.TerminalMS || r.RunsPerSec <= 0 || r.SubmitMS <= 0 || r.OpenMS <= 0 {
			t.Errorf("%s: %+v; want every time measured", r.System, r)
		}
		if r.System == sysDBOS && r.JobStarts < runs {
			t.Errorf("DBOS: %d step starts for %d workflows; want at least one each", r.JobStarts, runs)
		}
		if r.System != sysDBOS && (r.JobsRerun != 0 || r.LeaseWaitMS != 0) {
			t.Errorf("agenthost: %d jobs run again, lease wait %.0f ms; want none and 0 (one node name)", r.JobsRerun, r.LeaseWaitMS)
		}
	}
	if !systems["agenthost"] || !systems[sysDBOS] {
		t.Errorf("systems %v; want agenthost and dbos", systems)
	}
	for _, r := range got.Result.Ratios {
		if r.Total <= 0 {
			t.Errorf("ratio %+v: want a positive ratio", r)
		}
	}
}

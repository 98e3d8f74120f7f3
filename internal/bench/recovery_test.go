package bench

import (
	"encoding/json"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestBenchRecovery runs `agenthost bench recovery` with a few Runs: a
// child agenthost process puts them in flight and is killed with SIGKILL,
// and the bench recovers them in this process. It checks what the bench
// reports, not how fast: every Run completed, every in-flight effect went
// through a recovery decision, and the timings are real.
func TestBenchRecovery(t *testing.T) {
	conformance.SkipInShort(t, "SIGKILLing a child under load")
	checkBenchRecovery(t, "badger")
}

// TestBenchRecoveryOnPostgres is TestBenchRecovery on a database of the
// shared test server: the child and this process share it, and recovery
// starts once the child's lease has run out. It runs the plugins on the
// reference call path, so that both paths recover Runs.
func TestBenchRecoveryOnPostgres(t *testing.T) {
	r := checkBenchRecovery(t, "postgres", "--dsn", pgserver.NewDatabase(t), "--lease-ttl", "3s", "--plugin-call-path", "extism-sdk")
	if r.LeaseWaitMS < 3000 {
		t.Errorf("the bench waited %.0f ms for the child's lease, want lease_ttl (3s) or more", r.LeaseWaitMS)
	}
}

func checkBenchRecovery(t *testing.T, store string, args ...string) recoveryResult {
	const runs = 20
	bin := buildBinary(t)
	args = append([]string{"--agenthost-bin", bin, "--json", "recovery", "--runs", "20", "--concurrency", "8", "--store", store}, args...)
	out, err := runBench(t, benchPluginsDir(t), args...)
	if err != nil {
		t.Fatalf("bench recovery: %v\n%s", err, out)
	}
	var got struct {
		Bench  string         `json:"bench"`
		Params recoveryParams `json:"params"`
		Result recoveryResult `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("decoding --json: %v\n%s", err, out)
	}
	r := got.Result
	if got.Bench != "recovery" || got.Params.Runs != runs || got.Params.Store != store {
		t.Errorf("bench %q with %d runs on %s, want recovery with %d on %s", got.Bench, got.Params.Runs, got.Params.Store, runs, store)
	}
	wantPath := "native"
	for i, a := range args {
		if a == "--plugin-call-path" && i+1 < len(args) {
			wantPath = args[i+1]
		}
	}
	if got.Params.PluginCallPath != wantPath {
		t.Errorf("plugin_call_path %q, want %q", got.Params.PluginCallPath, wantPath)
	}
	if !r.OK || len(r.Problems) > 0 {
		t.Errorf("the bench's checks failed: %v", r.Problems)
	}
	if r.Completed != runs || r.Failed+r.Cancelled+r.NotTerminal != 0 {
		t.Errorf("Runs completed %d, failed %d, cancelled %d, not terminal %d; want all %d completed",
			r.Completed, r.Failed, r.Cancelled, r.NotTerminal, runs)
	}
	if r.LogViolations != 0 || r.JobsRerun != 0 || r.JobsFailed != 0 {
		t.Errorf("event log violations %d, jobs run twice %d, jobs not finished %d; want 0",
			r.LogViolations, r.JobsRerun, r.JobsFailed)
	}
	var decided int64
	for _, d := range []string{"reattach", "settle", "retry", "fail", "fail_run"} {
		decided += r.Decisions[d]
	}
	if decided < runs || r.SessionsTaken < runs {
		t.Errorf("recovery decided %d effects (%v) and took over %d sessions, want at least %d of each", decided, r.Decisions, r.SessionsTaken, runs)
	}
	if r.SubmitMS <= 0 || r.OpenMS <= 0 || r.ReadyMS <= 0 || r.DecidedMS <= 0 || r.TerminalMS < r.DecidedMS || r.RunsPerSec <= 0 {
		t.Errorf("timings are not real: submit %.1f, open %.1f, ready %.1f, decided %.1f, terminal %.1f ms, %.1f Runs/s",
			r.SubmitMS, r.OpenMS, r.ReadyMS, r.DecidedMS, r.TerminalMS, r.RunsPerSec)
	}
	return r
}

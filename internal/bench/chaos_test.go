package bench

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/chaos"
	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestChaosShort is the short chaos run of docs/DESIGN.md §9: `agenthost bench
// chaos` for 60 s of faults against the built binary, which it SIGKILLs,
// SIGSTOPs and restarts with SIGTERM under load. The bench itself checks
// the invariants over every acknowledged Run and fails with the violations
// it found; the test also checks that the run showed something: a kill, a
// pause and a graceful restart survived (the first three faults are one
// of each), and Runs of every kind acknowledged.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	t.Parallel()                             // it waits on a child process most of the time
	args := chaosTestArgs(t, 60*time.Second) // of faults; plus start, drain and checks
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaos.Result `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses, %d graceful restarts, %d Runs acknowledged %v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.Restarts, r.Acknowledged, r.ByStatus, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if len(r.UnusualEnds) > 0 {
		t.Logf("Runs that ended otherwise than their kind usually does: %q", r.UnusualEnds)
	}
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Kills < 1 || r.Pauses < 1 || r.Restarts < 1 {
		t.Errorf("seed %d: %d kills, %d pauses and %d graceful restarts; want at least one of each", r.Seed, r.Kills, r.Pauses, r.Restarts)
	}
	for _, kind := range chaos.Kinds() {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

// chaosTestArgs are the args of a short chaos run of duration, or of
// AGENTHOST_CHAOS_DURATION, with the seed AGENTHOST_CHAOS_SEED if set.
func chaosTestArgs(t *testing.T, duration time.Duration, extra ...string) []string {
	t.Helper()
	if s := os.Getenv("AGENTHOST_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AGENTHOST_CHAOS_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	args := append([]string{"--agenthost-bin", buildBinary(t), "chaos", "--duration", duration.String(), "--json"}, extra...)
	if s := os.Getenv("AGENTHOST_CHAOS_SEED"); s != "" {
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("AGENTHOST_CHAOS_SEED=%q: %v", s, err)
		}
		args = append(args, "--seed", s)
	}
	return args
}

// TestChaosShortPostgres is TestChaosShort on PostgreSQL with three
// nodes: `agenthost bench chaos --store postgres --nodes 3`, which starts
// its own PostgreSQL server (fsync on) and three `serve` nodes on one
// database, for 25 s of faults under load: SIGKILL, SIGSTOP (the first
// one past the 5 s lease, so that the others take the paused node's
// sessions over and the node exits for its lost lease), SIGTERM, a
// partition of a node from PostgreSQL (past its lease: it must give the
// lease up before another node takes its sessions over, and exit) and a
// crash and restart of PostgreSQL itself. The clients submit round robin
// and follow each Run's events on another node. The bench checks the
// invariants with the same checks as on Badger, through pgstore, and
// that every event stream delivered the store's log; the test wants 0
// violations and at least one fault of each kind.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShortPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatalf("this test starts PostgreSQL: %v", err)
	}
	t.Parallel() // it waits on child processes most of the time
	args := chaosTestArgs(t, 25*time.Second, "--store", "postgres", "--nodes", "3", "--lease-ttl", "5s",
		"--fault-every", "1s-3s", "--pause", "500ms-1500ms")
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaos.Result `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses (%d past the lease), %d graceful restarts, %d PostgreSQL restarts %+v, %d partitions, %d lease-lost exits; %d Runs acknowledged %v, streams %+v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.PausesPastLease, r.Restarts, r.PgRestarts, r.PgRestartFigures, r.Partitions, r.LeaseLostExits, r.Acknowledged, r.ByStatus,
		r.Streams, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if r.Takeovers != nil {
		t.Logf("takeovers: %+v", r.Takeovers.All)
	}
	if len(r.UnusualEnds) > 0 {
		t.Logf("Runs that ended otherwise than their kind usually does: %q", r.UnusualEnds)
	}
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Store != "postgres" || r.Nodes != 3 {
		t.Errorf("seed %d: ran on %d nodes of %s, want 3 of postgres", r.Seed, r.Nodes, r.Store)
	}
	if r.Kills < 1 || r.Pauses < 1 || r.Restarts < 1 || r.PgRestarts < 1 || r.Partitions < 1 {
		t.Errorf("seed %d: %d kills, %d pauses, %d graceful restarts, %d PostgreSQL restarts and %d partitions from PostgreSQL; want at least one of each",
			r.Seed, r.Kills, r.Pauses, r.Restarts, r.PgRestarts, r.Partitions)
	}
	if r.PausesPastLease < 1 {
		t.Errorf("seed %d: no pause past the lease (the first pause lasts 1.2 to 1.6 lease TTLs, and the node must exit for its lost lease)", r.Seed)
	}
	if r.Streams.CrossNode == 0 || r.Streams.Followed == 0 {
		t.Errorf("seed %d: event streams %+v: want Runs followed to their end on a node other than the one that acknowledged them", r.Seed, r.Streams)
	}
	for _, kind := range chaos.Kinds() {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

// The partition fault is refused, saying why, where it cannot be done.
func TestChaosRefusesAPartitionWithoutPostgres(t *testing.T) {
	_, err := runBench(t, t.TempDir(), "chaos", "--faults", "partition", "--duration", "1s")
	if err == nil || !strings.Contains(err.Error(), "the partition fault cuts a node off from PostgreSQL: it needs --store postgres") {
		t.Fatalf("--faults partition on Badger: %v", err)
	}
	_, err = runBench(t, t.TempDir(), "chaos", "--faults", "cut", "--duration", "1s")
	if err == nil || !strings.Contains(err.Error(), "kill, pause, term, pgrestart and partition") {
		t.Fatalf("--faults cut: %v", err)
	}
}

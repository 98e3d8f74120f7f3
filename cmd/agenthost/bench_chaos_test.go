package main

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestChaosShort is the short chaos run of DESIGN §9: `agenthost bench
// chaos` for about a minute against the built binary, which it SIGKILLs
// and SIGSTOPs under load. The bench itself checks the invariants over
// every acknowledged Run and fails with the violations it found; the test
// also checks that the run showed something: a kill and a pause survived,
// and Runs of every kind acknowledged.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	duration := 45 * time.Second // plus start, drain and checks: about a minute
	if s := os.Getenv("AGENTHOST_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AGENTHOST_CHAOS_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	args := []string{"--agenthost-bin", buildBinary(t), "chaos", "--duration", duration.String(), "--json"}
	if s := os.Getenv("AGENTHOST_CHAOS_SEED"); s != "" {
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("AGENTHOST_CHAOS_SEED=%q: %v", s, err)
		}
		args = append(args, "--seed", s)
	}
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaosResult `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses, %d Runs acknowledged %v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.Acknowledged, r.ByStatus, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Kills < 1 || r.Pauses < 1 {
		t.Errorf("seed %d: %d kills and %d pauses; want at least one of each", r.Seed, r.Kills, r.Pauses)
	}
	for _, kind := range chaosKinds {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

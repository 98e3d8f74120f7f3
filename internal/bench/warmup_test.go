package bench

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/benchkit"
)

// countingBare is a bareRounds that counts the commits it is asked for.
type countingBare struct {
	rounds, commits atomic.Int64
	clients         atomic.Int64
}

func (b *countingBare) Round(c, n int) (time.Duration, error) {
	b.rounds.Add(1)
	b.commits.Add(int64(n))
	b.clients.Store(int64(c))
	return time.Millisecond, nil
}

func (b *countingBare) Close() error { return nil }

// TestALevelStartsWithItsWarmUpOnEveryTarget checks the untimed start of
// a level: each target runs its Runs, per client, capped, and the bare
// commits get a round of as many, at the level's concurrency; none with
// --warmup 0; and a Run that fails there ends the bench with its error.
func TestALevelStartsWithItsWarmUpOnEveryTarget(t *testing.T) {
	for _, tc := range []struct{ c, perClient, want int }{
		{1, 8, 8},
		{16, 8, 128},
		{256, 8, benchkit.MaxWarmupRuns},
		{16, 0, 0},
	} {
		var ran [2]atomic.Int64
		targets := make([]levelTarget, 2)
		for i := range targets {
			targets[i].one = func() (time.Duration, error) { ran[i].Add(1); return time.Millisecond, nil }
		}
		bare := &countingBare{}
		if err := warmUp(tc.c, tc.perClient, targets, bare); err != nil {
			t.Fatal(err)
		}
		for i := range ran {
			if got := ran[i].Load(); got != int64(tc.want) {
				t.Errorf("c %d, --warmup %d: target %d ran %d Runs, want %d", tc.c, tc.perClient, i, got, tc.want)
			}
		}
		wantRounds := int64(2)
		if tc.want == 0 {
			wantRounds = 0
		}
		if r, n := bare.rounds.Load(), bare.commits.Load(); r != wantRounds || n != wantRounds*int64(tc.want) {
			t.Errorf("c %d, --warmup %d: %d bare rounds of %d commits in all, want %d of %d each", tc.c, tc.perClient, r, n, wantRounds, tc.want)
		}
		if tc.want > 0 && bare.clients.Load() != int64(tc.c) {
			t.Errorf("c %d: bare commits from %d clients", tc.c, bare.clients.Load())
		}
	}

	boom := errors.New("boom")
	failing := []levelTarget{{one: func() (time.Duration, error) { return 0, boom }}}
	if err := warmUp(2, 1, failing, &countingBare{}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "warming up") {
		t.Errorf("a failed warm-up Run: err = %v, want boom, said to be in the warm-up", err)
	}
}

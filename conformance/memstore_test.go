package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agenthost/agenthost/runtime"
)

func TestMemStoreConformance(t *testing.T) {
	StoreSuite(t, func(t *testing.T, cfg StoreConfig) runtime.Store {
		return NewMemStore(cfg.Clock, cfg.KV)
	})
}

// MemStore writes first steps when told to, as pgstore does: the suite
// holds it to the port's rules for them.
func TestMemStoreThatStepsFirstRunsConformance(t *testing.T) {
	StoreSuite(t, func(t *testing.T, cfg StoreConfig) runtime.Store {
		s := NewMemStore(cfg.Clock, cfg.KV)
		s.StepFirstRuns(true)
		return s
	})
}

func TestMemStoreKillNodeOrphansItsSessionsAtOnce(t *testing.T) {
	ctx := context.Background()
	clock := NewFakeClock(time.Time{})
	s := NewMemStore(clock, KVLimits{})
	h := &harness{t: t, s: s, clock: clock, ctx: ctx}
	h.register("a", time.Hour)
	e := h.claim("t", "s", "a")
	h.create("t", "s", "r", "")
	s.KillNode("a")
	if err := s.RenewNode(ctx, "a", h.nowMS()+1000); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("RenewNode of a killed node: %v", err)
	}
	orphans, err := s.OrphanedSessions(ctx, h.nowMS())
	if err != nil || len(orphans) != 1 || orphans[0].Owner != "a" {
		t.Fatalf("orphans = %+v, %v", orphans, err)
	}
	h.register("b", time.Hour)
	if got := h.claim("t", "s", "b"); got != e+1 {
		t.Fatalf("takeover epoch %d, want %d", got, e+1)
	}
}

func TestMemStoreRestartKillsEveryEarlierIncarnation(t *testing.T) {
	ctx := context.Background()
	clock := NewFakeClock(time.Time{})
	s := NewMemStore(clock, KVLimits{})
	h := &harness{t: t, s: s, clock: clock, ctx: ctx}
	h.register("a", time.Hour)
	h.claim("t", "s", "a")
	h.create("t", "s", "r", "")
	s.Restart()
	if err := s.RenewNode(ctx, "a", h.nowMS()+1000); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("RenewNode after Restart: %v", err)
	}
	h.register("b", time.Hour)
	if got := h.claim("t", "s", "b"); got != 2 {
		t.Fatalf("claim after Restart: epoch %d, want 2", got)
	}
}

func TestMemStoreUnavailableKVGetIsAnErrorNotAMissingKey(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore(nil, KVLimits{})
	if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	s.SetUnavailable(true)
	v, err := s.KVGet(ctx, "t", "p", []byte("k"))
	if !errors.Is(err, runtime.ErrStoreUnavailable) || v != nil {
		t.Fatalf("KVGet on a failing store = %q, %v; want ErrStoreUnavailable", v, err)
	}
	s.SetUnavailable(false)
	if v, err := s.KVGet(ctx, "t", "p", []byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("KVGet after recovery = %q, %v", v, err)
	}
}

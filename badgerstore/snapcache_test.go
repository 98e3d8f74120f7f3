package badgerstore

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The store suite again with the snapshot cache off, so that both of
// LoadRun's paths meet it.
func TestStoreConformanceWithoutTheSnapshotCache(t *testing.T) {
	storeSuite(t, Options{SnapshotCacheBytes: -1})
}

// createRunT creates Run id, pending, in tenant t and session s.
func createRunT(t *testing.T, s *Store, id string) loop.Run {
	t.Helper()
	spec := loop.Spec{Tenant: "t", Session: "s", ID: id, Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRun(context.Background(), runtime.CreateRun{Run: r, Event: ev}); err != nil {
		t.Fatal(err)
	}
	return r
}

func snapAt(id string, seq int64) []byte {
	r := loop.Run{Spec: loop.Spec{Tenant: "t", Session: "s", ID: id}, Seq: seq}
	return runcodec.Append(nil, &r)
}

// An older snapshot never replaces a newer one, whatever order the puts
// come in; the cache stays within its bound; a dropped entry is gone.
func TestTheSnapshotCacheKeepsTheNewestWithinItsBound(t *testing.T) {
	one := len(snapAt("r0", 1))
	c := newSnapCache(3 * one)
	c.put("t", "r0", 6, snapAt("r0", 6))
	c.put("t", "r0", 5, snapAt("r0", 5))
	if r, ok, err := c.load("t", "r0"); !ok || err != nil || r.Seq != 6 {
		t.Fatalf("after puts of Seq 6 then 5: %d, %v, %v; want 6", r.Seq, ok, err)
	}
	for i, id := range []string{"r1", "r2", "r3", "r4"} {
		c.put("t", id, int64(i+1), snapAt(id, int64(i+1)))
		if c.bytes > c.max || len(c.m) > 3 {
			t.Fatalf("%d entries of %d bytes, over the bound of %d", len(c.m), c.bytes, c.max)
		}
	}
	c.drop("t", "r4")
	if _, ok, _ := c.load("t", "r4"); ok {
		t.Fatal("a dropped entry loads")
	}
	off := newSnapCache(-1)
	off.put("t", "r0", 1, snapAt("r0", 1))
	if _, ok, _ := off.load("t", "r0"); ok {
		t.Fatal("a cache that is off holds an entry")
	}
}

// The cache answers with a Run of the caller's own: changing what LoadRun
// returned changes nothing the next load returns.
func TestALoadedRunSharesNothingWithTheCache(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), Options{})
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "r", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Metadata: []byte(`{"k":"v"}`)}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev}); err != nil {
		t.Fatal(err)
	}
	first, err := s.LoadRun(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	first.Metadata[2] = 'X'
	again, err := s.LoadRun(ctx, "t", "r")
	if err != nil || !reflect.DeepEqual(again, r) {
		t.Fatalf("the second load: %s, %v; want %s", again.Metadata, err, r.Metadata)
	}
}

// A load that begins once a commit is visible in Badger sees it, even
// before the commit has put its snapshot in the cache: a follower that
// read the Run's new events, then the Run, got the version before them
// (seen as a stream that ended on run_completed while GET /v1/runs/{id}
// answered running, under load).
func TestALoadAfterACommitIsVisibleSeesIt(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := openT(t, t.TempDir(), Options{Clock: clock})
	r := createRunT(t, s, "r")
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != 1 {
		t.Fatalf("load: %d, %v", got.Seq, err)
	}
	visible, release := make(chan struct{}), make(chan struct{})
	s.afterCommitWrite = func() { close(visible); <-release }
	start := loop.Event{Type: loop.EventRunStarted, Seq: 2, At: 2}
	next, err := loop.Apply(r, start)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Commit(ctx, runtime.Commit{Tenant: "t", Session: "s", RunID: "r", CommandID: "c", ExpectedSeq: 1, Events: []loop.Event{start}, Run: next})
		done <- err
	}()
	<-visible
	evs, err := s.Events(ctx, "t", "r", 2, 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("the commit's event is not visible: %v, %v", evs, err)
	}
	got, err := s.LoadRun(ctx, "t", "r")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil || got.Seq != 2 {
		t.Fatalf("a load after the commit's event was read: Seq %d, %v; want 2", got.Seq, err)
	}
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != 2 {
		t.Fatalf("a load after the commit returned: Seq %d, %v; want 2", got.Seq, err)
	}
}

// A claim caches the active Runs it read, so that the claimant's drives
// load them without a Badger transaction.
func TestAClaimCachesTheRunsItRead(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	dir := t.TempDir()
	s, err := Open(dir, Options{Clock: clock, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	createRunT(t, s, "r")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{Clock: clock})
	now := clock.Now().UnixMilli()
	if err := s.RegisterNode(ctx, "n", now+60_000); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.snaps.load("t", "r"); ok {
		t.Fatal("a fresh open has the Run cached")
	}
	claims, err := s.ClaimSessions(ctx, "n", now, []runtime.SessionRef{{Tenant: "t", Session: "s"}})
	if err != nil || len(claims) != 1 || claims[0].Err != nil || len(claims[0].Active) != 1 {
		t.Fatalf("claim: %+v, %v", claims, err)
	}
	got, ok, err := s.snaps.load("t", "r")
	if !ok || err != nil || !reflect.DeepEqual(got, claims[0].Active[0]) {
		t.Fatalf("after the claim the cache holds %+v (%v, %v); want the Run the claim read", got, ok, err)
	}
}

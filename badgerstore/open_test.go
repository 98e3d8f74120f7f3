package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func openT(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func wantOpenError(t *testing.T, dir string, parts ...string) {
	t.Helper()
	s, err := Open(dir, Options{Logger: quietLogger()})
	if err == nil {
		_ = s.Close()
		t.Fatalf("Open %s succeeded; want an error containing %q", dir, parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("Open %s: %v\nwant it to contain %q", dir, err, p)
		}
	}
	if !strings.HasPrefix(err.Error(), "badgerstore: ") {
		t.Fatalf("error does not start with the package name: %v", err)
	}
}

func TestOpenInitialisesAMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := openT(t, dir, Options{})
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); err != nil {
		t.Fatalf("no MANIFEST after Open: %v", err)
	}
	if s.generation != 1 {
		t.Fatalf("first open generation = %d", s.generation)
	}
}

func TestOpenRefusesADirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{})
	wantOpenError(t, dir, "another agenthost process is using "+dir)
}

func TestOpenRefusesANonBadgerDirectoryAndLeavesItAlone(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantOpenError(t, dir, "not a Badger directory", "notes.txt")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("Open wrote into a directory it refused: %v", entries)
	}
}

func TestOpenRefusesADamagedDirectory(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := os.WriteFile(filepath.Join(dir, badger.ManifestFilename), []byte("this is not a manifest at all"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantOpenError(t, dir, "damaged", dir)
}

func TestOpenRefusesABadgerDatabaseThatIsNotAnAgenthostStore(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("someone"), []byte("else")) }); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	wantOpenError(t, dir, "not an agenthost store")
}

func TestOpenRefusesAnUnknownFormatVersion(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	newer := strconv.Itoa(formatVersion + 1)
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set(metaKey(metaFormat), []byte(newer)) }); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	wantOpenError(t, dir, `format "`+newer+`"`, fmt.Sprintf("reads formats %d to %d", oldestFormat, formatVersion))
}

// Reopening the directory proves every earlier incarnation is gone: their
// sessions are orphans at once, long before their leases run out.
func TestReopenMakesEveryEarlierIncarnationDead(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := conformance.NewFakeClock(time.Time{})
	now := func() int64 { return clock.Now().UnixMilli() }
	s, err := Open(dir, Options{Logger: quietLogger(), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterNode(ctx, "a", now()+time.Hour.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	epoch, err := s.ClaimSession(ctx, "t", "s", "a", now())
	if err != nil {
		t.Fatal(err)
	}
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "r", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, now())
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev}); err != nil {
		t.Fatal(err)
	}
	if orphans, _ := s.OrphanedSessions(ctx, now()); len(orphans) != 0 {
		t.Fatalf("orphans while a lives = %+v", orphans)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, dir, Options{Clock: clock})
	if s.generation != 2 {
		t.Fatalf("second open generation = %d", s.generation)
	}
	orphans, err := s.OrphanedSessions(ctx, now())
	if err != nil || len(orphans) != 1 || orphans[0].Owner != "a" || orphans[0].Epoch != epoch {
		t.Fatalf("orphans after reopen = %+v, %v; want t/s owned by a", orphans, err)
	}
	if err := s.RenewNode(ctx, "a", now()+time.Hour.Milliseconds()); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("RenewNode of the previous incarnation: %v, want ErrNodeExpired", err)
	}
	if err := s.RegisterNode(ctx, "b", now()+time.Hour.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	got, err := s.ClaimSession(ctx, "t", "s", "b", now())
	if err != nil || got != epoch+1 {
		t.Fatalf("takeover after reopen: epoch %d, %v; want %d", got, err, epoch+1)
	}
	if loaded, err := s.LoadRun(ctx, "t", "r"); err != nil || loaded.Seq != 1 {
		t.Fatalf("run after reopen: %+v, %v", loaded, err)
	}
}

func TestValueLogGCGoroutineStopsOnClose(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: quietLogger(), GCInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 50 {
		if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte(strings.Repeat("x", 1+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.gcDone:
	default:
		t.Fatal("the GC goroutine is still running after Close")
	}
}

package badgerstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

func (s *Store) kvViewsOpened() uint64 {
	s.kvView.mu.Lock()
	defer s.kvView.mu.Unlock()
	return s.kvView.opened
}

// KV reads share one Badger transaction until a KV write begins or the
// view ages out; a Run's commit, which writes no KV key, leaves it. Each
// read still answers what the store holds.
func TestKVReadsShareAViewUntilAKVWrite(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := openT(t, t.TempDir(), Options{Clock: clock})
	get := func(plugin, key, want string) {
		t.Helper()
		v, err := s.KVGet(ctx, "t", plugin, []byte(key))
		if err != nil || string(v) != want {
			t.Fatalf("get %s/%s: %q, %v; want %q", plugin, key, v, err, want)
		}
	}
	views := func(want uint64) {
		t.Helper()
		if got := s.kvViewsOpened(); got != want {
			t.Fatalf("views opened: %d, want %d", got, want)
		}
	}
	if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		get("p", "k", "v1")
		get("p", "missing", "")
	}
	views(1)

	createRunT(t, s, "r")
	get("p", "k", "v1")
	views(1)

	if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte("v2")); err != nil {
		t.Fatal(err)
	}
	get("p", "k", "v2")
	views(2)
	if err := s.KVSet(ctx, "t", "other", []byte("k"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	get("other", "k", "x")
	get("p", "k", "v2")
	views(3)
	if err := s.KVDelete(ctx, "t", "p", []byte("k")); err != nil {
		t.Fatal(err)
	}
	get("p", "k", "")
	views(4)

	clock.Advance(kvViewMaxAge - time.Millisecond)
	get("other", "k", "x")
	views(4)
	clock.Advance(time.Millisecond)
	get("other", "k", "x")
	views(5)
}

// A KV read through a shared view is linearizable: it returns at least
// the value of every write that returned before it began, and only values
// some write wrote. Writers bump counters while readers check them.
func TestKVReadsThroughTheViewSeeEveryWriteThatReturned(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), Options{Clock: conformance.NewFakeClock(time.Unix(1_700_000_000, 0))})
	const keys, writes = 4, 150
	var acked, begun [keys]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := int64(1); v <= writes; v++ {
				begun[k].Store(v)
				if err := s.KVSet(ctx, "t", "p", []byte(strconv.Itoa(k)), []byte(strconv.FormatInt(v, 10))); err != nil {
					errs <- err
					return
				}
				acked[k].Store(v)
			}
		}()
	}
	var stop atomic.Bool
	var readers sync.WaitGroup
	for i := range 6 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for n := 0; !stop.Load(); n++ {
				k := (n + i) % keys
				floor := acked[k].Load()
				v, err := s.KVGet(ctx, "t", "p", []byte(strconv.Itoa(k)))
				ceil := begun[k].Load()
				if err != nil {
					errs <- err
					return
				}
				got := int64(0)
				if len(v) > 0 {
					if got, err = strconv.ParseInt(string(v), 10, 64); err != nil {
						errs <- fmt.Errorf("key %d holds %q", k, v)
						return
					}
				}
				if got < floor || got > ceil {
					errs <- fmt.Errorf("key %d read %d; writes returned up to %d before the read, began up to %d after it", k, got, floor, ceil)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		v, err := s.KVGet(ctx, "t", "p", []byte(strconv.Itoa(k)))
		if err != nil || !bytes.Equal(v, []byte(strconv.Itoa(writes))) {
			t.Fatalf("key %d at the end: %q, %v; want %d", k, v, err, writes)
		}
	}
}

// Close with a view open discards it; the directory opens again with the
// values in it.
func TestCloseWithAKVViewOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, Options{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KVGet(ctx, "t", "p", []byte("k")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{})
	if v, err := s.KVGet(ctx, "t", "p", []byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("after a reopen: %q, %v", v, err)
	}
}

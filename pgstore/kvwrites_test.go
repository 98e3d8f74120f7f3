package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/runtime"
)

func holdFirstKVBatch(t *testing.T, s *Store) *heldBatches {
	h := newHeldBatches(t)
	s.kvBatchHook = func(_, _ string, n int) { h.hook(n) }
	return h
}

// untilQueued waits until n writes of (t, p) wait behind the held batch.
func untilQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	untilCount(t, "KV writes queued", n, s.kvQueueOf("t", "p").len)
}

func openKVStore(t *testing.T, quota int64) *Store {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	s, err := Open(context.Background(), Options{DSN: dsn, Schema: freshSchema(t, dsn), Logger: quietLogger(), KVQuotaBytes: quota})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The KV writes of one plugin that queue while a transaction writes share
// the next one: 64 writers at once make two commits, not 64, and each
// write lands. (Each was a synced commit of its own, one behind the other
// under the plugin's usage lock.)
func TestKVWritesOfOnePluginShareATransaction(t *testing.T) {
	s := openKVStore(t, 1<<20)
	h := holdFirstKVBatch(t, s)
	ctx := context.Background()
	const writers = 64
	errs := make(chan error, writers)
	write := func(i int) {
		errs <- s.KVSet(ctx, "t", "p", fmt.Appendf(nil, "k%02d", i), []byte(strings.Repeat("v", i+1)))
	}
	go write(0)
	<-h.entered
	for i := 1; i < writers; i++ {
		go write(i)
	}
	untilQueued(t, s, writers-1)
	h.release()
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := h.batchSizes(); len(got) != 2 || got[0] != 1 || got[1] != writers-1 {
		t.Fatalf("batches of %v writes; want [1 %d]", got, writers-1)
	}
	if n := s.kvCommits.Load(); n != 2 {
		t.Fatalf("%d KV commits; want 2", n)
	}
	var want int64
	for i := range writers {
		v, err := s.KVGet(ctx, "t", "p", fmt.Appendf(nil, "k%02d", i))
		if err != nil || len(v) != i+1 {
			t.Fatalf("k%02d = %q, %v; want %d bytes", i, v, err, i+1)
		}
		want += int64(3 + i + 1)
	}
	var usage int64
	if err := s.pool.QueryRow(ctx, `SELECT bytes FROM kv_usage WHERE tenant = 't' AND plugin = 'p'`).Scan(&usage); err != nil || usage != want {
		t.Fatalf("usage %d (%v); want %d", usage, err, want)
	}
}

// In one transaction the writes are judged in the order they came, as
// one at a time: a key set, deleted and set again ends with its last
// value, a write past the quota is refused alone, and a delete frees the
// quota for the writes after it.
func TestKVWritesInOneTransactionAreJudgedInOrder(t *testing.T) {
	s := openKVStore(t, 100)
	h := holdFirstKVBatch(t, s)
	ctx := context.Background()
	type write struct {
		key, value string
		want       error
	}
	writes := []write{ // after the held write's 5 bytes:
		{"a", strings.Repeat("1", 40), nil},                // 46 used
		{"a", "", nil},                                     // deleted: 5
		{"b", strings.Repeat("2", 59), nil},                // 65
		{"c", strings.Repeat("3", 40), runtime.ErrKVQuota}, // 106 would pass 100
		{"a", strings.Repeat("4", 34), nil},                // 100, the quota
		{"b", "", nil},                                     // 40
		{"c", strings.Repeat("5", 40), nil},                // 81
	}
	errs := make([]chan error, len(writes)+1)
	for i := range errs {
		errs[i] = make(chan error, 1)
	}
	go func() { errs[0] <- s.KVSet(ctx, "t", "p", []byte("lead"), []byte("x")) }() // 5 bytes, held
	<-h.entered
	for i, w := range writes {
		go func() { errs[i+1] <- s.KVSet(ctx, "t", "p", []byte(w.key), []byte(w.value)) }()
		untilQueued(t, s, i+1) // queued in this order
	}
	h.release()
	if err := <-errs[0]; err != nil {
		t.Fatal(err)
	}
	for i, w := range writes {
		err := <-errs[i+1]
		if w.want == nil && err != nil || w.want != nil && !errors.Is(err, w.want) {
			t.Fatalf("write %d (%s = %d bytes): %v; want %v", i, w.key, len(w.value), err, w.want)
		}
	}
	if got := h.batchSizes(); len(got) != 2 || got[1] != len(writes) {
		t.Fatalf("batches of %v writes; want the %d in one", got, len(writes))
	}
	for key, want := range map[string]string{"a": strings.Repeat("4", 34), "b": "", "c": strings.Repeat("5", 40)} {
		v, err := s.KVGet(ctx, "t", "p", []byte(key))
		if err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v; want %q", key, v, err, want)
		}
	}
	var usage int64
	if err := s.pool.QueryRow(ctx, `SELECT bytes FROM kv_usage WHERE tenant = 't' AND plugin = 'p'`).Scan(&usage); err != nil || usage != 81 {
		t.Fatalf("usage %d (%v); want 81", usage, err)
	}
}

// A writer whose context ends while its write waits in the queue takes
// it out: nothing is written, and the writes behind it are.
func TestAKVWriteWithdrawnFromTheQueueIsNotWritten(t *testing.T) {
	s := openKVStore(t, 1<<20)
	h := holdFirstKVBatch(t, s)
	ctx := context.Background()
	lead := make(chan error, 1)
	go func() { lead <- s.KVSet(ctx, "t", "p", []byte("lead"), []byte("x")) }()
	<-h.entered
	wctx, cancel := context.WithCancel(ctx)
	withdrawn := make(chan error, 1)
	go func() { withdrawn <- s.KVSet(wctx, "t", "p", []byte("gone"), []byte("x")) }()
	untilQueued(t, s, 1)
	after := make(chan error, 1)
	go func() { after <- s.KVSet(ctx, "t", "p", []byte("kept"), []byte("x")) }()
	untilQueued(t, s, 2)
	cancel()
	if err := <-withdrawn; !errors.Is(err, context.Canceled) || !errors.Is(err, runtime.ErrStoreUnavailable) {
		t.Fatalf("the withdrawn write: %v; want the context's error", err)
	}
	h.release()
	for _, ch := range []chan error{lead, after} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for key, want := range map[string]string{"lead": "x", "gone": "", "kept": "x"} {
		if v, err := s.KVGet(ctx, "t", "p", []byte(key)); err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v; want %q", key, v, err, want)
		}
	}
}

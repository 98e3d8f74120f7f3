package conformance

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/runtime"
)

// The StoreSuite case here holds a store's plugin KV to its limits and
// quota, alone and under concurrent writers.

func testKV(t *testing.T, h *harness) {
	get := func(tenant, plugin, key string) string {
		t.Helper()
		v, err := h.s.KVGet(h.ctx, tenant, plugin, []byte(key))
		if err != nil {
			t.Fatalf("KVGet %s/%s/%s: %v", tenant, plugin, key, err)
		}
		if v == nil {
			return "<nil>"
		}
		return string(v)
	}
	set := func(key string, n int) error {
		return h.s.KVSet(h.ctx, "t", "p", []byte(key), []byte(strings.Repeat("v", n)))
	}
	if got := get("t", "p", "missing"); got != "<nil>" {
		t.Fatalf("missing key = %q", got)
	}
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if got := get("t", "p", "k"); got != "v1" {
		t.Fatalf("k = %q", got)
	}
	buf := []byte("v2")
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), buf); err != nil {
		t.Fatal(err)
	}
	buf[0] = 'X' // the store keeps its own copy
	if got := get("t", "p", "k"); got != "v2" {
		t.Fatalf("k after overwrite = %q", got)
	}
	// An empty value deletes.
	if err := h.s.KVSet(h.ctx, "t", "p", []byte("k"), nil); err != nil {
		t.Fatal(err)
	}
	if got := get("t", "p", "k"); got != "<nil>" {
		t.Fatalf("k after an empty set = %q", got)
	}
	h.wantErr(set("big", suiteKVMaxValue+1), runtime.ErrKVTooLarge, "value over the limit")
	h.wantErr(set(strings.Repeat("k", suiteKVMaxKey+1), 1), runtime.ErrKVTooLarge, "key over the limit")
	if err := set("edge", suiteKVMaxValue); err != nil {
		t.Fatalf("a value at the limit: %v", err)
	}
	// Quota: len(key)+len(value) summed over the plugin's keys.
	steps := []struct {
		key  string
		n    int
		want error
		used int
	}{
		{"k1", 60, nil, 68 + 62},
		{"k2", 64, nil, 130 + 66},
		{"k3", 2, nil, 200}, // exactly at the quota
		{"k4", 1, runtime.ErrKVQuota, 200},
		{"k1", 10, nil, 200 - 62 + 12}, // shrinking an entry frees quota
		{"k4", 1, nil, 150 + 3},
	}
	for _, st := range steps {
		err := set(st.key, st.n)
		if st.want == nil && err != nil {
			t.Fatalf("set %s (%d bytes) at %d used: %v", st.key, st.n, st.used, err)
		}
		if st.want != nil {
			h.wantErr(err, st.want, fmt.Sprintf("set %s (%d bytes) past the quota", st.key, st.n))
			if got := get("t", "p", st.key); got != "<nil>" {
				t.Fatalf("a refused write was stored: %s = %q", st.key, got)
			}
		}
	}
	// Deleting frees quota: 153 - 68 = 85, room for another 64-byte value.
	if err := h.s.KVDelete(h.ctx, "t", "p", []byte("edge")); err != nil {
		t.Fatal(err)
	}
	if err := h.s.KVDelete(h.ctx, "t", "p", []byte("never-set")); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := set("late", 64); err != nil {
		t.Fatalf("a write after a delete freed quota: %v", err)
	}
	h.wantErr(set("more", 64), runtime.ErrKVQuota, "a write past the quota again")
	// The quota is per (tenant, plugin).
	if err := h.s.KVSet(h.ctx, "t", "p2", []byte("late"), []byte(strings.Repeat("v", 64))); err != nil {
		t.Fatalf("another plugin's quota: %v", err)
	}
	if err := h.s.KVSet(h.ctx, "t2", "p", []byte("late"), []byte(strings.Repeat("v", 64))); err != nil {
		t.Fatalf("another tenant's quota: %v", err)
	}
	// Binary keys, and the empty key, are keys like any other.
	for _, k := range []string{"", "\x00", "a\x00b"} {
		if err := h.s.KVSet(h.ctx, "t", "p3", []byte(k), []byte("x"+k)); err != nil {
			t.Fatalf("KVSet %q: %v", k, err)
		}
	}
	for _, k := range []string{"", "\x00", "a\x00b"} {
		if got := get("t", "p3", k); got != "x"+k {
			t.Fatalf("KVGet %q = %q", k, got)
		}
	}
	err := h.s.KVSet(h.ctx, "t", "", []byte("k"), []byte("v"))
	h.wantErr(err, runtime.ErrInvalidRequest, "KVSet with an empty plugin name")

	// Many writers of one plugin at once (a pool of instances) all
	// succeed, and the usage stays exact: 32 writers overwrite and delete
	// their own keys 20 times, then exactly the rest of the quota fits.
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("c%02d", w)) // 3 bytes
			for i := 0; i < 20; i++ {
				val := []byte(strings.Repeat("v", 1+i%2))
				if i%5 == 4 {
					val = nil // a delete now and then
				}
				if err := h.s.KVSet(h.ctx, "t", "pc", key, val); err != nil {
					errs <- fmt.Errorf("writer %d, write %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent KV writers of one plugin: %v", err)
	}
	// Every key ends with write 19, a delete: the plugin holds nothing,
	// so 3 entries of 66 bytes and one of 2 fill the 200-byte quota
	// exactly, and one more is refused.
	for _, k := range []string{"f1", "f2", "f3"} {
		if err := h.s.KVSet(h.ctx, "t", "pc", []byte(k), []byte(strings.Repeat("v", suiteKVMaxValue))); err != nil {
			t.Fatalf("after concurrent writes that deleted everything, the whole quota must fit: %s: %v", k, err)
		}
	}
	if err := h.s.KVSet(h.ctx, "t", "pc", []byte("g"), []byte("v")); err != nil {
		t.Fatalf("the last 2 bytes of the quota: %v", err)
	}
	err = h.s.KVSet(h.ctx, "t", "pc", []byte("h"), []byte("v"))
	h.wantErr(err, runtime.ErrKVQuota, "2 bytes past the quota after concurrent writes")
}

package badgerstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// formatOneRecord is a run record as format 1 wrote it: the header's JSON
// and the snapshot's JSON.
func formatOneRecord(t *testing.T, h runHeader, r loop.Run) []byte {
	t.Helper()
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.AppendUvarint(nil, uint64(len(hb)))
	return append(append(out, hb...), snap...)
}

// TestAFormatOneStoreIsReadAndMoved: a directory whose run records are
// format 1's JSON opens, its Runs load as they were, a commit rewrites a
// record in the binary form with the tenant's stored bytes still exact,
// and the directory is moved to the current format (formatVersion).
func TestAFormatOneStoreIsReadAndMoved(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := conformance.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := openT(t, dir, Options{Clock: clock})
	now := clock.Now().UnixMilli()
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "r", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Metadata: json.RawMessage(`{"k":"v"}`), Tools: []loop.ToolSpec{{Name: "calc", Policy: loop.DefaultToolPolicy(false)}}}
	ev := loop.RunCreated(spec, now)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev}); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterNode(ctx, "a", now+60_000); err != nil {
		t.Fatal(err)
	}
	epoch, err := s.ClaimSession(ctx, "t", "s", "a", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Rewrite the record, and the format, as format 1 had them; the stored
	// bytes count the JSON snapshot, as format 1 counted it.
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		b, _, err := getRecord(txn, "t", "r")
		if err != nil {
			return err
		}
		h, _, err := decodeRecord(b)
		if err != nil {
			return err
		}
		snap, _ := json.Marshal(r)
		evb, _ := json.Marshal(ev)
		held := int64(len(snap) + len(evb))
		h.StoredBytes = &held
		if err := txn.Set(runKey("t", "r"), formatOneRecord(t, h, r)); err != nil {
			return err
		}
		return txn.Set(metaKey(metaFormat), []byte("1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()

	s = openT(t, dir, Options{Clock: clock})
	loaded, err := s.LoadRun(ctx, "t", "r")
	if err != nil {
		t.Fatalf("load a format-1 record: %v", err)
	}
	if !reflect.DeepEqual(loaded, r) {
		t.Fatalf("a format-1 record loads as %+v, want %+v", loaded, r)
	}
	snapJSON, _ := json.Marshal(r)
	evJSON, _ := json.Marshal(ev)
	if got, err := s.TenantStoredBytes(ctx, "t"); err != nil || got != int64(len(snapJSON)+len(evJSON)) {
		t.Fatalf("stored bytes of the format-1 Run = %d, %v; want %d", got, err, len(snapJSON)+len(evJSON))
	}
	start := loop.Event{Type: loop.EventRunStarted, Seq: 2, At: now}
	next, err := loop.Apply(r, start)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, runtime.Commit{Tenant: "t", Session: "s", RunID: "r", CommandID: "c1", ExpectedSeq: 1, Epoch: epoch,
		Events: []loop.Event{start}, Run: next}); err != nil {
		t.Fatalf("commit to a format-1 record: %v", err)
	}
	err = s.db.View(func(txn *badger.Txn) error {
		b, _, err := getRecord(txn, "t", "r")
		if err != nil {
			return err
		}
		hb, snap, err := splitRecord(b)
		if err != nil {
			return err
		}
		if !runcodec.IsBinary(hb) || !runcodec.IsBinary(snap) {
			t.Errorf("the commit left the record in JSON (header %q…)", hb[:min(8, len(hb))])
		}
		item, err := txn.Get(metaKey(metaFormat))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if want := strconv.Itoa(formatVersion); string(v) != want {
				t.Errorf("store format after the open = %q, want %s", v, want)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	startJSON, _ := json.Marshal(start)
	want := int64(len(runcodec.Append(nil, &next)) + len(evJSON) + len(startJSON) + len("c1"))
	if got, err := s.TenantStoredBytes(ctx, "t"); err != nil || got != want {
		t.Fatalf("stored bytes after the commit = %d, %v; want %d", got, err, want)
	}
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || !reflect.DeepEqual(got, next) {
		t.Fatalf("after the commit: %+v, %v", got, err)
	}
}

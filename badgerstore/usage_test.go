package badgerstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// twins applies the same writes to a Badger store and to a MemStore, the
// reference whose stored bytes are counted from the data itself.
type twins struct {
	t   *testing.T
	ctx context.Context
	bs  *Store
	ms  *conformance.MemStore
}

func (w *twins) create(tenant, id, cmd string) loop.Run {
	w.t.Helper()
	spec := loop.Spec{Tenant: tenant, Session: "s", ID: id, Input: "a question of some length",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		w.t.Fatal(err)
	}
	ev.Seq = 1
	for _, s := range []runtime.Store{w.bs, w.ms} {
		if _, err := s.CreateRun(w.ctx, runtime.CreateRun{Run: r, Event: ev, CommandID: cmd}); err != nil {
			w.t.Fatal(err)
		}
	}
	return r
}

func (w *twins) commit(r loop.Run, cmd string, at int64, evs ...loop.Event) loop.Run {
	w.t.Helper()
	c := runtime.Commit{Tenant: r.Tenant, Session: r.Session, RunID: r.ID, CommandID: cmd, ExpectedSeq: r.Seq}
	for _, ev := range evs {
		ev.At = at
		next, err := loop.Apply(r, ev)
		if err != nil {
			w.t.Fatalf("apply %s: %v", ev.Type, err)
		}
		ev.Seq = next.Seq
		c.Events = append(c.Events, ev)
		r = next
	}
	c.Run = r
	for _, s := range []runtime.Store{w.bs, w.ms} {
		if _, err := s.Commit(w.ctx, c); err != nil {
			w.t.Fatal(err)
		}
	}
	return r
}

// same fails unless both stores count the same stored bytes for tenant.
func (w *twins) same(tenant, when string) int64 {
	w.t.Helper()
	want, err := w.ms.TenantStoredBytes(w.ctx, tenant)
	if err != nil {
		w.t.Fatal(err)
	}
	got, err := w.bs.TenantStoredBytes(w.ctx, tenant)
	if err != nil {
		w.t.Fatal(err)
	}
	if got != want || want == 0 {
		w.t.Fatalf("%s: Badger counts %d stored bytes for %s, the data holds %d", when, got, tenant, want)
	}
	return got
}

// TestStoredBytesOfRecordsWrittenBeforeTheFigure holds the stored bytes of
// a store whose run records carry no figure (written before headers kept
// it) to the data: counted from the Runs' keys when the store is opened
// again, lowered by Prune of those Runs, and kept by commits to them.
func TestStoredBytesOfRecordsWrittenBeforeTheFigure(t *testing.T) {
	dir := t.TempDir()
	w := &twins{t: t, ctx: context.Background(), bs: openT(t, dir, Options{}), ms: conformance.NewMemStore(nil, conformance.KVLimits{})}
	var runs []loop.Run
	for i := range 6 {
		cmd := ""
		if i%2 == 0 {
			cmd = fmt.Sprintf("create-%d", i)
		}
		r := w.create("t", fmt.Sprintf("r%d", i), cmd)
		r = w.commit(r, fmt.Sprintf("start-%d", i), 2, loop.Event{Type: loop.EventRunStarted},
			loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: json.RawMessage(`{"model":"test"}`)})
		runs = append(runs, r)
	}
	// Two of them to the end, for Prune.
	for _, i := range []int{0, 1} {
		eff := loop.ModelEffectID(runs[i].ID, 1)
		r := w.commit(runs[i], "", 3, loop.Event{Type: loop.EventEffectDispatched, EffectID: eff, Attempt: 1})
		r = w.commit(r, loop.SettleCommandID(eff, 1), 4, loop.Settled(eff, 1, loop.Outcome{State: loop.OutcomeDone,
			Model: &abi.ModelOutcome{Message: abi.Message{Content: "an answer"}}}, 0))
		w.commit(r, "", 5, loop.Event{Type: loop.EventRunCompleted})
	}
	w.create("u", "other", "create-other")
	before := w.same("t", "as written")
	if err := w.bs.Close(); err != nil {
		t.Fatal(err)
	}

	// Strip the figure from every run record, as an older agenthost wrote
	// them, and open the store again.
	w.bs = openT(t, dir, Options{})
	stripped := 0
	err := w.bs.db.Update(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: newKey(tRun)})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(newKey(tRun)); it.Next() {
			b, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			h, err := decodeHeader(b)
			if err != nil {
				return err
			}
			_, snap, _ := splitRecord(b)
			h.StoredBytes = nil
			rec, err := encodeRecord(h, snap)
			if err != nil {
				return err
			}
			if err := txn.Set(it.Item().KeyCopy(nil), rec); err != nil {
				return err
			}
			stripped++
		}
		return nil
	})
	if err != nil || stripped != 7 {
		t.Fatalf("stripping the headers: %d records, %v", stripped, err)
	}
	if err := w.bs.Close(); err != nil {
		t.Fatal(err)
	}
	w.bs = openT(t, dir, Options{})
	if got := w.same("t", "counted from the keys after a reopen"); got != before {
		t.Fatalf("after a reopen: %d stored bytes, before it %d", got, before)
	}

	// Prune of old records, then commits to them.
	for _, s := range []runtime.Store{w.bs, w.ms} {
		if st, err := s.Prune(w.ctx, 10); err != nil || st.Runs != 2 {
			t.Fatalf("Prune = %+v, %v; want 2 Runs", st, err)
		}
	}
	w.same("t", "after Prune")
	w.commit(runs[2], "late", 6, loop.Event{Type: loop.EventEffectDispatched, EffectID: loop.ModelEffectID(runs[2].ID, 1), Attempt: 1})
	w.commit(runs[3], "", 6, loop.Event{Type: loop.EventEffectDispatched, EffectID: loop.ModelEffectID(runs[3].ID, 1), Attempt: 1})
	after := w.same("t", "after commits to records without the figure")
	if err := w.bs.Close(); err != nil {
		t.Fatal(err)
	}
	w.bs = openT(t, dir, Options{})
	if got := w.same("t", "after the last reopen"); got != after {
		t.Fatalf("after the last reopen: %d stored bytes, before it %d", got, after)
	}
	w.same("u", "tenant u")
}

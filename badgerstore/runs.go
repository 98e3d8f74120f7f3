package badgerstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// runHeader is the part of a run record the indexes are derived from, so
// that a Commit updates them without decoding the previous snapshot.
type runHeader struct {
	Ordinal   int64                  `json:"ordinal"`
	Session   string                 `json:"session"`
	Status    loop.Status            `json:"status"`
	Seq       int64                  `json:"seq"`
	UpdatedAt int64                  `json:"updated_at"`
	CreateCmd string                 `json:"create_cmd,omitempty"`
	Executing []runtime.EffectRecord `json:"executing,omitempty"`
	// StoredBytes is what the Run holds in the store, as
	// runtime.Store.TenantStoredBytes counts it: its snapshot's JSON, its
	// events' and its command IDs. It is nil in a record written before
	// the figure was kept; storedBytesOf then counts it from the Run's
	// keys, and the Run's next write records it.
	StoredBytes *int64 `json:"stored_bytes,omitempty"`
}

func headerOf(r loop.Run, ordinal int64, createCmd string, storedBytes int64) runHeader {
	return runHeader{Ordinal: ordinal, Session: r.Session, Status: r.Status, Seq: r.Seq, UpdatedAt: r.UpdatedAt,
		CreateCmd: createCmd, Executing: runtime.ExecutingRecords(r), StoredBytes: &storedBytes}
}

// encodeRecord frames a run record: uvarint(len(header)), the header,
// then the snapshot, both in the binary form (internal/runcodec: a
// version byte, then the fields). Records written before it hold JSON
// for both, which starts with '{': decodeHeader and decodeRecord read
// either, and the next write of the Run rewrites it in the binary form.
func encodeRecord(h runHeader, snapshot []byte) ([]byte, error) {
	w := runcodec.Writer{B: make([]byte, 0, 64+len(snapshot))}
	w.B = append(w.B, 0) // room for the header's length, patched below
	w.B = append(w.B, runcodec.Version1)
	w.Int(h.Ordinal)
	w.String(h.Session)
	w.String(string(h.Status))
	w.Int(h.Seq)
	w.Int(h.UpdatedAt)
	w.String(h.CreateCmd)
	w.Count(len(h.Executing), h.Executing == nil)
	for _, e := range h.Executing {
		w.String(e.Tenant)
		w.String(e.Session)
		w.String(e.RunID)
		w.String(e.EffectID)
		w.Int(int64(e.Attempt))
		w.String(e.Handle)
		w.Uint(e.Epoch)
	}
	w.Bool(h.StoredBytes != nil)
	if h.StoredBytes != nil {
		w.Int(*h.StoredBytes)
	}
	hlen := len(w.B) - 1
	out := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+hlen+len(snapshot)), uint64(hlen))
	out = append(out, w.B[1:]...)
	return append(out, snapshot...), nil
}

func splitRecord(b []byte) (header, snapshot []byte, err error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < n {
		return nil, nil, errors.New("badgerstore: malformed run record")
	}
	return b[w : w+int(n)], b[w+int(n):], nil
}

func decodeHeader(b []byte) (runHeader, error) {
	hb, _, err := splitRecord(b)
	if err != nil {
		return runHeader{}, err
	}
	var h runHeader
	if !runcodec.IsBinary(hb) {
		if err := json.Unmarshal(hb, &h); err != nil {
			return runHeader{}, fmt.Errorf("badgerstore: run record header: %w", err)
		}
		return h, nil
	}
	rd := runcodec.Reader{B: hb[1:]}
	h.Ordinal = rd.Int()
	h.Session = rd.String()
	h.Status = loop.Status(rd.String())
	h.Seq = rd.Int()
	h.UpdatedAt = rd.Int()
	h.CreateCmd = rd.String()
	if n, isNil := rd.Count(7); !isNil {
		h.Executing = make([]runtime.EffectRecord, n)
		for i := range h.Executing {
			h.Executing[i] = runtime.EffectRecord{Tenant: rd.String(), Session: rd.String(), RunID: rd.String(),
				EffectID: rd.String(), Attempt: int(rd.Int()), Handle: rd.String(), Epoch: rd.Uint()}
		}
	}
	if rd.Bool() {
		n := rd.Int()
		h.StoredBytes = &n
	}
	if rd.Err == nil && len(rd.B) != 0 {
		rd.Err = fmt.Errorf("%d bytes after its end", len(rd.B))
	}
	if rd.Err != nil {
		return runHeader{}, fmt.Errorf("badgerstore: run record header: %w", rd.Err)
	}
	return h, nil
}

func decodeRecord(b []byte) (runHeader, loop.Run, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return h, loop.Run{}, err
	}
	_, rb, _ := splitRecord(b)
	r, err := runcodec.Unmarshal(rb)
	if err != nil {
		return h, r, fmt.Errorf("badgerstore: run snapshot: %w", err)
	}
	return h, r, nil
}

// encodeSnapshot is a snapshot as a run record keeps it.
func encodeSnapshot(r *loop.Run) []byte { return runcodec.Append(nil, r) }

// getRecord reads the raw record of a run; ok is false when there is none.
func getRecord(txn *badger.Txn, tenant, runID string) (b []byte, ok bool, err error) {
	item, err := txn.Get(runKey(tenant, runID))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	b, err = item.ValueCopy(nil)
	return b, err == nil, err
}

func getU64(txn *badger.Txn, k key) (uint64, error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var v uint64
	err = item.Value(func(b []byte) error {
		var err error
		v, err = readBE64(b)
		return err
	})
	return v, err
}

// addLive adds delta to a session's count of non-terminal Runs, deleting
// the key at zero, so that OrphanedSessions reads only sessions with work,
// and returns the count left.
func addLive(txn *badger.Txn, tenant, session string, delta int64) (left int64, err error) {
	k := liveKey(tenant, session)
	n, err := getU64(txn, k)
	if err != nil {
		return 0, err
	}
	next := int64(n) + delta
	if next <= 0 {
		return 0, txn.Delete(k)
	}
	return next, txn.Set(k, be64(uint64(next)))
}

// writeIndexes moves a Run's index entries from what old says to what now
// says, in the caller's transaction. old is nil for a new Run. It reports
// whether the write ended the session's last live Run
// (runtime.CommitResult.SessionIdle).
func writeIndexes(txn *badger.Txn, tenant, runID string, old *runHeader, now runHeader) (sessionIdle bool, err error) {
	ord := uint64(now.Ordinal)
	if old == nil || old.Status != now.Status {
		if old != nil {
			if err := txn.Delete(statusPrefix(tenant, string(old.Status)).raw(runID)); err != nil {
				return false, err
			}
		}
		if err := txn.Set(statusPrefix(tenant, string(now.Status)).raw(runID), nil); err != nil {
			return false, err
		}
	}
	wasLive := old == nil || !old.Status.Terminal()
	switch {
	case old == nil && !now.Status.Terminal():
		if err := txn.Set(activePrefix(tenant, now.Session).u64(ord), []byte(runID)); err != nil {
			return false, err
		}
		if _, err := addLive(txn, tenant, now.Session, 1); err != nil {
			return false, err
		}
	case wasLive && now.Status.Terminal():
		if old != nil {
			if err := txn.Delete(activePrefix(tenant, now.Session).u64(ord)); err != nil {
				return false, err
			}
			left, err := addLive(txn, tenant, now.Session, -1)
			if err != nil {
				return false, err
			}
			sessionIdle = left == 0
		}
		if err := txn.Set(terminalKey(now.UpdatedAt, tenant, runID), nil); err != nil {
			return false, err
		}
	}
	prev := map[string]runtime.EffectRecord{}
	if old != nil {
		for _, e := range old.Executing {
			prev[e.EffectID] = e
		}
	}
	for _, e := range now.Executing {
		p, had := prev[e.EffectID]
		delete(prev, e.EffectID)
		if had && p == e {
			continue
		}
		b, err := json.Marshal(e)
		if err != nil {
			return false, err
		}
		if err := txn.Set(executingPrefix(tenant, now.Session).u64(ord).str(e.EffectID), b); err != nil {
			return false, err
		}
	}
	for id := range prev {
		if err := txn.Delete(executingPrefix(tenant, now.Session).u64(ord).str(id)); err != nil {
			return false, err
		}
	}
	return sessionIdle, nil
}

// CreateRun implements runtime.Store.
func (s *Store) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	if err := c.Check(); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("badgerstore: create run: %w", err)
	}
	ev := c.Event
	ev.Seq = 1
	evb, err := runcodec.MarshalJSON(ev)
	if err != nil {
		return runtime.CreateResult{}, fmt.Errorf("badgerstore: create run %s: encode event: %w", c.Run.ID, err)
	}
	snap := encodeSnapshot(&c.Run)
	if err := s.enter(); err != nil {
		return runtime.CreateResult{}, err
	}
	defer s.leave()
	t, id, session := c.Run.Tenant, c.Run.ID, c.Run.Session
	var res runtime.CreateResult
	// apply is the creation in a transaction, as Commit's is: checks,
	// then writes; it shares a group's transaction with Run commits.
	apply := func(txn *badger.Txn) (added int64, wrote bool, err error) {
		res = runtime.CreateResult{}
		if c.CommandID != "" {
			item, err := txn.Get(createCmdKey(t, c.CommandID))
			switch {
			case err == nil:
				first, err := item.ValueCopy(nil)
				if err != nil {
					return 0, false, err
				}
				b, ok, err := getRecord(txn, t, string(first))
				if err != nil {
					return 0, false, err
				}
				if !ok {
					return 0, false, fmt.Errorf("badgerstore: command %q names run %s/%s, which has no record: the store is inconsistent", c.CommandID, t, first)
				}
				h, r, err := decodeRecord(b)
				if err != nil {
					return 0, false, err
				}
				res = runtime.CreateResult{Run: r, Ordinal: h.Ordinal, Duplicate: true}
				return 0, false, nil
			case !errors.Is(err, badger.ErrKeyNotFound):
				return 0, false, err
			}
		}
		if _, exists, err := getRecord(txn, t, id); err != nil {
			return 0, false, err
		} else if exists {
			return 0, false, fmt.Errorf("badgerstore: create run %s/%s: %w", t, id, runtime.ErrRunExists)
		}
		last, err := getU64(txn, ordinalKey(t, session))
		if err != nil {
			return 0, false, err
		}
		ord := int64(last) + 1
		held := int64(len(snap) + len(evb) + len(c.CommandID))
		h := headerOf(c.Run, ord, c.CommandID, held)
		rec, err := encodeRecord(h, snap)
		if err != nil {
			return 0, false, err
		}
		sets := []struct {
			k key
			v []byte
		}{
			{ordinalKey(t, session), be64(uint64(ord))},
			{runKey(t, id), rec},
			{eventKey(t, id, 1), evb},
			{orderPrefix(t, session).u64(uint64(ord)), []byte(id)},
		}
		if c.CommandID != "" {
			sets = append(sets, struct {
				k key
				v []byte
			}{createCmdKey(t, c.CommandID), []byte(id)})
		}
		for _, kv := range sets {
			if err := txn.Set(kv.k, kv.v); err != nil {
				return 0, true, err
			}
		}
		if _, err := writeIndexes(txn, t, id, nil, h); err != nil {
			return 0, true, err
		}
		res = runtime.CreateResult{Run: c.Run, Ordinal: ord}
		if c.Claimant != "" {
			if res.Epoch, err = s.claimAtCreation(txn, t, session, c.Claimant); err != nil {
				return 0, true, err
			}
		}
		return held, true, nil
	}
	err = s.writeRun(ctx, t, len(snap)+len(evb)+commitKeysBytes, apply)
	if err != nil {
		s.snaps.drop(t, id)
		return runtime.CreateResult{}, wrapErr("create run "+t+"/"+id, err)
	}
	if !res.Duplicate {
		s.snaps.put(t, id, c.Run.Seq, snap)
		// Hand back a Run decoded from a copy of the stored bytes: the
		// decoded Run's raw fields share the bytes they were decoded
		// from, and those the cache now holds are never to change. The
		// Run shares nothing with the caller's argument either.
		r, err := runcodec.Decode(append([]byte(nil), snap...))
		if err != nil {
			return runtime.CreateResult{}, fmt.Errorf("badgerstore: create run %s: %w", id, err)
		}
		res.Run = r
	}
	return res, nil
}

// wrapErr gives an error from inside a transaction its context, unless it
// already starts with the package name.
func wrapErr(what string, err error) error {
	if strings.HasPrefix(err.Error(), "badgerstore:") {
		return err
	}
	return fmt.Errorf("badgerstore: %s: %w", what, err)
}

// LoadRun implements runtime.Store.
func (s *Store) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return loop.Run{}, fmt.Errorf("badgerstore: load run: %w", err)
	}
	if err := s.enter(); err != nil {
		return loop.Run{}, err
	}
	defer s.leave()
	if r, ok, err := s.snaps.load(tenant, runID); ok {
		return r, nil
	} else if err != nil {
		s.snaps.drop(tenant, runID)
	}
	var (
		r    loop.Run
		snap []byte
	)
	// Begun before the read, so that what it finds is cached only if no
	// commit of the Run changed it since (snapcache.go).
	rd := s.snaps.beginRead()
	defer s.snaps.endRead(rd)
	err := s.db.View(func(txn *badger.Txn) error {
		b, ok, err := getRecord(txn, tenant, runID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("badgerstore: load run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
		}
		_, r, err = decodeRecord(b)
		if _, sb, _ := splitRecord(b); runcodec.IsBinary(sb) {
			snap = sb
		}
		return err
	})
	if err != nil {
		return loop.Run{}, wrapErr("load run "+tenant+"/"+runID, err)
	}
	if snap != nil {
		// b is this call's copy (getRecord), and the decoded Run shares
		// it: the cache keeps its own.
		s.snaps.putRead(rd, tenant, runID, r.Seq, append([]byte(nil), snap...))
	}
	return r, nil
}

// Commit implements runtime.Store, in the order the port gives: the
// command-ID lookup, the Seq check, the epoch check, then the writes, in
// one transaction that it shares with the Run commits queued with it (one
// sync for all of them: groupcommit.go). A Badger conflict with a
// concurrent transaction runs it again from the lookup.
func (s *Store) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	if err := c.CheckIDs(); err != nil {
		return runtime.CommitResult{}, fmt.Errorf("badgerstore: commit: %w", err)
	}
	if err := s.enter(); err != nil {
		return runtime.CommitResult{}, err
	}
	defer s.leave()
	t, id := c.Tenant, c.RunID
	var (
		payloadOK error
		evbs      [][]byte
		snap      []byte
		newHeader runHeader
		res       runtime.CommitResult
	)
	s.snaps.begin(t, id)
	defer s.snaps.end(t, id)
	// apply is the commit in a transaction: its checks, which only read,
	// then its writes (wrote says they began). It runs in a group's
	// transaction (groupcommit.go) or, when the group could not take it,
	// in one of its own.
	apply := func(txn *badger.Txn) (added int64, wrote bool, err error) {
		res = runtime.CommitResult{}
		if c.CommandID != "" {
			seq, err := getU64(txn, commandKey(t, id, c.CommandID))
			if err != nil {
				return 0, false, err
			}
			if seq > 0 {
				res = runtime.CommitResult{Seq: int64(seq), Duplicate: true}
				return 0, false, nil
			}
		}
		b, ok, err := getRecord(txn, t, id)
		if err != nil {
			return 0, false, err
		}
		if !ok {
			return 0, false, fmt.Errorf("badgerstore: commit to run %s/%s: %w", t, id, runtime.ErrRunNotFound)
		}
		if payloadOK != nil {
			return 0, false, fmt.Errorf("badgerstore: commit: %w", payloadOK)
		}
		old, err := decodeHeader(b)
		if err != nil {
			return 0, false, err
		}
		if old.Session != c.Session {
			return 0, false, fmt.Errorf("badgerstore: commit to run %s: %w: it belongs to session %s, not %s", id, runtime.ErrInvalidRequest, old.Session, c.Session)
		}
		if old.Seq != c.ExpectedSeq {
			return 0, false, fmt.Errorf("badgerstore: commit to run %s/%s at Seq %d: %w (stored Seq is %d)", t, id, c.ExpectedSeq, runtime.ErrVersionConflict, old.Seq)
		}
		epoch, err := readEpoch(txn, t, c.Session)
		if err != nil {
			return 0, false, err
		}
		if epoch != c.Epoch {
			return 0, false, fmt.Errorf("badgerstore: commit to run %s/%s with epoch %d: %w (session epoch is %d)", t, id, c.Epoch, runtime.ErrFenced, epoch)
		}
		for _, also := range c.AlsoCommandIDs {
			seq, err := getU64(txn, commandKey(t, id, also))
			if err != nil {
				return 0, false, err
			}
			if seq > 0 {
				return 0, false, fmt.Errorf("badgerstore: commit to run %s/%s: %w: command %s, which it also applies, was applied at Seq %d", t, id, runtime.ErrVersionConflict, also, seq)
			}
		}
		_, oldSnap, _ := splitRecord(b)
		held, err := storedBytesOf(txn, t, id, old, len(oldSnap))
		if err != nil {
			return 0, false, err
		}
		added = int64(len(snap)-len(oldSnap)) + int64(len(c.CommandID))
		for _, also := range c.AlsoCommandIDs {
			added += int64(len(also))
		}
		for _, evb := range evbs {
			added += int64(len(evb))
		}
		newHeader = headerOf(c.Run, old.Ordinal, old.CreateCmd, held+added)
		rec, err := encodeRecord(newHeader, snap)
		if err != nil {
			return 0, false, err
		}
		for i, ev := range c.Events {
			if err := txn.Set(eventKey(t, id, ev.Seq), evbs[i]); err != nil {
				return 0, true, err
			}
		}
		if err := txn.Set(runKey(t, id), rec); err != nil {
			return 0, true, err
		}
		idle, err := writeIndexes(txn, t, id, &old, newHeader)
		if err != nil {
			return 0, true, err
		}
		for _, cmd := range append([]string{c.CommandID}, c.AlsoCommandIDs...) {
			if cmd == "" {
				continue
			}
			if err := txn.Set(commandKey(t, id, cmd), be64(uint64(c.Run.Seq))); err != nil {
				return 0, true, err
			}
		}
		res = runtime.CommitResult{Seq: c.Run.Seq, SessionIdle: idle}
		return added, true, nil
	}
	if payloadOK = c.Check(); payloadOK == nil {
		evbs = make([][]byte, len(c.Events))
		for i, ev := range c.Events {
			if evbs[i], payloadOK = runcodec.MarshalJSON(ev); payloadOK != nil {
				break
			}
		}
	}
	// The encoding is done here, by each caller, not by the group's
	// leader for all of them.
	bytes := 0
	if payloadOK == nil {
		snap = encodeSnapshot(&c.Run)
		bytes = len(snap) + commitKeysBytes
		for _, evb := range evbs {
			bytes += len(evb)
		}
	}
	err := s.writeRun(ctx, t, bytes, apply)
	if err != nil {
		// The write may have happened (a lost reply), or the Run moved on
		// (a conflict): the next load reads Badger.
		s.snaps.drop(t, id)
		return runtime.CommitResult{}, wrapErr("commit to run "+t+"/"+id, err)
	}
	if s.afterCommitWrite != nil {
		s.afterCommitWrite()
	}
	if !res.Duplicate {
		s.snaps.putCommitted(t, id, c.Run.Seq, snap)
	}
	return res, nil
}

// Events implements runtime.Store.
func (s *Store) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return nil, fmt.Errorf("badgerstore: events: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	if fromSeq < 1 {
		fromSeq = 1
	}
	var out []loop.Event
	err := s.db.View(func(txn *badger.Txn) error {
		if _, ok, err := getRecord(txn, tenant, runID); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("badgerstore: events of run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
		}
		prefix := eventPrefix(tenant, runID)
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, PrefetchSize: prefetch(limit), Prefix: prefix})
		defer it.Close()
		for it.Seek(eventKey(tenant, runID, fromSeq)); it.ValidForPrefix(prefix); it.Next() {
			if limit > 0 && len(out) == limit {
				break
			}
			var ev loop.Event
			if err := it.Item().Value(func(b []byte) error { return json.Unmarshal(b, &ev) }); err != nil {
				return fmt.Errorf("badgerstore: events of run %s/%s: decode: %w", tenant, runID, err)
			}
			out = append(out, ev)
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr("events of run "+tenant+"/"+runID, err)
	}
	return out, nil
}

func prefetch(limit int) int {
	if limit > 0 && limit < 100 {
		return limit
	}
	return 100
}

// indexedRecord reads the run record an index entry names (its value is
// the run ID). An entry with no record is an inconsistent store.
func indexedRecord(txn *badger.Txn, tenant string, entry *badger.Item) ([]byte, error) {
	id, err := entry.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	b, ok, err := getRecord(txn, tenant, string(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("badgerstore: an index lists run %s/%s, which has no record: the store is inconsistent", tenant, id)
	}
	return b, nil
}

// runsAt loads the Runs an ordinal-keyed index (tOrder or tActive) lists
// under prefix, from ordinal from on.
func runsAt(txn *badger.Txn, tenant string, prefix key, from uint64, limit int) ([]runtime.SessionRun, error) {
	var out []runtime.SessionRun
	it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, PrefetchSize: prefetch(limit), Prefix: prefix})
	defer it.Close()
	for it.Seek(append(prefix[:len(prefix):len(prefix)], be64(from)...)); it.ValidForPrefix(prefix); it.Next() {
		if limit > 0 && len(out) == limit {
			break
		}
		b, err := indexedRecord(txn, tenant, it.Item())
		if err != nil {
			return nil, err
		}
		h, r, err := decodeRecord(b)
		if err != nil {
			return nil, err
		}
		out = append(out, runtime.SessionRun{Ordinal: h.Ordinal, Run: r})
	}
	return out, nil
}

// SessionRuns implements runtime.Store.
func (s *Store) SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("badgerstore: session runs: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	if after < 0 {
		after = 0
	}
	var out []runtime.SessionRun
	err := s.db.View(func(txn *badger.Txn) (err error) {
		out, err = runsAt(txn, tenant, orderPrefix(tenant, session), uint64(after)+1, limit)
		return err
	})
	if err != nil {
		return nil, wrapErr("session runs of "+tenant+"/"+session, err)
	}
	return out, nil
}

// CompletedRunsBefore implements runtime.Store. It reads the session's
// order index forwards in windows that end at runID and step back, each
// as long as the completed Runs still missing: in a session whose Runs
// mostly complete, one window of limit Runs. Badger iterates forwards far
// faster than in reverse.
func (s *Store) CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session, "run", runID); err != nil {
		return nil, fmt.Errorf("badgerstore: completed runs before: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []loop.Run
	err := s.db.View(func(txn *badger.Txn) error {
		b, ok, err := getRecord(txn, tenant, runID)
		if err != nil {
			return err
		}
		var h runHeader
		if ok {
			if h, err = decodeHeader(b); err != nil {
				return err
			}
		}
		if !ok || h.Session != session {
			return fmt.Errorf("badgerstore: completed runs before %s/%s in session %s: %w", tenant, runID, session, runtime.ErrRunNotFound)
		}
		prefix := orderPrefix(tenant, session)
		for end := uint64(h.Ordinal); end > 1 && (limit <= 0 || len(out) < limit); {
			from := uint64(1)
			if limit > 0 {
				if need := uint64(max(limit-len(out), 8)); end > need {
					from = end - need
				}
			}
			window, err := completedRuns(txn, tenant, prefix, from, end)
			if err != nil {
				return err
			}
			out = append(window, out...)
			end = from
		}
		if limit > 0 && len(out) > limit {
			out = out[len(out)-limit:]
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr("completed runs before "+tenant+"/"+runID, err)
	}
	return out, nil
}

// completedRuns returns the completed Runs the order index under prefix
// lists at ordinals from (inclusive) to end (exclusive), in order. It
// decodes the snapshot of the completed ones only.
func completedRuns(txn *badger.Txn, tenant string, prefix key, from, end uint64) ([]loop.Run, error) {
	var out []loop.Run
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	for it.Seek(append(prefix[:len(prefix):len(prefix)], be64(from)...)); it.ValidForPrefix(prefix); it.Next() {
		k := it.Item().Key()
		if binary.BigEndian.Uint64(k[len(k)-8:]) >= end {
			break
		}
		b, err := indexedRecord(txn, tenant, it.Item())
		if err != nil {
			return nil, err
		}
		h, err := decodeHeader(b)
		if err != nil {
			return nil, err
		}
		if h.Status != loop.StatusCompleted {
			continue
		}
		_, r, err := decodeRecord(b)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// ActiveRuns implements runtime.Store. It reads the active index, never a
// terminal Run.
func (s *Store) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("badgerstore: active runs: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []loop.Run
	err := s.db.View(func(txn *badger.Txn) error {
		runs, err := runsAt(txn, tenant, activePrefix(tenant, session), 0, 0)
		for _, sr := range runs {
			out = append(out, sr.Run)
		}
		return err
	})
	if err != nil {
		return nil, wrapErr("active runs of "+tenant+"/"+session, err)
	}
	return out, nil
}

// RunsByStatus implements runtime.Store. The status index ends with the
// raw run ID, so its keys sort in ID order.
func (s *Store) RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error) {
	return s.runsByStatus(tenant, status, after, limit, false)
}

// RunsByStatusDesc implements runtime.Store: the status index of
// RunsByStatus, read backwards.
func (s *Store) RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error) {
	return s.runsByStatus(tenant, status, before, limit, true)
}

// runsByStatus reads up to limit IDs of the status index past cursor, in
// ID order or, reverse, backwards. A reverse iterator's Seek lands on the
// last key at or before the one sought, so it seeks the cursor's key
// itself (and skips it), or, from the last, the prefix followed by 0xff,
// a byte no run ID holds.
func (s *Store) runsByStatus(tenant string, status loop.Status, cursor string, limit int, reverse bool) ([]string, error) {
	what := "runs by status"
	if reverse {
		what = "runs by status, descending"
	}
	if err := loop.CheckID("tenant", tenant); err != nil {
		return nil, fmt.Errorf("badgerstore: %s: %w", what, err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []string
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := statusPrefix(tenant, string(status))
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: reverse})
		defer it.Close()
		from := append(key{}, prefix...).raw(cursor)
		if reverse && cursor == "" {
			from = append(key{}, prefix...).raw("\xff")
		}
		for it.Seek(from); it.ValidForPrefix(prefix); it.Next() {
			id := string(it.Item().Key()[len(prefix):])
			if id == cursor {
				continue
			}
			if limit > 0 && len(out) == limit {
				break
			}
			out = append(out, id)
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr(what+" of "+tenant, err)
	}
	return out, nil
}

// checkIDs checks IDs given as pairs: what the ID names, then the ID.
func checkIDs(whatAndID ...string) error {
	for i := 0; i+1 < len(whatAndID); i += 2 {
		if err := loop.CheckID(whatAndID[i], whatAndID[i+1]); err != nil {
			return err
		}
	}
	return nil
}

package badgerstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/runtime"
)

// The export path: read-only iterators over everything a store holds,
// whatever tenants a config declares, for `agenthost store copy`. The
// runtime.Store port reads one tenant at a time and cannot list tenants
// or a plugin's KV keys; these can. Each reads in pages of exportPage
// entries, in a read-only transaction per page, and calls fn between
// pages, outside any transaction, so fn may take its time and may call
// the store. Nothing here writes.

// exportPage bounds the entries one read transaction of an export
// collects before they are handed to fn.
const exportPage = 512

// ExportSessions calls fn for every session that holds a Run (every
// session a Run was ever created in), in the store's key order, with the
// session's fencing epoch (0 when no node ever claimed it). Its owner is
// not exported: a copy starts with no owners.
func (s *Store) ExportSessions(ctx context.Context, fn func(tenant, session string, epoch uint64) error) error {
	type session struct {
		tenant, session string
		epoch           uint64
	}
	prefix := newKey(tOrdinal)
	return exportPages(ctx, s, prefix, func(txn *badger.Txn, k []byte, _ *badger.Item) (session, error) {
		kr := readKey(k, tOrdinal)
		t, sess := kr.str(), kr.str()
		if kr.err != nil {
			return session{}, kr.err
		}
		epoch, err := readEpoch(txn, t, sess)
		return session{t, sess, epoch}, err
	}, func(e session) error { return fn(e.tenant, e.session, e.epoch) })
}

// ExportCommands calls fn for each command ID recorded for a Run, in Seq
// order: its creation command (the API's Idempotency-Key) with Seq 1 when
// it had one, then the command IDs of its Commits, each with the Seq the
// command produced. A pruned Run has none left. ErrRunNotFound (wrapped)
// when there is no such Run.
func (s *Store) ExportCommands(ctx context.Context, tenant, runID string, fn func(commandID string, seq int64) error) error {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return fmt.Errorf("badgerstore: export commands: %w", err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	type command struct {
		id  string
		seq int64
	}
	var cmds []command
	err := s.db.View(func(txn *badger.Txn) error {
		b, ok, err := getRecord(txn, tenant, runID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("badgerstore: export commands of run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
		}
		h, err := decodeHeader(b)
		if err != nil {
			return err
		}
		if h.CreateCmd != "" {
			// Prune drops the creation command with the log; the header
			// keeps its name.
			if _, err := txn.Get(createCmdKey(tenant, h.CreateCmd)); err == nil {
				cmds = append(cmds, command{h.CreateCmd, 1})
			} else if !errors.Is(err, badger.ErrKeyNotFound) {
				return err
			}
		}
		prefix := commandPrefix(tenant, runID)
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
			kr := readKey(it.Item().Key(), tCommand)
			kr.str()
			kr.str()
			id := kr.str()
			if kr.err != nil {
				return kr.err
			}
			var seq uint64
			if err := it.Item().Value(func(v []byte) error {
				var err error
				seq, err = readBE64(v)
				return err
			}); err != nil {
				return err
			}
			cmds = append(cmds, command{id, int64(seq)})
		}
		return nil
	})
	s.leave()
	if err != nil {
		return wrapErr("export commands of run "+tenant+"/"+runID, err)
	}
	sort.SliceStable(cmds, func(i, j int) bool { return cmds[i].seq < cmds[j].seq })
	for _, c := range cmds {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(c.id, c.seq); err != nil {
			return err
		}
	}
	return nil
}

// ExportKV calls fn for every plugin KV entry, in the store's key order.
// key and value are fn's to keep.
func (s *Store) ExportKV(ctx context.Context, fn func(tenant, plugin string, key, value []byte) error) error {
	type entry struct {
		tenant, plugin string
		key, value     []byte
	}
	prefix := newKey(tKV)
	return exportPages(ctx, s, prefix, func(_ *badger.Txn, k []byte, item *badger.Item) (entry, error) {
		kr := readKey(k, tKV)
		t, p := kr.str(), kr.str()
		kk := []byte(kr.str())
		if kr.err != nil {
			return entry{}, kr.err
		}
		v, err := item.ValueCopy(nil)
		return entry{t, p, kk, v}, err
	}, func(e entry) error { return fn(e.tenant, e.plugin, e.key, e.value) })
}

// exportPages walks every key under prefix, a page at a time: read turns
// a key (a copy) into an entry inside the page's read transaction, and
// each page's entries go to emit once the transaction is over.
func exportPages[E any](ctx context.Context, s *Store, prefix key,
	read func(txn *badger.Txn, k []byte, item *badger.Item) (E, error), emit func(E) error) error {
	var after []byte // the last key of the previous page
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.enter(); err != nil {
			return err
		}
		var page []E
		var last []byte
		err := s.db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, PrefetchSize: 64, Prefix: prefix})
			defer it.Close()
			start := []byte(prefix)
			if after != nil {
				start = after
			}
			for it.Seek(start); it.ValidForPrefix(prefix) && len(page) < exportPage; it.Next() {
				k := it.Item().KeyCopy(nil)
				if after != nil && bytes.Equal(k, after) {
					continue
				}
				e, err := read(txn, k, it.Item())
				if err != nil {
					return err
				}
				page, last = append(page, e), k
			}
			return nil
		})
		s.leave()
		if err != nil {
			return wrapErr("export", err)
		}
		for _, e := range page {
			if err := emit(e); err != nil {
				return err
			}
		}
		if len(page) < exportPage {
			return nil
		}
		after = last
	}
}

package badgerstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/runtime"
)

// pruneBatch bounds the keys one pruning transaction deletes, well under
// Badger's transaction size limit.
const pruneBatch = 1000

// Prune implements runtime.Store. It walks the terminal-by-update-time
// index (tTerminal) up to beforeMS and, for each Run, deletes its events
// and command IDs in bounded transactions, then its creation command and
// its tTerminal entry. The snapshot stays. It is cross-tenant, and safe to
// stop half-way: a Run whose tTerminal entry is left is pruned again.
//
// Once a Run's command IDs are pruned, a retried command is no longer
// recognised: it is decided afresh, and on a terminal Run that is a
// version conflict, not a duplicate.
func (s *Store) Prune(ctx context.Context, beforeMS int64) (runtime.PruneStats, error) {
	if err := s.enter(); err != nil {
		return runtime.PruneStats{}, err
	}
	defer s.leave()
	var st runtime.PruneStats
	for {
		due, err := s.dueForPrune(beforeMS)
		if err != nil {
			return st, fmt.Errorf("badgerstore: prune: %w", err)
		}
		if len(due) == 0 {
			return st, nil
		}
		for _, d := range due {
			if err := ctx.Err(); err != nil {
				return st, fmt.Errorf("badgerstore: prune: %w", err)
			}
			if err := s.recordStoredBytes(ctx, d.tenant, d.run); err != nil {
				return st, fmt.Errorf("badgerstore: prune run %s/%s: %w", d.tenant, d.run, err)
			}
			ev, err := s.deletePrefix(ctx, eventPrefix(d.tenant, d.run))
			st.Events += ev
			if err != nil {
				return st, fmt.Errorf("badgerstore: prune events of %s/%s: %w", d.tenant, d.run, err)
			}
			cmds, err := s.deletePrefix(ctx, commandPrefix(d.tenant, d.run))
			st.Commands += cmds
			if err != nil {
				return st, fmt.Errorf("badgerstore: prune commands of %s/%s: %w", d.tenant, d.run, err)
			}
			created := 0
			var freed int64
			err = s.write(ctx, d.tenant, &freed, func(txn *badger.Txn) error {
				created = 0
				b, ok, err := getRecord(txn, d.tenant, d.run)
				if err != nil {
					return err
				}
				if ok {
					h, err := decodeHeader(b)
					if err != nil {
						return err
					}
					if h.CreateCmd != "" {
						if _, err := txn.Get(createCmdKey(d.tenant, h.CreateCmd)); err == nil {
							created = 1
							if err := txn.Delete(createCmdKey(d.tenant, h.CreateCmd)); err != nil {
								return err
							}
						} else if !errors.Is(err, badger.ErrKeyNotFound) {
							return err
						}
					}
					// The header's figure is from before the log was
					// deleted: count what is left, and record it.
					_, snap, _ := splitRecord(b)
					held, err := storedBytesOf(txn, d.tenant, d.run, h, len(snap))
					if err != nil {
						return err
					}
					left, err := countStoredBytes(txn, d.tenant, d.run, h, len(snap))
					if err != nil {
						return err
					}
					if left != held {
						h.StoredBytes = &left
						rec, err := encodeRecord(h, snap)
						if err != nil {
							return err
						}
						if err := txn.Set(runKey(d.tenant, d.run), rec); err != nil {
							return err
						}
						freed = left - held
					}
				}
				return txn.Delete(d.key)
			})
			if err != nil {
				return st, fmt.Errorf("badgerstore: prune run %s/%s: %w", d.tenant, d.run, err)
			}
			st.Commands += created
			st.Runs++
		}
	}
}

// recordStoredBytes writes into a run record written before headers kept
// the Run's stored bytes the figure counted from its keys, so that Prune,
// which deletes the log in transactions of its own, can then lower the
// tenant's total by what it deleted. A record that has the figure is left
// alone.
func (s *Store) recordStoredBytes(ctx context.Context, tenant, run string) error {
	return s.update(ctx, func(txn *badger.Txn) error {
		b, ok, err := getRecord(txn, tenant, run)
		if err != nil || !ok {
			return err
		}
		h, err := decodeHeader(b)
		if err != nil || h.StoredBytes != nil {
			return err
		}
		_, snap, _ := splitRecord(b)
		n, err := countStoredBytes(txn, tenant, run, h, len(snap))
		if err != nil {
			return err
		}
		h.StoredBytes = &n
		rec, err := encodeRecord(h, snap)
		if err != nil {
			return err
		}
		return txn.Set(runKey(tenant, run), rec)
	})
}

type pruneItem struct {
	key         []byte
	tenant, run string
}

// dueForPrune lists up to pruneBatch tTerminal entries older than beforeMS.
func (s *Store) dueForPrune(beforeMS int64) ([]pruneItem, error) {
	var out []pruneItem
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := newKey(tTerminal)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix) && len(out) < pruneBatch; it.Next() {
			k := it.Item().KeyCopy(nil)
			kr := readKey(k, tTerminal)
			at := int64(kr.u64())
			tenant, run := kr.str(), kr.str()
			if kr.err != nil {
				return kr.err
			}
			if at >= beforeMS {
				break
			}
			out = append(out, pruneItem{key: k, tenant: tenant, run: run})
		}
		return nil
	})
	return out, err
}

// deletePrefix deletes every key under prefix, pruneBatch keys per
// transaction, and returns how many it deleted.
func (s *Store) deletePrefix(ctx context.Context, prefix key) (int, error) {
	total := 0
	for {
		n := 0
		err := s.update(ctx, func(txn *badger.Txn) error {
			n = 0
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			var keys [][]byte
			for it.Rewind(); it.ValidForPrefix(prefix) && len(keys) < pruneBatch; it.Next() {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
			it.Close()
			for _, k := range keys {
				if err := txn.Delete(k); err != nil {
					return err
				}
			}
			n = len(keys)
			return nil
		})
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

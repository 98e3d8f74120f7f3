package badgerstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func checkKVScope(tenant, plugin string) error {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return err
	}
	return runtime.CheckName("plugin", plugin)
}

// KVGet implements runtime.PluginKV. A store failure is an error, never a
// nil value. It reads through the store's KV view (kvview.go) when it can,
// so that it does not wait for the commits of Runs under way.
func (s *Store) KVGet(ctx context.Context, tenant, plugin string, k []byte) ([]byte, error) {
	if err := checkKVScope(tenant, plugin); err != nil {
		return nil, fmt.Errorf("badgerstore: kv get: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var v []byte
	err := s.kvView.get(s.db, s.opts.Clock.Now(), kvKey(tenant, plugin, k), func(item *badger.Item, err error) error {
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("badgerstore: kv get %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, err)
	}
	return v, nil
}

// KVSet implements runtime.PluginKV. The plugin's usage (the sum of its
// key and value sizes) is updated in the same transaction as the value.
//
// Every write of a (tenant, plugin) reads and writes its usage key, so
// concurrent writes would conflict with each other in Badger and, past a
// few writers, lose every retry. Instead they queue on the plugin's
// kvWriter (a leaderQueue): one writer at a time, the leader, commits the
// writes queued at its head in one transaction, each judged against the
// quota in order, while the next ones queue behind it; then the first of
// those leads (one fsync for many writes, no conflicts).
func (s *Store) KVSet(ctx context.Context, tenant, plugin string, k, value []byte) error {
	if err := checkKVScope(tenant, plugin); err != nil {
		return fmt.Errorf("badgerstore: kv set: %w", err)
	}
	if len(k) > s.opts.KVMaxKeyBytes {
		return fmt.Errorf("badgerstore: kv set %s/%s: %w: key is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(k), s.opts.KVMaxKeyBytes)
	}
	if len(value) > s.opts.KVMaxValueBytes {
		return fmt.Errorf("badgerstore: kv set %s/%s: %w: value is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(value), s.opts.KVMaxValueBytes)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	op := &kvOp{key: kvKey(tenant, plugin, k), size: int64(len(k)), value: append([]byte(nil), value...)}
	lctx := context.WithoutCancel(ctx) // a leader commits the others' writes too
	s.kvWriter(tenant, plugin).submit(op, func(batch []*kvOp) { s.commitKV(lctx, tenant, plugin, batch) })
	if err := op.err; err != nil {
		if errors.Is(err, runtime.ErrKVQuota) || errors.Is(err, runtime.ErrClosed) {
			return err
		}
		return fmt.Errorf("badgerstore: kv set %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, err)
	}
	return nil
}

// kvOp is one queued KV write: value empty deletes the key.
type kvOp struct {
	key   []byte
	size  int64 // of the plugin's key
	value []byte
	err   error
}

// kvBatchBytes bounds the values one KV transaction carries, well below
// Badger's transaction size limit.
const kvBatchBytes = 4 << 20

// kvWriter returns the write queue of one (tenant, plugin).
func (s *Store) kvWriter(tenant, plugin string) *leaderQueue[*kvOp] {
	id := tenant + "\x00" + plugin
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kvWriters == nil {
		s.kvWriters = map[string]*leaderQueue[*kvOp]{}
	}
	w := s.kvWriters[id]
	if w == nil {
		w = &leaderQueue[*kvOp]{maxBytes: kvBatchBytes, size: func(op *kvOp) int { return len(op.value) }}
		s.kvWriters[id] = w
	}
	return w
}

// commitKV applies a batch of writes in order in one transaction: each
// against the usage the writes before it left, one over the quota refused
// alone with ErrKVQuota.
func (s *Store) commitKV(ctx context.Context, tenant, plugin string, batch []*kvOp) {
	s.kvView.beginWrite()
	defer s.kvView.endWrite()
	err := s.update(ctx, func(txn *badger.Txn) error {
		usage, err := getU64(txn, kvUsageKey(tenant, plugin))
		if err != nil {
			return err
		}
		total := int64(usage)
		sizes := map[string]int64{} // key → its entry's size after the writes so far
		for _, op := range batch {
			op.err = nil
			old, seen := sizes[string(op.key)]
			if !seen {
				item, err := txn.Get(op.key)
				switch {
				case err == nil:
					old = op.size + item.ValueSize()
				case !errors.Is(err, badger.ErrKeyNotFound):
					return err
				}
			}
			next := int64(0)
			if len(op.value) > 0 {
				next = op.size + int64(len(op.value))
			}
			if next > 0 && total-old+next > s.opts.KVQuotaBytes {
				op.err = fmt.Errorf("badgerstore: kv set %s/%s: %w: the plugin would hold %d bytes, its quota is %d", tenant, plugin, runtime.ErrKVQuota, total-old+next, s.opts.KVQuotaBytes)
				sizes[string(op.key)] = old
				continue
			}
			switch {
			case next > 0:
				err = txn.Set(op.key, op.value)
			case old > 0:
				err = txn.Delete(op.key)
			}
			if err != nil {
				return err
			}
			total += next - old
			sizes[string(op.key)] = next
		}
		if total <= 0 {
			return txn.Delete(kvUsageKey(tenant, plugin))
		}
		return txn.Set(kvUsageKey(tenant, plugin), be64(uint64(total)))
	})
	if err != nil {
		for _, op := range batch {
			op.err = err
		}
	}
}

// KVDelete implements runtime.PluginKV.
func (s *Store) KVDelete(ctx context.Context, tenant, plugin string, k []byte) error {
	return s.KVSet(ctx, tenant, plugin, k, nil)
}

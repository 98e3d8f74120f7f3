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
// nil value.
func (s *Store) KVGet(ctx context.Context, tenant, plugin string, k []byte) ([]byte, error) {
	if err := checkKVScope(tenant, plugin); err != nil {
		return nil, fmt.Errorf("badgerstore: kv get: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var v []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(kvKey(tenant, plugin, k))
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
	value = append([]byte(nil), value...)
	err := s.update(ctx, func(txn *badger.Txn) error {
		usage, err := getU64(txn, kvUsageKey(tenant, plugin))
		if err != nil {
			return err
		}
		var oldSize int64
		item, err := txn.Get(kvKey(tenant, plugin, k))
		switch {
		case err == nil:
			oldSize = int64(len(k)) + item.ValueSize()
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		total := int64(usage) - oldSize
		if len(value) == 0 {
			if oldSize == 0 {
				return nil
			}
			if err := txn.Delete(kvKey(tenant, plugin, k)); err != nil {
				return err
			}
		} else {
			total += int64(len(k) + len(value))
			if total > s.opts.KVQuotaBytes {
				return fmt.Errorf("badgerstore: kv set %s/%s: %w: the plugin would hold %d bytes, its quota is %d", tenant, plugin, runtime.ErrKVQuota, total, s.opts.KVQuotaBytes)
			}
			if err := txn.Set(kvKey(tenant, plugin, k), value); err != nil {
				return err
			}
		}
		if total <= 0 {
			return txn.Delete(kvUsageKey(tenant, plugin))
		}
		return txn.Set(kvUsageKey(tenant, plugin), be64(uint64(total)))
	})
	if err != nil {
		if errors.Is(err, runtime.ErrKVQuota) || errors.Is(err, runtime.ErrClosed) {
			return err
		}
		return fmt.Errorf("badgerstore: kv set %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, err)
	}
	return nil
}

// KVDelete implements runtime.PluginKV.
func (s *Store) KVDelete(ctx context.Context, tenant, plugin string, k []byte) error {
	return s.KVSet(ctx, tenant, plugin, k, nil)
}

package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

type kvScope struct{ tenant, plugin string }

func checkKVScope(tenant, plugin string) error {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return err
	}
	return runtime.CheckName("plugin", plugin)
}

// KVGet implements runtime.PluginKV. A store failure is an error wrapping
// runtime.ErrStoreUnavailable, never a nil value.
func (s *Store) KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error) {
	if err := checkKVScope(tenant, plugin); err != nil {
		return nil, fmt.Errorf("pgstore: kv get: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var v []byte
	err := s.pool.QueryRow(ctx, `SELECT value FROM kv WHERE tenant = $1 AND plugin = $2 AND key = $3`, tenant, plugin, nonNil(key)).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("pgstore: kv get %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, err)
	}
	return v, nil
}

// nonNil makes a nil key the empty bytea, not NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// KVSet implements runtime.PluginKV. The plugin's usage row is created if
// missing and locked (which serializes the plugin's writes across every
// node), the key's present size read, and, within the quota, the value and
// the usage are written and committed: in a transaction of two round
// trips that the writes queued meanwhile in this process share
// (kvwrites.go).
func (s *Store) KVSet(ctx context.Context, tenant, plugin string, key, value []byte) error {
	if err := checkKVScope(tenant, plugin); err != nil {
		return fmt.Errorf("pgstore: kv set: %w", err)
	}
	if len(key) > s.opts.KVMaxKeyBytes {
		return fmt.Errorf("pgstore: kv set %s/%s: %w: key is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(key), s.opts.KVMaxKeyBytes)
	}
	if len(value) > s.opts.KVMaxValueBytes {
		return fmt.Errorf("pgstore: kv set %s/%s: %w: value is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(value), s.opts.KVMaxValueBytes)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	// Neither key nor value is copied: queueKVWrite returns only once
	// its write is written, refused or withdrawn, and nothing keeps them
	// after, so the caller may reuse them when it returns.
	return s.queueKVWrite(ctx, tenant, plugin, nonNil(key), value)
}

// KVDelete implements runtime.PluginKV.
func (s *Store) KVDelete(ctx context.Context, tenant, plugin string, key []byte) error {
	return s.KVSet(ctx, tenant, plugin, key, nil)
}

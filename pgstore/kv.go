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

// KVSet implements runtime.PluginKV, in one transaction of two round
// trips: the plugin's usage row is created if missing and locked (which
// serializes the plugin's writes across every node), the key's present
// size read; then, within the quota, the value and the usage are written
// and committed.
//
// Inside this process the writes of one plugin also take a lock first,
// so that a burst of them waits here, not on the row lock with a pooled
// connection each.
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
	sem := s.kvLock(tenant, plugin)
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pgstore: kv set %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, ctx.Err())
	}
	defer func() { <-sem }()
	key = nonNil(key)
	err := s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(`INSERT INTO kv_usage (tenant, plugin) VALUES ($1, $2) ON CONFLICT DO NOTHING`, tenant, plugin)
		b.Queue(`SELECT bytes FROM kv_usage WHERE tenant = $1 AND plugin = $2 FOR UPDATE`, tenant, plugin)
		b.Queue(`SELECT octet_length(key) + octet_length(value) FROM kv WHERE tenant = $1 AND plugin = $2 AND key = $3`, tenant, plugin, key)
		br := conn.SendBatch(ctx, b)
		var used, old int64
		err := execAll(br, 2)
		if err == nil {
			_, err = queryOne(br, &used)
		}
		if err == nil {
			_, err = queryOne(br, &old)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		next := int64(0)
		if len(value) > 0 {
			next = int64(len(key) + len(value))
		}
		if next == 0 && old == 0 {
			return nil // deleting a missing key: nothing to write
		}
		if next > 0 && used-old+next > s.opts.KVQuotaBytes {
			return fmt.Errorf("pgstore: kv set %s/%s: %w: the plugin would hold %d bytes, its quota is %d", tenant, plugin, runtime.ErrKVQuota, used-old+next, s.opts.KVQuotaBytes)
		}
		b = &pgx.Batch{}
		if next > 0 {
			b.Queue(`INSERT INTO kv (tenant, plugin, key, value) VALUES ($1, $2, $3, $4)
				ON CONFLICT (tenant, plugin, key) DO UPDATE SET value = EXCLUDED.value`, tenant, plugin, key, value)
		} else {
			b.Queue(`DELETE FROM kv WHERE tenant = $1 AND plugin = $2 AND key = $3`, tenant, plugin, key)
		}
		b.Queue(`UPDATE kv_usage SET bytes = $3 WHERE tenant = $1 AND plugin = $2`, tenant, plugin, used-old+next)
		b.Queue(sqlCommit)
		return sendWrites(ctx, conn, b)
	})
	if err != nil {
		return fail("kv set "+tenant+"/"+plugin, err)
	}
	return nil
}

// kvLock is the in-process lock of a (tenant, plugin)'s writes: a
// semaphore of one, so that waiting for it heeds the context.
func (s *Store) kvLock(tenant, plugin string) chan struct{} {
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kvLocks == nil {
		s.kvLocks = map[kvScope]chan struct{}{}
	}
	k := kvScope{tenant, plugin}
	sem := s.kvLocks[k]
	if sem == nil {
		sem = make(chan struct{}, 1)
		s.kvLocks[k] = sem
	}
	return sem
}

// KVDelete implements runtime.PluginKV.
func (s *Store) KVDelete(ctx context.Context, tenant, plugin string, key []byte) error {
	return s.KVSet(ctx, tenant, plugin, key, nil)
}

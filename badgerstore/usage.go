package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/loop"
)

// The stored bytes of a tenant (runtime.Store.TenantStoredBytes). Each
// Run's share is in its run record's header (runHeader.StoredBytes),
// written in the transaction that changes it, so no key is shared by the
// writes of two Runs. Since one process owns the directory, the tenant's
// total is kept in memory: seeded on the first call for the tenant from
// the headers, then moved by every write that commits.

// tenantTotals holds the in-memory totals.
type tenantTotals struct {
	// gate is read-held by every write from before its transaction until
	// its change is added to the totals, and write-held by a seed while it
	// opens its read transaction. A write is therefore either committed
	// and added before the seed's snapshot (which then reads it, and the
	// total ignores it) or committed after (the snapshot misses it, and
	// it is added to the total): never both, never neither.
	gate sync.RWMutex

	mu      sync.Mutex
	tenants map[string]*tenantTotal
}

// tenantTotal is one tenant's figure.
type tenantTotal struct {
	seedMu   sync.Mutex // held while the tenant is seeded
	counting bool       // writes are added (a seed has started)
	seeded   bool       // bytes is the tenant's figure
	bytes    int64
}

func (u *tenantTotals) entry(tenant string) *tenantTotal {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.tenants == nil {
		u.tenants = map[string]*tenantTotal{}
	}
	e := u.tenants[tenant]
	if e == nil {
		e = &tenantTotal{}
		u.tenants[tenant] = e
	}
	return e
}

// write runs a transaction that changes the stored bytes of tenant by
// the delta it sets (afresh on every attempt), and adds the delta to
// the tenant's total once the transaction has committed.
func (s *Store) write(ctx context.Context, tenant string, delta *int64, fn func(txn *badger.Txn) error) error {
	s.totals.gate.RLock()
	defer s.totals.gate.RUnlock()
	err := s.update(ctx, func(txn *badger.Txn) error {
		*delta = 0
		return fn(txn)
	})
	if err == nil && *delta != 0 {
		s.totals.add(tenant, *delta)
	}
	return err
}

func (u *tenantTotals) add(tenant string, delta int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if e := u.tenants[tenant]; e != nil && e.counting {
		e.bytes += delta
	}
}

// TenantStoredBytes implements runtime.Store. The first call for a tenant
// reads the header of each of its Runs (one prefix scan); the later ones
// read the figure the writes keep.
func (s *Store) TenantStoredBytes(ctx context.Context, tenant string) (int64, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return 0, fmt.Errorf("badgerstore: stored bytes: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	u := &s.totals
	e := u.entry(tenant)
	e.seedMu.Lock()
	defer e.seedMu.Unlock()
	u.mu.Lock()
	if e.seeded {
		defer u.mu.Unlock()
		return e.bytes, nil
	}
	u.mu.Unlock()

	u.gate.Lock()
	txn := s.db.NewTransaction(false)
	u.mu.Lock()
	e.counting, e.bytes = true, 0
	u.mu.Unlock()
	u.gate.Unlock()
	defer txn.Discard()
	held, err := scanStoredBytes(ctx, txn, tenant)
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil {
		e.counting = false
		return 0, wrapErr("stored bytes of "+tenant, err)
	}
	e.bytes += held
	e.seeded = true
	return e.bytes, nil
}

// scanStoredBytes sums the stored bytes in the headers of the tenant's
// run records, counting a record written before the figure was kept from
// the Run's keys.
func scanStoredBytes(ctx context.Context, txn *badger.Txn, tenant string) (int64, error) {
	prefix := newKey(tRun).str(tenant)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	var sum int64
	for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		kr := readKey(it.Item().Key(), tRun)
		kr.str()
		run := kr.str()
		if kr.err != nil {
			return 0, kr.err
		}
		var n int64
		err := it.Item().Value(func(b []byte) error {
			h, err := decodeHeader(b)
			if err != nil {
				return err
			}
			_, snap, _ := splitRecord(b)
			n, err = storedBytesOf(txn, tenant, run, h, len(snap))
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("badgerstore: run %s/%s: %w", tenant, run, err)
		}
		sum += n
	}
	return sum, nil
}

// storedBytesOf is what a Run holds, from its header, or, for a record
// written before headers kept it, counted from its keys: the snapshot
// (snapshotLen bytes), every event, every command ID, and the creation
// command while it is kept.
func storedBytesOf(txn *badger.Txn, tenant, run string, h runHeader, snapshotLen int) (int64, error) {
	if h.StoredBytes != nil {
		return *h.StoredBytes, nil
	}
	return countStoredBytes(txn, tenant, run, h, snapshotLen)
}

// countStoredBytes counts what a Run holds from its keys, as
// storedBytesOf describes.
func countStoredBytes(txn *badger.Txn, tenant, run string, h runHeader, snapshotLen int) (int64, error) {
	n := int64(snapshotLen)
	events := eventPrefix(tenant, run)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: events})
	for it.Rewind(); it.ValidForPrefix(events); it.Next() {
		if err := it.Item().Value(func(b []byte) error { n += int64(len(b)); return nil }); err != nil {
			it.Close()
			return 0, err
		}
	}
	it.Close()
	cmds := commandPrefix(tenant, run)
	it = txn.NewIterator(badger.IteratorOptions{Prefix: cmds})
	for it.Rewind(); it.ValidForPrefix(cmds); it.Next() {
		kr := readKey(it.Item().Key(), tCommand)
		kr.str()
		kr.str()
		n += int64(len(kr.str()))
		if kr.err != nil {
			it.Close()
			return 0, kr.err
		}
	}
	it.Close()
	if h.CreateCmd != "" {
		switch _, err := txn.Get(createCmdKey(tenant, h.CreateCmd)); {
		case err == nil:
			n += int64(len(h.CreateCmd))
		case !errors.Is(err, badger.ErrKeyNotFound):
			return 0, err
		}
	}
	return n, nil
}

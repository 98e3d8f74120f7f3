package badgerstore

import (
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// kvView lets plugin KV reads share one Badger read transaction instead of
// opening one each. Every Badger transaction begins by waiting until every
// commit already given a timestamp is written and, with sync writes,
// synced (its read watermark), whatever keys those commits touch. A
// plugin's kv_get therefore waited for the group commit of every Run in
// flight: in recovery, the slow-job plugin's few instances spent their
// attaches there while the other calls queued for them.
//
// A view is a read-only transaction opened while no KV write was under
// way, and it answers a KV read only while no KV write has begun since.
// Every write of a KV key goes through commitKV, which marks itself under
// way (beginWrite … endWrite) around its transaction, so a view's
// answer is what a transaction opened at the read would answer: every KV
// write completed before the read had completed before the view opened
// (none began since), so the view sees it, and no KV write was under way
// that it could half see. Run records and other keys do not touch it:
// their commits go on while reads use the view. A read that finds no
// usable view, or a KV write under way, opens a transaction of its own,
// as before. The view is retired after kvViewMaxAge (an open read
// transaction holds back Badger's discarding of older versions), at the
// first KV write, and at Close.
//
// Badger's transactions are not safe for concurrent use, so the reads of
// one view take turns (getMu); each is a lookup in memory or in the
// block cache, far shorter than the watermark wait it replaces.
type kvView struct {
	mu       sync.Mutex
	gen      uint64 // counts the KV writes begun
	inFlight int    // the KV writes under way
	cur      *viewTxn
	opened   uint64 // views opened, for tests
}

// kvViewMaxAge bounds how long one view answers reads.
const kvViewMaxAge = 500 * time.Millisecond

type viewTxn struct {
	txn    *badger.Txn
	opened time.Time
	refs   int  // the reads using it
	gone   bool // retired: discarded once refs reaches 0

	getMu sync.Mutex // one read at a time
}

// beginWrite marks a KV write as under way, before its transaction, and
// retires the view; endWrite, after the transaction, whatever its result.
func (v *kvView) beginWrite() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen++
	v.inFlight++
	v.retireLocked()
}

func (v *kvView) endWrite() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.inFlight--
}

// retireLocked retires the current view, discarding it now if no read uses
// it. v.mu is held.
func (v *kvView) retireLocked() {
	if t := v.cur; t != nil {
		v.cur = nil
		t.gone = true
		if t.refs == 0 {
			t.txn.Discard()
		}
	}
}

// get reads key through the current view, opening one when there is none
// and no KV write is under way; otherwise it reads in a transaction of its
// own. fn reads the item (or sees badger.ErrKeyNotFound) while the view is
// held.
func (v *kvView) get(db *badger.DB, now time.Time, key []byte, fn func(*badger.Item, error) error) error {
	t := v.acquire(db, now)
	if t == nil {
		return db.View(func(txn *badger.Txn) error { return fn(txn.Get(key)) })
	}
	defer v.release(t)
	t.getMu.Lock()
	defer t.getMu.Unlock()
	return fn(t.txn.Get(key))
}

// acquire returns a view to read through, counted as in use, or nil. now
// is the store clock's time.
func (v *kvView) acquire(db *badger.DB, now time.Time) *viewTxn {
	v.mu.Lock()
	if t := v.cur; t != nil {
		if now.Sub(t.opened) < kvViewMaxAge {
			t.refs++
			v.mu.Unlock()
			return t
		}
		v.retireLocked()
	}
	if v.inFlight > 0 {
		v.mu.Unlock()
		return nil
	}
	gen := v.gen
	v.mu.Unlock()

	// Opened unlocked: this is the watermark wait, once for every read the
	// view will answer.
	txn := db.NewTransaction(false)
	t := &viewTxn{txn: txn, opened: now, refs: 1}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.opened++
	if v.gen != gen {
		// A KV write began while it opened: good for this read, which
		// overlaps that write, and for no later one.
		t.gone = true
		return t
	}
	if v.cur == nil {
		v.cur = t
	} else {
		// Another read opened one first; both are as good. Keep that one.
		t.gone = true
	}
	return t
}

// release ends a read's use of t, discarding a retired t once unused.
func (v *kvView) release(t *viewTxn) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t.refs--
	if t.gone && t.refs == 0 {
		t.txn.Discard()
	}
}

// close retires the view; the Store calls it from Close, when no call is
// in progress.
func (v *kvView) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.retireLocked()
}

package pgstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/runtime"
)

// The writes of one plugin's KV (a tenant's) share transactions.
//
// Every write of a plugin reads and updates its usage row under a row
// lock, so that its quota holds across nodes: the writes of one plugin
// are serial, each a synced commit. A job started in each of 128 Runs
// at once, two KV writes each, waited for 256 commits one behind the
// other (docs/BENCHMARKS.md, "KV writes that share a commit"). So the
// writes of a (tenant, plugin) queue in this process, and whoever finds
// no transaction under way writes everything queued in one: one row lock,
// one read of the sizes, one commit, each write judged against the quota
// in the order it came, as one at a time would be. Writes that queue
// meanwhile go in the next transaction, written by the first of them.

// kvWrite is one KVSet (or KVDelete) in a plugin's queue.
type kvWrite struct {
	key, value []byte // value empty: delete
	err        error  // its result, set before done is closed
	done       chan struct{}
	// lead is closed when this write's caller is to write the queue.
	lead chan struct{}
}

// kvQueue is the queue of one (tenant, plugin)'s writes. Its mu is a
// leaf.
type kvQueue struct {
	mu      sync.Mutex
	pending []*kvWrite
	// leader is the write whose caller writes the queue next, or is
	// writing it; nil when no transaction is under way or handed on.
	leader *kvWrite
}

// kvQueueOf returns the queue of a (tenant, plugin), made on first use.
func (s *Store) kvQueueOf(tenant, plugin string) *kvQueue {
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kvQueues == nil {
		s.kvQueues = map[kvScope]*kvQueue{}
	}
	k := kvScope{tenant, plugin}
	q := s.kvQueues[k]
	if q == nil {
		q = &kvQueue{}
		s.kvQueues[k] = q
	}
	return q
}

// add queues w, and makes it the leader when no transaction is under way.
func (q *kvQueue) add(w *kvWrite) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, w)
	if q.leader == nil {
		q.leader = w
		close(w.lead)
	}
}

// withdraw takes w out of the queue if no transaction has taken it yet,
// handing the lead on when it was w's; it reports whether it did.
func (q *kvQueue) withdraw(w *kvWrite) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, p := range q.pending {
		if p != w {
			continue
		}
		q.pending = append(q.pending[:i:i], q.pending[i+1:]...)
		if q.leader == w {
			q.handOnLocked()
		}
		return true
	}
	return false
}

// take empties the queue into a batch.
func (q *kvQueue) take() []*kvWrite {
	q.mu.Lock()
	defer q.mu.Unlock()
	batch := q.pending
	q.pending = nil
	return batch
}

// handOn makes the first queued write the leader, or leaves none.
func (q *kvQueue) handOn() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.handOnLocked()
}

func (q *kvQueue) handOnLocked() {
	q.leader = nil
	if len(q.pending) > 0 {
		q.leader = q.pending[0]
		close(q.leader.lead)
	}
}

// len is the number of writes queued, not yet in a transaction.
func (q *kvQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// queueKVWrite queues a write of key and waits for its result: when its
// caller is the leader it writes the queue itself (writeKVBatch), with
// its own and every write queued up to then. A caller whose ctx ends
// before a transaction took its write withdraws it: nothing is written.
// Once taken, the write's result is waited for (statement_timeout bounds
// the transaction).
func (s *Store) queueKVWrite(ctx context.Context, tenant, plugin string, key, value []byte) error {
	w := &kvWrite{key: key, value: value, done: make(chan struct{}), lead: make(chan struct{})}
	q := s.kvQueueOf(tenant, plugin)
	q.add(w)
	lead, cancelled := w.lead, ctx.Done()
	for {
		select {
		case <-w.done:
			return w.err
		case <-lead:
			lead = nil
			batch := q.take()
			s.writeKVBatch(context.WithoutCancel(ctx), tenant, plugin, batch)
			q.handOn()
		case <-cancelled:
			cancelled = nil
			if q.withdraw(w) {
				return fmt.Errorf("pgstore: kv set %s/%s: %w: %w", tenant, plugin, runtime.ErrStoreUnavailable, ctx.Err())
			}
		}
	}
}

// The statements of a batch that look keys up do it key by key, each on
// the whole primary key, never with key = ANY($3). PostgreSQL plans a
// prepared statement once for all after its first five runs on a
// connection, and on the small table of a fresh schema it planned key =
// ANY($3) as a filter over an index scan of every key of the plugin: each
// batch then read all of them, 3,600 buffers and 16 ms for 20,000 keys,
// under the plugin's lock, until an ANALYZE planned it again
// (docs/BENCHMARKS.md, "KV writes that read every key of the plugin").
const (
	// sqlKVSizes reads the stored size of each key of $3, NULL for a
	// missing key.
	sqlKVSizes = `SELECT u.key, (SELECT octet_length(kv.key) + octet_length(kv.value) FROM kv
			WHERE kv.tenant = $1 AND kv.plugin = $2 AND kv.key = u.key)
		FROM unnest($3::bytea[]) AS u(key)`
	sqlKVDelete = `DELETE FROM kv WHERE tenant = $1 AND plugin = $2 AND key = $3`
)

// writeKVBatch writes a batch of one plugin's writes in one transaction
// and gives each its result: the quota is judged write by write in the
// batch's order, as if each were written alone, and a write it refuses is
// left out; the others are written or, when the transaction fails, all
// fail.
func (s *Store) writeKVBatch(ctx context.Context, tenant, plugin string, batch []*kvWrite) {
	if hook := s.kvBatchHook; hook != nil {
		hook(tenant, plugin, len(batch))
	}
	results := make([]error, len(batch))
	keys := make([][]byte, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for _, w := range batch {
		if !seen[string(w.key)] {
			seen[string(w.key)] = true
			keys = append(keys, w.key)
		}
	}
	err := s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(`INSERT INTO kv_usage (tenant, plugin) VALUES ($1, $2) ON CONFLICT DO NOTHING`, tenant, plugin)
		b.Queue(`SELECT bytes FROM kv_usage WHERE tenant = $1 AND plugin = $2 FOR UPDATE`, tenant, plugin)
		b.Queue(sqlKVSizes, tenant, plugin, keys)
		br := conn.SendBatch(ctx, b)
		var used int64
		size := make(map[string]int64, len(keys))
		err := execAll(br, 2)
		if err == nil {
			_, err = queryOne(br, &used)
		}
		if err == nil {
			var rows pgx.Rows
			rows, err = br.Query()
			if err == nil {
				var (
					k []byte
					n *int64 // NULL: no such key
				)
				_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error {
					if n != nil {
						size[string(k)] = *n
					}
					return nil
				})
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		// Each write in turn, as it would be alone; the last of a key is
		// what is written.
		final := make(map[string][]byte, len(keys))
		for i, w := range batch {
			old, next := size[string(w.key)], int64(0)
			if len(w.value) > 0 {
				next = int64(len(w.key) + len(w.value))
			}
			if next > 0 && used-old+next > s.opts.KVQuotaBytes {
				results[i] = fmt.Errorf("pgstore: kv set %s/%s: %w: the plugin would hold %d bytes, its quota is %d", tenant, plugin, runtime.ErrKVQuota, used-old+next, s.opts.KVQuotaBytes)
				continue
			}
			results[i] = nil
			used, size[string(w.key)] = used-old+next, next
			final[string(w.key)] = w.value
		}
		var sets, setValues, deletes [][]byte
		for _, k := range keys {
			v, ok := final[string(k)]
			switch {
			case !ok:
			case len(v) > 0:
				sets, setValues = append(sets, k), append(setValues, v)
			default:
				deletes = append(deletes, k)
			}
		}
		if len(sets) == 0 && len(deletes) == 0 {
			return nil // nothing to write (deletes of missing keys, refusals): rolled back
		}
		b = &pgx.Batch{}
		if len(sets) > 0 {
			b.Queue(`INSERT INTO kv (tenant, plugin, key, value) SELECT $1, $2, k, v FROM unnest($3::bytea[], $4::bytea[]) AS t(k, v)
				ON CONFLICT (tenant, plugin, key) DO UPDATE SET value = EXCLUDED.value`, tenant, plugin, sets, setValues)
		}
		for _, k := range deletes {
			b.Queue(sqlKVDelete, tenant, plugin, k)
		}
		b.Queue(`UPDATE kv_usage SET bytes = $3 WHERE tenant = $1 AND plugin = $2`, tenant, plugin, used)
		b.Queue(sqlCommit)
		if err := sendWrites(ctx, conn, b); err != nil {
			return err
		}
		s.kvCommits.Add(1)
		return nil
	})
	for i, w := range batch {
		w.err = results[i]
		if err != nil {
			w.err = fail("kv set "+tenant+"/"+plugin, err)
		}
		close(w.done)
	}
}

package badgerstore

import "sync"

// leaderQueue is a queue of writes that one caller at a time, the leader,
// commits in batches: the writes at the head of the queue, its own first,
// in one transaction and so one sync, while the next ones queue behind it.
// Then the first of those leads the next batch, so that no caller serves
// the others' writes for long. The KV writes of one plugin (kv.go) and
// the Run creations and commits (groupcommit.go) queue on one each.
type leaderQueue[T any] struct {
	// maxItems and maxBytes bound a batch (0: no bound on its length);
	// size is what an item counts against maxBytes. A batch holds at
	// least its leader's own item, whatever its size.
	maxItems int
	maxBytes int
	size     func(T) int
	// beforeTake, when set (by tests), runs in the leader before it takes
	// its batch from the queue.
	beforeTake func()

	mu    sync.Mutex
	busy  bool // a leader is committing a batch
	queue []*queued[T]
}

// queued is one item in the queue.
type queued[T any] struct {
	item T
	// lead is set (before done is closed, under the queue's mu) on the
	// item that is to lead the next batch instead of being committed.
	lead bool
	done chan struct{}
}

// submit queues item and returns once a leader has committed it in a
// batch; the caller leads that batch itself when no leader was busy, or
// when the lead is handed to it. A leader commits its batch with the
// commit it was given, so every caller of one queue must give the same.
func (q *leaderQueue[T]) submit(item T, commit func(batch []T)) {
	e := &queued[T]{item: item, done: make(chan struct{})}
	q.mu.Lock()
	q.queue = append(q.queue, e)
	lead := !q.busy
	if lead {
		q.busy, e.lead = true, true
	}
	q.mu.Unlock()
	if !lead {
		<-e.done // committed by a leader, or made the leader
		lead = e.lead
	}
	if lead {
		q.lead(commit)
	}
}

// lead commits one batch from the head of the queue, which is the
// leader's own item, then hands the lead to the next queued item (or
// marks the queue idle).
func (q *leaderQueue[T]) lead(commit func(batch []T)) {
	if q.beforeTake != nil {
		q.beforeTake()
	}
	q.mu.Lock()
	n, bytes := 0, 0
	for n < len(q.queue) && (n == 0 || (q.maxItems <= 0 || n < q.maxItems) && bytes+q.size(q.queue[n].item) <= q.maxBytes) {
		bytes += q.size(q.queue[n].item)
		n++
	}
	entries := q.queue[:n:n]
	if q.queue = q.queue[n:]; len(q.queue) == 0 {
		q.queue = nil // let the committed items go
	}
	q.mu.Unlock()
	batch := make([]T, n)
	for i, e := range entries {
		batch[i] = e.item
	}
	commit(batch)
	for _, e := range entries[1:] { // entries[0] is the leader's own
		close(e.done)
	}
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.busy = false
	} else {
		next := q.queue[0]
		next.lead = true
		close(next.done)
	}
	q.mu.Unlock()
}

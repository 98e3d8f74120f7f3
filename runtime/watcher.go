package runtime

import (
	"container/heap"
	"sync"
	"time"
)

// watchKind says what a Watcher item is for.
type watchKind uint8

const (
	// watchPoll polls a pending effect attempt.
	watchPoll watchKind = iota + 1
	// watchWake delivers TimerFired to a Run (the Loop's WakeAt).
	watchWake
	// watchAttach asks again, during recovery, an executor that was
	// unavailable.
	watchAttach
)

// watchItem is one registration in the Watcher. Key identifies it: a new
// registration with the same Key replaces the old one.
type watchItem struct {
	Key      string
	Kind     watchKind
	At       time.Time
	Tenant   string
	Session  string
	RunID    string
	EffectID string
	Attempt  int
	Handle   string
	// Interval is the poll interval that led to At; the next poll, unless
	// the executor asks for another, waits twice as long (up to the
	// Watcher's maximum).
	Interval time.Duration
}

// watcher is the runtime's one scheduler: a timer heap of effect polls and
// Run wake-ups, armed on a single Clock timer for the earliest item. It
// runs no goroutine per item: an item costs a heap slot until it falls
// due. When the timer fires, every item due by then is handed to fire in
// one batch.
//
// A watcher is safe for concurrent use. After Stop it drops every
// registration and accepts none.
type watcher struct {
	clock Clock
	fire  func(batch []watchItem)

	mu      sync.Mutex
	items   watchHeap
	index   map[string]*watchEntry
	timer   Timer
	armedAt time.Time
	stopped bool
}

type watchEntry struct {
	item watchItem
	pos  int
}

type watchHeap []*watchEntry

func (h watchHeap) Len() int { return len(h) }
func (h watchHeap) Less(i, j int) bool {
	if !h[i].item.At.Equal(h[j].item.At) {
		return h[i].item.At.Before(h[j].item.At)
	}
	return h[i].item.Key < h[j].item.Key
}
func (h watchHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].pos = i; h[j].pos = j }
func (h *watchHeap) Push(x any)   { e := x.(*watchEntry); e.pos = len(*h); *h = append(*h, e) }
func (h *watchHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.pos = -1
	return e
}

// newWatcher returns a Watcher that hands due items to fire. fire is
// called from a Clock timer goroutine and should hand the batch on rather
// than block.
func newWatcher(clock Clock, fire func(batch []watchItem)) *watcher {
	return &watcher{clock: clock, fire: fire, index: map[string]*watchEntry{}}
}

// Schedule registers it, replacing any item with the same Key. It reports
// false when the Watcher is stopped.
func (w *watcher) Schedule(it watchItem) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	if e, ok := w.index[it.Key]; ok {
		e.item = it
		heap.Fix(&w.items, e.pos)
	} else {
		e := &watchEntry{item: it}
		heap.Push(&w.items, e)
		w.index[it.Key] = e
	}
	w.armLocked()
	return true
}

// Cancel drops the item with key, if any.
func (w *watcher) Cancel(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.index[key]; ok {
		heap.Remove(&w.items, e.pos)
		delete(w.index, key)
	}
}

// Len returns the number of registered items (the queue depth).
func (w *watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.items)
}

// Stop drops every registration and disarms the timer.
func (w *watcher) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.items = nil
	w.index = map[string]*watchEntry{}
}

// armLocked makes sure one timer is armed for the earliest item.
func (w *watcher) armLocked() {
	if len(w.items) == 0 {
		return
	}
	next := w.items[0].item.At
	if w.timer != nil && !w.armedAt.After(next) {
		return
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	w.armedAt = next
	w.timer = w.clock.AfterFunc(next.Sub(w.clock.Now()), w.onTimer)
}

func (w *watcher) onTimer() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.timer = nil
	now := w.clock.Now()
	var batch []watchItem
	for len(w.items) > 0 && !w.items[0].item.At.After(now) {
		e := heap.Pop(&w.items).(*watchEntry)
		delete(w.index, e.item.Key)
		batch = append(batch, e.item)
	}
	w.armLocked()
	w.mu.Unlock()
	if len(batch) > 0 {
		w.fire(batch)
	}
}

// nextPollInterval doubles a poll interval, bounded by [min, max].
func nextPollInterval(prev, min, max time.Duration) time.Duration {
	next := prev * 2
	if next < min {
		next = min
	}
	if next > max {
		next = max
	}
	return next
}

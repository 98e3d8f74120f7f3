// Package watcher is the runtime's one scheduler: a timer heap of effect
// polls, Run wake-ups and deferred recovery attaches, armed on a single
// Clock timer for the earliest item (docs/DESIGN.md §5). It knows nothing
// of Runs: an Item names what to do, and the function given to New does
// it.
package watcher

import (
	"container/heap"
	"sync"
	"time"
)

// Kind says what an Item is for.
type Kind uint8

const (
	// Poll polls a pending effect attempt.
	Poll Kind = iota + 1
	// Wake delivers TimerFired to a Run (the Loop's WakeAt).
	Wake
	// Attach asks again, during recovery, an executor that was
	// unavailable.
	Attach
	// Budget starts a model call that waited for its endpoint's budget.
	Budget
)

// Item is one registration in the Watcher. Key identifies it: a new
// registration with the same Key replaces the old one.
type Item struct {
	Key      string
	Kind     Kind
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

// Clock is the source of time and timers a Watcher needs: the runtime's
// Clock, seen through a Timer of this package.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	Stop() bool
}

// Watcher is a timer heap of Items, armed on a single Clock timer for the
// earliest item. It runs no goroutine per item: an item costs a heap slot
// until it falls due. When the timer fires, every item due by then is
// handed to fire in one batch.
//
// A Watcher is safe for concurrent use. After Stop it drops every
// registration and accepts none.
type Watcher struct {
	// clock and fire are set by New and never change.
	clock Clock
	fire  func(batch []Item)

	// mu guards the fields below, up to the end of the struct. It is a
	// leaf but for the Clock: Schedule and Stop arm and stop the Clock's
	// timer under it. fire is called without it.
	mu      sync.Mutex
	items   itemHeap
	index   map[string]*entry
	timer   Timer
	armedAt time.Time
	stopped bool
}

type entry struct {
	item Item
	pos  int
}

type itemHeap []*entry

func (h itemHeap) Len() int { return len(h) }
func (h itemHeap) Less(i, j int) bool {
	if !h[i].item.At.Equal(h[j].item.At) {
		return h[i].item.At.Before(h[j].item.At)
	}
	return h[i].item.Key < h[j].item.Key
}
func (h itemHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].pos = i; h[j].pos = j }
func (h *itemHeap) Push(x any)   { e := x.(*entry); e.pos = len(*h); *h = append(*h, e) }
func (h *itemHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.pos = -1
	return e
}

// New returns a Watcher that hands due items to fire. fire is called from
// a Clock timer goroutine, holding no lock of the Watcher, and should
// hand the batch on rather than block.
func New(clock Clock, fire func(batch []Item)) *Watcher {
	return &Watcher{clock: clock, fire: fire, index: map[string]*entry{}}
}

// Schedule registers it, replacing any item with the same Key. It reports
// false when the Watcher is stopped.
func (w *Watcher) Schedule(it Item) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	if e, ok := w.index[it.Key]; ok {
		e.item = it
		heap.Fix(&w.items, e.pos)
	} else {
		e := &entry{item: it}
		heap.Push(&w.items, e)
		w.index[it.Key] = e
	}
	w.armLocked()
	return true
}

// Cancel drops the item with key, if any.
func (w *Watcher) Cancel(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.index[key]; ok {
		heap.Remove(&w.items, e.pos)
		delete(w.index, key)
	}
}

// Hasten makes the item with key due at at, if it is registered and due
// later; it reports whether it moved the item. The item is otherwise as
// it was (its Interval too, so a poll made early backs off from where it
// stood).
func (w *Watcher) Hasten(key string, at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.index[key]
	if !ok || w.stopped || !e.item.At.After(at) {
		return false
	}
	e.item.At = at
	heap.Fix(&w.items, e.pos)
	w.armLocked()
	return true
}

// Scheduled reports whether an item with key is registered.
func (w *Watcher) Scheduled(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.index[key]
	return ok
}

// Len returns the number of registered items (the queue depth).
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.items)
}

// Stop drops every registration and disarms the timer.
func (w *Watcher) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.items = nil
	w.index = map[string]*entry{}
}

// armLocked makes sure one timer is armed for the earliest item.
func (w *Watcher) armLocked() {
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

// onTimer runs on the Clock's timer goroutine: it takes every item due
// by now out of the heap, arms the timer for the next one, and hands the
// batch to fire once it has let go of the lock.
func (w *Watcher) onTimer() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.timer = nil
	now := w.clock.Now()
	var batch []Item
	for len(w.items) > 0 && !w.items[0].item.At.After(now) {
		e := heap.Pop(&w.items).(*entry)
		delete(w.index, e.item.Key)
		batch = append(batch, e.item)
	}
	w.armLocked()
	w.mu.Unlock()
	if len(batch) > 0 {
		w.fire(batch)
	}
}

// NextPollInterval doubles a poll interval, bounded by [min, max].
func NextPollInterval(prev, min, max time.Duration) time.Duration {
	next := prev * 2
	if next < min {
		next = min
	}
	if next > max {
		next = max
	}
	return next
}

package conformance

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/runtime"
)

// FakeClock is a runtime.Clock whose time moves only when a test says so.
// AfterFunc callbacks run, each in its own goroutine as the Clock contract
// says, when Advance or Set moves the time past their instant.
//
// For tests; not a stable API. Safe for concurrent use.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	timers  map[uint64]*fakeTimer
	running atomic.Int64 // callbacks started and not yet returned
}

var _ runtime.Clock = (*FakeClock)(nil)

type fakeTimer struct {
	c   *FakeClock
	id  uint64
	at  time.Time
	fn  func()
	ran bool
}

// NewFakeClock returns a FakeClock set to start. A zero start means
// 2026-01-01T00:00:00Z, so that tests are reproducible.
func NewFakeClock(start time.Time) *FakeClock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &FakeClock{now: start, timers: map[uint64]*fakeTimer{}}
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms f to run once the fake time reaches Now()+d. A d <= 0
// runs f at once, in its own goroutine.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) runtime.Timer {
	c.mu.Lock()
	c.seq++
	t := &fakeTimer{c: c, id: c.seq, at: c.now.Add(d), fn: f}
	if d <= 0 {
		t.ran = true
		c.mu.Unlock()
		c.run(f)
		return t
	}
	c.timers[t.id] = t
	c.mu.Unlock()
	return t
}

// Stop disarms the timer and reports whether it was armed.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.ran {
		return false
	}
	_, armed := t.c.timers[t.id]
	delete(t.c.timers, t.id)
	t.ran = true
	return armed
}

// Advance moves the time forward by d and fires, in instant order, every
// timer that falls due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	c.Set(target)
}

// Set moves the time to t (never backwards) and fires the timers that fall
// due.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	var due []*fakeTimer
	for id, tm := range c.timers {
		if !tm.at.After(c.now) {
			due = append(due, tm)
			tm.ran = true
			delete(c.timers, id)
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if !due[i].at.Equal(due[j].at) {
			return due[i].at.Before(due[j].at)
		}
		return due[i].id < due[j].id
	})
	for _, tm := range due {
		c.run(tm.fn)
	}
}

func (c *FakeClock) run(f func()) {
	c.running.Add(1)
	go func() {
		defer c.running.Add(-1)
		f()
	}()
}

// Running returns the number of callbacks started and not yet returned.
func (c *FakeClock) Running() int { return int(c.running.Load()) }

// Pending returns the number of armed timers. Tests wait for it to reach a
// value before they advance time, instead of sleeping.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NextAt returns the instant of the earliest armed timer.
func (c *FakeClock) NextAt() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, tm := range c.timers {
		if next.IsZero() || tm.at.Before(next) {
			next = tm.at
		}
	}
	return next, !next.IsZero()
}

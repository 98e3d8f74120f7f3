// Package backlog counts the Run commits under way in the store, and holds
// a session's new work back while they are too many.
package backlog

import (
	"context"
	"sync"
)

// Backlog counts the Run commits under way in the store, and holds new
// work back while they are too many. An executor call gives its call slot
// back as soon as its executor answers, before it commits the answer (the
// runtime's launch), so nothing else bounds the answers waiting for the
// store: when the executors answer faster than the store commits
// (recovery on a slow disk, once plugin KV reads no longer wait for the
// store's commits), those goroutines and their Runs pile up, and every
// commit, the node lease's renewal among them, waits behind them.
//
// The source of new work is a session's drive (a recovered Run's attach,
// a new Run's first step): a drive waits before it begins while
// Options.MaxCallsInFlight commits are under way, and goes on once they
// are fewer. It waits holding no Run's lock, and no commit waits for a
// drive, so the commits under way always finish. The commits themselves
// never wait here: an advance under way, a call's answer, goes on.
//
// A Backlog is safe for concurrent use.
type Backlog struct {
	// max is set by New and never changes.
	max int

	// mu guards the fields below, up to the end of the struct. It is a
	// leaf: Wait lets go of it before it waits.
	mu    sync.Mutex
	n     int
	below chan struct{} // closed while n < max
}

// New returns a Backlog that holds new work back while max commits are
// under way.
func New(max int) *Backlog {
	b := &Backlog{max: max, below: make(chan struct{})}
	close(b.below)
	return b
}

// Begin counts a commit as under way; End, as finished.
func (b *Backlog) Begin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n++; b.n == b.max {
		b.below = make(chan struct{})
	}
}

// End counts a commit Begin counted as finished.
func (b *Backlog) End() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n--; b.n == b.max-1 {
		close(b.below)
	}
}

// Wait returns once fewer than max commits are under way (true), or when
// ctx is done (false).
func (b *Backlog) Wait(ctx context.Context) bool {
	for {
		b.mu.Lock()
		if b.n < b.max {
			b.mu.Unlock()
			return true
		}
		below := b.below
		b.mu.Unlock()
		select {
		case <-below:
		case <-ctx.Done():
			return false
		}
	}
}

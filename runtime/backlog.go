package runtime

import (
	"context"
	"sync"
)

// commitBacklog counts the Run commits under way in the store, and holds
// new work back while they are too many. An executor call gives its call
// slot back as soon as its executor answers, before it commits the answer
// (launch), so nothing else bounds the answers waiting for the store:
// when the executors answer faster than the store commits (recovery on a
// slow disk, once plugin KV reads no longer wait for the store's
// commits), those goroutines and their Runs pile up, and every commit,
// the node lease's renewal among them, waits behind them.
//
// The source of new work is a session's drive (a recovered Run's attach,
// a new Run's first step): a drive waits before it begins while
// Options.MaxCallsInFlight commits are under way, and goes on once they
// are fewer. It waits holding no Run's lock, and no commit waits for a
// drive, so the commits under way always finish. The commits themselves
// never wait here: an advance under way, a call's answer, goes on.
type commitBacklog struct {
	mu    sync.Mutex
	n     int
	max   int
	below chan struct{} // closed while n < max
}

func newCommitBacklog(max int) *commitBacklog {
	b := &commitBacklog{max: max, below: make(chan struct{})}
	close(b.below)
	return b
}

// begin counts a commit as under way; end, as finished.
func (b *commitBacklog) begin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n++; b.n == b.max {
		b.below = make(chan struct{})
	}
}

func (b *commitBacklog) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n--; b.n == b.max-1 {
		close(b.below)
	}
}

// wait returns once fewer than max commits are under way (true), or when
// ctx is done (false).
func (b *commitBacklog) wait(ctx context.Context) bool {
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

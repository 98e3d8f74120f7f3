package conformance

import (
	"context"
	"sync"

	"github.com/agenthost/agenthost/runtime"
)

// MemHandle is one process's handle on a MemStore that several share, as
// several nodes share one PostgreSQL database: everything goes to the same
// MemStore, and the handle is a runtime.ChangeFeed that reports the Runs
// created and committed through the other handles. Make them with
// (*MemStore).Handle. ClusterSuite runs the runtime's several-node
// behaviour over them, deterministically, and over pgstore for real.
type MemHandle struct {
	*MemStore
	feed *memFeed
}

var (
	_ runtime.Store      = (*MemHandle)(nil)
	_ runtime.ChangeFeed = (*MemHandle)(nil)
)

// memFeed delivers the changes of the other handles to one handle's
// subscribers, in order, from one goroutine.
type memFeed struct {
	mu      sync.Mutex
	queue   []runtime.Change
	subs    map[int]func(runtime.Change)
	nextSub int
	wake    chan struct{}
	stop    chan struct{}
	stopped bool
	done    chan struct{}
}

// Handle returns a new handle on s. Close it to stop its feed; the
// MemStore stays open for the other handles.
func (s *MemStore) Handle() *MemHandle {
	f := &memFeed{subs: map[int]func(runtime.Change){}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go f.deliver()
	h := &MemHandle{MemStore: s, feed: f}
	s.feedMu.Lock()
	s.feeds = append(s.feeds, f)
	s.feedMu.Unlock()
	return h
}

// CreateRun implements runtime.Store, and reports the new Run to the other
// handles.
func (h *MemHandle) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	res, err := h.MemStore.CreateRun(ctx, c)
	if err == nil && !res.Duplicate {
		h.announce(res.Run.Tenant, res.Run.Session, res.Run.ID, res.Run.Seq)
	}
	return res, err
}

// Commit implements runtime.Store, and reports the commit to the other
// handles.
func (h *MemHandle) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	res, err := h.MemStore.Commit(ctx, c)
	if err == nil && !res.Duplicate {
		h.announce(c.Tenant, c.Session, c.RunID, res.Seq)
	}
	return res, err
}

// Close stops the handle's feed. The MemStore stays open.
func (h *MemHandle) Close() error {
	h.feed.close()
	return nil
}

// SubscribeChanges implements runtime.ChangeFeed.
func (h *MemHandle) SubscribeChanges(fn func(runtime.Change)) func() {
	f := h.feed
	f.mu.Lock()
	id := f.nextSub
	f.nextSub++
	f.subs[id] = fn
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		delete(f.subs, id)
		f.mu.Unlock()
	}
}

// Rescan delivers a Rescan to the handle's subscribers, as a feed does
// after it reconnected. Test-only.
func (h *MemHandle) Rescan() { h.feed.push(runtime.Change{Rescan: true}) }

func (h *MemHandle) announce(tenant, session, runID string, seq int64) {
	s := h.MemStore
	s.mu.Lock()
	var owner string
	if sess := s.sessions[memSessionKey{tenant, session}]; sess != nil {
		owner = sess.owner
	}
	s.mu.Unlock()
	c := runtime.Change{Tenant: tenant, Session: session, RunID: runID, Seq: seq, Owner: owner}
	s.feedMu.Lock()
	feeds := append([]*memFeed(nil), s.feeds...)
	s.feedMu.Unlock()
	for _, f := range feeds {
		if f != h.feed {
			f.push(c)
		}
	}
}

func (f *memFeed) push(c runtime.Change) {
	f.mu.Lock()
	if !f.stopped {
		f.queue = append(f.queue, c)
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *memFeed) deliver() {
	defer close(f.done)
	for {
		select {
		case <-f.stop:
			return
		case <-f.wake:
		}
		for {
			f.mu.Lock()
			if len(f.queue) == 0 || f.stopped {
				f.mu.Unlock()
				break
			}
			c := f.queue[0]
			f.queue = f.queue[1:]
			subs := make([]func(runtime.Change), 0, len(f.subs))
			for _, fn := range f.subs {
				subs = append(subs, fn)
			}
			f.mu.Unlock()
			for _, fn := range subs {
				fn(c)
			}
		}
	}
}

func (f *memFeed) close() {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.stopped = true
	f.mu.Unlock()
	close(f.stop)
	<-f.done
}

package runtime

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Notice tells a subscriber that something happened to a Run: events were
// committed up to Seq, or a plugin emitted a progress event.
type Notice struct {
	Tenant   string
	RunID    string
	Seq      int64          // the Run's version after a commit; 0 for an emit
	Emit     *abi.EmitEvent // a plugin's agenthost_emit, not durable
	EffectID string         // the effect whose call emitted
	Plugin   string
	Attempt  int   // the attempt of that effect
	DeltaSeq int64 // a model_delta's number within its call, from 1
}

// Hub fans notices out to the subscribers of each Run. The runtime
// publishes every commit into it, and the plugin host publishes emits (Hub
// is a runtime.EventSink). Delivery never blocks the publisher: a
// subscriber whose buffer is full misses notices, which costs it nothing
// durable, since commits are re-read from the Store; only emits, which
// are not durable, can be lost that way.
//
// The Hub also owns the followers of each Run (NewFollower, Follow) and
// their Run's tail, the one reader of its new events (tail.go). The
// Runtimes given one Hub must share one store: a notice names a Run of
// that store.
//
// Hub is safe for concurrent use.
type Hub struct {
	// mu guards subs, tails and followers. Under it, Publish, follow and
	// leave take a tail's mu: Hub.mu comes first.
	mu        sync.Mutex
	subs      map[string]map[chan Notice]struct{} // by tenant/run
	tails     map[string][]*tail                  // by tenant/run: one for each Runtime with a follower of the Run
	followers map[string]int                      // by tenant: the open followers
	counters  followCounters                      // atomic
}

var _ EventSink = (*Hub)(nil)

// NewHub returns an empty Hub.
func NewHub() *Hub {
	return &Hub{subs: map[string]map[chan Notice]struct{}{}, tails: map[string][]*tail{}, followers: map[string]int{}}
}

// Subscribe returns a channel of the Run's notices and a function that
// ends the subscription.
func (h *Hub) Subscribe(tenant, runID string) (<-chan Notice, func()) {
	ch := make(chan Notice, 64)
	k := runKey(tenant, runID)
	h.mu.Lock()
	if h.subs[k] == nil {
		h.subs[k] = map[chan Notice]struct{}{}
	}
	h.subs[k][ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs[k], ch)
			if len(h.subs[k]) == 0 {
				delete(h.subs, k)
			}
			h.mu.Unlock()
		})
	}
}

// Publish hands n to every subscriber of its Run, and to its tails,
// without blocking.
func (h *Hub) Publish(n Notice) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := runKey(n.Tenant, n.RunID)
	for ch := range h.subs[k] {
		select {
		case ch <- n:
		default:
		}
	}
	for _, t := range h.tails[k] {
		t.notice(n)
	}
}

// Emit implements EventSink: a plugin's progress event goes to the Run's
// subscribers.
func (h *Hub) Emit(_ context.Context, scope EmitScope, ev abi.EmitEvent) error {
	if scope.Tenant == "" || scope.RunID == "" {
		return errors.New("runtime: emit outside a Run")
	}
	h.Publish(Notice{Tenant: scope.Tenant, RunID: scope.RunID, Emit: &ev, EffectID: scope.EffectID, Plugin: scope.Plugin,
		Attempt: scope.Attempt, DeltaSeq: scope.DeltaSeq})
	return nil
}

// StreamItem is one item of a Run's stream: a committed event, or a
// plugin's emit: its progress, or a model's partial output (Emit.Type
// abi.EmitModelDelta), which is not durable either. The event and the
// emit may be shared with the Run's other followers: they must not be
// modified.
type StreamItem struct {
	Event    *loop.Event
	Emit     *abi.EmitEvent
	EffectID string // the effect whose call emitted
	Plugin   string
	Attempt  int   // the attempt of that effect
	DeltaSeq int64 // a model_delta's number within its call, from 1
}

// followFallback is how long a followed Run's tail waits between reads of
// its log when no notice comes: a commit made by another process
// publishes nothing here unless the store is a ChangeFeed, and a change
// notice can be lost (docs/DESIGN.md §5.6). It is measured on the
// runtime's Clock.
const followFallback = time.Second

// Follow calls fn, in order, for every event of a Run whose Seq is at least
// fromSeq, as they are committed, and for every emit while it follows. It
// returns nil after the Run's terminal event (or at once when the Run has
// ended and its log was pruned: a pruned log ends where the snapshot is
// terminal), ctx's error when ctx ends, or fn's error. Events are read
// from the Store, so none is skipped, however slow fn is.
//
// However many follow a Run, one reader, the Run's tail, reads its new
// events once for all of them; Follow reads from the store itself only
// the events before the tail's (see NewFollower, the pull form).
func (rt *Runtime) Follow(ctx context.Context, tenant, runID string, fromSeq int64, fn func(StreamItem) error) error {
	f, err := rt.NewFollower(tenant, runID, fromSeq, FollowOptions{})
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		items, done, err := f.Next(ctx)
		for _, it := range items {
			if err := fn(it); err != nil {
				return err
			}
		}
		switch {
		case err != nil:
			return err
		case done:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.Ready():
		}
	}
}

// Hub returns the runtime's notice hub.
func (rt *Runtime) Hub() *Hub { return rt.hub }

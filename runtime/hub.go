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
}

// Hub fans notices out to the subscribers of each Run. The runtime
// publishes every commit into it, and the plugin host publishes emits (Hub
// is a runtime.EventSink). Delivery never blocks the publisher: a
// subscriber whose buffer is full misses notices, which costs it nothing
// durable, since commits are re-read from the Store (see Runtime.Follow);
// only emits, which are not durable, can be lost that way.
//
// Hub is safe for concurrent use.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan Notice]struct{} // by tenant/run
}

var _ EventSink = (*Hub)(nil)

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{subs: map[string]map[chan Notice]struct{}{}} }

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

// Publish hands n to every subscriber of its Run, without blocking.
func (h *Hub) Publish(n Notice) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[runKey(n.Tenant, n.RunID)] {
		select {
		case ch <- n:
		default:
		}
	}
}

// Emit implements EventSink: a plugin's progress event goes to the Run's
// subscribers.
func (h *Hub) Emit(_ context.Context, scope EmitScope, ev abi.EmitEvent) error {
	if scope.Tenant == "" || scope.RunID == "" {
		return errors.New("runtime: emit outside a Run")
	}
	h.Publish(Notice{Tenant: scope.Tenant, RunID: scope.RunID, Emit: &ev, EffectID: scope.EffectID, Plugin: scope.Plugin})
	return nil
}

// StreamItem is one item of a Run's stream: a committed event, or a
// plugin's emit.
type StreamItem struct {
	Event    *loop.Event
	Emit     *abi.EmitEvent
	EffectID string
	Plugin   string
}

// followFallback is how long Follow waits for a notice before it reads the
// log again: a commit made by another process publishes nothing here. It
// is measured on the runtime's Clock.
const followFallback = time.Second

// Follow calls fn, in order, for every event of a Run whose Seq is at least
// fromSeq, as they are committed, and for every emit while it follows. It
// returns nil after the Run's terminal event, ctx's error when ctx ends, or
// fn's error. Events are read from the Store, so none is skipped, however
// slow fn is.
func (rt *Runtime) Follow(ctx context.Context, tenant, runID string, fromSeq int64, fn func(StreamItem) error) error {
	notices, cancel := rt.hub.Subscribe(tenant, runID)
	defer cancel()
	if fromSeq < 1 {
		fromSeq = 1
	}
	fallback := make(chan struct{}, 1)
	arm := func() Timer {
		return rt.clock.AfterFunc(followFallback, func() {
			select {
			case fallback <- struct{}{}:
			default:
			}
		})
	}
	tm := arm()
	defer func() { tm.Stop() }()
	for {
		evs, err := rt.store.Events(ctx, tenant, runID, fromSeq, 0)
		if err != nil {
			return err
		}
		for i := range evs {
			ev := evs[i]
			if err := fn(StreamItem{Event: &ev}); err != nil {
				return err
			}
			fromSeq = ev.Seq + 1
			if ev.Terminal() {
				return nil
			}
		}
		if len(evs) == 0 {
			// A pruned log ends where the snapshot is terminal.
			if run, err := rt.store.LoadRun(ctx, tenant, runID); err != nil {
				return err
			} else if run.Status.Terminal() {
				// Its terminal event was seen, or pruned with the log:
				// nothing more will come.
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case n := <-notices:
			if n.Emit != nil {
				if err := fn(StreamItem{Emit: n.Emit, EffectID: n.EffectID, Plugin: n.Plugin}); err != nil {
					return err
				}
			}
		case <-fallback:
			tm = arm()
		}
	}
}

// Hub returns the runtime's notice hub.
func (rt *Runtime) Hub() *Hub { return rt.hub }

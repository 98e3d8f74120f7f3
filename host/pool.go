package host

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/runtime"
)

// pool holds the instances of one (tenant, plugin), all from the plugin's
// one CompiledPlugin. At most Limits.MaxInstances exist at once: a call
// that finds no instance idle makes one while there are fewer, in its
// turn (acquire), and waits for one within its context beyond that, or
// while the host-wide memory cap leaves no room for another
// (Host.waitForRoom). Up to Limits.PoolSize instances are kept idle after
// their call, reused last-in first-out and closed after
// Limits.IdleTimeout on the host clock. An instance released while
// PoolSize are idle already is kept too while other calls want one
// (demand), and closed at once otherwise, with any idle beyond PoolSize:
// a burst of calls (a restart's attaches) is served by the instances it
// made, instead of closing each one past PoolSize as its call ends and
// making another for the call that waited. An instance that failed is
// closed, never put back.
type pool struct {
	p      *Plugin
	tenant string
	slots  chan struct{} // one token per instance in use or being made
	// waiting counts the callers waiting for a token or for memory.
	waiting atomic.Int64
	// demand counts the calls in acquire: those that want an instance
	// and have none yet.
	demand atomic.Int64

	mu   sync.Mutex
	idle []*instance
	// freed, made by a call that found nothing idle, is closed when an
	// instance is next released to idle (or the pool closes).
	freed  chan struct{}
	inUse  int
	closed bool
	timer  runtime.Timer // the armed idle sweep, if any
	st     PoolStats
}

// slowInstanceWait is the wait for an instance past which a call logs it.
const slowInstanceWait = time.Second

func newPool(p *Plugin, tenant string) *pool {
	return &pool{p: p, tenant: tenant, slots: make(chan struct{}, p.spec.Limits.MaxInstances)}
}

// acquire returns an instance for the caller's exclusive use, for a call
// of export. A call that finds none idle makes one in its turn: at most
// GOMAXPROCS instances are made at once over the host (Host.makers), and
// a call that finds every turn taken waits for one or for an instance
// another call of the pool releases meanwhile, and takes whichever comes
// first. So a burst of short calls on an empty pool (a restart's
// attaches) is served by a few instances, made while the first calls run,
// instead of each call making its own at once; calls that hold their
// instances (on the network) still get one each, made a few at a time.
// The wait for a turn is part of making the instance, as the making is:
// neither counts as a wait for an instance.
func (pl *pool) acquire(ctx context.Context, export string) (*instance, error) {
	pl.demand.Add(1)
	defer pl.demand.Add(-1)
	wait := callWait{plugin: pl.p.name} // begun once the call has to wait
	defer pl.noteWait(&wait)
	select {
	case pl.slots <- struct{}{}:
	default:
		wait.begin(ctx)
		pl.waiting.Add(1)
		select {
		case pl.slots <- struct{}{}:
			pl.waiting.Add(-1)
		case <-ctx.Done():
			pl.waiting.Add(-1)
			return nil, fmt.Errorf("waiting for one of max_instances %d instances of tenant %q: %w", cap(pl.slots), pl.tenant, ctx.Err())
		}
	}
	for {
		pl.mu.Lock()
		in, err := pl.takeIdleLocked()
		if in != nil || err != nil {
			pl.mu.Unlock()
			return in, err
		}
		if pl.freed == nil {
			pl.freed = make(chan struct{})
		}
		freed := pl.freed
		pl.mu.Unlock()
		select {
		case pl.p.h.makers <- struct{}{}:
		default:
			if hook := pl.p.h.onMakerWait; hook != nil {
				hook()
			}
			select {
			case pl.p.h.makers <- struct{}{}:
			case <-freed:
				continue
			case <-ctx.Done():
				<-pl.slots
				return nil, fmt.Errorf("waiting for a turn to make an instance (at most %d are made at once): %w", cap(pl.p.h.makers), ctx.Err())
			}
		}
		return pl.makeInTurn(ctx, export, &wait)
	}
}

// takeIdleLocked takes the newest idle instance (nil when none is idle),
// or fails when the pool is closed, giving the caller's slot back. Called
// with pl.mu held.
func (pl *pool) takeIdleLocked() (*instance, error) {
	if pl.closed {
		<-pl.slots
		return nil, errPoolClosed
	}
	n := len(pl.idle)
	if n == 0 {
		return nil, nil
	}
	in := pl.idle[n-1]
	pl.idle = pl.idle[:n-1]
	pl.inUse++
	pl.p.h.budget.lent()
	return in, nil
}

// makeInTurn makes an instance in the caller's turn to make one (a
// Host.makers token, which it gives back), or takes one released while
// the caller waited for the turn.
func (pl *pool) makeInTurn(ctx context.Context, export string, wait *callWait) (*instance, error) {
	defer func() { <-pl.p.h.makers }()
	pl.mu.Lock()
	if in, err := pl.takeIdleLocked(); in != nil || err != nil {
		pl.mu.Unlock()
		return in, err
	}
	pl.inUse++
	pl.mu.Unlock()
	in, err := pl.create(ctx, export, wait)
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if err != nil {
		pl.inUse--
		<-pl.slots
		return nil, err
	}
	pl.st.Created++
	pl.p.h.budget.lent()
	return in, nil
}

// create makes a new instance once there is room for it under the
// host-wide memory cap, waiting for room while other instances serve
// calls (counted as the caller's wait for an instance).
func (pl *pool) create(ctx context.Context, export string, wait *callWait) (*instance, error) {
	if err := pl.p.h.waitForRoom(ctx, wait, &pl.waiting); err != nil {
		return nil, err
	}
	return pl.p.newInstance(ctx, export)
}

// callWait is one call's wait for an instance: when it began (zero while
// the call has not waited), and the function that tells the runtime it
// ended (runtime.CapacityWaitBegan).
type callWait struct {
	plugin string
	since  time.Time
	ended  func()
}

// begin marks the call as waiting from now, unless it waits already, and
// tells the runtime which plugin it waits for, through ctx.
func (w *callWait) begin(ctx context.Context) {
	if !w.since.IsZero() {
		return
	}
	w.since = time.Now()
	w.ended = runtime.CapacityWaitBegan(ctx, w.plugin)
}

// noteWait ends a call's wait for an instance (none when it did not
// wait): it tells the runtime, counts the wait in the pool's and the
// plugin's counters, and logs a long one.
func (pl *pool) noteWait(w *callWait) {
	if w.since.IsZero() {
		return
	}
	w.ended()
	d := time.Since(w.since)
	pl.mu.Lock()
	pl.st.Waited++
	pl.mu.Unlock()
	pl.p.waits.Add(1)
	pl.p.waitNanos.Add(int64(d))
	if d >= slowInstanceWait {
		pl.p.h.log.Warn("a plugin call waited for an instance",
			"plugin", pl.p.name, "tenant", pl.tenant, "waited", d.Round(time.Millisecond).String(),
			"max_instances", cap(pl.slots), "memory_in_use", pl.p.h.budget.used.Load())
	}
}

// release gives an instance back: to the idle list when keep is set, the
// pool is open, and fewer than PoolSize are idle or another call wants
// an instance (demand); otherwise it is closed (its memory freed), and so
// are the idle instances beyond PoolSize that a burst left.
func (pl *pool) release(ctx context.Context, in *instance, keep bool) {
	defer pl.p.h.budget.returned()
	pl.mu.Lock()
	pl.inUse--
	if !keep {
		pl.st.Failed++
	}
	size := pl.p.spec.Limits.PoolSize
	if keep && !pl.closed && (len(pl.idle) < size || pl.demand.Load() > 0) {
		in.lastUsed = pl.p.h.clock.Now()
		pl.idle = append(pl.idle, in)
		pl.wakeLocked()
		pl.armSweepLocked()
		pl.mu.Unlock()
		<-pl.slots
		return
	}
	var surplus []*instance
	if keep && !pl.closed {
		pl.st.Trimmed++
		// The oldest first: the idle list is reused last-in first-out.
		if n := len(pl.idle) - size; n > 0 {
			surplus = append(surplus, pl.idle[:n]...)
			kept := copy(pl.idle, pl.idle[n:])
			clear(pl.idle[kept:])
			pl.idle = pl.idle[:kept]
			pl.st.Trimmed += n
		}
	}
	pl.mu.Unlock()
	in.close(ctx)
	for _, s := range surplus {
		s.close(ctx)
	}
	<-pl.slots
}

// wakeLocked wakes the calls waiting for a turn to make an instance: one
// is idle now, or the pool closed. Called with pl.mu held.
func (pl *pool) wakeLocked() {
	if pl.freed != nil {
		close(pl.freed)
		pl.freed = nil
	}
}

// armSweepLocked arms the idle sweep for the oldest idle instance.
func (pl *pool) armSweepLocked() {
	if pl.timer != nil || len(pl.idle) == 0 || pl.closed {
		return
	}
	oldest := pl.idle[0].lastUsed
	for _, in := range pl.idle[1:] {
		if in.lastUsed.Before(oldest) {
			oldest = in.lastUsed
		}
	}
	wait := oldest.Add(pl.p.spec.Limits.IdleTimeout).Sub(pl.p.h.clock.Now())
	pl.timer = pl.p.h.clock.AfterFunc(wait, pl.sweep)
}

// sweep closes the instances idle for IdleTimeout or longer.
func (pl *pool) sweep() {
	now := pl.p.h.clock.Now()
	pl.mu.Lock()
	pl.timer = nil
	var stale []*instance
	kept := pl.idle[:0]
	for _, in := range pl.idle {
		if !now.Before(in.lastUsed.Add(pl.p.spec.Limits.IdleTimeout)) {
			stale = append(stale, in)
		} else {
			kept = append(kept, in)
		}
	}
	clear(pl.idle[len(kept):])
	pl.idle = kept
	pl.st.Evicted += len(stale)
	pl.armSweepLocked()
	pl.mu.Unlock()
	for _, in := range stale {
		in.close(context.Background())
	}
}

// idleSnapshot lists the idle instances, for host-wide eviction.
func (pl *pool) idleSnapshot() []*instance {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return append([]*instance(nil), pl.idle...)
}

// evict closes one idle instance, if it is still idle.
func (pl *pool) evict(ctx context.Context, target *instance) {
	pl.mu.Lock()
	for i, in := range pl.idle {
		if in == target {
			pl.idle = append(pl.idle[:i], pl.idle[i+1:]...)
			pl.st.Evicted++
			pl.mu.Unlock()
			in.close(ctx)
			return
		}
	}
	pl.mu.Unlock()
}

func (pl *pool) stats() PoolStats {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	s := pl.st
	s.Idle, s.InUse, s.Waiting = len(pl.idle), pl.inUse, int(pl.waiting.Load())
	return s
}

// close closes the idle instances now; those in use close on release.
func (pl *pool) close(ctx context.Context) {
	pl.mu.Lock()
	pl.closed = true
	idle := pl.idle
	pl.idle = nil
	pl.wakeLocked()
	if pl.timer != nil {
		pl.timer.Stop()
		pl.timer = nil
	}
	pl.mu.Unlock()
	for _, in := range idle {
		in.close(ctx)
	}
}

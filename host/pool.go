package host

import (
	"context"
	"fmt"
	"slices"
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
// (Host.waitForRoom). Every instance goes back idle after its call,
// reused last-in first-out. Up to Limits.PoolSize stay idle until
// Limits.IdleTimeout on the host clock; the ones beyond PoolSize that a
// burst of calls left are closed, the oldest first, once unused for
// burstLinger (the idle sweep), or sooner when the host needs their memory
// (Host.evictIdleFor). So calls that come in waves (the Runs a group
// commit wakes at once, each holding its instance while it waits on the
// network or on a KV write; a restart's attaches) are served by the
// instances the first wave made, instead of closing each past PoolSize as
// its call ends and making another for the next wave. An instance that
// failed is closed, never put back.
type pool struct {
	p      *Plugin
	tenant string
	slots  chan struct{} // one token per instance in use or being made
	// waiting counts the callers waiting for a token or for memory.
	waiting atomic.Int64

	mu   sync.Mutex
	idle []*instance
	// freed, made by a call that found nothing idle, is closed when an
	// instance is next released to idle (or the pool closes).
	freed  chan struct{}
	inUse  int
	closed bool
	timer  runtime.Timer // the armed idle sweep, if any
	// sweepAt is when the armed sweep runs.
	sweepAt time.Time
	st      PoolStats
}

// burstLinger is how long an idle instance beyond PoolSize waits for a
// call before the sweep closes it. Long enough to span the gaps between
// waves of calls (a group commit's, milliseconds apart), short enough
// that a burst's instances give their memory back soon after it.
const burstLinger = time.Second

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

// release gives an instance back: to the idle list when keep is set and
// the pool is open (the sweep closes what is beyond PoolSize later),
// else it is closed, its memory freed.
func (pl *pool) release(ctx context.Context, in *instance, keep bool) {
	defer pl.p.h.budget.returned()
	pl.mu.Lock()
	pl.inUse--
	if !keep {
		pl.st.Failed++
	}
	if keep && !pl.closed {
		in.lastUsed = pl.p.h.clock.Now()
		pl.idle = append(pl.idle, in)
		pl.wakeLocked()
		pl.armSweepLocked()
		pl.mu.Unlock()
		<-pl.slots
		return
	}
	pl.mu.Unlock()
	in.close(ctx)
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

// armSweepLocked arms the idle sweep for the first idle instance due to
// be closed: the oldest, after burstLinger when more than PoolSize are
// idle, else after IdleTimeout. A sweep armed for later is armed again
// for then; one that could not be stopped is under way and arms the next
// itself.
func (pl *pool) armSweepLocked() {
	if len(pl.idle) == 0 || pl.closed {
		return
	}
	oldest := pl.idle[0].lastUsed
	for _, in := range pl.idle[1:] {
		if in.lastUsed.Before(oldest) {
			oldest = in.lastUsed
		}
	}
	at := oldest.Add(pl.idleLimit(len(pl.idle)))
	if pl.timer != nil {
		if !at.Before(pl.sweepAt) || !pl.timer.Stop() {
			return
		}
	}
	pl.sweepAt = at
	pl.timer = pl.p.h.clock.AfterFunc(at.Sub(pl.p.h.clock.Now()), pl.sweep)
}

// idleLimit is how long the oldest of n idle instances may stay idle:
// burstLinger when it is beyond PoolSize (never longer than IdleTimeout),
// else IdleTimeout.
func (pl *pool) idleLimit(n int) time.Duration {
	limits := pl.p.spec.Limits
	if n > limits.PoolSize {
		return min(burstLinger, limits.IdleTimeout)
	}
	return limits.IdleTimeout
}

// sweep closes the idle instances due: the oldest first, each one that
// has been idle for its idleLimit, given how many are idle beside it. The
// idle list stays oldest first, as reuse from its end wants it.
func (pl *pool) sweep() {
	now := pl.p.h.clock.Now()
	pl.mu.Lock()
	pl.timer = nil
	idle := pl.idle
	slices.SortStableFunc(idle, func(a, b *instance) int { return a.lastUsed.Compare(b.lastUsed) })
	n := 0
	for ; n < len(idle); n++ {
		left := len(idle) - n
		if now.Before(idle[n].lastUsed.Add(pl.idleLimit(left))) {
			break
		}
		if left > pl.p.spec.Limits.PoolSize && now.Before(idle[n].lastUsed.Add(pl.p.spec.Limits.IdleTimeout)) {
			pl.st.Trimmed++
		} else {
			pl.st.Evicted++
		}
	}
	stale := slices.Clone(idle[:n])
	kept := copy(idle, idle[n:])
	clear(idle[kept:])
	pl.idle = idle[:kept]
	pl.armSweepLocked()
	pl.mu.Unlock()
	for _, in := range stale {
		in.close(context.Background())
	}
}

// idleInstance is an idle instance as idleSnapshot saw it.
type idleInstance struct {
	in       *instance
	lastUsed time.Time
}

// idleSnapshot lists the idle instances and when each was last used, for
// host-wide eviction: read under the pool's lock, since a call may take
// an instance and give it back (a new lastUsed) while the host orders
// them.
func (pl *pool) idleSnapshot() []idleInstance {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	out := make([]idleInstance, len(pl.idle))
	for i, in := range pl.idle {
		out[i] = idleInstance{in: in, lastUsed: in.lastUsed}
	}
	return out
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

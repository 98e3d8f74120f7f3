package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// The tail of a followed Run (docs/DESIGN.md §5.2, "Streams").
//
// However many followers a Run has on a Hub, one tail reads its new
// events: on each commit notice whose Seq it has not read, and on the
// fallback tick, it reads the log once from where it stopped and hands
// the events to every follower that is up to date with it (joined). A
// follower that is behind (it resumed from an older event, or let its
// queue fill up) reads its own backlog from the store, a page at a time,
// and joins the tail once a read reaches the end of the log and nothing
// the tail handed out is missing from what it has: from then on it takes
// the tail's events from its own next Seq, so none is missed and none
// comes twice.
//
// A tail holds no goroutine while it waits: a notice starts its reader
// when it is idle, and the fallback runs it on the Clock's AfterFunc. A
// follower holds none either: the goroutine that calls Next (an HTTP
// handler, Follow's caller) is its only one.

const (
	// followPage bounds the events of one store read, the tail's or a
	// follower's.
	followPage = 256
	// followQueue bounds the items a follower holds undelivered. Past it
	// the follower falls behind the tail: it stops taking the tail's
	// events, and reads them from the store once it has delivered its
	// queue. Emits past it are dropped (they are not durable).
	followQueue = 256
	// tailReadTimeout bounds one store read of a tail, which runs for no
	// caller in particular.
	tailReadTimeout = 30 * time.Second
)

// ErrTooManyFollowers is the error of NewFollower when the tenant already
// has FollowOptions.MaxPerTenant followers open on the runtime's Hub.
var ErrTooManyFollowers = errors.New("runtime: too many followers for the tenant")

// FollowOptions configure NewFollower.
type FollowOptions struct {
	// MaxPerTenant refuses the follower with ErrTooManyFollowers while its
	// tenant already has this many followers open on the Hub (counting
	// every caller's, with or without a limit of their own); 0 means no
	// limit.
	MaxPerTenant int
}

// FollowStats counts a Hub's followers and what they cost, for metrics and
// tests.
type FollowStats struct {
	Followers    int   // open followers: event streams and Follow calls
	Tails        int   // Runs with at least one follower
	TailReads    int64 // store reads of the tails: at most one per notice or fallback tick of a followed Run, however many follow it
	BacklogReads int64 // store reads of followers behind their Run's tail
	Refused      int64 // followers refused for their tenant's limit (ErrTooManyFollowers)
	Dropped      int64 // followers ended with Drop: their reader stopped taking what they had
}

// followCounters are the live counters behind FollowStats.
type followCounters struct {
	tailReads, backlogReads, refused, dropped atomic.Int64
}

// Follower is one reader of a Run's stream: the pull form of Follow, for
// a caller with a loop of its own (an HTTP handler that also sends
// heartbeats). Call Next, deliver what it returns, and wait for Ready
// before calling it again; Close (or Drop) it when done.
//
// The events a Follower returns may be shared with the Run's other
// followers: they must not be modified.
//
// A Follower is used from one goroutine; Close and Drop may be called
// from any.
type Follower struct {
	// Set by follow and never changed.
	t      *tail
	tenant string
	ready  chan struct{} // a token when Next has something new

	// t.mu guards the fields below, up to the end of the struct.
	next   int64        // the Seq of the first event not yet in queue nor delivered
	queue  []StreamItem // handed over by the tail, not yet taken by Next
	behind bool         // it reads its events from the store itself
	done   bool         // the Run's end is in queue or delivered
	err    error        // the tail's read failed: the follower ends with it
	closed bool
}

// NewFollower starts following a Run from fromSeq (1 when lower): every
// event of the Run whose Seq is at least fromSeq, in order, each once, up
// to the terminal one, and the emits published while it follows. It
// returns ErrTooManyFollowers when opts.MaxPerTenant refuses it, and reads
// nothing before the first Next.
func (rt *Runtime) NewFollower(tenant, runID string, fromSeq int64, opts FollowOptions) (*Follower, error) {
	return rt.hub.follow(rt, tenant, runID, max(fromSeq, 1), opts)
}

// Ready receives a token when Next has something new to return; it may
// also receive one when Next finds nothing.
func (f *Follower) Ready() <-chan struct{} { return f.ready }

// Next returns, without waiting for more, what the follower has for its
// caller: the items the tail handed it, or, when it is behind, the next
// page of its backlog, read from the store with ctx. done reports that the
// Run's terminal event is the last of items, or was returned before (a
// pruned log ends where the snapshot is terminal): nothing more will come.
// An error ends the follower too, after items.
func (f *Follower) Next(ctx context.Context) (items []StreamItem, done bool, err error) {
	t := f.t
	t.mu.Lock()
	items, f.queue = f.queue, nil
	done, err, behind, from := f.done || f.closed, f.err, f.behind, f.next
	t.mu.Unlock()
	if len(items) > 0 || done || err != nil || !behind {
		if behind && !done && err == nil {
			f.signal() // its backlog comes after these
		}
		return items, done, err
	}
	return f.readBacklog(ctx, from)
}

// readBacklog reads the follower's next page of events from the store,
// and joins the tail once it has reached the end of the log.
func (f *Follower) readBacklog(ctx context.Context, from int64) ([]StreamItem, bool, error) {
	t := f.t
	t.hub.counters.backlogReads.Add(1)
	evs, err := t.rt.store.Events(ctx, t.tenant, t.runID, from, followPage)
	if err != nil {
		return nil, false, err
	}
	if len(evs) == 0 {
		run, err := t.rt.store.LoadRun(ctx, t.tenant, t.runID)
		if err != nil {
			return nil, false, err
		}
		if run.Status.Terminal() {
			// The Run may have ended between the two reads: its last
			// events and its terminal snapshot commit together, so the
			// log read again has them, unless they were delivered or
			// pruned with the log.
			if evs, err = t.rt.store.Events(ctx, t.tenant, t.runID, from, followPage); err != nil {
				return nil, false, err
			}
			if len(evs) == 0 {
				t.mu.Lock()
				f.done = true
				t.mu.Unlock()
				return nil, true, nil
			}
		}
	}
	items := make([]StreamItem, len(evs))
	for i := range evs {
		items[i] = StreamItem{Event: &evs[i]}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(evs) > 0 {
		last := evs[len(evs)-1]
		f.next = last.Seq + 1
		f.done = last.Terminal()
	}
	switch {
	case f.done:
	case len(evs) == followPage:
		f.signal() // the next page
	default:
		t.join(f)
	}
	return items, f.done, nil
}

// Close ends the follower. It is safe to call more than once.
func (f *Follower) Close() { f.t.hub.leave(f, false) }

// Drop ends the follower as Close does, and counts it in
// FollowStats.Dropped: for a reader that gave up because its client
// stopped taking what it sent.
func (f *Follower) Drop() { f.t.hub.leave(f, true) }

// signal gives Ready a token, unless it has one.
func (f *Follower) signal() {
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// live reports whether the follower still takes items. The caller holds
// t.mu.
func (f *Follower) live() bool { return !f.done && !f.closed && f.err == nil }

// tail reads a followed Run's new events for all its followers on a Hub
// (see the top of this file). Its Runtime gives it the store and the
// Clock.
type tail struct {
	// Set by newTail and never changed.
	hub           *Hub
	rt            *Runtime
	tenant, runID string

	// mu guards the fields below, up to the end of the struct, and the
	// fields of its followers marked so. The Hub's mu comes before it;
	// under it the tail arms and stops its fallback on the Clock and
	// starts its reader's goroutine, and calls nothing else.
	mu        sync.Mutex
	followers map[*Follower]struct{}
	// next is the Seq of the first event the tail has not read: every
	// event below it was handed to the followers then joined. 0 until the
	// first follower joins (the tail reads nothing before).
	next     int64
	ended    bool // it handed out the Run's end: it reads no more
	closed   bool // its last follower left
	reading  bool // its reader runs
	want     bool // a read is asked for
	check    bool // and, if it finds nothing, a look at the snapshot
	fallback Timer
}

func newTail(h *Hub, rt *Runtime, tenant, runID string) *tail {
	t := &tail{hub: h, rt: rt, tenant: tenant, runID: runID, followers: map[*Follower]struct{}{}}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fallback = rt.clock.AfterFunc(followFallback, t.onFallback)
	return t
}

// join makes a follower that has read the log to its end take the tail's
// events from now on, if it misses none of what the tail handed out;
// otherwise it reads again. The caller holds t.mu.
func (t *tail) join(f *Follower) {
	switch {
	case t.ended:
		// The end is in the log: it finds it with its next read.
		f.signal()
	case t.next == 0:
		// The first to join: the tail reads from where it stopped, at
		// once, for what was committed since (its notice may have come
		// before there was anything to read for).
		t.next, f.behind = f.next, false
		t.request(false)
	case f.next >= t.next:
		f.behind = false
	default:
		f.signal() // the tail has read past it
	}
}

// notice acts on a notice for the Run: an emit goes to every follower; a
// commit the tail has not read asks for a read. The caller holds the
// Hub's lock; it never waits on the store.
func (t *tail) notice(n Notice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n.Emit != nil {
		it := StreamItem{Emit: n.Emit, EffectID: n.EffectID, Plugin: n.Plugin, Attempt: n.Attempt, DeltaSeq: n.DeltaSeq}
		for f := range t.followers {
			if f.live() && len(f.queue) < followQueue {
				f.queue = append(f.queue, it)
				f.signal()
			}
		}
		return
	}
	if t.next != 0 && n.Seq >= t.next {
		t.request(false)
	}
}

// onFallback reads the log again on the Clock: a commit by another
// process publishes nothing here unless the store is a ChangeFeed, and a
// change notice may be lost. It runs in its own goroutine.
func (t *tail) onFallback() {
	t.mu.Lock()
	if t.closed || t.ended {
		t.mu.Unlock()
		return
	}
	t.fallback = t.rt.clock.AfterFunc(followFallback, t.onFallback)
	start := t.ask(true)
	t.mu.Unlock()
	if start {
		t.read()
	}
}

// request asks for a read, starting the reader in a goroutine of its own
// if it is idle. The caller holds t.mu.
func (t *tail) request(check bool) {
	if t.ask(check) {
		go t.read()
	}
}

// ask records that a read is wanted and reports whether the caller must
// start the reader. The caller holds t.mu.
func (t *tail) ask(check bool) bool {
	if t.closed || t.ended || t.next == 0 {
		return false
	}
	t.want, t.check = true, t.check || check
	if t.reading {
		return false
	}
	t.reading = true
	return true
}

// read is the tail's reader: it reads the log from t.next while reads are
// asked for, and hands each page out.
func (t *tail) read() {
	for {
		t.mu.Lock()
		if t.closed || t.ended || !t.want {
			t.reading = false
			t.mu.Unlock()
			return
		}
		from, check := t.next, t.check
		t.want, t.check = false, false
		t.mu.Unlock()

		evs, end, err := t.readFrom(from, check)
		t.mu.Lock()
		t.handOut(evs, end, err)
		t.mu.Unlock()
	}
}

// readFrom reads a page of the log from Seq from and, when it is empty
// and check is set, whether the snapshot is terminal (a pruned log).
func (t *tail) readFrom(from int64, check bool) ([]loop.Event, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), tailReadTimeout)
	defer cancel()
	t.hub.counters.tailReads.Add(1)
	evs, err := t.rt.store.Events(ctx, t.tenant, t.runID, from, followPage)
	if err != nil || len(evs) > 0 || !check {
		return evs, false, err
	}
	t.hub.counters.tailReads.Add(1)
	run, err := t.rt.store.LoadRun(ctx, t.tenant, t.runID)
	if err != nil || !run.Status.Terminal() {
		return nil, false, err
	}
	// The Run may have ended between the two reads: read the log again
	// (its last events commit with the terminal snapshot), and end only
	// if it is still empty (delivered, or pruned with the log).
	t.hub.counters.tailReads.Add(1)
	if evs, err = t.rt.store.Events(ctx, t.tenant, t.runID, from, followPage); err != nil || len(evs) > 0 {
		return evs, false, err
	}
	return nil, true, nil
}

// handOut gives the events of one read to the joined followers, each from
// its own next Seq; end says the Run ended with no event left to read. A
// follower whose queue is full falls behind. A read that failed ends the
// joined followers with its error (their callers resume from the last
// event they delivered). The caller holds t.mu.
func (t *tail) handOut(evs []loop.Event, end bool, err error) {
	if t.closed {
		return
	}
	if err == nil && len(evs) > 0 {
		last := evs[len(evs)-1]
		t.next = last.Seq + 1
		end = last.Terminal()
		if len(evs) == followPage {
			t.want = true
		}
	}
	if end {
		t.ended = true
		t.fallback.Stop()
	}
	for f := range t.followers {
		if f.behind || !f.live() {
			continue
		}
		if err != nil {
			f.err = err
			f.signal()
			continue
		}
		for i := range evs {
			if evs[i].Seq < f.next {
				continue // it read this one itself before it joined
			}
			if len(f.queue) >= followQueue {
				f.behind = true
				break
			}
			f.queue = append(f.queue, StreamItem{Event: &evs[i]})
			f.next = evs[i].Seq + 1
		}
		// A follower past the end (it resumed after the terminal event)
		// ends too.
		f.done = end && !f.behind
		f.signal()
	}
}

// follow adds a follower of a Run, with the Run's tail for rt.
func (h *Hub) follow(rt *Runtime, tenant, runID string, fromSeq int64, opts FollowOptions) (*Follower, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.followers[tenant]; opts.MaxPerTenant > 0 && n >= opts.MaxPerTenant {
		h.counters.refused.Add(1)
		return nil, fmt.Errorf("%w: tenant %s has %d open on this node, its limit", ErrTooManyFollowers, tenant, n)
	}
	k := runKey(tenant, runID)
	var t *tail
	for _, x := range h.tails[k] {
		if x.rt == rt {
			t = x
		}
	}
	if t == nil {
		t = newTail(h, rt, tenant, runID)
		h.tails[k] = append(h.tails[k], t)
	}
	f := &Follower{t: t, tenant: tenant, ready: make(chan struct{}, 1), next: fromSeq, behind: true}
	t.mu.Lock()
	t.followers[f] = struct{}{}
	t.mu.Unlock()
	h.followers[tenant]++
	return f, nil
}

// leave removes a follower, and its Run's tail with the last one.
func (h *Hub) leave(f *Follower, dropped bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := f.t
	t.mu.Lock()
	if f.closed {
		t.mu.Unlock()
		return
	}
	f.closed = true
	f.queue = nil
	delete(t.followers, f)
	last := len(t.followers) == 0
	if last {
		t.closed = true
		t.fallback.Stop()
	}
	t.mu.Unlock()

	if h.followers[f.tenant]--; h.followers[f.tenant] <= 0 {
		delete(h.followers, f.tenant)
	}
	if dropped {
		h.counters.dropped.Add(1)
	}
	if last {
		k := runKey(t.tenant, t.runID)
		tails := h.tails[k]
		for i, x := range tails {
			if x == t {
				tails = append(tails[:i:i], tails[i+1:]...)
				break
			}
		}
		if len(tails) == 0 {
			delete(h.tails, k)
		} else {
			h.tails[k] = tails
		}
	}
}

// FollowStats returns a snapshot of the Hub's follower counters.
func (h *Hub) FollowStats() FollowStats {
	h.mu.Lock()
	var s FollowStats
	for _, n := range h.followers {
		s.Followers += n
	}
	for _, ts := range h.tails {
		s.Tails += len(ts)
	}
	h.mu.Unlock()
	c := &h.counters
	s.TailReads, s.BacklogReads = c.tailReads.Load(), c.backlogReads.Load()
	s.Refused, s.Dropped = c.refused.Load(), c.dropped.Load()
	return s
}

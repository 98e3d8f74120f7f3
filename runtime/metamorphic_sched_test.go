package runtime_test

import (
	"context"
	"fmt"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The scheduling side of TestMetamorphic: a clock that fires one timer at
// a time and knows which goroutines sleep on it, and a gate that holds
// executor calls until the test lets them through. Together with the
// runtime's count of working goroutines they tell the test when the
// runtime can do nothing more by itself (quiet), so that it can pick,
// from the seed, what happens next.

// metaClock is a runtime.Clock whose time moves only when the test says
// so. Unlike conformance.FakeClock it can fire the due timers one at a
// time, in (instant, arming order), so that the test waits for the
// runtime to be quiet between two of them; and it counts the timers armed
// by the runtime's retry backoff ((*Runtime).sleep), whose goroutines are
// asleep rather than working.
type metaClock struct {
	mu       sync.Mutex
	now      time.Time
	seq      uint64
	timers   map[uint64]*metaTimer
	running  atomic.Int64 // callbacks started and not yet returned
	sleepers atomic.Int64 // armed timers of (*Runtime).sleep
	fired    atomic.Int64 // callbacks started, for progress
	// trace, when set, hears every timer fired: its instant, whether
	// (*Runtime).sleep armed it, and when it was armed.
	trace func(at, armed time.Time, sleeper string)
}

type metaTimer struct {
	c     *metaClock
	id    uint64
	at    time.Time
	armed time.Time
	fn    func()
	sleep bool
	// sleeper is the function that called (*Runtime).sleep.
	sleeper string
}

var _ runtime.Clock = (*metaClock)(nil)

func newMetaClock() *metaClock {
	return &metaClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), timers: map[uint64]*metaTimer{}}
}

func (c *metaClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// sleepFunc is the runtime's backoff wait: a goroutine blocked in it waits
// for the clock, not for work.
const sleepFunc = "github.com/agenthost/agenthost/runtime.(*Runtime).sleep"

// calledFromSleep reports whether AfterFunc was called by (*Runtime).sleep,
// and if so who is sleeping (the function that called sleep).
func calledFromSleep() (bool, string) {
	var pcs [8]uintptr
	n := goruntime.Callers(3, pcs[:]) // Callers, calledFromSleep, AfterFunc
	frames := goruntime.CallersFrames(pcs[:n])
	f, more := frames.Next()
	if f.Function != sleepFunc || !more {
		return false, ""
	}
	f, _ = frames.Next()
	return true, strings.TrimPrefix(f.Function, "github.com/agenthost/agenthost/runtime.")
}

func (c *metaClock) AfterFunc(d time.Duration, f func()) runtime.Timer {
	sleep, sleeper := calledFromSleep()
	c.mu.Lock()
	c.seq++
	t := &metaTimer{c: c, id: c.seq, at: c.now.Add(d), armed: c.now, fn: f, sleep: sleep, sleeper: sleeper}
	if d <= 0 {
		c.mu.Unlock()
		c.run(f)
		return t
	}
	c.timers[t.id] = t
	if sleep {
		c.sleepers.Add(1)
	}
	c.mu.Unlock()
	return t
}

func (t *metaTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if _, armed := t.c.timers[t.id]; !armed {
		return false
	}
	delete(t.c.timers, t.id)
	if t.sleep {
		t.c.sleepers.Add(-1)
	}
	return true
}

func (c *metaClock) run(f func()) {
	c.running.Add(1)
	c.fired.Add(1)
	go func() {
		defer c.running.Add(-1)
		f()
	}()
}

// earliestLocked returns the timer that fires first: the earliest instant,
// then the first armed.
func (c *metaClock) earliestLocked() *metaTimer {
	var first *metaTimer
	for _, t := range c.timers {
		if first == nil || t.at.Before(first.at) || t.at.Equal(first.at) && t.id < first.id {
			first = t
		}
	}
	return first
}

// Next returns the instant of the earliest armed timer.
func (c *metaClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.earliestLocked(); t != nil {
		return t.at, true
	}
	return time.Time{}, false
}

// FireNext moves the time to the earliest timer due by limit and fires
// that one timer alone. It reports whether there was one.
func (c *metaClock) FireNext(limit time.Time) bool {
	c.mu.Lock()
	t := c.earliestLocked()
	if t == nil || t.at.After(limit) {
		c.mu.Unlock()
		return false
	}
	delete(c.timers, t.id)
	if t.sleep {
		c.sleepers.Add(-1)
	}
	if t.at.After(c.now) {
		c.now = t.at
	}
	c.mu.Unlock()
	if c.trace != nil {
		c.trace(t.at, t.armed, t.sleeper)
	}
	c.run(t.fn)
	return true
}

// FireAll moves the time to limit and fires every timer due by then at
// once, each in its own goroutine, as conformance.FakeClock does.
func (c *metaClock) FireAll(limit time.Time) {
	c.mu.Lock()
	if limit.After(c.now) {
		c.now = limit
	}
	var due []*metaTimer
	for id, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
			delete(c.timers, id)
			if t.sleep {
				c.sleepers.Add(-1)
			}
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if !due[i].at.Equal(due[j].at) {
			return due[i].at.Before(due[j].at)
		}
		return due[i].id < due[j].id
	})
	for _, t := range due {
		c.run(t.fn)
	}
}

// SetAtLeast moves the time to t without firing anything; the caller has
// fired every timer due by then.
func (c *metaClock) SetAtLeast(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

// metaGate holds the executor calls of one runtime incarnation: each call
// waits at the gate, before or after it reaches the executor (after: the
// executor did the work and the reply is on its way), until the test
// releases it or the call's context ends. In the deterministic mode every
// call is held, and the test releases them one at a time in an order the
// seed chooses; in the concurrent mode a call is held only when the seed
// says so, to be in flight across the test's next operations (a crash, a
// Stop, a cancel), and the others go through at once.
//
// The gate also checks, at the port, what the runtime promises about
// calls: none for an attempt whose dispatch is not committed (write-ahead
// dispatch), and never two start, poll or attach calls of one attempt at
// once in one process (cancels may run beside them).
type metaGate struct {
	holdAll     bool
	decide      func(export, key string, n int) (hold, after bool)
	inner       runtime.Store // the store as it is, under the faults
	onViolation func(string)

	mu       sync.Mutex
	held     []*gateCall
	inflight map[string]string // assignment key → the export in flight (start, poll, attach)
	counts   map[string]int    // export + key → calls so far
	entered  atomic.Int64
}

type gateCall struct {
	export, key string
	release     chan struct{}
}

func (c *gateCall) String() string { return c.export + " " + c.key }

func newMetaGate(holdAll bool, inner runtime.Store, decide func(export, key string, n int) (bool, bool), onViolation func(string)) *metaGate {
	return &metaGate{holdAll: holdAll, decide: decide, inner: inner, onViolation: onViolation,
		inflight: map[string]string{}, counts: map[string]int{}}
}

// waiting is how many calls wait at the gate.
func (g *metaGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// heldCalls returns the calls waiting at the gate, in a stable order.
func (g *metaGate) heldCalls() []*gateCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := append([]*gateCall(nil), g.held...)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// release lets one held call through; false if it had gone already.
func (g *metaGate) release(c *gateCall) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, h := range g.held {
		if h == c {
			g.held = append(g.held[:i], g.held[i+1:]...)
			close(c.release)
			return true
		}
	}
	return false
}

// wait holds a call until it is released or ctx ends.
func (g *metaGate) wait(ctx context.Context, export, key string) error {
	c := &gateCall{export: export, key: key, release: make(chan struct{})}
	g.mu.Lock()
	g.held = append(g.held, c)
	g.mu.Unlock()
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		for i, h := range g.held {
			if h == c {
				g.held = append(g.held[:i], g.held[i+1:]...)
				break
			}
		}
		g.mu.Unlock()
		return ctx.Err()
	}
}

// enter records a call and checks it; the returned func records its end.
func (g *metaGate) enter(ctx context.Context, export string, call runtime.EffectCall) (n int, exit func()) {
	key := call.Input.Effect.AssignmentKey
	g.entered.Add(1)
	g.mu.Lock()
	g.counts[export+" "+key]++
	n = g.counts[export+" "+key]
	concurrent := export != abi.ExportCancel
	if concurrent {
		if prev, ok := g.inflight[key]; ok {
			g.mu.Unlock()
			g.onViolation(fmt.Sprintf("%s of %s called while its %s runs: one attempt called twice at once", export, key, prev))
			g.mu.Lock()
		} else {
			g.inflight[key] = export
		}
	}
	g.mu.Unlock()
	g.checkDispatched(ctx, export, call)
	return n, func() {
		if !concurrent {
			return
		}
		g.mu.Lock()
		if g.inflight[key] == export {
			delete(g.inflight, key)
		}
		g.mu.Unlock()
	}
}

// checkDispatched checks that the attempt's dispatch is on record.
func (g *metaGate) checkDispatched(ctx context.Context, export string, call runtime.EffectCall) {
	ctx = context.WithoutCancel(ctx)
	eff := call.Input.Effect
	run, err := g.inner.LoadRun(ctx, call.Tenant, call.RunID)
	if err != nil {
		return // a store closed under a halted runtime's straggler
	}
	if e := run.Effect(eff.ID); e != nil && e.Attempt >= eff.Attempt {
		return
	}
	evs, err := g.inner.Events(ctx, call.Tenant, call.RunID, 1, 0)
	if err != nil {
		return
	}
	for _, ev := range evs {
		if ev.Type == loop.EventEffectDispatched && ev.EffectID == eff.ID && ev.Attempt == eff.Attempt {
			return
		}
	}
	g.onViolation(fmt.Sprintf("%s of %s#%d before its dispatch was committed (write-ahead dispatch)", export, eff.ID, eff.Attempt))
}

// through runs one call of export through the gate.
func through[R any](g *metaGate, ctx context.Context, export string, call runtime.EffectCall, do func() (R, error)) (R, error) {
	n, exit := g.enter(ctx, export, call)
	defer exit()
	hold, after := true, false
	if g.decide != nil {
		var h bool
		h, after = g.decide(export, call.Input.Effect.AssignmentKey, n)
		hold = g.holdAll || h
	}
	if !hold {
		return do()
	}
	var zero R
	if after {
		r, err := do()
		if werr := g.wait(ctx, export, call.Input.Effect.AssignmentKey); werr != nil {
			return zero, fmt.Errorf("metamorphic gate: the reply was lost: %w", werr)
		}
		return r, err
	}
	if err := g.wait(ctx, export, call.Input.Effect.AssignmentKey); err != nil {
		return zero, fmt.Errorf("metamorphic gate: %w", err)
	}
	return do()
}

// gatedExecutor is an Executor whose calls go through a gate.
type gatedExecutor struct {
	g    *metaGate
	next runtime.Executor
}

func (e gatedExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return through(e.g, ctx, abi.ExportStart, c, func() (abi.EffectReply, error) { return e.next.Start(ctx, c) })
}

func (e gatedExecutor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return through(e.g, ctx, abi.ExportPoll, c, func() (abi.EffectReply, error) { return e.next.Poll(ctx, c) })
}

func (e gatedExecutor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return through(e.g, ctx, abi.ExportAttach, c, func() (abi.EffectReply, error) { return e.next.Attach(ctx, c) })
}

func (e gatedExecutor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	return through(e.g, ctx, abi.ExportCancel, c, func() (abi.CancelReply, error) { return e.next.Cancel(ctx, c) })
}

// describeHeld lists held calls, for the log.
func describeHeld(cs []*gateCall) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.String())
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func gosched() { goruntime.Gosched() }

// Package budget is the shared budget of one model endpoint (an executor
// plugin used as a model): how many calls may be in flight at once, how
// many may count in any minute (or any shorter window), how many tokens
// the calls of a minute may use, and a door a rate-limited reply closes
// for every Run until the time the provider named (docs/OPERATIONS.md,
// "Model budgets").
//
// A Budget takes the time as an argument and starts no timer: the caller
// (the runtime) asks Admit, and when it is refused schedules the call
// again at the time Admit expects to admit it. It is therefore tested
// with plain times, no clock.
package budget

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Limits are an endpoint's budget; 0 in a field means no limit of that
// kind.
type Limits struct {
	// MaxConcurrentCalls bounds the calls in flight at once.
	MaxConcurrentCalls int
	// RequestsPerMinute bounds the calls that count in any Window, scaled
	// to it (RequestsPerWindow). A call counts from its start until a
	// Window after it ends: the provider receives its request at some
	// moment in between, so it never sees more than that many requests
	// in any Window, however long the calls take to reach it.
	RequestsPerMinute int
	// TokensPerMinute bounds the tokens (input and output) the calls use
	// per minute: each call is charged its reply's usage when it ends,
	// and no call begins while the endpoint is in debt. The allowance
	// refills at this rate up to its share of one Window.
	TokensPerMinute int
	// Window is the length of the windows the per-minute limits are held
	// to, for a provider that enforces its per-minute limits over shorter
	// periods; a whole number of them make a minute. 0 means a minute.
	Window time.Duration
}

// IsZero reports whether l limits nothing (a Window alone limits
// nothing).
func (l Limits) IsZero() bool {
	return l.MaxConcurrentCalls == 0 && l.RequestsPerMinute == 0 && l.TokensPerMinute == 0
}

// window is l.Window, or a minute when it is unset.
func (l Limits) window() time.Duration {
	if l.Window <= 0 {
		return time.Minute
	}
	return l.Window
}

// RequestsPerWindow is the number of calls that may count in one Window:
// RequestsPerMinute scaled to the Window, rounded down, and at least 1;
// 0 when RequestsPerMinute is 0 (no limit).
func (l Limits) RequestsPerWindow() int {
	if l.RequestsPerMinute <= 0 {
		return 0
	}
	return max(int(int64(l.RequestsPerMinute)*int64(l.window())/int64(time.Minute)), 1)
}

// tokensPerWindow is the most tokens the allowance holds: TokensPerMinute
// scaled to the Window.
func (l Limits) tokensPerWindow() float64 {
	return float64(l.TokensPerMinute) * l.window().Minutes()
}

// Budget is one endpoint's budget, shared by every Run of every tenant of
// the process. A Budget is safe for concurrent use; its mu is a leaf.
type Budget struct {
	// Endpoint names the endpoint (the plugin ID) in metrics and logs;
	// Limits are its budget as configured, for all the nodes that share
	// the endpoint. Neither changes after New.
	Endpoint string
	Limits   Limits

	waits       atomic.Int64
	waitedNanos atomic.Int64

	// mu guards the fields below, up to the end of the struct. A leaf.
	mu sync.Mutex
	// share is this node's part of Limits (SetNodes).
	share    Limits
	inFlight int
	// ended holds the end times of the calls that ended within the last
	// Window, oldest first: with the calls in flight, the calls that
	// count against RequestsPerMinute.
	ended []time.Time
	// allowance is the tokens the endpoint may still use, refilled at
	// TokensPerMinute a minute up to one Window's share, as of
	// allowanceAt; below zero it is in debt.
	allowance   float64
	allowanceAt time.Time
	// closedUntil is when the last rate-limited reply allows calls again.
	closedUntil time.Time
	// waiting holds the calls refused and not admitted since, by key:
	// when they began to wait and when they expect to be admitted.
	waiting map[string]Wait
}

// Wait is a call waiting for budget: since when, and the time the budget
// expects to admit it (zero when it waits for a call in flight to end).
type Wait struct {
	Since, Until time.Time
}

// New returns the budget of endpoint, full.
func New(endpoint string, l Limits) *Budget {
	return &Budget{Endpoint: endpoint, Limits: l, share: l, allowance: l.tokensPerWindow(), waiting: map[string]Wait{}}
}

// SetNodes makes this node's share of the budget its Limits divided by
// nodes, the number of live nodes that share the endpoint (1 or less: all
// of it). Each limit set keeps at least 1, so that every node can make
// progress; a node's token allowance is cut to its new share at once. The
// Window stays as configured.
func (b *Budget) SetNodes(nodes int) {
	nodes = max(nodes, 1)
	part := func(n int) int {
		if n == 0 {
			return 0
		}
		return max(n/nodes, 1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.share = Limits{
		MaxConcurrentCalls: part(b.Limits.MaxConcurrentCalls),
		RequestsPerMinute:  part(b.Limits.RequestsPerMinute),
		TokensPerMinute:    part(b.Limits.TokensPerMinute),
		Window:             b.Limits.Window,
	}
	b.allowance = min(b.allowance, b.share.tokensPerWindow())
}

// Share is this node's part of the budget (SetNodes).
func (b *Budget) Share() Limits {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.share
}

// Admit asks for one call, under key (the caller's name for it, unique
// among its calls in flight or waiting), at now. Admitted, the call holds
// a share of the budget until Done. Refused, it reports the earliest
// time it expects to admit the call, or the zero time when only the end
// of a call in flight can (Done names the call it then lets in), and
// records key as waiting until it is admitted or Forget.
func (b *Budget) Admit(key string, now time.Time) (ok bool, retryAt time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	l := b.share
	var at time.Time
	later := func(t time.Time) {
		if t.After(at) {
			at = t
		}
	}
	blockedByCalls := false
	if now.Before(b.closedUntil) {
		later(b.closedUntil)
	}
	if k := l.RequestsPerWindow(); k > 0 {
		// The calls that count are those in flight and those that ended
		// within the Window. When too many, the call waits until enough
		// of the ended ones leave it, after the places they free for the
		// calls that have waited longer (so that the waiters do not all
		// wake for the first place); when the ended ones are not enough,
		// at least a Window, since a call in flight counts for a Window
		// after it ends.
		if counted := b.inFlight + len(b.ended); counted >= k {
			if i := counted - k + b.waitersAheadLocked(key, now); i < len(b.ended) {
				later(b.ended[i].Add(l.window()))
			} else {
				later(now.Add(l.window()))
			}
		}
	}
	if l.TokensPerMinute > 0 && b.allowance < 0 {
		debt := -b.allowance
		later(now.Add(time.Duration(debt/float64(l.TokensPerMinute)*float64(time.Minute)) + time.Millisecond))
	}
	if l.MaxConcurrentCalls > 0 && b.inFlight >= l.MaxConcurrentCalls {
		blockedByCalls = true
	}
	if at.IsZero() && !blockedByCalls {
		if w, ok := b.waiting[key]; ok {
			delete(b.waiting, key)
			b.waitedNanos.Add(int64(now.Sub(w.Since)))
		}
		b.inFlight++
		return true, time.Time{}
	}
	w, ok := b.waiting[key]
	if !ok {
		w.Since = now
		b.waits.Add(1)
	}
	w.Until = at
	b.waiting[key] = w
	return false, at
}

// waitersAheadLocked counts the calls that have waited longer than the
// call of key (which begins to wait at now if it does not wait yet).
func (b *Budget) waitersAheadLocked(key string, now time.Time) int {
	since := now
	if w, ok := b.waiting[key]; ok {
		since = w.Since
	}
	ahead := 0
	for k, w := range b.waiting {
		if k != key && (w.Since.Before(since) || w.Since.Equal(since) && k < key) {
			ahead++
		}
	}
	return ahead
}

// Done ends an admitted call at now, charging it tokens (its reply's
// input and output tokens; 0 when it had no usage). Under a
// RequestsPerMinute the call counts for a Window more.
func (b *Budget) Done(now time.Time, tokens int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	if b.inFlight > 0 {
		b.inFlight--
	}
	if b.share.RequestsPerMinute > 0 {
		// Ends come in order but for the calls that read the time before
		// another ended: keep the list sorted.
		i, _ := slices.BinarySearchFunc(b.ended, now, func(t, now time.Time) int {
			if t.After(now) {
				return 1
			}
			return -1
		})
		b.ended = slices.Insert(b.ended, i, now)
	}
	if b.share.TokensPerMinute > 0 {
		b.allowance -= float64(tokens)
	}
}

// LongestWaiter returns the key of the call that has waited longest for a
// call in flight to end (its Wait's Until is zero), or "": the one to ask
// Admit for again once Done freed a place.
func (b *Budget) LongestWaiter() (key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var since time.Time
	for k, w := range b.waiting {
		if w.Until.IsZero() && (key == "" || w.Since.Before(since) || w.Since.Equal(since) && k < key) {
			key, since = k, w.Since
		}
	}
	return key
}

// CloseUntil admits no call before until: the endpoint answered a call
// as rate-limited and asked to be called again no earlier.
func (b *Budget) CloseUntil(until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if until.After(b.closedUntil) {
		b.closedUntil = until
	}
}

// Forget drops a waiting call that will not ask again (cancelled, or its
// Run ended), counting the time it waited up to now.
func (b *Budget) Forget(key string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.waiting[key]; ok {
		delete(b.waiting, key)
		b.waitedNanos.Add(int64(now.Sub(w.Since)))
	}
}

// Waiting reports whether the call of key waits for budget, and how.
func (b *Budget) Waiting(key string) (Wait, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w, ok := b.waiting[key]
	return w, ok
}

// Waits is the number of calls that had to wait for budget.
func (b *Budget) Waits() int64 { return b.waits.Load() }

// WaitedSeconds is the time the calls that waited for budget spent
// waiting, counted when each was admitted or forgotten.
func (b *Budget) WaitedSeconds() float64 { return time.Duration(b.waitedNanos.Load()).Seconds() }

// refillLocked brings the window of ended calls and the token allowance
// up to now.
func (b *Budget) refillLocked(now time.Time) {
	w := b.share.window()
	cut := 0
	for cut < len(b.ended) && !b.ended[cut].Add(w).After(now) {
		cut++
	}
	b.ended = b.ended[cut:]
	if tpm := b.share.TokensPerMinute; tpm > 0 {
		if !b.allowanceAt.IsZero() && now.After(b.allowanceAt) {
			b.allowance += now.Sub(b.allowanceAt).Minutes() * float64(tpm)
			b.allowance = min(b.allowance, b.share.tokensPerWindow())
		}
		if b.allowanceAt.IsZero() || now.After(b.allowanceAt) {
			b.allowanceAt = now
		}
	}
}

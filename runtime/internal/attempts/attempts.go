// Package attempts is the runtime's one owner of what its process is
// doing about effect attempts (docs/DESIGN.md §5). It is a table behind
// one lock, with explicit transitions; it calls nothing out, so its lock is
// a leaf under every other lock of the runtime.
package attempts

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Table is the one owner of what this process is doing about effect
// attempts, by assignment key: which attempts it calls, watches (a poll or
// a deferred attach is due), cancels or settles, which it has settled for
// good, and how much synchronous work each Run has in flight. Nothing else
// holds per-attempt state, and every change goes through a transition
// below that checks it is legal: an illegal one is an error (and a panic
// in a build with the invariants tag, which make test uses).
//
// The life of an attempt in this process:
//
//	absent ──Reserve/BeginCall──▶ calling ──Settling──▶ settling ──SettledDurably──▶ settled
//	                               │   ▲                                              (a tombstone
//	                           Watch   TakeWatched                                    until its Run
//	                               ▼   │                                              ends)
//	                              watched
//
// plus BeginCancel, which marks any live attempt as cancelling (a cancel
// call runs beside whatever else runs on it), and Abandon, which gives up
// one piece of work without an answer (the runtime is stopping, or the
// store refused for good): when none is left the attempt is forgotten and
// its record stays executing, for recovery.
//
// Each running piece of work (a start, poll or attach call, a cancel call,
// the commit of their answer) holds the attempt once; a Run's holds
// summed are its "busy" count, which keeps its waiters from being told it
// is quiescent while an answer is on its way. A hold is taken by Reserve,
// BeginCall, BeginCancel and TakeWatched, and given back by exactly one of
// Release, SettledDurably and Abandon.
//
// A Table is safe for concurrent use.
type Table struct {
	// mu guards the fields below, up to the end of the struct, and the
	// attempts byKey holds. It is a leaf: nothing is called while it is
	// held.
	mu    sync.Mutex
	byKey map[string]*attempt
	// byRun indexes the keys by their Run's prefix (runPrefix), so that
	// dropping an ended Run's entries costs that Run's entries, not a scan
	// of every attempt tracked: a recovery of 10,000 Runs tracks 10,000
	// attempts at once.
	byRun map[string]map[string]struct{}
	busy  map[string]int // holds summed, by runPrefix
	// ended holds the prefixes of the Runs that have ended while work was
	// still running on some of their attempts; each such attempt goes once
	// its last work concludes, and the prefix with the Run's last entry.
	ended map[string]bool
}

// attemptPhase is where an attempt stands in this process.
type attemptPhase uint8

const (
	// phaseCalling: a start, poll or attach call runs, or is about to (a
	// dispatch reserved before its commit, an adopted attempt).
	phaseCalling attemptPhase = iota + 1
	// phaseWatched: the watcher holds a poll or a deferred attach for it.
	phaseWatched
	// phaseSettling: its outcome is being committed; the commit is retried
	// under its one settlement command ID until it is durable.
	phaseSettling
	// phaseSettled: its settlement is durable. It never executes again, so
	// an advance acting on a snapshot read before that commit must not
	// call or cancel it again. The tombstone goes when the Run ends.
	phaseSettled
)

func (p attemptPhase) String() string {
	switch p {
	case phaseCalling:
		return "calling"
	case phaseWatched:
		return "watched"
	case phaseSettling:
		return "settling"
	case phaseSettled:
		return "settled"
	}
	return "absent"
}

type attempt struct {
	phase      attemptPhase
	cancelling bool // a cancel call runs or ran: it is not cancelled twice
	holds      int  // running work that will report on it
	// deferrals counts recovery's deferred attaches of it (the executor
	// was unavailable), the first at firstDeferredMS.
	deferrals       int
	firstDeferredMS int64
}

// New returns an empty Table.
func New() *Table {
	return &Table{byKey: map[string]*attempt{}, byRun: map[string]map[string]struct{}{}, busy: map[string]int{}, ended: map[string]bool{}}
}

// runPrefix is the "<tenant>/<session>/<run>." an assignment key starts
// with. IDs hold no '.' (loop.ValidID), so the first '.' of a key ends its
// Run's ID.
func runPrefix(key string) string {
	if i := strings.IndexByte(key, '.'); i >= 0 {
		return key[:i+1]
	}
	return key
}

// RunPrefixOf is the runPrefix of a Run's keys.
func RunPrefixOf(tenant, session, runID string) string {
	return tenant + "/" + session + "/" + runID + "."
}

// illegal reports an illegal transition: an error, and a panic under the
// invariants build tag.
func illegal(op, key string, a *attempt) error {
	phase, holds := attemptPhase(0), 0
	if a != nil {
		phase, holds = a.phase, a.holds
	}
	err := fmt.Errorf("runtime: attempt %s: %s is illegal in phase %s with %d holds", key, op, phase, holds)
	if invariants {
		panic(err)
	}
	return err
}

func (t *Table) addLocked(key string, a *attempt) {
	t.byKey[key] = a
	p := runPrefix(key)
	keys := t.byRun[p]
	if keys == nil {
		keys = map[string]struct{}{}
		t.byRun[p] = keys
	}
	keys[key] = struct{}{}
	t.busy[p] += a.holds
}

func (t *Table) deleteLocked(key string) {
	a, ok := t.byKey[key]
	if !ok {
		return
	}
	delete(t.byKey, key)
	p := runPrefix(key)
	if keys := t.byRun[p]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(t.byRun, p)
			delete(t.ended, p)
		}
	}
	t.addBusyLocked(p, -a.holds)
}

func (t *Table) addBusyLocked(prefix string, d int) {
	n := t.busy[prefix] + d
	switch {
	case n < 0:
		if invariants {
			panic(fmt.Sprintf("runtime: the busy count of %s went negative (%d)", prefix, n))
		}
		delete(t.busy, prefix)
	case n == 0:
		delete(t.busy, prefix)
	default:
		t.busy[prefix] = n
	}
}

func (t *Table) holdLocked(key string, a *attempt) {
	a.holds++
	t.addBusyLocked(runPrefix(key), 1)
}

// unholdLocked gives back one hold; false when there was none.
func (t *Table) unholdLocked(key string, a *attempt) bool {
	if a.holds <= 0 {
		return false
	}
	a.holds--
	t.addBusyLocked(runPrefix(key), -1)
	return true
}

// Reserve marks an attempt that a commit is about to dispatch as being
// called, before the commit, so that no other advance that reads the
// commit can mistake it for an orphan and call it a second time.
func (t *Table) Reserve(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		return illegal("reserve", key, a)
	}
	t.addLocked(key, &attempt{phase: phaseCalling, holds: 1})
	return nil
}

// Unreserve undoes reserve when the dispatch was not committed.
func (t *Table) Unreserve(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || a.phase != phaseCalling || a.holds != 1 || a.cancelling {
		return illegal("unreserve", key, a)
	}
	t.deleteLocked(key)
	return nil
}

// BeginCall marks an attempt found executing on record, which this
// process does not handle yet, as being called; false when it is handled
// already (called, watched, cancelled, settled).
func (t *Table) BeginCall(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[key] != nil {
		return false
	}
	t.addLocked(key, &attempt{phase: phaseCalling, holds: 1})
	return true
}

// BeginCancel marks an attempt as being cancelled, once; false when it is
// cancelled or settled already. watched reports that the attempt was
// watched: the caller drops its watcher items, since the cancel reply
// settles it.
func (t *Table) BeginCancel(key string) (watched, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil {
		a = &attempt{phase: phaseCalling}
		t.addLocked(key, a)
	}
	if a.cancelling || a.phase == phaseSettling || a.phase == phaseSettled {
		return false, false
	}
	watched = a.phase == phaseWatched
	a.cancelling, a.phase = true, phaseCalling
	a.deferrals, a.firstDeferredMS = 0, 0
	t.holdLocked(key, a)
	return watched, true
}

// Watch hands a called attempt to the watcher (a pending reply, a
// deferred attach). The hold of the call stays until release. It reports
// false, and changes nothing, when other work settles the attempt: a
// cancel call runs on it (its reply settles it), or its settlement is
// being committed, or is durable, already. There is nothing to watch.
func (t *Table) Watch(key string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || a.holds == 0 || a.phase == phaseWatched {
		return false, illegal("watch", key, a)
	}
	if a.cancelling || a.phase == phaseSettling || a.phase == phaseSettled {
		return false, nil
	}
	a.phase = phaseWatched
	return true, nil
}

// TakeWatched turns a watched attempt whose poll or attach fell due into a
// called one; false when it is no longer watched (cancelled, settled,
// forgotten).
func (t *Table) TakeWatched(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || a.phase != phaseWatched || a.cancelling {
		return false
	}
	a.phase = phaseCalling
	t.holdLocked(key, a)
	return true
}

// Release gives back the hold of a piece of work that concluded without a
// settlement: a poll still pending, a deferred attach, a pending record
// committed.
func (t *Table) Release(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || !t.unholdLocked(key, a) {
		return illegal("release", key, a)
	}
	if a.holds == 0 && t.ended[runPrefix(key)] {
		t.deleteLocked(key) // its Run ended while this work ran
	}
	return nil
}

// Settling marks an attempt whose outcome is about to be committed. It
// reports false when the attempt is settled already: the outcome is
// stale, and the caller gives its hold back with SettledDurably.
func (t *Table) Settling(key string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	switch {
	case a == nil || a.holds == 0:
		return false, illegal("settling", key, a)
	case a.phase == phaseSettled:
		return false, nil
	}
	a.phase = phaseSettling
	return true, nil
}

// SettledDurably records that the settlement of an attempt is durable (or
// that its outcome was dropped as stale), and gives back the hold of the
// work that settled it. The tombstone stays until the Run ends; when the
// Run has ended already (a reply that came after its end), nothing stays
// once no work is left on it.
func (t *Table) SettledDurably(key string, runEnded bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || !t.unholdLocked(key, a) {
		return illegal("settledDurably", key, a)
	}
	a.phase = phaseSettled
	a.deferrals, a.firstDeferredMS = 0, 0
	if a.holds == 0 && (runEnded || t.ended[runPrefix(key)]) {
		t.deleteLocked(key)
	}
	return nil
}

// MarkSettled records that an attempt is settled on record without
// giving back a hold: the watcher found it settled by another path before
// its poll fell due, or another advance of the Run committed its queued
// settlement, whose own advance gives its hold back later.
func (t *Table) MarkSettled(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		a.phase = phaseSettled
		a.deferrals, a.firstDeferredMS = 0, 0
		if a.holds == 0 && t.ended[runPrefix(key)] {
			t.deleteLocked(key)
		}
	}
}

// Abandon gives up one piece of work on an attempt without an answer:
// the runtime is stopping, or its answer cannot be committed. Once no
// work is left on it and it is not settled, the attempt is forgotten: its
// record stays executing, and recovery (or a later advance of this
// process, which adopts it) takes it from there.
func (t *Table) Abandon(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || !t.unholdLocked(key, a) {
		return illegal("abandon", key, a)
	}
	if a.holds == 0 && (a.phase != phaseSettled || t.ended[runPrefix(key)]) {
		t.deleteLocked(key)
	}
	return nil
}

// Forget drops a watched attempt whose Run or tenant is gone, or whose
// watcher item could not be registered (the runtime is stopping).
func (t *Table) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil && a.holds == 0 {
		t.deleteLocked(key)
	}
}

// Deferral counts a deferred attach of an attempt and returns the
// count before it and the instant of the first deferral (0 for none).
func (t *Table) Deferral(key string) (n int, firstMS int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		return a.deferrals, a.firstDeferredMS
	}
	return 0, 0
}

// DeferAttach records one more deferral of an attempt's attach at nowMS.
func (t *Table) DeferAttach(key string, nowMS int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		if a.deferrals == 0 {
			a.firstDeferredMS = nowMS
		}
		a.deferrals++
	}
}

// ClearDeferral forgets an attempt's deferrals (it was attached, or
// settled).
func (t *Table) ClearDeferral(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		a.deferrals, a.firstDeferredMS = 0, 0
	}
}

// ForgetRun drops the entries of a Run that has ended, but for those with
// work still running on them: each goes when its work concludes
// (SettledDurably with runEnded, abandon).
func (t *Table) ForgetRun(prefix string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key := range t.byRun[prefix] {
		if t.byKey[key].holds == 0 {
			t.deleteLocked(key)
		}
	}
	if len(t.byRun[prefix]) > 0 {
		t.ended[prefix] = true
	}
}

// ForgetSettledIn drops the tombstones of a session this process gave up
// (keys under prefix "<tenant>/<session>/").
func (t *Table) ForgetSettledIn(prefix string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, a := range t.byKey {
		if a.phase == phaseSettled && a.holds == 0 && strings.HasPrefix(key, prefix) {
			t.deleteLocked(key)
		}
	}
}

// BusyRun is the number of holds on a Run's attempts: work running whose
// answer will advance it.
func (t *Table) BusyRun(prefix string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.busy[prefix]
}

// Handled reports whether this process handles the attempt: calls,
// watches, cancels or settles it.
func (t *Table) Handled(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	return a != nil && a.phase != phaseSettled
}

// InFlight counts the attempts of keys under prefix that are not settled.
func (t *Table) InFlight(prefix string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for key, a := range t.byKey {
		if a.phase != phaseSettled && strings.HasPrefix(key, prefix) {
			n++
		}
	}
	return n
}

// Len is the number of attempts the table holds: in flight, watched, or
// settled tombstones.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// Describe lists the attempts the table holds, each with its phase and
// holds, sorted, for failure messages.
func (t *Table) Describe() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k, a := range t.byKey {
		out = append(out, fmt.Sprintf("%s %s holds=%d cancelling=%v deferrals=%d", k, a.phase, a.holds, a.cancelling, a.deferrals))
	}
	sort.Strings(out)
	return out
}

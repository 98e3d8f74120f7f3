package runtime

import (
	"fmt"
	"strings"
	"sync"
)

// attempts is the one owner of what this process is doing about effect
// attempts, by assignment key: which attempts it calls, watches (a poll or
// a deferred attach is due), cancels or settles, which it has settled for
// good, and how much synchronous work each Run has in flight. Nothing else
// holds per-attempt state, and every change goes through a transition
// below that checks it is legal: an illegal one is an error (and a panic
// in a build with the invariants tag, which make test uses).
//
// The life of an attempt in this process:
//
//	absent ──reserve/beginCall──▶ calling ──settling──▶ settling ──settledDurably──▶ settled
//	                               │   ▲                                              (a tombstone
//	                           watch   takeWatched                                    until its Run
//	                               ▼   │                                              ends)
//	                              watched
//
// plus beginCancel, which marks any live attempt as cancelling (a cancel
// call runs beside whatever else runs on it), and abandon, which gives up
// one piece of work without an answer (the runtime is stopping, or the
// store refused for good): when none is left the attempt is forgotten and
// its record stays executing, for recovery.
//
// Each running piece of work (a start, poll or attach call, a cancel call,
// the commit of their answer) holds the attempt once; a Run's holds
// summed are its "busy" count, which keeps its waiters from being told it
// is quiescent while an answer is on its way. A hold is taken by reserve,
// beginCall, beginCancel and takeWatched, and given back by exactly one of
// release, settledDurably and abandon.
//
// attempts is safe for concurrent use; its lock is never held while
// calling out.
type attempts struct {
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

func newAttempts() *attempts {
	return &attempts{byKey: map[string]*attempt{}, byRun: map[string]map[string]struct{}{}, busy: map[string]int{}, ended: map[string]bool{}}
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

// runPrefixOf is the runPrefix of a Run's keys.
func runPrefixOf(tenant, session, runID string) string {
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

func (t *attempts) addLocked(key string, a *attempt) {
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

func (t *attempts) deleteLocked(key string) {
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

func (t *attempts) addBusyLocked(prefix string, d int) {
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

func (t *attempts) holdLocked(key string, a *attempt) {
	a.holds++
	t.addBusyLocked(runPrefix(key), 1)
}

// unholdLocked gives back one hold; false when there was none.
func (t *attempts) unholdLocked(key string, a *attempt) bool {
	if a.holds <= 0 {
		return false
	}
	a.holds--
	t.addBusyLocked(runPrefix(key), -1)
	return true
}

// reserve marks an attempt that a commit is about to dispatch as being
// called, before the commit, so that no other advance that reads the
// commit can mistake it for an orphan and call it a second time.
func (t *attempts) reserve(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		return illegal("reserve", key, a)
	}
	t.addLocked(key, &attempt{phase: phaseCalling, holds: 1})
	return nil
}

// unreserve undoes reserve when the dispatch was not committed.
func (t *attempts) unreserve(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	if a == nil || a.phase != phaseCalling || a.holds != 1 || a.cancelling {
		return illegal("unreserve", key, a)
	}
	t.deleteLocked(key)
	return nil
}

// beginCall marks an attempt found executing on record, which this
// process does not handle yet, as being called; false when it is handled
// already (called, watched, cancelled, settled).
func (t *attempts) beginCall(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[key] != nil {
		return false
	}
	t.addLocked(key, &attempt{phase: phaseCalling, holds: 1})
	return true
}

// beginCancel marks an attempt as being cancelled, once; false when it is
// cancelled or settled already. watched reports that the attempt was
// watched: the caller drops its watcher items, since the cancel reply
// settles it.
func (t *attempts) beginCancel(key string) (watched, ok bool) {
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

// watch hands a called attempt to the watcher (a pending reply, a
// deferred attach). The hold of the call stays until release. It reports
// false, and changes nothing, when other work settles the attempt: a
// cancel call runs on it (its reply settles it), or its settlement is
// being committed, or is durable, already. There is nothing to watch.
func (t *attempts) watch(key string) (bool, error) {
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

// takeWatched turns a watched attempt whose poll or attach fell due into a
// called one; false when it is no longer watched (cancelled, settled,
// forgotten).
func (t *attempts) takeWatched(key string) bool {
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

// release gives back the hold of a piece of work that concluded without a
// settlement: a poll still pending, a deferred attach, a pending record
// committed.
func (t *attempts) release(key string) error {
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

// settling marks an attempt whose outcome is about to be committed. It
// reports false when the attempt is settled already: the outcome is
// stale, and the caller gives its hold back with settledDurably.
func (t *attempts) settling(key string) (bool, error) {
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

// settledDurably records that the settlement of an attempt is durable (or
// that its outcome was dropped as stale), and gives back the hold of the
// work that settled it. The tombstone stays until the Run ends; when the
// Run has ended already (a reply that came after its end), nothing stays
// once no work is left on it.
func (t *attempts) settledDurably(key string, runEnded bool) error {
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

// markSettled records that an attempt is settled on record without
// giving back a hold: the watcher found it settled by another path before
// its poll fell due, or another advance of the Run committed its queued
// settlement, whose own advance gives its hold back later.
func (t *attempts) markSettled(key string) {
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

// abandon gives up one piece of work on an attempt without an answer:
// the runtime is stopping, or its answer cannot be committed. Once no
// work is left on it and it is not settled, the attempt is forgotten: its
// record stays executing, and recovery (or a later advance of this
// process, which adopts it) takes it from there.
func (t *attempts) abandon(key string) error {
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

// forget drops a watched attempt whose Run or tenant is gone, or whose
// watcher item could not be registered (the runtime is stopping).
func (t *attempts) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil && a.holds == 0 {
		t.deleteLocked(key)
	}
}

// deferral counts a deferred attach of an attempt and returns the
// count before it and the instant of the first deferral (0 for none).
func (t *attempts) deferral(key string) (n int, firstMS int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		return a.deferrals, a.firstDeferredMS
	}
	return 0, 0
}

// deferAttach records one more deferral of an attempt's attach at nowMS.
func (t *attempts) deferAttach(key string, nowMS int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		if a.deferrals == 0 {
			a.firstDeferredMS = nowMS
		}
		a.deferrals++
	}
}

// clearDeferral forgets an attempt's deferrals (it was attached, or
// settled).
func (t *attempts) clearDeferral(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byKey[key]; a != nil {
		a.deferrals, a.firstDeferredMS = 0, 0
	}
}

// forgetRun drops the entries of a Run that has ended, but for those with
// work still running on them: each goes when its work concludes
// (settledDurably with runEnded, abandon).
func (t *attempts) forgetRun(prefix string) {
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

// forgetSettledIn drops the tombstones of a session this process gave up
// (keys under prefix "<tenant>/<session>/").
func (t *attempts) forgetSettledIn(prefix string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, a := range t.byKey {
		if a.phase == phaseSettled && a.holds == 0 && strings.HasPrefix(key, prefix) {
			t.deleteLocked(key)
		}
	}
}

// busyRun is the number of holds on a Run's attempts: work running whose
// answer will advance it.
func (t *attempts) busyRun(prefix string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.busy[prefix]
}

// handled reports whether this process handles the attempt: calls,
// watches, cancels or settles it.
func (t *attempts) handled(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byKey[key]
	return a != nil && a.phase != phaseSettled
}

// inFlight counts the attempts of keys under prefix that are not settled.
func (t *attempts) inFlight(prefix string) int {
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

func (t *attempts) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

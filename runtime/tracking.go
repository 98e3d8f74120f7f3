package runtime

import "strings"

// trackingTable holds what this process is doing about effect attempts
// (calling, polling, cancelling) and the tombstones of the attempts it
// settled, by assignment key, with an index by Run: dropping an ended
// Run's entries (forgetRun) then costs that Run's entries, not a scan of
// every attempt the process tracks. A recovery of 10,000 Runs tracks
// 10,000 attempts at once, and a scan per ended Run under rt.mu was 10%
// of its CPU and held every other caller of rt.mu meanwhile.
//
// The Runtime's mu guards it; it is not safe for concurrent use.
type trackingTable struct {
	byKey map[string]*tracking
	byRun map[string]map[string]struct{} // runPrefix(key) → keys
}

func newTrackingTable() trackingTable {
	return trackingTable{byKey: map[string]*tracking{}, byRun: map[string]map[string]struct{}{}}
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

func (t *trackingTable) get(key string) *tracking { return t.byKey[key] }

// getOrAdd returns key's entry, adding an empty one when there is none.
func (t *trackingTable) getOrAdd(key string) *tracking {
	tr := t.byKey[key]
	if tr == nil {
		tr = &tracking{}
		t.put(key, tr)
	}
	return tr
}

func (t *trackingTable) put(key string, tr *tracking) {
	t.byKey[key] = tr
	p := runPrefix(key)
	keys := t.byRun[p]
	if keys == nil {
		keys = map[string]struct{}{}
		t.byRun[p] = keys
	}
	keys[key] = struct{}{}
}

func (t *trackingTable) delete(key string) {
	if _, ok := t.byKey[key]; !ok {
		return
	}
	delete(t.byKey, key)
	p := runPrefix(key)
	if keys := t.byRun[p]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(t.byRun, p)
		}
	}
}

// deleteRun drops every entry of a Run, given as its runPrefix
// ("<tenant>/<session>/<run>.").
func (t *trackingTable) deleteRun(prefix string) {
	for key := range t.byRun[prefix] {
		delete(t.byKey, key)
	}
	delete(t.byRun, prefix)
}

// all calls f with every entry; f may delete the entry it is given.
func (t *trackingTable) all(f func(key string, tr *tracking)) {
	for k, tr := range t.byKey {
		f(k, tr)
	}
}

func (t *trackingTable) len() int { return len(t.byKey) }

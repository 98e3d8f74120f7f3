package badgerstore

import (
	"sync"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
)

// snapCache holds the snapshots this Store committed or read lately, in
// their stored (binary) form, by Run, so that LoadRun answers without a
// Badger transaction. Every Badger transaction, a read's too, begins by
// waiting until every commit already given a timestamp is written and,
// with sync writes, synced (its read watermark): a Run's reload after its
// own commit therefore waited for the next group commit of every other
// Run, a second fsync in each advance. The snapshot stays the store's:
// one process owns the directory, and every write of a run record goes
// through this Store.
//
// The cache never answers a version older than the one committed last:
//
//   - A commit puts its snapshot only once its transaction has committed,
//     and only over an older one (a Run's Seq only grows); when it cannot
//     put it (the snapshot is past the bound) or its write failed (the
//     write may have happened), the Run's entry is dropped, never kept.
//   - A commit that overlapped another commit of the same Run (a group
//     transaction that held both) drops the entry instead of putting:
//     their answers return in any order, and an older one's put after a
//     newer one's drop would cache the older version (putCommitted).
//   - While a commit of a Run is under way (begin … end), its loads read
//     Badger and put nothing: between the moment the commit is visible in
//     Badger (to a read of the Run's events, say) and the moment its
//     snapshot is put here, the entry would be one version behind. So a
//     load that begins after a commit is visible sees it, and one that
//     overlaps the commit may see the snapshot before it, as a Badger read
//     that began first would.
//   - What a read of Badger found is put (putRead) only if no commit of
//     the Run began, put, dropped or ended since the read began: each of
//     those takes the next value of a generation counter, and a Run's
//     last one is recorded while any read is under way (changed); a read
//     takes the counter's value before it begins (beginRead). Otherwise a
//     commit that completed between the read and its put, and whose entry
//     was then evicted or dropped, would leave the read's older version
//     cached for good.
//
// The cache is bounded (Options.SnapshotCacheBytes): bytes is always the
// sum of the entries' lengths and never more than max; past it, entries go
// in no particular order. The runtime keeps nothing between advances
// (docs/DESIGN.md §5): it reloads from the store each time, and the store
// answers from here.
type snapCache struct {
	mu      sync.Mutex
	m       map[runRef]cachedSnap
	writing map[runRef]int // the commits of each Run under way
	// overlapped holds the Runs two of whose commits have been under way
	// at once since the last moment none was: their answers may come
	// back in any order, so none of them puts its snapshot
	// (putCommitted).
	overlapped map[runRef]bool
	bytes      int
	max        int

	gen     uint64            // the last generation given to a change of a Run
	changed map[runRef]uint64 // each Run's last change while reads are under way
	reads   int               // the reads under way (beginRead … endRead)
	// floor is the generation at which changed was last cleared while
	// reads were under way: a read that began before it may not put.
	floor uint64

	// beforePutRead, when set (by tests), runs in putRead before it looks
	// at the cache: after the read of Badger whose find it caches.
	beforePutRead func()
}

// maxChanged bounds the Runs changed records while reads overlap without
// a break: past it the record is cleared, and the reads under way put
// nothing (floor).
const maxChanged = 1 << 14

type runRef struct{ tenant, run string }

type cachedSnap struct {
	seq  int64
	snap []byte // never changed once here
}

// snapRead is a read of Badger whose Runs may be cached (putRead): the
// generation when it began.
type snapRead struct{ gen uint64 }

func newSnapCache(max int) *snapCache {
	return &snapCache{m: map[runRef]cachedSnap{}, writing: map[runRef]int{}, overlapped: map[runRef]bool{}, changed: map[runRef]uint64{}, max: max}
}

// changedLocked gives a change of Run k (a commit's begin, put, drop or
// end) the next generation, and records it for the reads under way.
func (c *snapCache) changedLocked(k runRef) {
	c.gen++
	if c.reads == 0 {
		// A read that begins later takes this generation or a later one:
		// nothing needs to remember the change.
		return
	}
	if len(c.changed) >= maxChanged {
		clear(c.changed)
		c.floor = c.gen
	}
	c.changed[k] = c.gen
}

// begin marks a commit of a Run as under way, before its transaction;
// end, after the commit has put its snapshot or dropped the entry.
func (c *snapCache) begin(tenant, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	if c.writing[k] > 0 {
		c.overlapped[k] = true
	}
	c.writing[k]++
	c.changedLocked(k)
}

func (c *snapCache) end(tenant, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	if c.writing[k]--; c.writing[k] <= 0 {
		delete(c.writing, k)
		delete(c.overlapped, k)
	}
	c.changedLocked(k)
}

// putCommitted records what a commit of a Run (begin … end) wrote at seq,
// unless another commit of the Run was under way beside it: two commits
// of one Run that overlap (a group transaction holds both, one of them
// refused) return in any order, and the older one's put after the
// newer one's, or after a refused one's drop, would leave an older
// version cached for good. Such a commit drops the entry instead, and
// the next load reads Badger. The runtime commits a Run's advances one at
// a time, so this costs nothing in a Run's normal course.
func (c *snapCache) putCommitted(tenant, run string, seq int64, snap []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	c.changedLocked(k)
	if c.overlapped[k] {
		c.dropLocked(k)
		return
	}
	c.putLocked(k, seq, snap)
}

// put records the committed snapshot of a Run at seq, unless a newer one
// is there: what a creation wrote (a commit puts with putCommitted).
func (c *snapCache) put(tenant, run string, seq int64, snap []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	c.changedLocked(k)
	c.putLocked(k, seq, snap)
}

// beginRead is called before a read of Badger whose Runs are to be cached
// (putRead); endRead, once they are.
func (c *snapCache) beginRead() snapRead {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return snapRead{gen: c.gen}
}

func (c *snapCache) endRead(snapRead) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reads--; c.reads == 0 {
		clear(c.changed)
	}
}

// putRead records what read rd found in Badger, unless a commit of the Run
// is under way or changed it since rd began: what rd found may then be
// older than what was committed.
func (c *snapCache) putRead(rd snapRead, tenant, run string, seq int64, snap []byte) {
	if c.beforePutRead != nil {
		c.beforePutRead()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	if c.writing[k] > 0 || rd.gen < c.floor || c.changed[k] > rd.gen {
		return
	}
	c.putLocked(k, seq, snap)
}

// putLocked puts snap as Run k's entry unless the entry is newer. A
// snapshot past the bound is not kept, and neither is the entry it
// replaces: that entry is older.
func (c *snapCache) putLocked(k runRef, seq int64, snap []byte) {
	old, had := c.m[k]
	if had && old.seq > seq {
		return
	}
	if had {
		delete(c.m, k)
		c.bytes -= len(old.snap)
	}
	if c.max <= 0 || len(snap) > c.max {
		return
	}
	for c.bytes+len(snap) > c.max && len(c.m) > 0 {
		for ek, e := range c.m {
			delete(c.m, ek)
			c.bytes -= len(e.snap)
			break
		}
	}
	c.m[k] = cachedSnap{seq: seq, snap: snap}
	c.bytes += len(snap)
}

// drop forgets a Run's entry.
func (c *snapCache) drop(tenant, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	c.changedLocked(k)
	c.dropLocked(k)
}

func (c *snapCache) dropLocked(k runRef) {
	if old, ok := c.m[k]; ok {
		c.bytes -= len(old.snap)
		delete(c.m, k)
	}
}

// load decodes a Run's cached snapshot; ok is false when there is none,
// or when a commit of the Run is under way.
func (c *snapCache) load(tenant, run string) (r loop.Run, ok bool, err error) {
	c.mu.Lock()
	k := runRef{tenant, run}
	e, ok := c.m[k]
	if c.writing[k] > 0 {
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return loop.Run{}, false, nil
	}
	// Decoded from a copy: the decoded Run's raw fields share the bytes
	// they were decoded from, and the caller may do as it likes with its
	// Run.
	r, err = runcodec.Decode(append([]byte(nil), e.snap...))
	return r, err == nil, err
}

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
// through this Store, which puts the snapshot here only once its
// transaction has committed, and only over an older one (a Run's Seq only
// grows), and drops a Run's entry when a write of it fails (the write may
// have happened). While a commit of a Run is under way (begin … end), its
// loads read Badger and put nothing: between the moment the commit is
// visible in Badger (to a read of the Run's events, say) and the moment
// its snapshot is put here, the entry would be one version behind. So a
// load that begins after a commit is visible sees it, and one that
// overlaps the commit may see the snapshot before it, as a Badger read
// that began first would. The cache is
// bounded (Options.SnapshotCacheBytes); past it, entries go in no
// particular order. The runtime keeps nothing between advances
// (docs/DESIGN.md §5): it reloads from the store each time, and the store
// answers from here.
type snapCache struct {
	mu      sync.Mutex
	m       map[runRef]cachedSnap
	writing map[runRef]int // the commits of each Run under way
	bytes   int
	max     int
}

type runRef struct{ tenant, run string }

type cachedSnap struct {
	seq  int64
	snap []byte // never changed once here
}

func newSnapCache(max int) *snapCache {
	return &snapCache{m: map[runRef]cachedSnap{}, writing: map[runRef]int{}, max: max}
}

// begin marks a commit of a Run as under way, before its transaction;
// end, after the commit has put its snapshot or dropped the entry.
func (c *snapCache) begin(tenant, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writing[runRef{tenant, run}]++
}

func (c *snapCache) end(tenant, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	if c.writing[k]--; c.writing[k] <= 0 {
		delete(c.writing, k)
	}
}

// put records the committed snapshot of a Run at seq, unless a newer one
// is there: what a commit wrote.
func (c *snapCache) put(tenant, run string, seq int64, snap []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(runRef{tenant, run}, seq, snap)
}

// putRead records what a load read from Badger, unless a commit of the
// Run is under way (what the load read may be the version before it).
func (c *snapCache) putRead(tenant, run string, seq int64, snap []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runRef{tenant, run}
	if c.writing[k] > 0 {
		return
	}
	c.putLocked(k, seq, snap)
}

func (c *snapCache) putLocked(k runRef, seq int64, snap []byte) {
	if c.max <= 0 || len(snap) > c.max {
		return
	}
	if old, ok := c.m[k]; ok {
		if old.seq > seq {
			return
		}
		c.bytes -= len(old.snap)
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

// Package ownedruns keeps, for the sessions this node owns, the snapshot
// of each live Run as this node last committed it (or last read it under
// its claim, finding nothing to write), under the fencing epoch it
// committed or read with, and the history its builder was given, so
// that the advances of a Run neither read back from the store a
// snapshot the node itself has just written nor read the session's
// history at every model step (docs/DESIGN.md §5.4).
//
// A snapshot taken from here is a guess the store checks: the commit
// that follows it expects its Seq and carries its epoch, so a stale
// snapshot (a guest node's input committed under the owner's epoch, a
// takeover) costs a refused commit and a read, never a wrong write. The
// runtime drops a Run's snapshot whenever the store's answer is not a
// commit of it: a refusal, an error (the commit may or may not be
// written), a duplicate; it forgets the Run when it ends and the session
// when this node loses it.
package ownedruns

import (
	"sync"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Cache is the one owner of the snapshots and histories this node keeps
// for the Runs of the sessions it owns. Safe for concurrent use; the
// runtime uses a Run's entries under that Run's advance lock.
type Cache struct {
	// mu guards bySession and every entry in it. It is a leaf: nothing is
	// called while it is held.
	mu        sync.Mutex
	bySession map[string]map[string]*entry // session key → run ID → entry
}

type entry struct {
	run        loop.Run
	epoch      uint64
	hasRun     bool
	history    []abi.Message
	hasHistory bool
}

// New returns an empty Cache.
func New() *Cache { return &Cache{bySession: map[string]map[string]*entry{}} }

// getLocked returns the Run's entry, made when missing and add is set; the
// caller holds mu.
func (c *Cache) getLocked(session, run string, add bool) *entry {
	runs := c.bySession[session]
	if runs == nil {
		if !add {
			return nil
		}
		runs = map[string]*entry{}
		c.bySession[session] = runs
	}
	e := runs[run]
	if e == nil && add {
		e = &entry{}
		runs[run] = e
	}
	return e
}

// Snapshot returns the snapshot this node last committed of the Run of
// session (a tenant/session key), and the epoch it committed it under.
func (c *Cache) Snapshot(session, run string) (loop.Run, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(session, run, false)
	if e == nil || !e.hasRun {
		return loop.Run{}, 0, false
	}
	return e.run.Clone(), e.epoch, true
}

// ExecutingAttempts returns the assignment keys of the executing effects
// of the session's Runs, as their snapshots here have them, in no order.
func (c *Cache) ExecutingAttempts(session string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, e := range c.bySession[session] {
		if !e.hasRun {
			continue
		}
		for i := range e.run.Effects {
			if f := &e.run.Effects[i]; f.State == loop.EffectExecuting {
				out = append(out, loop.AssignmentKey{Tenant: e.run.Tenant, Session: e.run.Session, EffectID: f.ID, Attempt: f.Attempt}.String())
			}
		}
	}
	return out
}

// Committed records r as the snapshot this node committed, or read
// under its claim, under epoch, of the Run of session. A terminal Run is forgotten instead: no advance
// of it follows.
func (c *Cache) Committed(session string, r loop.Run, epoch uint64) {
	if r.Status.Terminal() {
		c.Forget(session, r.ID)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(session, r.ID, true)
	e.run, e.epoch, e.hasRun = r.Clone(), epoch, true
}

// Drop drops the Run's snapshot (its history stays): the store's answer
// to a commit from it was not that commit, or the snapshot it held was
// not the store's.
func (c *Cache) Drop(session, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.getLocked(session, run, false); e != nil {
		e.run, e.hasRun = loop.Run{}, false
	}
}

// History returns the history the Run's builder was given.
func (c *Cache) History(session, run string) ([]abi.Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(session, run, false)
	if e == nil || !e.hasHistory {
		return nil, false
	}
	return e.history, true
}

// SetHistory records the history the Run's builder was given: the
// transcripts of the session's completed Runs before it, which do not
// change while it is live (the Runs of a session run one at a time, in
// order, and a terminal Run stays as it is). msgs is not changed after.
func (c *Cache) SetHistory(session, run string, msgs []abi.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.getLocked(session, run, true)
	e.history, e.hasHistory = msgs, true
}

// Forget forgets a Run: it has ended.
func (c *Cache) Forget(session, run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if runs := c.bySession[session]; runs != nil {
		delete(runs, run)
		if len(runs) == 0 {
			delete(c.bySession, session)
		}
	}
}

// ForgetSession forgets the Runs of a session: this node no longer owns
// it.
func (c *Cache) ForgetSession(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.bySession, session)
}

// Len is the number of Runs with an entry.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, runs := range c.bySession {
		n += len(runs)
	}
	return n
}

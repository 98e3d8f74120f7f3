package badgerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/runtime"
)

// nodeRecord is a node incarnation's lease.
type nodeRecord struct {
	ExpiresMS int64 `json:"expires_ms"`
	// Generation is the open generation the node registered under. A node
	// of an earlier generation is dead: its process no longer holds the
	// directory lock.
	Generation uint64 `json:"generation"`
}

// ownerRecord is who owns a session, and its fencing epoch.
type ownerRecord struct {
	Owner string `json:"owner,omitempty"`
	Epoch uint64 `json:"epoch"`
}

func readJSON(txn *badger.Txn, k key, v any) (bool, error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, item.Value(func(b []byte) error { return json.Unmarshal(b, v) })
}

func writeJSON(txn *badger.Txn, k key, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return txn.Set(k, b)
}

func readEpoch(txn *badger.Txn, tenant, session string) (uint64, error) {
	var o ownerRecord
	_, err := readJSON(txn, ownerKey(tenant, session), &o)
	return o.Epoch, err
}

// alive reports whether node is a live incarnation at nowMS.
func (s *Store) alive(txn *badger.Txn, node string, nowMS int64) (bool, error) {
	var n nodeRecord
	found, err := readJSON(txn, nodeKey(node), &n)
	if err != nil || !found {
		return false, err
	}
	return n.Generation == s.generation && nowMS < n.ExpiresMS, nil
}

// RegisterNode implements runtime.Ownership: one write. Registering an ID
// again while it lives extends its lease; an ID whose incarnation is dead
// gives ErrNodeExpired.
func (s *Store) RegisterNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return s.putNode(ctx, "register", nodeID, expiresMS, false)
}

// RenewNode implements runtime.Ownership: one write.
func (s *Store) RenewNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return s.putNode(ctx, "renew", nodeID, expiresMS, true)
}

func (s *Store) putNode(ctx context.Context, verb, nodeID string, expiresMS int64, mustExist bool) error {
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return fmt.Errorf("badgerstore: %s node: %w", verb, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	now := s.opts.Clock.Now().UnixMilli()
	err := s.update(ctx, func(txn *badger.Txn) error {
		var n nodeRecord
		found, err := readJSON(txn, nodeKey(nodeID), &n)
		if err != nil {
			return err
		}
		live := found && n.Generation == s.generation && now < n.ExpiresMS
		if (found || mustExist) && !live {
			return fmt.Errorf("badgerstore: %s node %s: %w; stop driving its sessions and register a fresh node id", verb, nodeID, runtime.ErrNodeExpired)
		}
		if found && expiresMS < n.ExpiresMS {
			expiresMS = n.ExpiresMS // a lease never shrinks
		}
		return writeJSON(txn, nodeKey(nodeID), nodeRecord{ExpiresMS: expiresMS, Generation: s.generation})
	})
	if err != nil {
		return wrapErr(verb+" node "+nodeID, err)
	}
	return nil
}

// ClaimSession implements runtime.Ownership.
func (s *Store) ClaimSession(ctx context.Context, tenant, session, nodeID string, nowMS int64) (uint64, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return 0, fmt.Errorf("badgerstore: claim session: %w", err)
	}
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return 0, fmt.Errorf("badgerstore: claim session: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	var epoch uint64
	err := s.update(ctx, func(txn *badger.Txn) error {
		self, err := s.alive(txn, nodeID, nowMS)
		if err != nil {
			return err
		}
		if !self {
			return fmt.Errorf("badgerstore: claim session %s/%s by %s: %w", tenant, session, nodeID, runtime.ErrNodeExpired)
		}
		epoch, err = s.claimInTxn(txn, tenant, session, nodeID, nowMS, nil)
		return err
	})
	if err != nil {
		return 0, wrapErr("claim session "+tenant+"/"+session, err)
	}
	return epoch, nil
}

// claimInTxn claims a session for nodeID, whose own lease the caller
// checked, in txn: the same epoch when nodeID owns it already, a
// *SessionOwnedError when a live incarnation does, else the epoch plus
// one, written. liveOwners, when not nil, remembers for the transaction
// whether each owner seen is alive.
func (s *Store) claimInTxn(txn *badger.Txn, tenant, session, nodeID string, nowMS int64, liveOwners map[string]bool) (uint64, error) {
	var o ownerRecord
	if _, err := readJSON(txn, ownerKey(tenant, session), &o); err != nil {
		return 0, err
	}
	if o.Owner == nodeID {
		return o.Epoch, nil
	}
	if o.Owner != "" {
		live, seen := liveOwners[o.Owner]
		if !seen {
			var err error
			if live, err = s.alive(txn, o.Owner, nowMS); err != nil {
				return 0, err
			}
			if liveOwners != nil {
				liveOwners[o.Owner] = live
			}
		}
		if live {
			return 0, fmt.Errorf("badgerstore: claim session %s/%s by %s: %w", tenant, session, nodeID,
				&runtime.SessionOwnedError{Tenant: tenant, Session: session, Owner: o.Owner, Epoch: o.Epoch})
		}
	}
	epoch := o.Epoch + 1
	return epoch, writeJSON(txn, ownerKey(tenant, session), ownerRecord{Owner: nodeID, Epoch: epoch})
}

// claimAtCreation claims a session for nodeID in the transaction that
// creates a Run in it (runtime.CreateRun.Claimant), as ClaimSession
// would, but only when no one owns it or nodeID does already: it returns
// the claim's epoch, or 0 when it makes none (another incarnation owns
// the session, or nodeID's lease ran out).
func (s *Store) claimAtCreation(txn *badger.Txn, tenant, session, nodeID string) (uint64, error) {
	self, err := s.alive(txn, nodeID, s.opts.Clock.Now().UnixMilli())
	if err != nil || !self {
		return 0, err
	}
	var o ownerRecord
	if _, err := readJSON(txn, ownerKey(tenant, session), &o); err != nil {
		return 0, err
	}
	switch o.Owner {
	case nodeID:
		return o.Epoch, nil
	case "":
		o = ownerRecord{Owner: nodeID, Epoch: o.Epoch + 1}
		return o.Epoch, writeJSON(txn, ownerKey(tenant, session), o)
	}
	return 0, nil
}

// ClaimSessions implements runtime.Ownership: one transaction, and so one
// synced write, for the whole batch. A Badger conflict with a concurrent
// writer (a claim, a Run created in one of the sessions) runs it again
// from its first read, as every update does.
func (s *Store) ClaimSessions(ctx context.Context, nodeID string, nowMS int64, sessions []runtime.SessionRef) ([]runtime.SessionClaim, error) {
	if err := runtime.CheckClaimBatch(nodeID, sessions); err != nil {
		return nil, fmt.Errorf("badgerstore: claim sessions: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []runtime.SessionClaim
	// Begun before the first read, so that the Runs the claim finds are
	// cached only if no commit changed them since (snapcache.go).
	rd := s.snaps.beginRead()
	defer s.snaps.endRead(rd)
	err := s.update(ctx, func(txn *badger.Txn) error {
		out = make([]runtime.SessionClaim, len(sessions))
		self, err := s.alive(txn, nodeID, nowMS)
		if err != nil {
			return err
		}
		if !self {
			return fmt.Errorf("badgerstore: claim %d sessions by %s: %w", len(sessions), nodeID, runtime.ErrNodeExpired)
		}
		liveOwners := map[string]bool{}
		for i, ref := range sessions {
			epoch, err := s.claimInTxn(txn, ref.Tenant, ref.Session, nodeID, nowMS, liveOwners)
			if errors.Is(err, runtime.ErrSessionOwned) {
				out[i].Err = err
				continue
			}
			if err != nil {
				return err
			}
			out[i].Epoch = epoch
			runs, err := runsAt(txn, ref.Tenant, activePrefix(ref.Tenant, ref.Session), 0, 0)
			if err != nil {
				return err
			}
			for j, sr := range runs {
				if j == 0 {
					out[i].HeadOrdinal = sr.Ordinal
				}
				out[i].Active = append(out[i].Active, sr.Run)
			}
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr(fmt.Sprintf("claim %d sessions", len(sessions)), err)
	}
	// The Runs the claim read are what the claimant's drives load next:
	// cached as LoadRun caches what it reads, they load without a Badger
	// transaction, which would wait for the commits under way (snapcache.go).
	for i, c := range out {
		for j := range c.Active {
			r := &out[i].Active[j]
			s.snaps.putRead(rd, sessions[i].Tenant, r.ID, r.Seq, encodeSnapshot(r))
		}
	}
	return out, nil
}

// ReleaseSession implements runtime.Ownership.
func (s *Store) ReleaseSession(ctx context.Context, tenant, session, nodeID string) error {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return fmt.Errorf("badgerstore: release session: %w", err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	err := s.update(ctx, func(txn *badger.Txn) error {
		var o ownerRecord
		if _, err := readJSON(txn, ownerKey(tenant, session), &o); err != nil {
			return err
		}
		if o.Owner != nodeID {
			return nil
		}
		return writeJSON(txn, ownerKey(tenant, session), ownerRecord{Epoch: o.Epoch})
	})
	if err != nil {
		return wrapErr("release session "+tenant+"/"+session, err)
	}
	return nil
}

// OrphanedSessions implements runtime.Ownership. It is cross-tenant: it
// reads the sessions that hold a non-terminal Run (tLive), and the owner of
// each, never a Run.
func (s *Store) OrphanedSessions(ctx context.Context, nowMS int64) ([]runtime.SessionOwner, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []runtime.SessionOwner
	err := s.db.View(func(txn *badger.Txn) error {
		out = nil
		liveNodes := map[string]bool{}
		prefix := newKey(tLive)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
			kr := readKey(it.Item().Key(), tLive)
			tenant, session := kr.str(), kr.str()
			if kr.err != nil {
				return kr.err
			}
			var o ownerRecord
			if _, err := readJSON(txn, ownerKey(tenant, session), &o); err != nil {
				return err
			}
			if o.Owner != "" {
				live, seen := liveNodes[o.Owner]
				if !seen {
					var err error
					if live, err = s.alive(txn, o.Owner, nowMS); err != nil {
						return err
					}
					liveNodes[o.Owner] = live
				}
				if live {
					continue
				}
			}
			out = append(out, runtime.SessionOwner{Tenant: tenant, Session: session, Owner: o.Owner, Epoch: o.Epoch})
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr("orphaned sessions", err)
	}
	return out, nil
}

// ActiveSessions implements runtime.Ownership. Like OrphanedSessions it
// reads the index of sessions that hold a non-terminal Run (tLive) and the
// owner of each, never a Run. That index is in key order, where a shorter
// ID sorts first; a lexWalk merges its runs of equal length, so a page
// costs a few seeks per ID length present plus one seek and one owner
// read per session returned, not a pass over every active session.
func (s *Store) ActiveSessions(ctx context.Context, afterTenant, afterSession string, limit int) ([]runtime.SessionOwner, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []runtime.SessionOwner
	err := s.db.View(func(txn *badger.Txn) error {
		out = nil
		it := txn.NewIterator(badger.IteratorOptions{Prefix: newKey(tLive)})
		defer it.Close()
		tenants, err := newLexWalk(it, newKey(tLive), afterTenant, true)
		if err != nil {
			return err
		}
		for limit <= 0 || len(out) < limit {
			tenant, ok, err := tenants.next()
			if err != nil || !ok {
				return err
			}
			after := ""
			if tenant == afterTenant {
				after = afterSession
			}
			sessions, err := newLexWalk(it, newKey(tLive).str(tenant), after, false)
			if err != nil {
				return err
			}
			for limit <= 0 || len(out) < limit {
				if err := ctx.Err(); err != nil {
					return err
				}
				session, ok, err := sessions.next()
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				var o ownerRecord
				if _, err := readJSON(txn, ownerKey(tenant, session), &o); err != nil {
					return err
				}
				out = append(out, runtime.SessionOwner{Tenant: tenant, Session: session, Owner: o.Owner, Epoch: o.Epoch})
			}
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr("active sessions", err)
	}
	return out, nil
}

// ExecutingEffects implements runtime.Ownership, from the executing index.
func (s *Store) ExecutingEffects(ctx context.Context, tenant, session string) ([]runtime.EffectRecord, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("badgerstore: executing effects: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []runtime.EffectRecord
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := executingPrefix(tenant, session)
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.ValidForPrefix(prefix); it.Next() {
			var e runtime.EffectRecord
			if err := it.Item().Value(func(b []byte) error { return json.Unmarshal(b, &e) }); err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, wrapErr("executing effects of "+tenant+"/"+session, err)
	}
	return out, nil
}

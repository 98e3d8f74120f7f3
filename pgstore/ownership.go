package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/runtime"
)

// Leases are kept in the database's clock. Only durations cross machines:
// the caller's expiry, computed on its own clock, becomes a TTL on this
// process's clock (the same one, in the caller's process), and the
// database stores its own now plus that TTL. When Options.Clock is set,
// its time stands in for the database's, and an expiry is stored as given.

// sqlRegisterNode inserts a node, or renews it if it is alive: $1 node,
// $2 now (or NULL), $3 TTL in ms. An incarnation found dead is marked
// dead for good. It returns whether the node is alive.
var sqlRegisterNode = `WITH c AS (SELECT ` + dbNow(2) + ` AS now)
	INSERT INTO nodes AS n (node_id, expires_ms, dead)
	SELECT $1, c.now + $3, false FROM c
	ON CONFLICT (node_id) DO UPDATE SET
		expires_ms = CASE WHEN NOT n.dead AND (SELECT now FROM c) < n.expires_ms
			THEN greatest(n.expires_ms, EXCLUDED.expires_ms) ELSE n.expires_ms END,
		dead = n.dead OR (SELECT now FROM c) >= n.expires_ms
	RETURNING NOT n.dead`

// sqlRenewNode extends a live node's lease, never shortening it, and
// marks one whose lease ran out dead. No row: the node is unknown.
var sqlRenewNode = `UPDATE nodes AS n SET
		expires_ms = CASE WHEN NOT n.dead AND c.now < n.expires_ms
			THEN greatest(n.expires_ms, c.now + $3) ELSE n.expires_ms END,
		dead = n.dead OR c.now >= n.expires_ms
	FROM (SELECT ` + dbNow(2) + ` AS now) AS c
	WHERE n.node_id = $1
	RETURNING NOT n.dead`

// alive is the SQL test of a node row n at c.now.
const alive = `NOT n.dead AND c.now < n.expires_ms`

// sqlLiveNodes counts the live node incarnations: $1 now.
var sqlLiveNodes = `SELECT count(*) FROM nodes AS n, (SELECT ` + dbNow(1) + ` AS now) AS c WHERE ` + alive

// sqlClaimState reads, without a lock, what ClaimSession decides by:
// $1 tenant, $2 session, $3 node, $4 now. The session may have no row.
var sqlClaimState = `SELECT s.owner, s.epoch,
		coalesce((SELECT ` + alive + ` FROM nodes n WHERE n.node_id = $3), false),
		coalesce((SELECT ` + alive + ` FROM nodes n WHERE n.node_id = s.owner), false)
	FROM (SELECT ` + dbNow(4) + ` AS now) AS c
	LEFT JOIN sessions s ON s.tenant = $1 AND s.session = $2`

// sqlClaimTake is ClaimSession's take, the statement that reads, after
// the session row is locked, its owner and epoch and whether the claiming
// node and the owner are alive (the claiming node's lease read after the
// session's lock, in the same statement as the write), and takes the
// session (owner $3, epoch + 1) if the claim goes ahead: the node is
// alive, and the owner is none, or dead, and not the node itself. A claim
// refused deletes the session's row again if it is empty (no Run, never
// claimed). $1 tenant, $2 session, $4 now. It returns what it read and
// whether it wrote.
var sqlClaimTake = `WITH c AS (SELECT ` + dbNow(4) + ` AS now),
	st AS (SELECT s.owner, s.epoch,
			coalesce((SELECT ` + alive + ` FROM nodes n WHERE n.node_id = $3), false) AS self,
			coalesce((SELECT ` + alive + ` FROM nodes n WHERE n.node_id = s.owner), false) AS owner_alive
		FROM sessions s, c WHERE s.tenant = $1 AND s.session = $2),
	ok AS (SELECT st.epoch + 1 AS epoch FROM st WHERE st.self AND st.owner <> $3 AND (st.owner = '' OR NOT st.owner_alive)),
	u AS (UPDATE sessions SET owner = $3, epoch = ok.epoch FROM ok
		WHERE sessions.tenant = $1 AND sessions.session = $2 RETURNING 1),
	j AS (DELETE FROM sessions WHERE tenant = $1 AND session = $2 AND NOT EXISTS (SELECT 1 FROM ok)
		AND last_ordinal = 0 AND owner = '' AND epoch = 0 AND live_count = 0)
	SELECT st.owner, st.epoch, st.self, st.owner_alive, EXISTS (SELECT 1 FROM u) FROM st`

// A batch claim's statements take every session of the batch at once:
// $1 the tenants, $2 the sessions, in (tenant, session) byte order, so
// that two nodes' batches, whose rows are inserted and locked in that
// order (COLLATE "C", the columns' own), cannot deadlock.
//
// sqlBatchEnsureSessions creates the rows that are missing.
const sqlBatchEnsureSessions = `INSERT INTO sessions (tenant, session)
	SELECT b.tenant, b.session FROM unnest($1::text[], $2::text[]) AS b(tenant, session)
	ORDER BY b.tenant COLLATE "C", b.session COLLATE "C"
	ON CONFLICT DO NOTHING`

// sqlBatchLockSessions locks the rows, in order.
const sqlBatchLockSessions = `SELECT 1 FROM sessions s
	JOIN unnest($1::text[], $2::text[]) AS b(tenant, session) ON s.tenant = b.tenant AND s.session = b.session
	ORDER BY s.tenant, s.session FOR UPDATE OF s`

// sqlBatchClaimTake is a batch claim's take, a statement that starts once
// the rows are locked: for each session, what sqlClaimTake does for one
// ($3 the node, $4 now), and it returns, by session, what it read and
// whether it wrote. It does not judge the claiming node's lease again:
// sqlClaimant judged it once for the whole batch, and the batch gets this
// far only if the node was alive. Were the take to judge it anew, a lease
// that ran out midway (the database's clock moves on, another process
// marks the node dead) could refuse some sessions of a batch whose
// others are claimed. With the node alive, a claim is refused only for a
// session that has an owner, whose row is not empty: there is no row to
// delete again, as ClaimSession's refused take may.
var sqlBatchClaimTake = `WITH c AS (SELECT ` + dbNow(4) + ` AS now),
	st AS (SELECT s.tenant, s.session, s.owner, s.epoch,
			coalesce((SELECT ` + alive + ` FROM nodes n WHERE n.node_id = s.owner), false) AS owner_alive
		FROM unnest($1::text[], $2::text[]) AS b(tenant, session)
		JOIN sessions s ON s.tenant = b.tenant AND s.session = b.session, c),
	ok AS (SELECT st.tenant, st.session, st.epoch + 1 AS epoch FROM st
		WHERE st.owner <> $3 AND (st.owner = '' OR NOT st.owner_alive)),
	u AS (UPDATE sessions SET owner = $3, epoch = ok.epoch FROM ok
		WHERE sessions.tenant = ok.tenant AND sessions.session = ok.session
		RETURNING sessions.tenant, sessions.session)
	SELECT st.tenant, st.session, st.owner, st.epoch, st.owner_alive,
		EXISTS (SELECT 1 FROM u WHERE u.tenant = st.tenant AND u.session = st.session)
	FROM st`

// sqlClaimant judges, once for a batch claim and before its first write,
// whether the claiming node $1 is alive at $2 (its now, or NULL). A node
// found dead makes the transaction read-only: the batch's first write
// then fails, nothing after it runs (not the COMMIT), and the transaction
// rolls back, so that the refused batch writes nothing and waits for no
// session's lock.
var sqlClaimant = `SELECT j.alive, CASE WHEN j.alive THEN '' ELSE set_config('transaction_read_only', 'on', true) END
	FROM (SELECT coalesce((SELECT ` + alive + ` FROM nodes n, (SELECT ` + dbNow(2) + ` AS now) AS c
		WHERE n.node_id = $1), false) AS alive) AS j`

// RegisterNode implements runtime.Ownership: one statement. Registering a
// live incarnation again renews it (never shortening its lease); one
// whose lease ran out gives ErrNodeExpired, and stays dead.
func (s *Store) RegisterNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return s.putNode(ctx, "register", sqlRegisterNode, nodeID, expiresMS)
}

// RenewNode implements runtime.Ownership: one statement.
func (s *Store) RenewNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return s.putNode(ctx, "renew", sqlRenewNode, nodeID, expiresMS)
}

// LiveNodes counts the node incarnations whose lease is live
// (runtime.NodeCounter): the nodes that share the store, among which each
// runtime divides its model budgets.
func (s *Store) LiveNodes(ctx context.Context) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	var n int64
	if err := s.pool.QueryRow(ctx, sqlLiveNodes, s.nowParam()).Scan(&n); err != nil {
		return 0, fail("count live nodes", err)
	}
	return int(n), nil
}

func (s *Store) putNode(ctx context.Context, verb, q, nodeID string, expiresMS int64) error {
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return fmt.Errorf("pgstore: %s node: %w", verb, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	// Only the lease's length crosses to the database, measured on the
	// clock the caller computed expiresMS with.
	now := s.nowParam()
	local := time.Now().UnixMilli()
	if now != nil {
		local = *now
	}
	var live bool
	err := s.pool.QueryRow(ctx, q, nodeID, now, expiresMS-local).Scan(&live)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // RenewNode of an unknown node
	case err != nil:
		return fail(verb+" node "+nodeID, err)
	}
	if !live {
		return fmt.Errorf("pgstore: %s node %s: %w; stop driving its sessions and register a fresh node id", verb, nodeID, runtime.ErrNodeExpired)
	}
	return nil
}

// ClaimSession implements runtime.Ownership. When it writes nothing (the
// node owns the session already, a live node owns it, or the claiming
// node is dead) one read without a lock decides. A claim that takes the
// session runs a transaction of one round trip: BEGIN; create the
// session's row if missing; lock it; read again whether the nodes are
// alive and write the new owner and epoch if the claim still goes ahead
// (sqlClaimTake); COMMIT.
func (s *Store) ClaimSession(ctx context.Context, tenant, session, nodeID string, nowMS int64) (uint64, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return 0, fmt.Errorf("pgstore: claim session: %w", err)
	}
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return 0, fmt.Errorf("pgstore: claim session: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	what := "claim session " + tenant + "/" + session
	now := s.nowParam()
	var (
		owner              *string
		epoch              *int64
		self, ownerIsAlive bool
	)
	err := s.pool.QueryRow(ctx, sqlClaimState, tenant, session, nodeID, now).Scan(&owner, &epoch, &self, &ownerIsAlive)
	if err != nil {
		return 0, fail(what, err)
	}
	if e, done, err := claimDecision(tenant, session, nodeID, deref(owner), uint64(deref(epoch)), self, ownerIsAlive); done {
		return e, err
	}
	var result uint64
	err = s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		result = 0
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(sqlEnsureSession, tenant, session)
		b.Queue(sqlLockSessionEpoch, tenant, session)
		b.Queue(sqlClaimTake, tenant, session, nodeID, now)
		b.Queue(sqlCommit)
		br := conn.SendBatch(ctx, b)
		var (
			owner              string
			epoch              int64
			self, alive, wrote bool
		)
		err := execAll(br, 2)
		if err == nil {
			_, err = queryOne(br, &owner, &epoch)
		}
		if err == nil {
			_, err = queryOne(br, &owner, &epoch, &self, &alive, &wrote)
		}
		if err == nil {
			err = execAll(br, 1)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		e, done, refused := claimDecision(tenant, session, nodeID, owner, uint64(epoch), self, alive)
		if !done {
			e = uint64(epoch) + 1
		}
		if wrote == done {
			return fmt.Errorf("pgstore: %s by %s: the write's checks (wrote: %v) and the rows read disagree: %w", what, nodeID, wrote, runtime.ErrStoreUnavailable)
		}
		result = e
		return refused
	})
	if err != nil {
		return 0, fail(what, err)
	}
	return result, nil
}

// sqlClaimedActiveRuns reads, in a batch claim's transaction, the active
// Runs of the sessions ($1 tenants, $2 sessions) that node $3 owns, in
// session order.
const sqlClaimedActiveRuns = `SELECT r.tenant, r.session, r.ordinal, r.snapshot
	FROM unnest($1::text[], $2::text[]) AS b(tenant, session)
	JOIN sessions s ON s.tenant = b.tenant AND s.session = b.session AND s.owner = $3
	JOIN runs r ON r.tenant = b.tenant AND r.session = b.session AND r.live
	ORDER BY r.tenant, r.session, r.ordinal`

// ClaimSessions implements runtime.Ownership: one transaction of one round
// trip for the whole batch: BEGIN; judge the claiming node's lease, once
// (sqlClaimant); what ClaimSession's transaction does for each session,
// in one statement each for the whole batch, in (tenant, session) order
// so that two nodes' batches lock their rows in the same order and
// cannot deadlock: create the rows that are missing, lock them, take
// those the claim goes ahead for (sqlBatchEnsureSessions,
// sqlBatchLockSessions, sqlBatchClaimTake); then the active Runs of the
// sessions the node now owns; COMMIT. A node found dead gets
// ErrNodeExpired, and its batch stops at its first write and rolls back.
// The lease is judged when the batch begins, as Badger judges it at
// nowMS: one that runs out while the batch waits for a session's lock
// refuses none of the sessions after it, and the epochs fence the claims
// of a node that died meanwhile as they fence its commits.
func (s *Store) ClaimSessions(ctx context.Context, nodeID string, nowMS int64, sessions []runtime.SessionRef) ([]runtime.SessionClaim, error) {
	if err := runtime.CheckClaimBatch(nodeID, sessions); err != nil {
		return nil, fmt.Errorf("pgstore: claim sessions: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	order := make([]int, len(sessions))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		x, y := sessions[order[a]], sessions[order[b]]
		return x.Tenant < y.Tenant || (x.Tenant == y.Tenant && x.Session < y.Session)
	})
	tenants, names := make([]string, len(sessions)), make([]string, len(sessions))
	for j, i := range order {
		tenants[j], names[j] = sessions[i].Tenant, sessions[i].Session
	}
	what := fmt.Sprintf("claim %d sessions", len(sessions))
	now := s.nowParam()
	var out []runtime.SessionClaim
	err := s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		out = make([]runtime.SessionClaim, len(sessions))
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(sqlClaimant, nodeID, now)
		b.Queue(sqlBatchEnsureSessions, tenants, names)
		b.Queue(sqlBatchLockSessions, tenants, names)
		b.Queue(sqlBatchClaimTake, tenants, names, nodeID, now)
		b.Queue(sqlClaimedActiveRuns, tenants, names, nodeID)
		b.Queue(sqlCommit)
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		if err := execAll(br, 1); err != nil {
			return err
		}
		var (
			self     bool
			readOnly string
		)
		if _, err := queryOne(br, &self, &readOnly); err != nil {
			return err
		}
		if !self {
			// The rest of the batch fails at its first write; br.Close
			// reads that failure and txOnce rolls the transaction back.
			return fmt.Errorf("pgstore: claim %d sessions by %s: %w", len(sessions), nodeID, runtime.ErrNodeExpired)
		}
		if err := execAll(br, 2); err != nil { // the rows made, and locked
			return err
		}
		at := make(map[runtime.SessionRef]int, len(sessions))
		for i, ref := range sessions {
			at[ref] = i
		}
		decided := make([]bool, len(sessions))
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				ref          runtime.SessionRef
				owner        string
				epoch        int64
				alive, wrote bool
			)
			if err := rows.Scan(&ref.Tenant, &ref.Session, &owner, &epoch, &alive, &wrote); err != nil {
				rows.Close()
				return err
			}
			i, ok := at[ref]
			if !ok || decided[i] {
				rows.Close()
				return fmt.Errorf("pgstore: claim %d sessions by %s: the take read session %s/%s, which the batch does not name once: %w",
					len(sessions), nodeID, ref.Tenant, ref.Session, runtime.ErrStoreUnavailable)
			}
			decided[i] = true
			e, done, refused := claimDecision(ref.Tenant, ref.Session, nodeID, owner, uint64(epoch), true, alive)
			if !done {
				e = uint64(epoch) + 1
			}
			if wrote == done {
				rows.Close()
				return fmt.Errorf("pgstore: claim session %s/%s by %s: the write's checks (wrote: %v) and the rows read disagree: %w",
					ref.Tenant, ref.Session, nodeID, wrote, runtime.ErrStoreUnavailable)
			}
			out[i] = runtime.SessionClaim{Epoch: e, Err: refused}
			if refused != nil {
				out[i].Epoch = 0
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i, ok := range decided {
			if !ok {
				return fmt.Errorf("pgstore: claim session %s/%s by %s: its row was not there to take: %w",
					sessions[i].Tenant, sessions[i].Session, nodeID, runtime.ErrStoreUnavailable)
			}
		}
		rows, err = br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				ref  runtime.SessionRef
				ord  int64
				snap []byte
			)
			if err := rows.Scan(&ref.Tenant, &ref.Session, &ord, &snap); err != nil {
				rows.Close()
				return err
			}
			r, err := runcodec.Unmarshal(snap)
			if err != nil {
				rows.Close()
				return fmt.Errorf("pgstore: claim sessions: decode the snapshot of a Run of %s/%s: %w", ref.Tenant, ref.Session, err)
			}
			if i, ok := at[ref]; ok && out[i].Err == nil {
				if out[i].Active == nil {
					out[i].HeadOrdinal = ord
				}
				out[i].Active = append(out[i].Active, r)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return execAll(br, 1)
	})
	if err != nil {
		return nil, fail(what, err)
	}
	return out, nil
}

// claimDecision decides a claim that writes nothing; done is false when
// the claim takes the session.
func claimDecision(tenant, session, nodeID, owner string, epoch uint64, self, ownerAlive bool) (uint64, bool, error) {
	switch {
	case !self:
		return 0, true, fmt.Errorf("pgstore: claim session %s/%s by %s: %w", tenant, session, nodeID, runtime.ErrNodeExpired)
	case owner == nodeID:
		return epoch, true, nil
	case owner != "" && ownerAlive:
		return 0, true, fmt.Errorf("pgstore: claim session %s/%s by %s: %w", tenant, session, nodeID,
			&runtime.SessionOwnedError{Tenant: tenant, Session: session, Owner: owner, Epoch: epoch})
	}
	return 0, false, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// ReleaseSession implements runtime.Ownership: one statement.
func (s *Store) ReleaseSession(ctx context.Context, tenant, session, nodeID string) error {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return fmt.Errorf("pgstore: release session: %w", err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	_, err := s.pool.Exec(ctx, `UPDATE sessions SET owner = '' WHERE tenant = $1 AND session = $2 AND owner = $3`, tenant, session, nodeID)
	if err != nil {
		return fail("release session "+tenant+"/"+session, err)
	}
	return nil
}

// OrphanedSessions implements runtime.Ownership. It is cross-tenant: it
// reads the sessions that hold a non-terminal Run (sessions_live) and the
// owner of each, never a Run.
func (s *Store) OrphanedSessions(ctx context.Context, nowMS int64) ([]runtime.SessionOwner, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	out, err := s.sessionOwners(ctx, `SELECT s.tenant, s.session, s.owner, s.epoch
		FROM sessions s CROSS JOIN (SELECT `+dbNow(1)+` AS now) AS c
		LEFT JOIN nodes n ON n.node_id = s.owner
		WHERE s.live_count > 0 AND (s.owner = '' OR n.node_id IS NULL OR NOT (`+alive+`))
		ORDER BY s.tenant, s.session`, s.nowParam())
	if err != nil {
		return nil, fail("orphaned sessions", err)
	}
	return out, nil
}

// ActiveSessions implements runtime.Ownership, through sessions_live, in
// byte order of (tenant, session).
func (s *Store) ActiveSessions(ctx context.Context, afterTenant, afterSession string, limit int) ([]runtime.SessionOwner, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	out, err := s.sessionOwners(ctx, `SELECT tenant, session, owner, epoch FROM sessions
		WHERE live_count > 0 AND (tenant, session) > ($1, $2)
		ORDER BY tenant, session LIMIT $3`, afterTenant, afterSession, limitParam(limit))
	if err != nil {
		return nil, fail("active sessions", err)
	}
	return out, nil
}

func (s *Store) sessionOwners(ctx context.Context, q string, args ...any) ([]runtime.SessionOwner, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runtime.SessionOwner
	for rows.Next() {
		var (
			o     runtime.SessionOwner
			epoch int64
		)
		if err := rows.Scan(&o.Tenant, &o.Session, &o.Owner, &epoch); err != nil {
			return nil, err
		}
		o.Epoch = uint64(epoch)
		out = append(out, o)
	}
	return out, rows.Err()
}

// ExecutingEffects implements runtime.Ownership, through runs_executing:
// the records the Runs of the session with executing effects hold.
func (s *Store) ExecutingEffects(ctx context.Context, tenant, session string) ([]runtime.EffectRecord, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("pgstore: executing effects: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	rows, err := s.pool.Query(ctx, `SELECT executing FROM runs
		WHERE tenant = $1 AND session = $2 AND has_executing ORDER BY ordinal`, tenant, session)
	if err != nil {
		return nil, fail("executing effects of "+tenant+"/"+session, err)
	}
	defer rows.Close()
	var out []runtime.EffectRecord
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, fail("executing effects of "+tenant+"/"+session, err)
		}
		var recs []runtime.EffectRecord
		if err := json.Unmarshal(b, &recs); err != nil {
			return nil, fmt.Errorf("pgstore: executing effects of %s/%s: decode: %w", tenant, session, err)
		}
		out = append(out, recs...)
	}
	if err := rows.Err(); err != nil {
		return nil, fail("executing effects of "+tenant+"/"+session, err)
	}
	return out, nil
}

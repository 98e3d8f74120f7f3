package pgstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/runtime"
)

var _ runtime.NodeNames = (*Store)(nil)

// nodeNameLockKey is the session-level advisory lock that the process
// holding a node name keeps on its own connection, in the schema's key
// space.
func nodeNameLockKey(schema, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("agenthost node name " + schema + " " + name))
	return int64(h.Sum64())
}

// sqlRetireNodeName declares dead every live incarnation of a node name
// but the one registering: $1 and $2 bound the node IDs that begin
// with the name's prefix (node_id is COLLATE "C", so the range is the
// prefix, and the primary key serves it), $3 is the new incarnation.
const sqlRetireNodeName = `UPDATE nodes SET dead = true
	WHERE node_id >= $1 AND node_id < $2 AND node_id <> $3 AND NOT dead`

// sqlNodeNameSessionTimeoutsOff turns off, on the node name's
// connection, the server-side timeouts that would end it, and the lock
// with it, while the process lives.
const sqlNodeNameSessionTimeoutsOff = `SELECT set_config(name, '0', false) FROM pg_settings
	WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout', 'statement_timeout')`

// nodeNameReleaseTimeout bounds the close of a node name's connection;
// the server releases the lock when the connection ends, however it
// ends.
const nodeNameReleaseTimeout = 5 * time.Second

// HoldNodeName implements runtime.NodeNames. The name is held by a
// session-level advisory lock (pg_try_advisory_lock) on a connection of
// its own, outside the pool, that stays open until release: the server
// ends the lock when that connection ends, so that the lock is free again
// as soon as the holding process dies (a kill -9 closes its sockets).
// The connection turns the server's idle_session_timeout,
// idle_in_transaction_session_timeout and statement_timeout off, so that
// an idle lock is not ended by them; but nothing watches it afterwards:
// a connection lost while the process lives (a network cut, a server
// restart, pg_terminate_backend, a pooler between them) frees the lock
// unnoticed. Only the holder of the lock declares the name's other
// incarnations dead, so a process is refused with ErrNodeNameHeld while a
// live process keeps its lock connection; one that took the name after
// the lock was lost is kept from harm by fencing alone: the sessions it
// takes over have their epochs raised, and the earlier incarnation,
// declared dead, loses its lease at its next renewal. The connection
// counts against the server's max_connections, one a node.
func (s *Store) HoldNodeName(ctx context.Context, name, nodeID string) (func(), error) {
	if err := runtime.CheckNodeName(name); err != nil {
		return nil, fmt.Errorf("pgstore: hold node name: %w", err)
	}
	prefix := runtime.NodeNamePrefix(name)
	if !strings.HasPrefix(nodeID, prefix) || len(nodeID) == len(prefix) {
		return nil, fmt.Errorf("pgstore: hold node name %q: %w: node id %q does not begin %q", name, runtime.ErrInvalidRequest, nodeID, prefix)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	conn, err := pgx.ConnectConfig(ctx, s.connCf.Copy())
	if err != nil {
		return nil, fail("hold node name "+name, err)
	}
	release := sync.OnceFunc(func() {
		cctx, cancel := context.WithTimeout(context.Background(), nodeNameReleaseTimeout)
		defer cancel()
		conn.Close(cctx)
	})
	// set_config, not SET: a server older than PostgreSQL 14 has no
	// idle_session_timeout, and the ones it lacks are skipped.
	if _, err := conn.Exec(ctx, sqlNodeNameSessionTimeoutsOff); err != nil {
		release()
		return nil, fail("hold node name "+name, err)
	}
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, nodeNameLockKey(s.opts.Schema, name)).Scan(&held); err != nil {
		release()
		return nil, fail("hold node name "+name, err)
	}
	if !held {
		release()
		return nil, fmt.Errorf("pgstore: node name %q is held by another live process on %s: %w; two processes never share a node name: give this one another node.name, or stop the other one first", name, s.where, runtime.ErrNodeNameHeld)
	}
	// The prefix ends in '/'; '0' is the byte after it.
	if _, err := s.pool.Exec(ctx, sqlRetireNodeName, prefix, prefix[:len(prefix)-1]+"0", nodeID); err != nil {
		release()
		return nil, fail("retire the earlier incarnations of node name "+name, err)
	}
	return release, nil
}

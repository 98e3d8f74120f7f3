// Package pgstore implements runtime.Store on PostgreSQL (pgx v5 and
// pgxpool): Run snapshots, their event logs, the indexes recovery and the
// API read, node leases and session ownership, the plugins' key/value
// space, and a change feed (runtime.ChangeFeed) over LISTEN/NOTIFY. Unlike
// badgerstore, any number of agenthost processes may share one database.
//
// # Use
//
//	s, err := pgstore.Open(ctx, pgstore.Options{DSN: "postgres://agenthost:…@db:5432/agenthost"})
//	if err != nil { … } // one line that says what to do, never the password
//	defer s.Close()
//
// Open pings the server, brings the schema up to date and starts the
// change feed. Its errors say what to do: a malformed store.dsn, a server
// it cannot reach, a login refused, a database whose schema is newer than
// this binary. RedactDSN masks the password of a DSN for any message.
//
// # Schema
//
// The tables live in one PostgreSQL schema (Options.Schema, "agenthost" by
// default), created when missing and put on every pooled connection's
// search_path, so that several agenthost deployments, or test cases, can
// share a database. The layout is in versioned migrations embedded in the
// binary (migrations/NNNN_what.sql). Open applies the missing ones in one
// transaction under a transaction-scoped advisory lock, so that nodes
// starting together do not race, and records each in agenthost_schema
// (version, applied_at). A database at a newer version than the binary
// knows is refused and left alone.
//
// Every ID is text COLLATE "C", so that order and paging compare bytes, as
// Badger's keys do. Snapshots and events are bytea holding the bytes
// json.Marshal gave (jsonb would rewrite them). The tables are logged.
// Schema version 1:
//
//	sessions (tenant, session) PK          last_ordinal, owner ('' when none), epoch, live_count (non-terminal Runs)
//	  sessions_live (tenant, session) WHERE live_count > 0     OrphanedSessions, ActiveSessions
//	runs (tenant, run_id) PK               session, ordinal, seq, status, live, updated_at, create_cmd, executing, snapshot
//	  runs_by_session UNIQUE (tenant, session, ordinal)        SessionRuns
//	  runs_active (tenant, session, ordinal) WHERE live        ActiveRuns
//	  runs_by_status (tenant, status, run_id)                  RunsByStatus
//	events (tenant, run_id, seq) PK        body: the event's JSON
//	commands (tenant, run_id, command_id) PK                 seq: the Seq the command produced
//	create_commands (tenant, command_id) PK                  run_id: the Run a CreateRun command created
//	effects (tenant, session, ordinal, effect_id) PK         run_id, attempt, handle, epoch: executing effects (ExecutingEffects)
//	prunable (updated_at, tenant, run_id) PK                 terminal Runs not yet pruned, by the update that ended them (Prune)
//	nodes (node_id) PK                     expires_ms (database clock), dead
//	kv (tenant, plugin, key) PK            value
//	kv_usage (tenant, plugin) PK           bytes: keys plus values the plugin holds, for its quota
//	agenthost_schema (version) PK          applied_at
//
// A runs row holds what the indexes derive from (live is
// !status.Terminal(); executing is the JSON of the Run's executing effects'
// records), so that a Commit neither decodes the previous snapshot nor
// rewrites an index that did not change: the effects rows only when the
// executing set changed, sessions.live_count and prunable only when the
// Run ends. The columns a Commit changes every time (seq, updated_at,
// snapshot, executing) are in no index, so its update of the runs row can
// be a HOT update.
//
// # Transactions
//
// Transactions run at READ COMMITTED on one connection of the pool, in
// two round trips of pipelined statements (pgx.Batch), every statement
// prepared once per connection. A Commit's first batch begins, locks the
// session row (SELECT … FOR UPDATE), locks and reads the Run, and looks
// its command ID up; each read is its own statement, taken after the
// lock, so it sees what the previous holder committed. Go then applies
// the port's order (duplicate command, version, epoch) and the second
// batch writes and commits. CreateRun upserts and locks the session row
// (its last ordinal, owner and epoch) the same way. Locks are always taken
// session first, then Run. A transaction PostgreSQL aborts with a
// serialization failure or a deadlock (40001, 40P01) runs again, a few
// times, after a short jittered pause; any other failure is returned
// wrapping runtime.ErrStoreUnavailable (after a lost connection a commit
// may or may not have happened, and the runtime reads the Run back).
//
// # Time
//
// Leases and claims are judged by the database's clock, the one clock all
// nodes share. Only durations cross machines: RegisterNode and RenewNode
// turn the caller's expiry into a TTL on the local clock and store the
// database's now plus that TTL; ClaimSession and OrphanedSessions compare
// with the database's now, not the caller's nowMS. When Options.Clock is
// set (tests pass a conformance.FakeClock) its time is passed as the
// database's now instead.
//
// # Change feed
//
// After a CreateRun or Commit (never inside its transaction, where a
// NOTIFY would serialize every commit) the Store queues a runtime.Change.
// A notifier goroutine gathers them for a few milliseconds, keeps the
// newest Seq of each Run, and sends them with pg_notify on the
// agenthost_changes channel from one dedicated connection, as compact
// JSON payloads under 8000 bytes that carry this instance's origin ID and
// schema. A listener goroutine holds another dedicated connection that
// LISTENs, and hands the changes of other instances (same schema) to the
// subscribers, each through its own bounded queue and goroutine, so that a
// slow subscriber blocks neither the store nor the other subscribers.
// When the listener's connection fails, it reconnects with a jittered
// exponential backoff, LISTENs again and delivers Change{Rescan: true};
// a queue that overflows is replaced by a Rescan too. Notifications are
// a latency hint: everything stays correct when they are lost.
//
// Store is safe for concurrent use. After Close, every method returns an
// error wrapping runtime.ErrClosed.
package pgstore

// Package pgstore implements runtime.Store on PostgreSQL (pgx v5 and
// pgxpool): Run snapshots, their event logs, the indexes recovery and the
// API read, node leases and session ownership, the plugins' key/value
// space, a change feed (runtime.ChangeFeed) over LISTEN/NOTIFY, the live
// node count (runtime.NodeCounter) and the closures of rate-limited model
// endpoints (runtime.EndpointGate). Unlike badgerstore, any number of
// agenthost processes may share one database.
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
// Badger's keys do. Snapshots are bytea in the binary form of
// internal/runcodec (from schema version 3; a row written before holds
// the snapshot's JSON, which is read as well, and the Run's next commit
// rewrites it); events are bytea holding the bytes runcodec.MarshalJSON
// gave (JSON without encoding/json's HTML escapes; a row written before
// holds json.Marshal's, which reads the same), as the other stores keep
// them: jsonb would rewrite them, and the tenant's stored bytes would no
// longer be the same in every store. The tables are logged.
// Schema version 6:
//
//	sessions (tenant, session) PK          last_ordinal, owner ('' when none), epoch, live_count (non-terminal Runs)
//	  sessions_live (tenant, session) WHERE live_count > 0     OrphanedSessions, ActiveSessions
//	runs (tenant, run_id) PK               session, ordinal, seq, status, live, has_executing, updated_at,
//	                                       create_cmd, executing, snapshot, stored_bytes
//	  runs_by_session UNIQUE (session, tenant, ordinal)        SessionRuns, CompletedRunsBefore
//	  runs_active (tenant, session, ordinal) WHERE live        ActiveRuns
//	  runs_by_status (status, tenant, run_id)                  RunsByStatus, RunsByStatusDesc (scanned backwards)
//	  runs_executing (tenant, session, ordinal) WHERE has_executing   ExecutingEffects
//	events (tenant, run_id, seq) PK        body: the event's JSON
//	commands (tenant, run_id, command_id) PK                 seq: the Seq the command produced
//	create_commands (tenant, command_id) PK                  run_id: the Run a CreateRun command created
//	prunable (updated_at, tenant, run_id) PK                 terminal Runs not yet pruned, by the update that ended them (Prune)
//	nodes (node_id) PK                     expires_ms (database clock), dead
//	kv (tenant, plugin, key) PK            value
//	kv_usage (tenant, plugin) PK           bytes: keys plus values the plugin holds, for its quota
//	endpoint_closures (endpoint) PK        closed_until_ms (database clock): a model endpoint a rate-limited answer closed (runtime.EndpointGate)
//	agenthost_schema (version) PK          applied_at
//
// A runs row holds what the indexes derive from: live is
// !status.Terminal() (a Commit that would take a Run out of a terminal
// status is refused as malformed), executing the JSON of the Run's executing effects'
// records (runtime.ExecutingRecords, NULL when none) and has_executing
// whether there are any. A Commit therefore never decodes the previous
// snapshot, and the columns it changes every time (seq, updated_at,
// executing, snapshot) are in no index, so that its update of the row is
// a HOT update (no index entry written) unless the Run's status or the
// presence of executing effects changes. sessions.live_count and prunable
// change only when a Run is created or ends.
//
// No secondary index of runs leads with the tenant (schema version 6),
// so that a lookup of a Run by its key, (tenant, run_id), can only go
// through the primary key. On a table PostgreSQL has not analyzed yet (a
// new schema, until autovacuum's first ANALYZE) an index that leads with
// the tenant costs the same for that lookup, and the planner took
// runs_by_status bounded by the tenant alone; a pooled connection kept
// the plan, and each commit, load and creation read every Run of the
// tenant. The queries by session and by status name both leading columns
// of their index, and CompletedRunsBefore reads its Run by the key alone
// before it checks the session. plans_test.go checks the generic plans of
// the statements that look a Run up by its key, and of the reads by
// session and by status.
//
// runs.stored_bytes is what the Run holds, for its tenant's storage
// quota (TenantStoredBytes): the length of its snapshot, of each of its
// events, of each command ID applied to it and of its creation command
// while that is kept. It lives on the Run's own row, so counting takes no
// lock that another Run's commit needs (a per-tenant row would serialize
// all of a tenant's commits, across nodes): CreateRun sets it, a Commit
// changes it in the statement that rewrites the row (by what it adds, less
// the old snapshot's octet_length, which a TOASTed value answers without
// being fetched), and Prune subtracts what it deletes. It is in no index,
// so a Commit's update stays HOT; TenantStoredBytes sums it over the
// tenant's rows through the primary key. Migration 2 added the column and
// counted the Runs already stored from their rows.
//
// # Transactions
//
// Transactions run at READ COMMITTED on one connection of the pool, as
// pipelined statements (pgx.Batch), each prepared once per connection.
// Locks are always taken session first, then Run, each in a statement of
// its own that starts once the lock before it is held: under READ
// COMMITTED a statement's snapshot is taken when it starts, so a
// statement that starts after a lock sees what the lock's previous holder
// committed.
//
// A batch of statements sent as one pipeline ends with one Sync, and the
// server runs everything before a Sync in one implicit transaction: a
// batch that needs no decision in Go between its statements needs no
// BEGIN and COMMIT, two statements fewer for the server to run.
//
// A Commit is one round trip of two statements, one implicit
// transaction: lock the session row (SELECT … FOR UPDATE; its epoch
// fences the commit); one statement of data-modifying CTEs that locks
// and reads the Run (FOR UPDATE), looks the command IDs up (each by the
// whole primary key: a further command ID is a parameter of its own) and,
// only if the port's checks pass (no command applied, Seq, epoch), appends
// the events, rewrites the Run and records the command IDs. That statement
// returns the rows it read, whether it wrote and, when it ended the Run,
// the live Runs its session has left (CommitResult.SessionIdle); Go
// decides from the rows, in the port's order (duplicate, malformed,
// version conflict, fenced), and checks that the write agrees. A refused
// commit has written nothing, so committing it costs what a rollback
// would. CreateRun is one round trip the same way: create the session
// row if missing; lock it (its last ordinal, owner and epoch); one
// statement that looks the run ID and the creation command up and writes
// the Run only if neither was used (and, if it refuses, deletes the
// session row again when it is empty). When
// the creation names a Claimant whose lease is live and the session has
// no owner, the statement that writes the Run also claims the session for
// it (owner, epoch plus one), under the session's row lock, as
// ClaimSession's take would: the session's driver then needs no claim of
// its own, a transaction and a synced write fewer per new session.
// A creation that carries its Run's first step (CreateRun.FirstStep) is
// the same round trip: the statement writes the Run as the step leaves
// it, with the step's events after the first, when its checks find the
// session new (last ordinal 0) and the claim taken at the step's epoch,
// and says whether it did; Go checks that against the rows it read.
// Commits and creations that arrive while a transaction of them is under
// way queue, and share the next one, each with the statements it sends
// alone (group commit, groups.go); another transaction starts only when
// a backlog waits, up to Options.WriteGroups at once. A group is sorted by
// (tenant, session, run), the order batch claims lock in; judged each as
// if alone; written again each alone when PostgreSQL aborts the group, so
// that an error is its own write's.
// ClaimSession decides with one read when it writes nothing, and takes a
// session over in one round trip of the same shape. KVSet is two round
// trips: the locked reads, then Go decides and the writes and COMMIT
// follow, or the transaction is rolled back.
//
// A transaction PostgreSQL aborts with a serialization failure or a
// deadlock (40001, 40P01), or a creation that lost a race for a run or
// command ID (23505), runs again, a few times, after a short jittered
// pause; any other failure is returned wrapping
// runtime.ErrStoreUnavailable (after a lost connection a commit may or
// may not have happened, and the runtime reads the Run back).
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
// # Node names
//
// HoldNodeName (runtime.NodeNames) takes a session-level advisory lock,
// pg_try_advisory_lock on an FNV hash of the schema and the name, on a
// connection of its own outside the pool, kept open until the release
// the runtime calls at Stop or Halt; the server frees the lock when that
// connection ends, as it does when its process dies. Holding the lock, it
// marks dead, in one UPDATE, the other rows of nodes whose node_id begins
// with the name and a slash (a range on the primary key, which is
// COLLATE "C"). A lock held by another connection gives
// runtime.ErrNodeNameHeld and marks nothing.
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
// Instances on a schema announce themselves on the same channel (Hello
// when they begin to listen, answered by Here, and Here every 30 s): an
// instance that has heard no other within 90 s, past 2 s after it began
// to listen and while its listener listens, drops its changes instead of
// sending them, since only its own listener would hear them; its answer
// to a newcomer's Hello says it dropped some, and the newcomer delivers a
// Rescan (RATIONALE.md, "Why does an instance alone on its schema send no
// notifications?").
// When the listener's connection fails, it reconnects with a jittered
// exponential backoff, LISTENs again and delivers Change{Rescan: true};
// a queue that overflows is replaced by a Rescan too. Notifications are
// a latency hint: everything stays correct when they are lost.
//
// Store is safe for concurrent use. After Close, every method returns an
// error wrapping runtime.ErrClosed.
package pgstore

// Package badgerstore implements runtime.Store on an embedded Badger v4
// database: Run snapshots, their event logs, the indexes recovery and the
// API read, node leases and session ownership, and the plugins' key/value
// space.
//
// # Use
//
//	s, err := badgerstore.Open(dir, badgerstore.Options{})
//	if err != nil { … } // the message says what to do
//	defer s.Close()
//
// One process opens a directory at a time: Badger's directory lock
// refuses a second ("another agenthost process is using DIR"). Open
// creates and initialises a missing or empty directory; it refuses a
// non-empty directory that is not a Badger directory, a Badger database
// that is not an agenthost store, a store of another format version, and
// a damaged directory, and it never recreates or wipes one.
//
// Writes are durable when they return: SyncWrites is on unless
// Options.NoSyncWrites says otherwise. Throughput comes from concurrent
// committers (Badger groups their syncs), not from turning sync off.
// Value-log GC runs in a background goroutine that Close stops.
//
// Every open starts a new open generation. A node incarnation registered
// under an earlier generation is dead, since its process no longer holds
// the directory lock, so its sessions can be taken over at once
// (RATIONALE.md, "Why does the Badger directory lock make earlier
// incarnations dead?").
//
// # Key layout (format 1)
//
// A key is one table byte followed by components. A string component is
// length-prefixed (uvarint length, then its bytes), so a component never
// runs into the next one: tenant "a" with session "bs" and tenant "ab"
// with session "s" are different keys, and a prefix scan over tenant "a"
// or session "s" never reaches tenant "ab" or session "s1" (RATIONALE.md,
// "Why length-prefixed keys?"). An integer is 8 bytes big-endian, so it
// sorts numerically. lp(x) below is a length-prefixed component, be64(n)
// an integer.
//
//	0x00 lp("format")                          format version ("1"), written at the first open, checked at every open
//	0x00 lp("open_generation")                 be64: the number of this open, +1 at every open
//	'r' lp(tenant) lp(run)                     run record: uvarint(len(header)) header snapshot (binary, internal/runcodec; JSON in format 1)
//	'e' lp(tenant) lp(run) be64(seq)           event JSON, Seq 1…
//	'c' lp(tenant) lp(run) lp(command)         be64: the Seq the command produced (its first result)
//	'C' lp(tenant) lp(command)                 run ID a CreateRun command created
//	'q' lp(tenant) lp(session)                 be64: the last session ordinal given
//	'o' lp(tenant) lp(session) be64(ordinal)   run ID: the Runs of a session in order
//	'a' lp(tenant) lp(session) be64(ordinal)   run ID: the non-terminal Runs of a session in order
//	'l' lp(tenant) lp(session)                 be64: how many non-terminal Runs the session has (absent at 0)
//	's' lp(tenant) lp(status) run              empty: Runs by status; the run ID is last and raw, so it sorts in ID order
//	'x' lp(tenant) lp(session) be64(ordinal) lp(effect)  runtime.EffectRecord JSON: effects in state executing
//	'w' lp(tenant) lp(session)                 {"owner","epoch"}: the session's owner incarnation and fencing epoch
//	'n' lp(node)                               {"expires_ms","generation"}: a node incarnation's lease
//	'u' be64(updated_at) lp(tenant) lp(run)    empty: terminal Runs by last update, for Prune
//	'k' lp(tenant) lp(plugin) lp(key)          plugin KV value
//	'K' lp(tenant) lp(plugin)                  be64: bytes (keys plus values) the plugin holds, for its quota
//
// The header of a run record holds what the indexes derive from (ordinal,
// session, status, Seq, update time, creation command, executing effects),
// so a Commit moves the indexes from the old header to the new one in the
// same transaction that writes the events and the snapshot, without
// decoding the old snapshot. It also holds the Run's stored bytes (its
// snapshot as stored, its events' JSON and its command IDs, for the tenant's
// storage quota), which every write of the Run sets in the same
// transaction; no key is shared by two Runs' writes, so counting adds no
// conflict between them. Since one process owns the directory, each
// tenant's total is kept in memory: seeded from the headers at the first
// TenantStoredBytes for the tenant, then moved by each write that commits
// (usage.go). A header written before the figure was kept has none; the
// Run's keys are counted instead, and its next write records it (Prune
// records it before it deletes the log). The field is optional JSON, so
// the format stays 1. The 'l' and 'u' tables make the recovery scan
// (OrphanedSessions), the scan of active sessions (ActiveSessions) and
// Prune read only what they need: sessions with work, and terminal Runs in
// update order.
//
// Command IDs live with their Run ('c'), so a Commit finds a repeated
// command with one point read, and Prune drops them with the Run's log
// (RATIONALE.md, "Why is Seq the version, and why do command IDs live with
// the Run?"). Once pruned, a retried command is no longer recognised.
//
// A change to this layout bumps formatVersion; Open refuses a format it
// does not know, so a store is migrated, never misread.
//
// Store is safe for concurrent use. A transaction that loses a Badger
// conflict to a concurrent one is run again internally, from its first
// read, so Commit's order (command-ID lookup, Seq check, epoch check,
// write) holds against concurrent writers.
package badgerstore

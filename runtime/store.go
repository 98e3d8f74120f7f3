package runtime

import (
	"context"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// Store is the durable memory of the runtime: Run snapshots, their event
// logs, the indexes recovery and the API read, session ownership, and the
// plugins' key/value space. badgerstore.Store is the production
// implementation; conformance.MemStore is its in-memory twin for tests, and
// conformance.StoreSuite holds both to the same contract.
//
// Every method is scoped to one tenant, except the recovery scans, which
// say so. A Run's version is its loop.Run.Seq: the number of events in its
// log. Snapshots returned to the caller are the caller's; the store keeps
// no reference to them and the caller must not expect changes to reach
// the store except through Commit.
//
// The port asks for nothing a distributed store could not give: a
// compare-and-set on a version, a record of applied command IDs, and
// leases with fencing epochs.
//
// Implementations are safe for concurrent use. After Close, every method
// returns an error wrapping ErrClosed.
type Store interface {
	// CreateRun atomically appends the Run's first event (RunCreated, with
	// Seq 1), writes its first snapshot, places it last in its session's
	// order and indexes it. c.Run must be the result of loop.Apply on the
	// zero Run and c.Event.
	//
	// IDs outside [A-Za-z0-9_-]{1,64} give loop.ErrInvalidID. A Run ID used
	// before in the tenant gives ErrRunExists. When c.CommandID is not
	// empty and was used before in the tenant, CreateRun writes nothing and
	// returns the Run it created the first time, with Duplicate set.
	CreateRun(ctx context.Context, c CreateRun) (CreateResult, error)

	// LoadRun returns the authoritative snapshot of a Run. Its Seq is the
	// version a Commit must expect. ErrRunNotFound when there is none.
	LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error)

	// Commit applies one command to a Run, atomically, in this order:
	//  1. if c.CommandID was applied to this Run before, it returns that
	//     first result with Duplicate set and writes nothing;
	//  2. it checks that the stored Seq equals c.ExpectedSeq
	//     (ErrVersionConflict) and that c.Epoch is the session's current
	//     epoch (ErrFenced);
	//  3. it appends c.Events (whose Seq run ExpectedSeq+1 …), writes c.Run
	//     as the new snapshot, updates the indexes and records the command
	//     ID, and each of c.AlsoCommandIDs, in one transaction.
	//
	// c.AlsoCommandIDs are the commands the commit applies besides
	// c.CommandID (the runtime folds the settlements of several attempts
	// of a Run that arrive together into one commit, each under its own
	// settlement command ID). They do not decide a duplicate, since only
	// the first command is retried under its ID; a commit one of which was
	// applied before is refused with ErrVersionConflict and writes
	// nothing (its events were applied with it, so the Run has moved on).
	//
	// A retried commit whose acknowledgement was lost therefore succeeds.
	// c.Run.Seq must equal ExpectedSeq+len(Events). When the Run is not
	// found: ErrRunNotFound.
	Commit(ctx context.Context, c Commit) (CommitResult, error)

	// Events returns up to limit events of a Run whose Seq is >= fromSeq,
	// in order (limit <= 0 means all). A pruned log returns what is left.
	Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error)

	// SessionRuns returns up to limit Runs of a session in the order they
	// were created, starting after the Run with session ordinal after
	// (0 means from the first). limit <= 0 means all.
	SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]SessionRun, error)

	// CompletedRunsBefore returns the last limit completed Runs of a
	// session among those created before the Run runID, oldest first
	// (limit <= 0 means all of them): a builder's history. It reads back
	// from runID and stops at the limit, so what it costs does not grow
	// with the session's length. When runID is not a Run of that session:
	// ErrRunNotFound.
	CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error)

	// ActiveRuns returns the non-terminal Runs of a session, in session
	// order, through an index (it does not read terminal Runs). The first
	// one is the session's head: the only one that may run.
	ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error)

	// RunsByStatus returns up to limit IDs of the tenant's Runs with the
	// given status, in ID order after the ID after ("" from the first).
	RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error)

	// RunsByStatusDesc is RunsByStatus read backwards: up to limit IDs of
	// the tenant's Runs with the given status, in descending ID order,
	// before the ID before ("" from the last). A Run ID begins with its
	// creation time, so that is newest first. limit <= 0 means all.
	RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error)

	// TenantStoredBytes returns the bytes the tenant's Runs hold in the
	// store, for its storage quota: over every Run, the length of its
	// snapshot as the store keeps it (the binary form of
	// internal/runcodec, or the JSON a store wrote before it), of each
	// event's JSON in its log, and of each
	// command ID recorded for it (the creation command's included). A
	// CreateRun or Commit that writes changes the figure in the same
	// transaction, by what it wrote less the snapshot it replaced; one
	// that writes nothing (a duplicate, a refused commit) leaves it as it
	// was; Prune lowers it by what it deletes. Each Run's share is kept
	// with the Run's own record, so that no write of one Run waits for
	// another's. 0 for a tenant with no Runs.
	TenantStoredBytes(ctx context.Context, tenant string) (int64, error)

	Ownership
	PluginKV

	// Prune removes the event logs and command IDs of terminal Runs whose
	// last update is before beforeMS (Unix ms). Their snapshots, and so
	// their final transcripts, stay. It is cross-tenant.
	Prune(ctx context.Context, beforeMS int64) (PruneStats, error)

	// Close releases the store. It is safe to call more than once.
	Close() error
}

// NodeCounter is a Store that several nodes share and that counts them:
// the node incarnations whose lease is live. The runtime divides its model
// budgets by that count (Options.ModelBudgets); a Store that is not one
// serves one node, which takes the whole budget.
type NodeCounter interface {
	LiveNodes(ctx context.Context) (int, error)
}

// EndpointGate is a Store that several nodes share and that carries among
// them the closing of a model endpoint the provider answered as
// rate-limited: the node that got the answer closes the endpoint for the
// wait the provider asked for, and every node asks before it lets a model
// call to the endpoint start (docs/DESIGN.md §5, "Model budgets"). The
// store keeps the time in its own clock, so the nodes' clocks need not
// agree. A Store that is not one serves one node, whose budget closes
// the endpoint by itself.
type EndpointGate interface {
	// CloseEndpoint closes endpoint (a model executor's plugin ID) for
	// wait from now; a closure that ends later stays as it is.
	CloseEndpoint(ctx context.Context, endpoint string, wait time.Duration) error
	// EndpointClosedFor returns how long endpoint stays closed from now:
	// 0 when it is open.
	EndpointClosedFor(ctx context.Context, endpoint string) (time.Duration, error)
}

// NodeNames is a Store that several processes share and on which a
// process may hold a node name (Options.NodeName, the config's node.name),
// so that when it restarts under the same name it takes back at once the
// sessions of its own previous incarnation, without waiting out that
// incarnation's lease (docs/DESIGN.md §5, "Node names"). A Store that is
// not one needs no name: Badger's directory lock already makes every
// earlier incarnation in its data dir dead the moment a process opens it.
type NodeNames interface {
	// HoldNodeName takes name for this process until release is called or
	// the process dies, and declares dead every other incarnation
	// registered under name (node IDs that begin NodeNamePrefix(name)):
	// their sessions are then orphans that recovery claims at once,
	// bumping each epoch, so that such an incarnation, were it still
	// running, is fenced at its next commit and its next renewal. A name
	// that another live process holds gives ErrNodeNameHeld, and nothing
	// is declared dead.
	HoldNodeName(ctx context.Context, name, nodeID string) (release func(), err error)
}

// NodeNamePrefix is how the node IDs of the incarnations of a node name
// begin: the name and a slash, which no name holds (CheckNodeName).
func NodeNamePrefix(name string) string { return name + "/" }

// Ownership is the part of the Store that holds node incarnations and
// session ownership (docs/DESIGN.md §5).
type Ownership interface {
	// RegisterNode records a new node incarnation whose lease runs until
	// expiresMS (Unix ms). nodeID is fresh for every process. Registering
	// an incarnation that is still live again is a renewal: it extends the
	// lease to expiresMS and never shortens it. Registering one that is
	// dead (its lease ran out, it was declared dead, or the store counts
	// it dead since a restart) gives ErrNodeExpired: a dead incarnation
	// never comes back, so the caller registers a fresh nodeID.
	RegisterNode(ctx context.Context, nodeID string, expiresMS int64) error

	// RenewNode extends the lease with one write. It returns
	// ErrNodeExpired when the incarnation's lease had already run out or it
	// was declared dead; the caller must then stop driving its sessions.
	RenewNode(ctx context.Context, nodeID string, expiresMS int64) error

	// ClaimSession makes nodeID the owner of a session and returns the
	// epoch that fences its commits. If nodeID owns it already, the epoch
	// is unchanged and nothing is written. If the session has no owner, or
	// its owner incarnation is dead at nowMS, the epoch goes up by one. If
	// a live incarnation owns it: ErrSessionOwned. A node whose own lease
	// has expired gets ErrNodeExpired.
	ClaimSession(ctx context.Context, tenant, session, nodeID string, nowMS int64) (uint64, error)

	// ClaimSessions claims several sessions for nodeID in one transaction,
	// each as ClaimSession would, and reads in the same transaction the
	// active Runs of every session it claims. Claims[i] answers
	// sessions[i]. A session that a live incarnation owns gets a
	// *SessionOwnedError (ErrSessionOwned) in its Err and nothing else;
	// the others are claimed all the same. Any other failure fails the
	// whole call and writes nothing, and so does ErrNodeExpired (nodeID's
	// own lease has run out). At most MaxClaimBatch sessions a call, each
	// named once. Recovery claims the orphans it finds this way, one
	// transaction (one synced write) for a few hundred sessions, and
	// drives each from the Runs the claim read.
	ClaimSessions(ctx context.Context, nodeID string, nowMS int64, sessions []SessionRef) ([]SessionClaim, error)

	// ReleaseSession gives up ownership of a session held by nodeID, so
	// that another incarnation may claim it at once. Releasing a session
	// owned by someone else does nothing.
	ReleaseSession(ctx context.Context, tenant, session, nodeID string) error

	// OrphanedSessions is a recovery scan, across tenants: the sessions
	// that have a non-terminal Run and whose owner incarnation is dead (or
	// missing) at nowMS. No API serves it.
	OrphanedSessions(ctx context.Context, nowMS int64) ([]SessionOwner, error)

	// ActiveSessions is a scan across tenants: the sessions that hold a
	// non-terminal Run, each with its owner incarnation and epoch (Owner ""
	// when none has claimed it), in (tenant, session) order after the
	// session (afterTenant, afterSession) ("", "" from the first), at most
	// limit of them (limit <= 0: all). Whether the owner is alive is not
	// judged: OrphanedSessions does that.
	ActiveSessions(ctx context.Context, afterTenant, afterSession string, limit int) ([]SessionOwner, error)

	// ExecutingEffects returns the effects of the session in state
	// executing, through an index, for recovery's attach pass.
	ExecutingEffects(ctx context.Context, tenant, session string) ([]EffectRecord, error)
}

// PluginKV is the durable key/value space of each (tenant, plugin). A
// zero-length value is the same as a missing key.
type PluginKV interface {
	// KVGet returns the value, or nil when the key is missing. A store
	// failure is an error, never a nil value: the host must not mistake it
	// for a missing key.
	KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error)
	// KVSet writes durably before it returns. An empty value deletes the
	// key. ErrKVTooLarge for a key or value over the per-value limit;
	// ErrKVQuota when the plugin's total would pass its quota.
	KVSet(ctx context.Context, tenant, plugin string, key, value []byte) error
	// KVDelete removes a key; a missing key is not an error.
	KVDelete(ctx context.Context, tenant, plugin string, key []byte) error
}

// CreateRun is the input of Store.CreateRun.
type CreateRun struct {
	Run       loop.Run
	Event     loop.Event
	CommandID string // optional: an idempotency key, scoped to the tenant
	// Claimant is optional: the node that submits the Run. When it is set
	// and the creation writes the Run, a store may also claim the Run's
	// session for it in the creation's transaction, as ClaimSession would
	// (the node's lease is live; the session has no owner, and its epoch
	// goes up by one, or the node owns it already), and report the claim
	// in CreateResult.Epoch. It saves the session's driver a claim of its
	// own: a transaction, and a synced write, per new session. A store
	// that does not claim leaves Epoch 0, and so do the claims it would
	// refuse (another node owns the session, the node's lease ran out).
	Claimant string
	// FirstStep is optional: the commit the session's driver would make
	// first on the new Run (start, plan, dispatch), made by the submitter
	// ahead of the creation under the claim the creation would take. A
	// store may write it in the creation's own transaction, in place of
	// the Run alone, and only when the Run is its session's first
	// (ordinal 1) and the creation claims the session for Claimant at
	// exactly FirstStep.Epoch (the session had no owner). It then reports
	// CreateResult.Stepped, and returns the stepped Run. Otherwise, or in
	// a store that never steps, it writes the Run alone, as without
	// FirstStep: the driver makes that first commit itself. It saves a new
	// session's first Run a commit (a transaction, and a synced write).
	FirstStep *FirstStep
}

// FirstStepper is a Store that says whether its CreateRun writes a
// creation's FirstStep where the port allows it. The runtime makes a
// first step ahead of a creation only for a store that says it does:
// for any other, the builder call it costs would be wasted.
type FirstStepper interface {
	StepsFirstRuns() bool
}

// FirstStep is the first commit of a new session's first Run, made
// ahead of its creation (CreateRun.FirstStep): its events, from Seq 2
// on, the snapshot after them, and the epoch of the claim its dispatches
// are made under.
type FirstStep struct {
	Events []loop.Event
	Run    loop.Run
	Epoch  uint64
}

// CreateResult is what Store.CreateRun returns.
type CreateResult struct {
	Run       loop.Run
	Ordinal   int64 // the Run's position in its session, from 1
	Duplicate bool
	// Epoch is the epoch of CreateRun.Claimant's claim on the session,
	// which the creation made or found (ClaimSession's answer, from the
	// same transaction); 0 when it made none: the runtime claims the
	// session when it drives it.
	Epoch uint64
	// Stepped is true when the creation wrote CreateRun.FirstStep too:
	// Run is then its snapshot.
	Stepped bool
}

// Commit is the input of Store.Commit.
type Commit struct {
	Tenant    string
	Session   string
	RunID     string
	CommandID string
	// AlsoCommandIDs are further commands the commit applies, each
	// recorded like CommandID (Store.Commit).
	AlsoCommandIDs []string
	ExpectedSeq    int64
	Epoch          uint64
	Events         []loop.Event
	Run            loop.Run
}

// CommitResult is what Store.Commit returns.
type CommitResult struct {
	Seq       int64 // the Run's version after the command
	Duplicate bool  // the command was applied before; nothing was written
	// SessionIdle is set by a store that keeps count of each session's
	// live Runs (pgstore) when the commit ended the Run and left its
	// session with no live Run: nothing is queued behind it. False tells
	// nothing. A Run created in the session later is driven by its own
	// kick or change-feed notice, so the runtime skips the pass that would
	// look for a next Run (afterAdvance).
	SessionIdle bool
}

// SessionRun is one Run of a session, with its place in the session.
type SessionRun struct {
	Ordinal int64
	Run     loop.Run
}

// SessionOwner names a session and who owns it.
type SessionOwner struct {
	Tenant  string
	Session string
	Owner   string // the owner incarnation, "" when none
	Epoch   uint64
}

// SessionRef names one session of a tenant.
type SessionRef struct {
	Tenant  string
	Session string
}

// MaxClaimBatch is the most sessions one ClaimSessions call takes.
const MaxClaimBatch = 512

// SessionClaim is ClaimSessions' answer for one session.
type SessionClaim struct {
	// Epoch fences the claimant's commits to the session, as
	// ClaimSession's does; 0 when Err is set.
	Epoch uint64
	// Err is a *SessionOwnedError when a live incarnation owns the
	// session; nil when the session is claimed.
	Err error
	// Active holds the session's non-terminal Runs, in session order (the
	// head first), as the claim's transaction read them, as ActiveRuns
	// would return them.
	Active []loop.Run
	// HeadOrdinal is the ordinal of Active[0] in its session, from 1; 0
	// when Active is empty or the store does not say. A head at 1 has no
	// Run before it, so its builder's history is empty without a read.
	HeadOrdinal int64
}

// EffectRecord is an executing effect as the index holds it.
type EffectRecord struct {
	Tenant   string
	Session  string
	RunID    string
	EffectID string
	Attempt  int
	Handle   string
	Epoch    uint64 // the epoch that dispatched it
}

// PruneStats counts what Prune removed.
type PruneStats struct {
	Runs     int
	Events   int
	Commands int
}

// Change is the news that a Run was created or committed to, as a Store
// that several processes share reports it to the others.
type Change struct {
	Tenant  string
	Session string
	RunID   string
	Seq     int64 // the Run's version after the commit
	// Owner is the session's owner incarnation on record when the commit
	// was made ("" when none): the node that should drive what it asks.
	Owner string
	// Rescan says that changes may have been missed (the feed reconnected):
	// the other fields are empty, and a subscriber looks again at
	// everything it cares about.
	Rescan bool
}

// ChangeFeed is implemented by a Store that several processes share
// (pgstore, through LISTEN/NOTIFY). The runtime subscribes to it at Start
// to wake its drivers, Follow streams and waiters when another node
// commits. It is a latency hint only: a change may be late or lost, and
// correctness never depends on it (the watchdog and Follow's fallback
// poll the store).
type ChangeFeed interface {
	// SubscribeChanges calls fn for each change committed through another
	// Store instance (another process), and with Rescan set after the feed
	// may have missed some. fn is called from one goroutine, in order, and
	// must not block. The returned function ends the subscription.
	SubscribeChanges(fn func(Change)) (cancel func())
}

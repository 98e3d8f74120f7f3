package runtime

import (
	"errors"
	"fmt"
)

// Sentinel errors of the runtime's ports. Implementations wrap them with
// context; callers check them with errors.Is.
var (
	// ErrRunNotFound: no Run with that ID in that tenant.
	ErrRunNotFound = errors.New("runtime: run not found")
	// ErrRunExists: a Run with that ID exists (or existed) in the tenant.
	// Run IDs are never reused.
	ErrRunExists = errors.New("runtime: run id already used")
	// ErrVersionConflict: the Run's stored version is not the one the
	// commit expected; reload and decide again.
	ErrVersionConflict = errors.New("runtime: version conflict")
	// ErrFenced: the commit's epoch is not the session's current epoch;
	// another incarnation owns the session now.
	ErrFenced = errors.New("runtime: fenced by a newer session epoch")
	// ErrSessionOwned: the session belongs to a live incarnation.
	ErrSessionOwned = errors.New("runtime: session owned by a live incarnation")
	// ErrNodeExpired: the node incarnation's lease expired or was declared
	// dead; it must stop driving sessions.
	ErrNodeExpired = errors.New("runtime: node incarnation expired")
	// ErrNodeNameHeld: another live process holds the node name this one
	// was configured with (NodeNames); two processes never share one.
	ErrNodeNameHeld = errors.New("runtime: node name held by another live process")
	// ErrKVTooLarge: a plugin KV value is over the per-value limit.
	ErrKVTooLarge = errors.New("runtime: kv value too large")
	// ErrKVQuota: a plugin KV write would exceed the plugin's quota.
	ErrKVQuota = errors.New("runtime: kv quota exceeded")
	// ErrStoreUnavailable: the store cannot serve the request now.
	ErrStoreUnavailable = errors.New("runtime: store unavailable")
	// ErrClosed: the store or runtime is closed.
	ErrClosed = errors.New("runtime: closed")
	// ErrExecutorUnavailable: no executor can carry out the effect (the
	// plugin is missing or failed to load).
	ErrExecutorUnavailable = errors.New("runtime: executor unavailable")
	// ErrPluginVersionGone: the plugin version that holds an attempt
	// (EffectCall.Plugin) is no longer loaded, and the version in force
	// does not declare it can take over its attempts. Recovery settles
	// the attempt by its missing-effect policy (recovery.AttachVersionGone).
	ErrPluginVersionGone = errors.New("runtime: the plugin version that holds the attempt is gone")
	// ErrRunChanged: an input made with IfSeq found the Run's log past the
	// seq the caller read; nothing was written. Read the Run again and
	// answer what it waits for now.
	ErrRunChanged = errors.New("runtime: the run changed since the version the request names")
)

// ErrInvalidRequest: a store request is malformed (a Commit whose events
// do not follow ExpectedSeq, a snapshot that does not match its Run, a
// name that is empty or too long). It is a bug in the caller; retrying the
// same request fails the same way.
var ErrInvalidRequest = errors.New("runtime: invalid store request")

// SessionOwnedError is the ErrSessionOwned a ClaimSession gives: it names
// the live incarnation that owns the session and the session's epoch, so
// that a node which accepted an input for a session it does not own can
// commit that input under the owner's epoch (docs/DESIGN.md §5, "Several
// nodes") instead of refusing it.
type SessionOwnedError struct {
	Tenant, Session string
	Owner           string // the live owner incarnation
	Epoch           uint64 // the session's current epoch
}

func (e *SessionOwnedError) Error() string {
	return fmt.Sprintf("runtime: session %s/%s owned by the live incarnation %s (epoch %d)", e.Tenant, e.Session, e.Owner, e.Epoch)
}

// Unwrap makes errors.Is(err, ErrSessionOwned) true.
func (e *SessionOwnedError) Unwrap() error { return ErrSessionOwned }

// PluginMessage is a plugin's own words about why its call failed: the
// message it gave with Extism's error_set, or the error.message of a
// failed reply that the host turned into another class (a failure after
// a sandbox refusal). An Executor or Builder wraps it in the Err of its
// PluginError; the failure a tenant reads keeps it, cut to
// MaxPluginMessageBytes, while everything else the error says goes only
// to the server's log (failure.go).
type PluginMessage struct {
	Text string
}

func (m *PluginMessage) Error() string { return m.Text }

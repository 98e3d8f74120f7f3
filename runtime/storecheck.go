package runtime

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/agenthost/agenthost/loop"
)

// Limits on the free-form names the Store keys by. Tenant, session and Run
// IDs follow the stricter grammar of loop.ValidID.
const (
	// MaxNameLen bounds node IDs and plugin names.
	MaxNameLen = 255
	// MaxCommandIDLen bounds command IDs.
	MaxCommandIDLen = 512
)

// CheckName validates a node ID or plugin name: 1 to MaxNameLen bytes.
// Stores call it so that every implementation refuses the same names.
func CheckName(what, name string) error {
	if len(name) == 0 || len(name) > MaxNameLen {
		return fmt.Errorf("%w: %s %q must be 1 to %d bytes", ErrInvalidRequest, what, name, MaxNameLen)
	}
	return nil
}

// Check validates a CreateRun before any store reads: the IDs follow the
// grammar, c.Claimant (when set) is a valid node ID, c.Event is the
// RunCreated event of c.Run, and c.Run is a first snapshot (Seq 1). Every Store implementation calls it, so they refuse the
// same requests with the same errors (loop.ErrInvalidID, ErrInvalidRequest).
func (c CreateRun) Check() error {
	for _, id := range [][2]string{{"tenant", c.Run.Tenant}, {"session", c.Run.Session}, {"run", c.Run.ID}} {
		if err := loop.CheckID(id[0], id[1]); err != nil {
			return err
		}
	}
	if len(c.CommandID) > MaxCommandIDLen {
		return fmt.Errorf("%w: command id of run %s is %d bytes; the limit is %d", ErrInvalidRequest, c.Run.ID, len(c.CommandID), MaxCommandIDLen)
	}
	if c.Claimant != "" {
		if err := CheckName("node id", c.Claimant); err != nil {
			return err
		}
	}
	ev := c.Event
	if ev.Type != loop.EventRunCreated || ev.Spec == nil {
		return fmt.Errorf("%w: run %s: the first event must be run_created with a spec, got %q", ErrInvalidRequest, c.Run.ID, ev.Type)
	}
	if ev.Seq != 0 && ev.Seq != 1 {
		return fmt.Errorf("%w: run %s: run_created has Seq %d, want 1", ErrInvalidRequest, c.Run.ID, ev.Seq)
	}
	if ev.Spec.Tenant != c.Run.Tenant || ev.Spec.Session != c.Run.Session || ev.Spec.ID != c.Run.ID {
		return fmt.Errorf("%w: run %s: the run_created spec (%s/%s/%s) does not match the snapshot", ErrInvalidRequest,
			c.Run.ID, ev.Spec.Tenant, ev.Spec.Session, ev.Spec.ID)
	}
	if c.Run.Seq != 1 || c.Run.Status.Terminal() {
		return fmt.Errorf("%w: run %s: a new snapshot must have Seq 1 and a non-terminal status (got Seq %d, %s); build it with loop.Apply on the zero Run",
			ErrInvalidRequest, c.Run.ID, c.Run.Seq, c.Run.Status)
	}
	if f := c.FirstStep; f != nil {
		step := Commit{Tenant: c.Run.Tenant, Session: c.Run.Session, RunID: c.Run.ID, ExpectedSeq: 1, Epoch: f.Epoch, Events: f.Events, Run: f.Run}
		if err := step.Check(); err != nil {
			return fmt.Errorf("%w (the first step of a new Run)", err)
		}
		if f.Epoch == 0 || f.Run.Status.Terminal() {
			return fmt.Errorf("%w: run %s: a first step needs the epoch of the creation's claim and must leave the Run live (got epoch %d, %s)",
				ErrInvalidRequest, c.Run.ID, f.Epoch, f.Run.Status)
		}
	}
	return nil
}

// CheckIDs validates the IDs of a Commit, the part of the request a store
// needs before it can look its command ID up.
func (c Commit) CheckIDs() error {
	for _, id := range [][2]string{{"tenant", c.Tenant}, {"session", c.Session}, {"run", c.RunID}} {
		if err := loop.CheckID(id[0], id[1]); err != nil {
			return err
		}
	}
	if len(c.CommandID) > MaxCommandIDLen {
		return fmt.Errorf("%w: command id of run %s is %d bytes; the limit is %d", ErrInvalidRequest, c.RunID, len(c.CommandID), MaxCommandIDLen)
	}
	if len(c.AlsoCommandIDs) > 0 && c.CommandID == "" {
		return fmt.Errorf("%w: commit to run %s names further command ids but no command id", ErrInvalidRequest, c.RunID)
	}
	for i, id := range c.AlsoCommandIDs {
		if id == "" || len(id) > MaxCommandIDLen {
			return fmt.Errorf("%w: further command id %d of run %s is %d bytes; it must be 1 to %d", ErrInvalidRequest, i, c.RunID, len(id), MaxCommandIDLen)
		}
		if id == c.CommandID || slices.Contains(c.AlsoCommandIDs[:i], id) {
			return fmt.Errorf("%w: commit to run %s names command id %q twice", ErrInvalidRequest, c.RunID, id)
		}
	}
	return nil
}

// Check validates the payload of a Commit: at least one event, events
// numbered ExpectedSeq+1 … in order, and a snapshot of the same Run whose
// Seq is ExpectedSeq+len(Events). A store calls it after the command-ID
// lookup, so that a retried command is answered from its first result
// whatever it carries now.
func (c Commit) Check() error {
	if err := c.CheckIDs(); err != nil {
		return err
	}
	if len(c.Events) == 0 {
		return fmt.Errorf("%w: commit to run %s carries no event", ErrInvalidRequest, c.RunID)
	}
	for i, ev := range c.Events {
		if want := c.ExpectedSeq + int64(i) + 1; ev.Seq != want {
			return fmt.Errorf("%w: commit to run %s: event %d (%s) has Seq %d, want %d", ErrInvalidRequest, c.RunID, i, ev.Type, ev.Seq, want)
		}
		if ev.Type == loop.EventRunCreated {
			return fmt.Errorf("%w: commit to run %s carries run_created; use CreateRun", ErrInvalidRequest, c.RunID)
		}
	}
	if c.Run.Tenant != c.Tenant || c.Run.Session != c.Session || c.Run.ID != c.RunID {
		return fmt.Errorf("%w: commit to %s/%s/%s carries the snapshot of %s/%s/%s", ErrInvalidRequest,
			c.Tenant, c.Session, c.RunID, c.Run.Tenant, c.Run.Session, c.Run.ID)
	}
	if want := c.ExpectedSeq + int64(len(c.Events)); c.Run.Seq != want {
		return fmt.Errorf("%w: commit to run %s: snapshot Seq %d, want ExpectedSeq+len(Events) = %d", ErrInvalidRequest, c.RunID, c.Run.Seq, want)
	}
	return nil
}

// ExecutingRecords derives, from a snapshot, the records a Store's
// executing-effects index holds for it, in the snapshot's effect order.
// Stores derive the index with it, so the index always agrees with the
// snapshot.
func ExecutingRecords(r loop.Run) []EffectRecord {
	var out []EffectRecord
	for _, e := range r.Effects {
		if e.State != loop.EffectExecuting {
			continue
		}
		out = append(out, EffectRecord{Tenant: r.Tenant, Session: r.Session, RunID: r.ID,
			EffectID: e.ID, Attempt: e.Attempt, Handle: e.Handle, Epoch: e.Epoch})
	}
	return out
}

// CheckClaimBatch checks a ClaimSessions call's arguments, for the
// stores: the node's name, every ID, at most MaxClaimBatch sessions, none
// twice.
func CheckClaimBatch(nodeID string, sessions []SessionRef) error {
	if err := CheckName("node id", nodeID); err != nil {
		return err
	}
	if len(sessions) > MaxClaimBatch {
		return fmt.Errorf("%w: %d sessions in one claim, over the %d a batch may hold", ErrInvalidRequest, len(sessions), MaxClaimBatch)
	}
	seen := make(map[SessionRef]bool, len(sessions))
	for _, r := range sessions {
		if err := loop.CheckID("tenant", r.Tenant); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := loop.CheckID("session", r.Session); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if seen[r] {
			return fmt.Errorf("%w: session %s/%s is named twice in one claim", ErrInvalidRequest, r.Tenant, r.Session)
		}
		seen[r] = true
	}
	return nil
}

// nodeNamePattern is the grammar of a node name: no slash, which ends the
// name within its incarnations' node IDs (NodeNamePrefix).
var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckNodeName validates a node name (Options.NodeName, node.name): 1 to
// 64 letters, digits, '.', '_' or '-', beginning with a letter or digit.
func CheckNodeName(name string) error {
	if !nodeNamePattern.MatchString(name) {
		return fmt.Errorf("%w: node name %q must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit", ErrInvalidRequest, name)
	}
	return nil
}

package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// MemStore is an in-memory runtime.Store: the twin of badgerstore.Store,
// held to the same contract by StoreSuite. Snapshots and events are kept
// as JSON, as the durable store keeps them, so a caller sees the same
// round-trip (and never shares memory with the store).
//
// It is for tests; it is not for production and not a stable API. Nothing
// survives the process. It has test hooks the durable store does not:
// KillNode, Restart and SetUnavailable.
//
// Safe for concurrent use. Every method runs under one mutex, so every
// method is atomic.
type MemStore struct {
	clock runtime.Clock
	lim   KVLimits

	mu          sync.Mutex
	closed      bool
	unavailable bool
	stepsFirst  bool // writes CreateRun.FirstStep (StepFirstRuns)
	generation  uint64
	runs        map[memRunKey]*memRun
	createCmds  map[memCmdKey]string // tenant, command ID → run ID
	sessions    map[memSessionKey]*memSession
	nodes       map[string]*memNode
	kv          map[memKVScope]map[string][]byte
	kvUsed      map[memKVScope]int64

	feedMu sync.Mutex
	feeds  []*memFeed // of the handles on this store (MemHandle)
}

var _ runtime.Store = (*MemStore)(nil)

// KVLimits bound the plugin KV of a store. A zero field takes its default.
type KVLimits struct {
	MaxKeyBytes   int   // per key; default 1 KiB
	MaxValueBytes int   // per value; default 256 KiB
	QuotaBytes    int64 // per (tenant, plugin), keys plus values; default 64 MiB
}

// Defaults of KVLimits. badgerstore uses the same figures.
const (
	DefaultKVMaxKeyBytes   = 1 << 10
	DefaultKVMaxValueBytes = 256 << 10
	DefaultKVQuotaBytes    = 64 << 20
)

func (l KVLimits) withDefaults() KVLimits {
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = DefaultKVMaxKeyBytes
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = DefaultKVMaxValueBytes
	}
	if l.QuotaBytes <= 0 {
		l.QuotaBytes = DefaultKVQuotaBytes
	}
	return l
}

type memRunKey struct{ tenant, run string }
type memCmdKey struct{ tenant, cmd string }
type memSessionKey struct{ tenant, session string }
type memKVScope struct{ tenant, plugin string }

type memRun struct {
	ordinal   int64
	snapshot  []byte   // the current loop.Run, in the stores' binary form (internal/runcodec)
	run       loop.Run // decoded from snapshot, never handed out
	events    [][]byte // JSON events; events[i] has Seq firstSeq+i
	firstSeq  int64
	commands  map[string]int64 // command ID → the Seq it produced
	createCmd string
}

// storedBytes is what the Run holds, as runtime.Store.TenantStoredBytes
// counts it: its snapshot, its events and its command IDs. MemStore
// counts it from the data itself, so it is the reference the durable
// stores' running counts are held to.
func (r *memRun) storedBytes() int64 {
	n := len(r.snapshot) + len(r.createCmd)
	for _, ev := range r.events {
		n += len(ev)
	}
	for cmd := range r.commands {
		n += len(cmd)
	}
	return int64(n)
}

type memSession struct {
	order  []string // run IDs, by ordinal (ordinal i+1)
	owner  string
	epoch  uint64
	active int // non-terminal Runs
}

type memNode struct {
	expiresMS  int64
	generation uint64
	dead       bool
}

// NewMemStore returns an empty MemStore. clock is what RenewNode reads to
// tell an expired lease; nil means the system clock.
func NewMemStore(clock runtime.Clock, limits KVLimits) *MemStore {
	if clock == nil {
		clock = runtime.SystemClock{}
	}
	return &MemStore{
		clock:      clock,
		lim:        limits.withDefaults(),
		generation: 1,
		runs:       map[memRunKey]*memRun{},
		createCmds: map[memCmdKey]string{},
		sessions:   map[memSessionKey]*memSession{},
		nodes:      map[string]*memNode{},
		kv:         map[memKVScope]map[string][]byte{},
		kvUsed:     map[memKVScope]int64{},
	}
}

// KillNode declares a node incarnation dead, as if its process had
// vanished: RenewNode answers ErrNodeExpired and its sessions become
// orphans at once. Test-only.
func (s *MemStore) KillNode(nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil {
		n.dead = true
	}
}

// Restart does to the store what reopening a badgerstore directory does:
// every node incarnation registered so far counts as dead. Test-only.
func (s *MemStore) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.generation++
}

// SetUnavailable makes every method fail with an error wrapping
// runtime.ErrStoreUnavailable while on is true, the way a failing disk
// would. Test-only.
func (s *MemStore) SetUnavailable(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unavailable = on
}

// StepFirstRuns makes CreateRun write a creation's FirstStep where the
// port allows it, as pgstore does, or (off, the default) never, as
// badgerstore does: both are correct stores, and tests choose.
func (s *MemStore) StepFirstRuns(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stepsFirst = on
}

// lock takes the mutex and reports whether the store can serve.
func (s *MemStore) lock() error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return fmt.Errorf("memstore: %w", runtime.ErrClosed)
	case s.unavailable:
		s.mu.Unlock()
		return fmt.Errorf("memstore: %w (SetUnavailable)", runtime.ErrStoreUnavailable)
	}
	return nil
}

// Close marks the store closed. It is safe to call more than once.
func (s *MemStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func decodeRun(b []byte) loop.Run {
	// A copy of the bytes: the decoded Run's raw JSON fields share them,
	// and it is handed out.
	r, err := runcodec.Decode(append([]byte(nil), b...))
	if err != nil {
		// Only MemStore encodes these bytes; a failure is a bug here.
		panic(fmt.Sprintf("memstore: snapshot does not decode: %v", err))
	}
	return r
}

// CreateRun implements runtime.Store.
func (s *MemStore) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	if err := c.Check(); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("memstore: create run: %w", err)
	}
	snap := runcodec.Append(nil, &c.Run)
	ev := c.Event
	ev.Seq = 1
	evb, err := runcodec.MarshalJSON(ev)
	if err != nil {
		return runtime.CreateResult{}, fmt.Errorf("memstore: create run %s: encode event: %w", c.Run.ID, err)
	}
	var (
		stepEvents [][]byte
		stepSnap   []byte
	)
	if f := c.FirstStep; f != nil {
		for _, ev := range f.Events {
			b, err := runcodec.MarshalJSON(ev)
			if err != nil {
				return runtime.CreateResult{}, fmt.Errorf("memstore: create run %s: encode the first step's event %d: %w", c.Run.ID, ev.Seq, err)
			}
			stepEvents = append(stepEvents, b)
		}
		stepSnap = runcodec.Append(nil, &f.Run)
	}
	if err := s.lock(); err != nil {
		return runtime.CreateResult{}, err
	}
	defer s.mu.Unlock()
	tenant := c.Run.Tenant
	if c.CommandID != "" {
		if id, ok := s.createCmds[memCmdKey{tenant, c.CommandID}]; ok {
			r := s.runs[memRunKey{tenant, id}]
			return runtime.CreateResult{Run: decodeRun(r.snapshot), Ordinal: r.ordinal, Duplicate: true}, nil
		}
	}
	rk := memRunKey{tenant, c.Run.ID}
	if _, ok := s.runs[rk]; ok {
		return runtime.CreateResult{}, fmt.Errorf("memstore: create run %s/%s: %w", tenant, c.Run.ID, runtime.ErrRunExists)
	}
	sk := memSessionKey{tenant, c.Run.Session}
	sess := s.sessions[sk]
	if sess == nil {
		sess = &memSession{}
		s.sessions[sk] = sess
	}
	sess.order = append(sess.order, c.Run.ID)
	sess.active++
	r := &memRun{
		ordinal:   int64(len(sess.order)),
		snapshot:  snap,
		run:       decodeRun(snap),
		events:    [][]byte{evb},
		firstSeq:  1,
		commands:  map[string]int64{},
		createCmd: c.CommandID,
	}
	s.runs[rk] = r
	if c.CommandID != "" {
		s.createCmds[memCmdKey{tenant, c.CommandID}] = c.Run.ID
	}
	res := runtime.CreateResult{Run: decodeRun(snap), Ordinal: r.ordinal}
	// The claimant claims the session when no one owns it, or holds it.
	taken := false
	if c.Claimant != "" && s.alive(c.Claimant, s.clock.Now().UnixMilli()) && (sess.owner == "" || sess.owner == c.Claimant) {
		if sess.owner == "" {
			sess.owner = c.Claimant
			sess.epoch++
			taken = true
		}
		res.Epoch = sess.epoch
	}
	// The first step goes with the session's first Run, under the claim
	// the creation took for it at the step's epoch.
	if f := c.FirstStep; f != nil && s.stepsFirst && r.ordinal == 1 && taken && sess.epoch == f.Epoch {
		r.events = append(r.events, stepEvents...)
		r.snapshot = stepSnap
		r.run = decodeRun(r.snapshot)
		res.Run, res.Stepped = decodeRun(r.snapshot), true
	}
	return res, nil
}

// LoadRun implements runtime.Store.
func (s *MemStore) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return loop.Run{}, fmt.Errorf("memstore: load run: %w", err)
	}
	if err := s.lock(); err != nil {
		return loop.Run{}, err
	}
	defer s.mu.Unlock()
	r := s.runs[memRunKey{tenant, runID}]
	if r == nil {
		return loop.Run{}, fmt.Errorf("memstore: load run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
	}
	return decodeRun(r.snapshot), nil
}

// Commit implements runtime.Store.
func (s *MemStore) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	if err := c.CheckIDs(); err != nil {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit: %w", err)
	}
	if err := s.lock(); err != nil {
		return runtime.CommitResult{}, err
	}
	defer s.mu.Unlock()
	r := s.runs[memRunKey{c.Tenant, c.RunID}]
	if r == nil {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s/%s: %w", c.Tenant, c.RunID, runtime.ErrRunNotFound)
	}
	if c.CommandID != "" {
		if seq, ok := r.commands[c.CommandID]; ok {
			return runtime.CommitResult{Seq: seq, Duplicate: true}, nil
		}
	}
	if err := c.Check(); err != nil {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit: %w", err)
	}
	if r.run.Session != c.Session {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s: %w: it belongs to session %s, not %s",
			c.RunID, runtime.ErrInvalidRequest, r.run.Session, c.Session)
	}
	if r.run.Seq != c.ExpectedSeq {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s/%s at Seq %d: %w (stored Seq is %d)",
			c.Tenant, c.RunID, c.ExpectedSeq, runtime.ErrVersionConflict, r.run.Seq)
	}
	sess := s.sessions[memSessionKey{c.Tenant, c.Session}]
	if sess.epoch != c.Epoch {
		return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s/%s with epoch %d: %w (session epoch is %d)",
			c.Tenant, c.RunID, c.Epoch, runtime.ErrFenced, sess.epoch)
	}
	for _, also := range c.AlsoCommandIDs {
		if seq, ok := r.commands[also]; ok {
			return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s/%s: %w: command %s, which it also applies, was applied at Seq %d",
				c.Tenant, c.RunID, runtime.ErrVersionConflict, also, seq)
		}
	}
	snap := runcodec.Append(nil, &c.Run)
	evs := make([][]byte, len(c.Events))
	var err error
	for i, ev := range c.Events {
		if evs[i], err = runcodec.MarshalJSON(ev); err != nil {
			return runtime.CommitResult{}, fmt.Errorf("memstore: commit to run %s: encode event %d: %w", c.RunID, ev.Seq, err)
		}
	}
	wasTerminal := r.run.Status.Terminal()
	r.events = append(r.events, evs...)
	r.snapshot = snap
	r.run = decodeRun(snap)
	idle := false // it keeps count of live Runs, as pgstore does
	if !wasTerminal && r.run.Status.Terminal() {
		sess.active--
		idle = sess.active == 0
	}
	if c.CommandID != "" {
		r.commands[c.CommandID] = r.run.Seq
	}
	for _, also := range c.AlsoCommandIDs {
		r.commands[also] = r.run.Seq
	}
	return runtime.CommitResult{Seq: r.run.Seq, SessionIdle: idle}, nil
}

// Events implements runtime.Store.
func (s *MemStore) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return nil, fmt.Errorf("memstore: events: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	r := s.runs[memRunKey{tenant, runID}]
	if r == nil {
		return nil, fmt.Errorf("memstore: events of run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
	}
	var out []loop.Event
	for i, b := range r.events {
		if r.firstSeq+int64(i) < fromSeq {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		var ev loop.Event
		if err := json.Unmarshal(b, &ev); err != nil {
			return nil, fmt.Errorf("memstore: events of run %s: decode: %w", runID, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// SessionRuns implements runtime.Store.
func (s *MemStore) SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("memstore: session runs: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	sess := s.sessions[memSessionKey{tenant, session}]
	if sess == nil {
		return nil, nil
	}
	var out []runtime.SessionRun
	for i, id := range sess.order {
		ord := int64(i + 1)
		if ord <= after {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, runtime.SessionRun{Ordinal: ord, Run: decodeRun(s.runs[memRunKey{tenant, id}].snapshot)})
	}
	return out, nil
}

// CompletedRunsBefore implements runtime.Store.
func (s *MemStore) CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session, "run", runID); err != nil {
		return nil, fmt.Errorf("memstore: completed runs before: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	r := s.runs[memRunKey{tenant, runID}]
	sess := s.sessions[memSessionKey{tenant, session}]
	if r == nil || sess == nil || r.run.Session != session {
		return nil, fmt.Errorf("memstore: completed runs before %s/%s in session %s: %w", tenant, runID, session, runtime.ErrRunNotFound)
	}
	var out []loop.Run
	for i := r.ordinal - 2; i >= 0 && (limit <= 0 || len(out) < limit); i-- {
		if prior := s.runs[memRunKey{tenant, sess.order[i]}]; prior.run.Status == loop.StatusCompleted {
			out = append(out, decodeRun(prior.snapshot))
		}
	}
	slices.Reverse(out)
	return out, nil
}

// sessionRunsLocked returns a session's Runs in submission order; s.mu
// is held.
func (s *MemStore) sessionRunsLocked(tenant, session string) []*memRun {
	sess := s.sessions[memSessionKey{tenant, session}]
	if sess == nil {
		return nil
	}
	out := make([]*memRun, 0, len(sess.order))
	for _, id := range sess.order {
		out = append(out, s.runs[memRunKey{tenant, id}])
	}
	return out
}

// ActiveRuns implements runtime.Store.
func (s *MemStore) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("memstore: active runs: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.activeRunsLocked(tenant, session), nil
}

// activeRunsLocked is ActiveRuns under the store's lock.
func (s *MemStore) activeRunsLocked(tenant, session string) []loop.Run {
	var out []loop.Run
	for _, r := range s.sessionRunsLocked(tenant, session) {
		if !r.run.Status.Terminal() {
			out = append(out, decodeRun(r.snapshot))
		}
	}
	return out
}

// RunsByStatus implements runtime.Store.
func (s *MemStore) RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return nil, fmt.Errorf("memstore: runs by status: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var ids []string
	for k, r := range s.runs {
		if k.tenant == tenant && r.run.Status == status && k.run > after {
			ids = append(ids, k.run)
		}
	}
	sort.Strings(ids)
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	return ids, nil
}

// RunsByStatusDesc implements runtime.Store.
func (s *MemStore) RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return nil, fmt.Errorf("memstore: runs by status, descending: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var ids []string
	for k, r := range s.runs {
		if k.tenant == tenant && r.run.Status == status && (before == "" || k.run < before) {
			ids = append(ids, k.run)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(ids)))
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	return ids, nil
}

// TenantStoredBytes implements runtime.Store: the sum over the tenant's
// Runs, counted afresh from what each holds.
func (s *MemStore) TenantStoredBytes(ctx context.Context, tenant string) (int64, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return 0, fmt.Errorf("memstore: stored bytes: %w", err)
	}
	if err := s.lock(); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var n int64
	for k, r := range s.runs {
		if k.tenant == tenant {
			n += r.storedBytes()
		}
	}
	return n, nil
}

// alive reports whether a node incarnation is alive at nowMS. The caller
// holds the mutex.
func (s *MemStore) alive(nodeID string, nowMS int64) bool {
	n := s.nodes[nodeID]
	return n != nil && !n.dead && n.generation == s.generation && nowMS < n.expiresMS
}

// RegisterNode implements runtime.Ownership. Registering a live
// incarnation again extends its lease and never shortens it; a dead one
// gives ErrNodeExpired.
func (s *MemStore) RegisterNode(ctx context.Context, nodeID string, expiresMS int64) error {
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return fmt.Errorf("memstore: register node: %w", err)
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n == nil {
		s.nodes[nodeID] = &memNode{expiresMS: expiresMS, generation: s.generation}
		return nil
	}
	if !s.alive(nodeID, s.clock.Now().UnixMilli()) {
		return fmt.Errorf("memstore: register node %s: %w: that incarnation is dead; register a fresh node id", nodeID, runtime.ErrNodeExpired)
	}
	n.expiresMS = max(n.expiresMS, expiresMS) // a lease never shrinks
	return nil
}

// RenewNode implements runtime.Ownership.
func (s *MemStore) RenewNode(ctx context.Context, nodeID string, expiresMS int64) error {
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return fmt.Errorf("memstore: renew node: %w", err)
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if !s.alive(nodeID, s.clock.Now().UnixMilli()) {
		return fmt.Errorf("memstore: renew node %s: %w", nodeID, runtime.ErrNodeExpired)
	}
	if n := s.nodes[nodeID]; expiresMS > n.expiresMS {
		n.expiresMS = expiresMS
	}
	return nil
}

// ClaimSession implements runtime.Ownership.
func (s *MemStore) ClaimSession(ctx context.Context, tenant, session, nodeID string, nowMS int64) (uint64, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return 0, fmt.Errorf("memstore: claim session: %w", err)
	}
	if err := runtime.CheckName("node id", nodeID); err != nil {
		return 0, fmt.Errorf("memstore: claim session: %w", err)
	}
	if err := s.lock(); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if !s.alive(nodeID, nowMS) {
		return 0, fmt.Errorf("memstore: claim session %s/%s by %s: %w", tenant, session, nodeID, runtime.ErrNodeExpired)
	}
	return s.claimLocked(tenant, session, nodeID, nowMS)
}

// claimLocked claims a session for nodeID, whose own lease the caller
// checked, under the store's lock: ClaimSession's decision once the
// claimant is known alive, which ClaimSessions makes for each session.
func (s *MemStore) claimLocked(tenant, session, nodeID string, nowMS int64) (uint64, error) {
	sk := memSessionKey{tenant, session}
	sess := s.sessions[sk]
	if sess == nil {
		sess = &memSession{}
		s.sessions[sk] = sess
	}
	switch {
	case sess.owner == nodeID:
		return sess.epoch, nil
	case sess.owner != "" && s.alive(sess.owner, nowMS):
		return 0, fmt.Errorf("memstore: claim session %s/%s by %s: %w", tenant, session, nodeID,
			&runtime.SessionOwnedError{Tenant: tenant, Session: session, Owner: sess.owner, Epoch: sess.epoch})
	}
	sess.owner = nodeID
	sess.epoch++
	return sess.epoch, nil
}

// ClaimSessions implements runtime.Ownership, as one step under the
// store's lock.
func (s *MemStore) ClaimSessions(ctx context.Context, nodeID string, nowMS int64, sessions []runtime.SessionRef) ([]runtime.SessionClaim, error) {
	if err := runtime.CheckClaimBatch(nodeID, sessions); err != nil {
		return nil, fmt.Errorf("memstore: claim sessions: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if !s.alive(nodeID, nowMS) {
		return nil, fmt.Errorf("memstore: claim %d sessions by %s: %w", len(sessions), nodeID, runtime.ErrNodeExpired)
	}
	out := make([]runtime.SessionClaim, len(sessions))
	for i, ref := range sessions {
		epoch, err := s.claimLocked(ref.Tenant, ref.Session, nodeID, nowMS)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Epoch = epoch
		for ord, r := range s.sessionRunsLocked(ref.Tenant, ref.Session) {
			if !r.run.Status.Terminal() {
				if out[i].Active == nil {
					out[i].HeadOrdinal = int64(ord) + 1
				}
				out[i].Active = append(out[i].Active, decodeRun(r.snapshot))
			}
		}
	}
	return out, nil
}

// ReleaseSession implements runtime.Ownership.
func (s *MemStore) ReleaseSession(ctx context.Context, tenant, session, nodeID string) error {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return fmt.Errorf("memstore: release session: %w", err)
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if sess := s.sessions[memSessionKey{tenant, session}]; sess != nil && sess.owner == nodeID {
		sess.owner = ""
	}
	return nil
}

// OrphanedSessions implements runtime.Ownership. It is cross-tenant.
func (s *MemStore) OrphanedSessions(ctx context.Context, nowMS int64) ([]runtime.SessionOwner, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []runtime.SessionOwner
	for k, sess := range s.sessions {
		if sess.active > 0 && (sess.owner == "" || !s.alive(sess.owner, nowMS)) {
			out = append(out, runtime.SessionOwner{Tenant: k.tenant, Session: k.session, Owner: sess.owner, Epoch: sess.epoch})
		}
	}
	sortSessions(out)
	return out, nil
}

// ActiveSessions implements runtime.Ownership. It is cross-tenant.
func (s *MemStore) ActiveSessions(ctx context.Context, afterTenant, afterSession string, limit int) ([]runtime.SessionOwner, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []runtime.SessionOwner
	for k, sess := range s.sessions {
		if sess.active > 0 && (k.tenant > afterTenant || k.tenant == afterTenant && k.session > afterSession) {
			out = append(out, runtime.SessionOwner{Tenant: k.tenant, Session: k.session, Owner: sess.owner, Epoch: sess.epoch})
		}
	}
	sortSessions(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// sortSessions puts sessions in (tenant, session) order.
func sortSessions(out []runtime.SessionOwner) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Session < out[j].Session
	})
}

// ExecutingEffects implements runtime.Ownership.
func (s *MemStore) ExecutingEffects(ctx context.Context, tenant, session string) ([]runtime.EffectRecord, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("memstore: executing effects: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []runtime.EffectRecord
	for _, r := range s.sessionRunsLocked(tenant, session) {
		out = append(out, runtime.ExecutingRecords(r.run)...)
	}
	return out, nil
}

// KVGet implements runtime.PluginKV.
func (s *MemStore) KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error) {
	if err := checkKVScope(tenant, plugin); err != nil {
		return nil, fmt.Errorf("memstore: kv get: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	v, ok := s.kv[memKVScope{tenant, plugin}][string(key)]
	if !ok {
		return nil, nil
	}
	return append([]byte(nil), v...), nil
}

// KVSet implements runtime.PluginKV.
func (s *MemStore) KVSet(ctx context.Context, tenant, plugin string, key, value []byte) error {
	if err := checkKVScope(tenant, plugin); err != nil {
		return fmt.Errorf("memstore: kv set: %w", err)
	}
	if len(key) > s.lim.MaxKeyBytes {
		return fmt.Errorf("memstore: kv set %s/%s: %w: key is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(key), s.lim.MaxKeyBytes)
	}
	if len(value) > s.lim.MaxValueBytes {
		return fmt.Errorf("memstore: kv set %s/%s: %w: value is %d bytes, the limit is %d", tenant, plugin, runtime.ErrKVTooLarge, len(value), s.lim.MaxValueBytes)
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	sc := memKVScope{tenant, plugin}
	m := s.kv[sc]
	var used int64
	old, had := m[string(key)]
	if had {
		used = int64(len(key) + len(old))
	}
	if len(value) == 0 {
		if had {
			delete(m, string(key))
			s.kvUsed[sc] -= used
		}
		return nil
	}
	total := s.kvUsed[sc] - used + int64(len(key)+len(value))
	if total > s.lim.QuotaBytes {
		return fmt.Errorf("memstore: kv set %s/%s: %w: the plugin would hold %d bytes, its quota is %d", tenant, plugin, runtime.ErrKVQuota, total, s.lim.QuotaBytes)
	}
	if m == nil {
		m = map[string][]byte{}
		s.kv[sc] = m
	}
	m[string(key)] = append([]byte(nil), value...)
	s.kvUsed[sc] = total
	return nil
}

// KVDelete implements runtime.PluginKV.
func (s *MemStore) KVDelete(ctx context.Context, tenant, plugin string, key []byte) error {
	return s.KVSet(ctx, tenant, plugin, key, nil)
}

// Prune implements runtime.Store. It is cross-tenant.
func (s *MemStore) Prune(ctx context.Context, beforeMS int64) (runtime.PruneStats, error) {
	if err := s.lock(); err != nil {
		return runtime.PruneStats{}, err
	}
	defer s.mu.Unlock()
	var st runtime.PruneStats
	for k, r := range s.runs {
		if !r.run.Status.Terminal() || r.run.UpdatedAt >= beforeMS || (len(r.events) == 0 && len(r.commands) == 0 && r.createCmd == "") {
			continue
		}
		st.Runs++
		st.Events += len(r.events)
		st.Commands += len(r.commands)
		r.firstSeq += int64(len(r.events))
		r.events = nil
		r.commands = map[string]int64{}
		if r.createCmd != "" {
			delete(s.createCmds, memCmdKey{k.tenant, r.createCmd})
			r.createCmd = ""
			st.Commands++
		}
	}
	return st, nil
}

// checkIDs checks IDs given as pairs: what the ID names, then the ID.
func checkIDs(whatAndID ...string) error {
	for i := 0; i+1 < len(whatAndID); i += 2 {
		if err := loop.CheckID(whatAndID[i], whatAndID[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func checkKVScope(tenant, plugin string) error {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return err
	}
	return runtime.CheckName("plugin", plugin)
}

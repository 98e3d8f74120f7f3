package runtime

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// Options configure a Runtime. Store, Tenants and Clock are required.
type Options struct {
	Store   Store
	Tenants Tenants
	Clock   Clock
	Logger  *slog.Logger
	// NodeID names this incarnation; a fresh random one when empty. It must
	// never be reused across processes.
	NodeID string
	// LeaseTTL is how long the node's lease lasts between renewals
	// (default 15s); it is renewed every LeaseTTL/3 with one write.
	LeaseTTL time.Duration
	// CallTimeout bounds one executor or builder call made by the runtime
	// (default 2m). The plugin host enforces its own, shorter, call limit.
	CallTimeout time.Duration
	// CommitTimeout bounds one settlement commit, which runs detached from
	// the caller's context (default 30s).
	CommitTimeout time.Duration
	// PollMin and PollMax bound the Watcher's poll backoff (defaults 200ms
	// and 30s).
	PollMin, PollMax time.Duration
	// MaxConcurrentCalls bounds the goroutines that carry out due Watcher
	// items (default 64).
	MaxConcurrentCalls int
	// MaxDrivers bounds the sessions driven at once (default 128). Session
	// drivers are cheap, but thousands at once (a recovery pass over
	// thousands of sessions) flood the store's write queue, and every
	// commit, the node's lease renewal included, waits behind them.
	MaxDrivers int
	// RecoveryInterval is the time between recovery passes after the first
	// one at start-up (default 10s).
	RecoveryInterval time.Duration
	// MaxDefer is how long recovery waits for an unavailable executor
	// before the missing-effect policy applies (default 5m).
	MaxDefer time.Duration
	// WatchdogInterval is the time between watchdog scans (default 30s).
	WatchdogInterval time.Duration
	// Hub receives a notice after every commit; give the same Hub to the
	// plugin host as its EventSink so emits reach Follow too. Default: a
	// new Hub.
	Hub *Hub
	// Observer receives what the runtime does, for metrics. Default:
	// NopObserver.
	Observer Observer
}

// Runtime drives Runs: it composes the Loop, the executors and session
// ownership into one execution service. It never holds Run state between
// steps: every advance reloads the authoritative snapshot from the Store,
// decides, and commits.
//
// Runtime is safe for concurrent use.
type Runtime struct {
	opts    Options
	store   Store
	clock   Clock
	log     *slog.Logger
	nodeID  string
	watcher *watcher
	hub     *Hub
	// attempts owns what this process does about each effect attempt.
	attempts *attempts
	dog      *watchdog

	life     context.Context
	stopLife context.CancelFunc
	wg       sync.WaitGroup
	slots    chan struct{} // bounds watcher-fired work
	drivers  chan struct{} // bounds concurrent session drivers
	// lost is closed when the node's lease expired: the runtime has given
	// up every session and drives nothing from then on.
	lost chan struct{}

	mu       sync.Mutex
	started  bool
	stopped  bool
	expired  bool
	sessions map[string]*sessionState // by tenant/session
	waiters  map[string][]waiter      // by tenant/run
	runLocks map[string]*runLock      // by tenant/run, while an advance holds or waits
	renew    Timer

	recoveryTimer, watchdogTimer Timer

	ready    atomic.Bool
	halted   atomic.Bool
	active   atomic.Int64 // goroutines doing runtime work
	stats    statCounters
	recStats recoveryCounters
}

type sessionState struct {
	tenant, session string
	epoch           uint64
	claimed         bool
	driving         bool
	dirty           bool
	idleScans       int // watchdog scans in a row that found no active Run
}

// Stats is a snapshot of the runtime's counters, taken by Stats.
type Stats struct {
	Commits           int64 // commits that wrote
	DuplicateCommits  int64 // commits answered from a command ID
	Conflicts         int64 // version conflicts retried
	DroppedOutcomes   int64 // stale or repeated outcomes dropped
	Boundaries        int64 // sessions given up on lost ownership
	ExecutorCalls     int64 // start, poll, attach and cancel calls made
	EffectsSettled    int64 // settlements committed (a timeout's or a cancellation's included), counted before the Run's waiters hear of them
	RunsCompleted     int64
	RunsFailed        int64
	RunsCancelled     int64
	UnavailableErrors int64 // executor calls that found the executor unavailable
	WatcherQueueDepth int   // polls and Run wake-ups scheduled, not yet due
}

// RunsEnded is how many Runs this runtime took to an end: completed,
// failed or cancelled.
func (s Stats) RunsEnded() int64 { return s.RunsCompleted + s.RunsFailed + s.RunsCancelled }

// statCounters are the live counters behind Stats; the runtime's
// goroutines add to them.
type statCounters struct {
	Commits, DuplicateCommits, Conflicts, DroppedOutcomes, Boundaries atomic.Int64
	ExecutorCalls, EffectsSettled                                     atomic.Int64
	RunsCompleted, RunsFailed, RunsCancelled, UnavailableErrors       atomic.Int64
}

// New returns a Runtime; call Start before using it.
func New(opts Options) (*Runtime, error) {
	if opts.Store == nil || opts.Tenants == nil || opts.Clock == nil {
		return nil, errors.New("runtime: Options need Store, Tenants and Clock")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.NodeID == "" {
		opts.NodeID = "node-" + randomID(10)
	}
	setDefault(&opts.LeaseTTL, 15*time.Second)
	setDefault(&opts.CallTimeout, 2*time.Minute)
	setDefault(&opts.CommitTimeout, 30*time.Second)
	setDefault(&opts.PollMin, 200*time.Millisecond)
	setDefault(&opts.PollMax, 30*time.Second)
	if opts.MaxConcurrentCalls <= 0 {
		opts.MaxConcurrentCalls = 64
	}
	if opts.MaxDrivers <= 0 {
		opts.MaxDrivers = 128
	}
	setDefault(&opts.RecoveryInterval, 10*time.Second)
	setDefault(&opts.MaxDefer, 5*time.Minute)
	setDefault(&opts.WatchdogInterval, 30*time.Second)
	if opts.Hub == nil {
		opts.Hub = NewHub()
	}
	if opts.Observer == nil {
		opts.Observer = NopObserver{}
	}
	rt := &Runtime{
		opts:     opts,
		store:    opts.Store,
		clock:    opts.Clock,
		log:      opts.Logger.With("node", opts.NodeID),
		nodeID:   opts.NodeID,
		hub:      opts.Hub,
		slots:    make(chan struct{}, opts.MaxConcurrentCalls),
		drivers:  make(chan struct{}, opts.MaxDrivers),
		attempts: newAttempts(),
		sessions: map[string]*sessionState{},
		waiters:  map[string][]waiter{},
		runLocks: map[string]*runLock{},
		dog:      &watchdog{suspects: map[string]int64{}},
	}
	rt.lost = make(chan struct{})
	rt.life, rt.stopLife = context.WithCancel(context.Background())
	rt.watcher = newWatcher(opts.Clock, rt.onWatcherFire)
	return rt, nil
}

// LeaseLost is closed when this node's lease expired before it could be
// renewed (the process was paused, or starved of CPU, for longer than
// LeaseTTL). The runtime has then given up every session, and it drives
// nothing more: its in-flight work can no longer commit. The process
// should stop and start again; the new incarnation's recovery takes every
// session over. A runtime does not re-register by itself, because its
// executor calls still running could then run a second time beside
// recovery's.
func (rt *Runtime) LeaseLost() <-chan struct{} { return rt.lost }

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// NodeID returns this incarnation's ID.
func (rt *Runtime) NodeID() string { return rt.nodeID }

// Stats returns a snapshot of the runtime's counters.
func (rt *Runtime) Stats() Stats {
	c := &rt.stats
	return Stats{
		Commits: c.Commits.Load(), DuplicateCommits: c.DuplicateCommits.Load(), Conflicts: c.Conflicts.Load(),
		DroppedOutcomes: c.DroppedOutcomes.Load(), Boundaries: c.Boundaries.Load(),
		ExecutorCalls: c.ExecutorCalls.Load(), EffectsSettled: c.EffectsSettled.Load(),
		RunsCompleted: c.RunsCompleted.Load(), RunsFailed: c.RunsFailed.Load(), RunsCancelled: c.RunsCancelled.Load(),
		UnavailableErrors: c.UnavailableErrors.Load(),
		WatcherQueueDepth: rt.watcher.Len(),
	}
}

// Start registers the node incarnation, arms its lease renewal, and starts
// recovery: a first pass at once (Ready reports when it is done), then one
// every RecoveryInterval, and the watchdog every WatchdogInterval.
func (rt *Runtime) Start(ctx context.Context) error {
	rt.mu.Lock()
	if rt.started {
		rt.mu.Unlock()
		return errors.New("runtime: already started")
	}
	rt.started = true
	rt.mu.Unlock()
	if err := rt.store.RegisterNode(ctx, rt.nodeID, rt.nowMS()+rt.opts.LeaseTTL.Milliseconds()); err != nil {
		return fmt.Errorf("runtime: register node %s: %w", rt.nodeID, err)
	}
	rt.armRenewal()
	rt.startRecovery()
	rt.log.Info("runtime started", "lease_ttl", rt.opts.LeaseTTL)
	return nil
}

func (rt *Runtime) armRenewal() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped || rt.expired {
		return
	}
	rt.renew = rt.clock.AfterFunc(rt.opts.LeaseTTL/3, rt.renewLease)
}

func (rt *Runtime) renewLease() {
	ctx, cancel := context.WithTimeout(rt.life, rt.opts.LeaseTTL/3)
	defer cancel()
	err := rt.store.RenewNode(ctx, rt.nodeID, rt.nowMS()+rt.opts.LeaseTTL.Milliseconds())
	switch {
	case errors.Is(err, ErrNodeExpired):
		rt.log.Error("node lease expired: this runtime gives up every session", "lease_ttl", rt.opts.LeaseTTL, "err", err)
		rt.mu.Lock()
		rt.expired = true
		sessions := rt.sessions
		rt.sessions = map[string]*sessionState{}
		rt.mu.Unlock()
		for _, s := range sessions {
			rt.boundary(s.tenant, s.session, err)
		}
		close(rt.lost)
		return
	case err != nil && rt.life.Err() == nil:
		rt.log.Warn("node lease renewal failed; retrying", "err", err)
	}
	rt.armRenewal()
}

// Stop stops intake and the watcher, and waits until ctx ends for the
// work in progress to finish: executor calls, and the commits of their
// answers (an answer that arrives during the drain is committed; an
// effect it dispatches is left to recovery). It then releases the
// sessions this node owns, so that another incarnation may take them over
// at once, and returns nil.
//
// If ctx ends first, Stop cancels what is left, commits nothing more,
// releases nothing (the sessions pass to another incarnation when this
// node's lease expires) and returns ctx's error. Effects still executing
// are left on record for recovery either way. Stop is safe to call more
// than once; a second call returns nil at once.
func (rt *Runtime) Stop(ctx context.Context) error {
	if rt.markStopped() {
		return nil
	}
	done := make(chan struct{})
	go func() { rt.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("runtime: stop: the work in progress did not finish in time; cancelled it, leaving it to recovery: %w", ctx.Err())
		rt.halted.Store(true)
	}
	rt.stopLife()
	rt.mu.Lock()
	sessions := rt.sessions
	rt.sessions = map[string]*sessionState{}
	waiters := rt.waiters
	rt.waiters = map[string][]waiter{}
	rt.mu.Unlock()
	if err == nil {
		for _, s := range sessions {
			if !s.claimed {
				continue
			}
			if rerr := rt.store.ReleaseSession(ctx, s.tenant, s.session, rt.nodeID); rerr != nil {
				rt.log.Warn("release session; it passes to another incarnation when this node's lease expires",
					"tenant", s.tenant, "session", s.session, "err", rerr)
			}
		}
	}
	for _, ws := range waiters {
		for _, w := range ws {
			select {
			case w.ch <- Result{Kind: ResultBoundary, Err: ErrClosed}:
			default:
			}
		}
	}
	if err != nil {
		rt.log.Warn("runtime stopped before its work in progress finished", "err", err)
		return err
	}
	rt.log.Info("runtime stopped")
	return nil
}

// Halt stops the runtime the way a crash would: at once, with no further
// commit, no session released and the node's lease left to expire. Calls
// in flight are cancelled; a commit already inside the store finishes or
// not, as it would in a crash. It exists for crash tests and for an
// operator's emergency stop; Stop is the graceful way.
func (rt *Runtime) Halt() {
	rt.halted.Store(true)
	rt.markStopped()
	rt.stopLife()
}

// markStopped refuses new work from here on: it marks the runtime
// stopped and stops its timers and the Watcher. It reports whether the
// runtime was stopped before.
func (rt *Runtime) markStopped() (already bool) {
	rt.mu.Lock()
	already, rt.stopped = rt.stopped, true
	for _, tm := range []Timer{rt.renew, rt.recoveryTimer, rt.watchdogTimer} {
		if tm != nil {
			tm.Stop()
		}
	}
	rt.mu.Unlock()
	rt.watcher.Stop()
	return already
}

// stopping reports whether Stop or Halt has begun.
func (rt *Runtime) stopping() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.stopped
}

func (rt *Runtime) nowMS() int64 { return rt.clock.Now().UnixMilli() }

// goTracked runs f as tracked runtime work, unless the runtime is stopping.
func (rt *Runtime) goTracked(f func()) bool {
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return false
	}
	rt.wg.Add(1)
	rt.active.Add(1)
	rt.mu.Unlock()
	go func() {
		defer rt.wg.Done()
		defer rt.active.Add(-1)
		f()
	}()
	return true
}

// Idle reports whether no goroutine of the runtime is working: no session
// driver, no executor call, no Watcher batch. Together with a clock that
// has no callback running, it marks a quiescent point (tests use it to
// check invariants between steps without sleeping).
func (rt *Runtime) Idle() bool { return rt.active.Load() == 0 }

// commitCtx is the detached context of a commit: it outlives the caller
// (and a cancelled Execute) but is bounded by CommitTimeout.
func (rt *Runtime) commitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(rt.life), rt.opts.CommitTimeout)
}

// callCtx is the context of one executor or builder call: bounded by
// CallTimeout and by the runtime's lifetime.
func (rt *Runtime) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(rt.life, rt.opts.CallTimeout)
}

// runLock serializes the advances of one Run in this process: each one
// loads, decides, commits and performs on a snapshot no other advance of
// this process can make stale. (Other processes are kept out by session
// ownership and fencing.)
type runLock struct {
	mu   sync.Mutex
	refs int
}

// lockRun takes the Run's advance lock and returns its release.
func (rt *Runtime) lockRun(rk string) func() {
	rt.mu.Lock()
	l := rt.runLocks[rk]
	if l == nil {
		l = &runLock{}
		rt.runLocks[rk] = l
	}
	l.refs++
	rt.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		rt.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(rt.runLocks, rk)
		}
		rt.mu.Unlock()
	}
}

func sessionKey(tenant, session string) string { return tenant + "/" + session }
func runKey(tenant, run string) string         { return tenant + "/" + run }

// claim returns the epoch this node holds for a session, claiming it the
// first time.
func (rt *Runtime) claim(ctx context.Context, tenant, session string) (uint64, error) {
	rt.mu.Lock()
	s := rt.sessionLocked(tenant, session)
	if s.claimed {
		e := s.epoch
		rt.mu.Unlock()
		return e, nil
	}
	expired := rt.expired
	rt.mu.Unlock()
	if expired {
		return 0, ErrNodeExpired
	}
	epoch, err := rt.store.ClaimSession(ctx, tenant, session, rt.nodeID, rt.nowMS())
	if err != nil {
		return 0, err
	}
	rt.mu.Lock()
	s = rt.sessionLocked(tenant, session)
	s.epoch, s.claimed = epoch, true
	rt.mu.Unlock()
	rt.log.Debug("session claimed", "tenant", tenant, "session", session, "epoch", epoch)
	return epoch, nil
}

func (rt *Runtime) sessionLocked(tenant, session string) *sessionState {
	k := sessionKey(tenant, session)
	s, ok := rt.sessions[k]
	if !ok {
		s = &sessionState{tenant: tenant, session: session}
		rt.sessions[k] = s
	}
	return s
}

// boundary gives a session up: this node no longer owns it. Waiters of its
// Runs get a boundary result.
func (rt *Runtime) boundary(tenant, session string, cause error) {
	rt.stats.Boundaries.Add(1)
	rt.mu.Lock()
	delete(rt.sessions, sessionKey(tenant, session))
	rt.mu.Unlock()
	rt.attempts.forgetSettledIn(tenant + "/" + session + "/")
	rt.log.Warn("ownership boundary: this node stops driving the session", "tenant", tenant, "session", session, "err", cause)
	rt.notifySession(tenant, session, Result{Kind: ResultBoundary, Err: cause})
}

// kick makes sure the session is being driven: it starts a driver
// goroutine, or tells the running one to look again.
func (rt *Runtime) kick(tenant, session string) {
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return
	}
	s := rt.sessionLocked(tenant, session)
	if s.driving {
		s.dirty = true
		rt.mu.Unlock()
		return
	}
	s.driving = true
	rt.wg.Add(1)
	rt.active.Add(1)
	rt.mu.Unlock()
	go func() {
		defer rt.wg.Done()
		defer rt.active.Add(-1)
		select {
		case rt.drivers <- struct{}{}:
			defer func() { <-rt.drivers }()
		case <-rt.life.Done():
			rt.mu.Lock()
			s.driving = false
			rt.mu.Unlock()
			return
		}
		for {
			rt.driveSession(tenant, session)
			rt.mu.Lock()
			if !s.dirty || rt.stopped {
				s.driving = false
				rt.mu.Unlock()
				return
			}
			s.dirty = false
			rt.mu.Unlock()
		}
	}()
}

// driveSession advances the head Run of a session until it is terminal (then
// the next one starts) or quiescent. A store error on the way (the claim,
// the read of the session's Runs) is retried with a backoff on the Clock:
// a Run acknowledged into the session must not wait for the watchdog
// because one read failed.
func (rt *Runtime) driveSession(tenant, session string) {
	ctx := rt.life
	backoff := commitRetryMin
	retry := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		rt.log.Warn("session driver: "+what+" failed; retrying", "tenant", tenant, "session", session, "retry_in", backoff, "err", err)
		ok := rt.sleep(backoff)
		backoff = min(2*backoff, commitRetryMax)
		return ok
	}
	for ctx.Err() == nil {
		epoch, err := rt.claim(ctx, tenant, session)
		if errors.Is(err, ErrSessionOwned) || errors.Is(err, ErrNodeExpired) {
			rt.boundary(tenant, session, err)
			return
		}
		if err != nil {
			if retry("claiming the session", err) {
				continue
			}
			return
		}
		runs, err := rt.store.ActiveRuns(ctx, tenant, session)
		if err != nil {
			if retry("reading the session's active Runs", err) {
				continue
			}
			return
		}
		if len(runs) == 0 {
			return
		}
		for _, queued := range runs[1:] {
			rt.notifyRun(tenant, queued.ID, Result{Kind: ResultWaiting, Run: queued, Waiting: &Waiting{Queued: true}})
		}
		head, err := rt.advance(ctx, advanceReq{tenant: tenant, session: session, runID: runs[0].ID, epoch: epoch, mayStart: true})
		if errors.Is(err, errStoreFailed) && !rt.stopping() {
			if retry("advancing the head Run", err) {
				continue
			}
			return
		}
		if err != nil || !head.Status.Terminal() {
			return
		}
		backoff = commitRetryMin
	}
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// NewRunID returns a fresh Run ID: time-ordered, random, within the ID
// grammar.
func NewRunID(now time.Time) string {
	return "run_" + strconv.FormatInt(now.UnixMilli(), 36) + randomID(8)
}

// checkIDs validates the IDs of a request.
func checkIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := loop.CheckID(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

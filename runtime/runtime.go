package runtime

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"github.com/agenthost/agenthost/internal/budget"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime/internal/attempts"
	"github.com/agenthost/agenthost/runtime/internal/backlog"
	"github.com/agenthost/agenthost/runtime/internal/driverslots"
	"github.com/agenthost/agenthost/runtime/internal/ownedruns"
	"github.com/agenthost/agenthost/runtime/internal/settlequeue"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// Options configure a Runtime. Store, Tenants and Clock are required.
type Options struct {
	Store   Store
	Tenants Tenants
	Clock   Clock
	Logger  *slog.Logger
	// NodeID names this incarnation; a fresh random one when empty
	// (NodeNamePrefix(NodeName) and a random part, when NodeName is set).
	// It must never be reused across processes.
	NodeID string
	// NodeName, when set, is the node's identity across restarts (the
	// config's node.name): the incarnation's ID is then the name, a slash
	// and a fresh random part, and on a Store that is NodeNames, Start
	// holds the name for this process and declares every earlier
	// incarnation of it dead, so that the first recovery pass takes their
	// sessions back without waiting out their leases. Start fails with
	// ErrNodeNameHeld while another live process holds the name. It
	// changes nothing else on a Store that is not NodeNames (Badger).
	NodeName string
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
	// MaxConcurrentCalls bounds the goroutines that carry out one batch
	// of due Watcher items (default 64). A batch that falls due while an
	// earlier one is still being carried out gets workers of its own.
	MaxConcurrentCalls int
	// MaxCallsInFlight bounds the executor calls (start, poll, attach,
	// cancel) that advances launch and that are running at once (default
	// 256): a launch past it waits for a call to answer (launch). The
	// Watcher's calls have their own bound, MaxConcurrentCalls. It also
	// bounds the Run commits under way past which a session's drive waits
	// before it begins (runtime/internal/backlog).
	MaxCallsInFlight int
	// MaxDrivers bounds the sessions driven at once (default 128). Session
	// drivers are cheap, but thousands at once (a recovery pass over
	// thousands of sessions) flood the store's write queue, and every
	// commit, the node's lease renewal included, waits behind them. A
	// session kicked while every slot is taken waits for one in the
	// order it was kicked.
	MaxDrivers int
	// RecoveryInterval is the time between recovery passes after the first
	// one at start-up (default 10s; LeaseTTL/3 when the Store is a
	// ChangeFeed, shared with other nodes: there a node that dies leaves
	// its sessions to the others once its lease runs out, and the next
	// pass should not be far behind).
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
	// ModelBudgets are the model budgets the tenants' agents use
	// (Agent.ModelBudget), each once. When the Store is a NodeCounter the
	// runtime gives each this node's share (budget.Budget.SetNodes) from
	// the live node count, at its start and at every lease renewal.
	ModelBudgets []*budget.Budget
}

// Runtime drives Runs: it composes the Loop, the executors and session
// ownership into one execution service. It never holds Run state between
// steps: every advance reloads the authoritative snapshot from the Store,
// decides, and commits.
//
// Runtime is safe for concurrent use.
type Runtime struct {
	// Set by New and never changed: read without a lock. lost is closed
	// once, by loseLease (under mu, the first time expired is set);
	// life ends with stopLife, haltedCtx with cancelHalted (halt).
	opts     Options
	store    Store
	clock    Clock
	log      *slog.Logger
	nodeID   string
	hub      *Hub
	life     context.Context
	stopLife context.CancelFunc
	// haltedCtx is cancelled, through halt, when the runtime may commit
	// nothing more, ending the commits under way (commitCtx).
	haltedCtx    context.Context
	cancelHalted context.CancelFunc
	// lost is closed when the node's lease expired: the runtime has given
	// up every session and drives nothing from then on.
	lost chan struct{}

	// The parts below, set by New, each own their state behind a lock
	// of their own, a leaf that is never held while calling out (doc.go,
	// "Goroutines and locks"). The runtime reaches them only through
	// their methods.
	//
	// attempts owns what this process does about each effect attempt.
	attempts *attempts.Table
	// sessions holds the sessions this process owns, their claims and
	// drivers.
	sessions *sessionTable
	// watcher is the one timer heap: polls, wake-ups, deferred attaches.
	watcher *watcher.Watcher
	// settles queues the settlements waiting for their commit, so that
	// one commit takes those of a Run that arrive together.
	settles *settlequeue.Queue
	// owned keeps the snapshots this node committed, and the histories
	// its builders were given, of the live Runs of the sessions it owns,
	// so that an advance need not read them back (guessRun).
	owned *ownedruns.Cache
	// commits counts the Run commits under way; drives wait while they
	// are MaxCallsInFlight or more.
	commits *backlog.Backlog
	// drivers bounds the session drivers running at once, and hands the
	// slots out in kick order.
	drivers *driverslots.Slots
	// dog holds the watchdog's suspects.
	dog *watchdog
	// instanceWaits holds the executor calls waiting for a plugin
	// instance (InstanceWait).
	instanceWaits instanceWaits
	// budgetWaits makes a model call's refusal by its endpoint's budget
	// and its registration in the Watcher one step for the wake-ups of
	// budget waiters (admitModelCall, wakeBudgetWaiter). It guards no
	// field.
	budgetWaits sync.Mutex
	// calls holds a token for each launched executor call in flight
	// (Options.MaxCallsInFlight; launch). A channel, not a lock: a
	// launch waits for a token holding its Run's advance lock.
	calls chan struct{}

	// mu guards the fields below, up to the blank line, and the refs of
	// every runLock. It also orders wg.Add (goTracked, kick), which
	// happens under it only while stopped and expired are false, before
	// Stop's wg.Wait. Lock order: a Run's advance lock, then mu, then
	// sessions' and drivers' own locks; see doc.go.
	mu      sync.Mutex
	started bool
	stopped bool
	expired bool
	// leaseFrom is when the last good renewal (or the registration)
	// began: the lease is trusted until LeaseTTL minus leaseMargin after.
	leaseFrom time.Time
	renew     Timer
	// trust gives the lease up when its trust window passes
	// (armTrustLocked), whatever the renewal is doing; renewing is when
	// the renewal in flight began (zero when none is), and renewErr the
	// last renewal's error, for the message.
	trust                        Timer
	renewing                     time.Time
	renewErr                     error
	recoveryTimer, watchdogTimer Timer
	// nameHold releases the node name Start holds (NodeNames); nil when
	// none is held.
	nameHold func()
	// shared is set when the store is a ChangeFeed, shared with other
	// nodes; leaveFeed ends the subscription (cluster.go).
	shared    bool
	leaveFeed func()
	waiters   map[string]*runWaiters // by tenant/run
	runLocks  map[string]*runLock    // by tenant/run, while an advance holds or waits

	// wg counts the tracked goroutines (goTracked, session drivers), for
	// Stop; see mu for its Add.
	wg sync.WaitGroup

	// stepsFirst is set when the store writes a new session's first Run
	// with its first step (FirstStepper; Runtime.firstStep).
	stepsFirst bool

	// Atomic: read and written without a lock.
	//
	// ready is set once a recovery pass has succeeded (Ready).
	ready atomic.Bool
	// halted is set, through halt, when the runtime may commit nothing
	// more (its lease lost, a forced stop, Halt).
	halted   atomic.Bool
	active   atomic.Int64 // goroutines doing runtime work
	stats    statCounters
	recStats recoveryCounters
	// watcherFireHook, when set (tests, through export_test.go), runs
	// once onWatcherFire has started its first worker. It is this
	// runtime's own, so that a runtime another test left running never
	// calls it, and atomic, since a test sets it while the runtime runs.
	watcherFireHook atomic.Pointer[func()]
	// guessHook, when set (tests, through export_test.go), is called
	// with each snapshot an advance may take as a guess (guessRun), under
	// the Run's advance lock; false makes the advance load the Run
	// instead.
	guessHook atomic.Pointer[func(loop.Run) bool]
	// reportHook, when set (tests, through export_test.go), is handed each
	// advance's report of the Run it left (afterAdvance), once the Run's
	// lock is let go, to run when the test says: a report that comes late.
	reportHook atomic.Pointer[func(loop.Run, func())]
}

// Stats is a snapshot of the runtime's counters, taken by Stats.
type Stats struct {
	Commits           int64 // commits that wrote
	DuplicateCommits  int64 // commits answered from a command ID
	Conflicts         int64 // version conflicts retried
	DroppedOutcomes   int64 // stale or repeated outcomes dropped
	Boundaries        int64 // sessions given up on lost ownership
	GuestInputs       int64 // inputs committed for sessions another live node drives
	ExecutorCalls     int64 // start, poll, attach and cancel calls made
	EffectsSettled    int64 // settlements committed (a timeout's or a cancellation's included), counted before the Run's waiters hear of them
	RunsCompleted     int64
	RunsFailed        int64
	RunsCancelled     int64
	UnavailableErrors int64 // executor calls that found the executor unavailable
	WatcherQueueDepth int   // polls and Run wake-ups scheduled, not yet due
	// LeaseRenewals counts the node lease's renewals that succeeded;
	// LeaseGapMax is the longest time, on the runtime's Clock, from the
	// start of one successful renewal (or the registration) to the start
	// of the next, the figure that must stay under LeaseTTL's trust window
	// (LeaseTTL less a fifth) for the lease to hold: renewals are due every
	// LeaseTTL/3, so a gap well above that says the renewal was held up
	// (a slow store, a starved process). LeaseRenewMax is the longest one
	// RenewNode call took.
	LeaseRenewals int64
	LeaseGapMax   time.Duration
	LeaseRenewMax time.Duration
	// MergedSettlements counts the settlements committed in the commit of
	// another settlement of the same Run (advance, foldActions).
	MergedSettlements int64
	// FirstSteps counts the Runs whose creation wrote their first step
	// too (Store.CreateRun's FirstStep): a commit fewer each.
	FirstSteps int64
	// FirstStepsNotWritten counts the first steps made ahead of a
	// creation that the store did not write (the Run was not its
	// session's first, or the session had an owner): a builder call
	// each, made in vain. A session this process finds so is not given
	// another (sessionTable.known).
	FirstStepsNotWritten int64
}

// RunsEnded is how many Runs this runtime took to an end: completed,
// failed or cancelled.
func (s Stats) RunsEnded() int64 { return s.RunsCompleted + s.RunsFailed + s.RunsCancelled }

// statCounters are the live counters behind Stats; the runtime's
// goroutines add to them.
type statCounters struct {
	Commits, DuplicateCommits, Conflicts, DroppedOutcomes, Boundaries atomic.Int64
	GuestInputs                                                       atomic.Int64
	ExecutorCalls, EffectsSettled                                     atomic.Int64
	RunsCompleted, RunsFailed, RunsCancelled, UnavailableErrors       atomic.Int64
	LeaseRenewals, LeaseGapMax, LeaseRenewMax                         atomic.Int64 // the durations in ns
	MergedSettlements, FirstSteps, FirstStepsNotWritten               atomic.Int64
}

// raiseMax raises m to v when v is larger.
func raiseMax(m *atomic.Int64, v int64) {
	for {
		old := m.Load()
		if v <= old || m.CompareAndSwap(old, v) {
			return
		}
	}
}

// stepsFirstRuns reports whether s writes a creation's first step
// (FirstStepper).
func stepsFirstRuns(s Store) bool {
	fs, ok := s.(FirstStepper)
	return ok && fs.StepsFirstRuns()
}

// New returns a Runtime; call Start before using it.
func New(opts Options) (*Runtime, error) {
	if opts.Store == nil || opts.Tenants == nil || opts.Clock == nil {
		return nil, errors.New("runtime: Options need Store, Tenants and Clock")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.NodeName != "" {
		if err := CheckNodeName(opts.NodeName); err != nil {
			return nil, fmt.Errorf("runtime: Options.NodeName: %w", err)
		}
	}
	switch {
	case opts.NodeID != "":
	case opts.NodeName != "":
		opts.NodeID = NodeNamePrefix(opts.NodeName) + randomID(10)
	default:
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
	if opts.MaxCallsInFlight <= 0 {
		opts.MaxCallsInFlight = 256
	}
	if opts.MaxDrivers <= 0 {
		opts.MaxDrivers = 128
	}
	if _, shared := opts.Store.(ChangeFeed); shared {
		setDefault(&opts.RecoveryInterval, opts.LeaseTTL/3)
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
		opts:       opts,
		store:      opts.Store,
		clock:      opts.Clock,
		stepsFirst: stepsFirstRuns(opts.Store),
		log:        opts.Logger.With("node", opts.NodeID),
		nodeID:     opts.NodeID,
		hub:        opts.Hub,
		drivers:    driverslots.New(opts.MaxDrivers),
		calls:      make(chan struct{}, opts.MaxCallsInFlight),
		commits:    backlog.New(opts.MaxCallsInFlight),
		attempts:   attempts.New(),
		settles:    settlequeue.New(),
		owned:      ownedruns.New(),
		sessions:   newSessionTable(),
		waiters:    map[string]*runWaiters{},
		runLocks:   map[string]*runLock{},
		dog:        &watchdog{suspects: map[string]int64{}},
	}
	rt.lost = make(chan struct{})
	rt.life, rt.stopLife = context.WithCancel(context.Background())
	rt.haltedCtx, rt.cancelHalted = context.WithCancel(context.Background())
	rt.watcher = watcher.New(watcherClock{opts.Clock}, rt.onWatcherFire)
	return rt, nil
}

// LeaseLost is closed when this node's lease expired before it could be
// renewed (the process was paused, or starved of CPU, for longer than
// LeaseTTL), or when no renewal succeeded within the lease's trust window
// (LeaseTTL minus a fifth of it, from the start of the last good renewal,
// on the runtime's Clock: the store could not be reached, whether the
// renewals failed or hang). The runtime has then given up every
// session, cancelled its calls, and it commits nothing more. The process
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
		DroppedOutcomes: c.DroppedOutcomes.Load(), Boundaries: c.Boundaries.Load(), GuestInputs: c.GuestInputs.Load(),
		ExecutorCalls: c.ExecutorCalls.Load(), EffectsSettled: c.EffectsSettled.Load(),
		RunsCompleted: c.RunsCompleted.Load(), RunsFailed: c.RunsFailed.Load(), RunsCancelled: c.RunsCancelled.Load(),
		UnavailableErrors: c.UnavailableErrors.Load(),
		WatcherQueueDepth: rt.watcher.Len(),
		LeaseRenewals:     c.LeaseRenewals.Load(), LeaseGapMax: time.Duration(c.LeaseGapMax.Load()),
		LeaseRenewMax: time.Duration(c.LeaseRenewMax.Load()), MergedSettlements: c.MergedSettlements.Load(),
		FirstSteps: c.FirstSteps.Load(), FirstStepsNotWritten: c.FirstStepsNotWritten.Load(),
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
	if err := rt.holdNodeName(ctx); err != nil {
		return err
	}
	began := rt.clock.Now()
	if err := rt.store.RegisterNode(ctx, rt.nodeID, began.UnixMilli()+rt.opts.LeaseTTL.Milliseconds()); err != nil {
		rt.releaseNodeName()
		return fmt.Errorf("runtime: register node %s: %w", rt.nodeID, err)
	}
	rt.mu.Lock()
	rt.leaseFrom = began
	rt.armTrustLocked()
	rt.mu.Unlock()
	rt.armRenewal(rt.opts.LeaseTTL / 3)
	rt.shareModelBudgets(ctx)
	rt.joinFeed()
	rt.startRecovery()
	rt.log.Info("runtime started", "lease_ttl", rt.opts.LeaseTTL)
	return nil
}

// holdNodeName holds Options.NodeName for this process on a Store that
// is NodeNames, which declares the name's earlier incarnations dead; the
// name is held until Stop or Halt (or the process's death) releases it.
func (rt *Runtime) holdNodeName(ctx context.Context) error {
	names, ok := rt.store.(NodeNames)
	if rt.opts.NodeName == "" || !ok {
		return nil
	}
	release, err := names.HoldNodeName(ctx, rt.opts.NodeName, rt.nodeID)
	if err != nil {
		return fmt.Errorf("runtime: register node %s: node name %q: %w", rt.nodeID, rt.opts.NodeName, err)
	}
	rt.mu.Lock()
	rt.nameHold = release
	rt.mu.Unlock()
	return nil
}

// releaseNodeName releases the node name holdNodeName holds, if any.
func (rt *Runtime) releaseNodeName() {
	rt.mu.Lock()
	release := rt.nameHold
	rt.nameHold = nil
	rt.mu.Unlock()
	if release != nil {
		release()
	}
}

func (rt *Runtime) armRenewal(after time.Duration) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped || rt.expired {
		return
	}
	rt.renew = rt.clock.AfterFunc(after, rt.renewLease)
}

// leaseMargin is how long before its lease runs out, counted from the
// start of its last good renewal, a node stops trusting it: the margin
// covers the clock skew between this node and the store, and a renewal
// whose reply is on its way. A fifth of the TTL (3 s of the default 15 s).
func (rt *Runtime) leaseMargin() time.Duration { return rt.opts.LeaseTTL / 5 }

// trustedUntilLocked is the end of the lease's trust window: LeaseTTL
// minus leaseMargin after the start of the last good renewal (or the
// registration). Called with rt.mu held.
func (rt *Runtime) trustedUntilLocked() time.Time {
	return rt.leaseFrom.Add(rt.opts.LeaseTTL - rt.leaseMargin())
}

// armTrustLocked arms the timer that ends the trust window of the lease
// as leaseFrom now stands, replacing the one of the previous renewal. It
// is the node's own clock that ends the window (monotonic: the real
// clock's instants carry Go's monotonic reading), not the outcome of a
// renewal: a renewal can hang (a network partitioned from the store, a
// stalled disk) for longer than the lease, and a node that waited for it
// would go on starting effects and committing while another node takes
// its sessions over. Called with rt.mu held.
func (rt *Runtime) armTrustLocked() {
	if rt.stopped || rt.expired {
		return
	}
	if rt.trust != nil {
		rt.trust.Stop()
	}
	rt.trust = rt.clock.AfterFunc(rt.trustedUntilLocked().Sub(rt.clock.Now()), rt.trustWindowEnded)
}

// trustWindowEnded runs when the trust window of a renewal ends: unless
// a later renewal has succeeded meanwhile (it armed a timer of its own),
// the node gives its lease up, without waiting for the renewal in flight.
func (rt *Runtime) trustWindowEnded() {
	rt.mu.Lock()
	now, trusted := rt.clock.Now(), rt.trustedUntilLocked()
	if rt.stopped || rt.expired || now.Before(trusted) {
		rt.mu.Unlock()
		return
	}
	var cause error
	switch {
	case !rt.renewing.IsZero():
		cause = fmt.Errorf("the renewal begun %s ago has not answered (last renewal error: %v)", now.Sub(rt.renewing), rt.renewErr)
	case rt.renewErr != nil:
		cause = rt.renewErr
	default:
		cause = fmt.Errorf("no renewal was attempted since %s ago: the node was starved of CPU or paused", now.Sub(rt.leaseFrom))
	}
	rt.mu.Unlock()
	rt.loseLease("no renewal succeeded within the lease's trust window", cause)
}

// renewLease extends the node's lease. A renewal that fails is tried again
// sooner, but only within the trust window: if no renewal has succeeded
// within LeaseTTL minus leaseMargin of the start of the last good one
// (the lease may be running out at the store, and another node may take
// the sessions over), the node gives its lease up (loseLease). The
// trust-window timer (armTrustLocked) does the same when a renewal hangs
// past the window, so that the node never waits for the store to say
// anything before it stops trusting its lease.
func (rt *Runtime) renewLease() {
	ctx, cancel := context.WithTimeout(rt.life, rt.opts.LeaseTTL/3)
	defer cancel()
	began := rt.clock.Now()
	rt.mu.Lock()
	rt.renewing = began
	rt.mu.Unlock()
	err := rt.store.RenewNode(ctx, rt.nodeID, began.UnixMilli()+rt.opts.LeaseTTL.Milliseconds())
	rt.mu.Lock()
	rt.renewing, rt.renewErr = time.Time{}, err
	if rt.expired {
		// The trust window ended while the renewal ran: the lease is
		// given up for good, whatever the store answered.
		rt.mu.Unlock()
		return
	}
	if err == nil {
		gap := began.Sub(rt.leaseFrom)
		rt.leaseFrom = began
		rt.armTrustLocked()
		rt.mu.Unlock()
		rt.stats.LeaseRenewals.Add(1)
		raiseMax(&rt.stats.LeaseGapMax, int64(gap))
		raiseMax(&rt.stats.LeaseRenewMax, int64(rt.clock.Now().Sub(began)))
		// The next one is due LeaseTTL/3 after this one began, not after
		// it answered: a slow renewal must not push the next one towards
		// the end of the trust window, which runs from when this began.
		rt.armRenewal(began.Add(rt.opts.LeaseTTL / 3).Sub(rt.clock.Now()))
		rt.shareModelBudgets(ctx)
		return
	}
	rt.mu.Unlock()
	switch {
	case errors.Is(err, ErrNodeExpired):
		rt.loseLease("the store says its lease expired", err)
	case rt.life.Err() != nil:
	default:
		rt.mu.Lock()
		trusted := rt.trustedUntilLocked()
		rt.mu.Unlock()
		if !rt.clock.Now().Before(trusted) {
			rt.loseLease("no renewal succeeded within the lease's trust window", err)
			return
		}
		retry := min(rt.opts.LeaseTTL/10, trusted.Sub(rt.clock.Now()))
		rt.log.Warn("node lease renewal failed; retrying", "retry_in", retry, "trusted_until", trusted, "err", err)
		rt.armRenewal(retry)
	}
}

// loseLease gives the node's lease up: no commit starts from here on (a
// lease this node cannot vouch for fences nothing at the store yet, so it
// must fence itself), no call or other tracked work starts (goTracked),
// the calls still running are cancelled, every session is given up at an
// ownership boundary, and LeaseLost closes.
func (rt *Runtime) loseLease(why string, cause error) {
	rt.mu.Lock()
	if rt.expired {
		rt.mu.Unlock()
		return
	}
	rt.expired = true
	rt.halt()
	for _, tm := range []Timer{rt.renew, rt.trust} {
		if tm != nil {
			tm.Stop()
		}
	}
	rt.mu.Unlock()
	sessions := rt.sessions.takeAll()
	rt.stopLife()
	rt.log.Error("node lease lost: this runtime gives up every session and cancels its calls: "+why,
		"lease_ttl", rt.opts.LeaseTTL, "err", cause)
	for _, s := range sessions {
		rt.boundary(s.tenant, s.session, fmt.Errorf("%w: %s: %w", ErrNodeExpired, why, cause))
	}
	close(rt.lost)
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
		rt.halt()
	}
	rt.stopLife()
	sessions := rt.sessions.takeAll()
	rt.mu.Lock()
	waiters := rt.waiters
	rt.waiters = map[string]*runWaiters{}
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
	for _, rw := range waiters {
		for _, w := range rw.list {
			select {
			case w.ch <- Result{Kind: ResultBoundary, Err: ErrClosed}:
			default:
			}
		}
	}
	rt.releaseNodeName()
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
	rt.halt()
	rt.markStopped()
	rt.stopLife()
	// A crashed process's hold on its node name ends with it.
	rt.releaseNodeName()
}

// markStopped refuses new work from here on: it marks the runtime
// stopped and stops its timers and the Watcher. It reports whether the
// runtime was stopped before.
func (rt *Runtime) markStopped() (already bool) {
	rt.mu.Lock()
	already, rt.stopped = rt.stopped, true
	for _, tm := range []Timer{rt.renew, rt.trust, rt.recoveryTimer, rt.watchdogTimer} {
		if tm != nil {
			tm.Stop()
		}
	}
	leave := rt.leaveFeed
	rt.leaveFeed = nil
	rt.mu.Unlock()
	if leave != nil {
		leave()
	}
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

// goTracked runs f as tracked runtime work, unless the runtime is stopping
// or has lost its lease (a node that no longer trusts its lease starts
// nothing: no call, no recovery pass, no watchdog scan).
func (rt *Runtime) goTracked(f func()) bool {
	rt.mu.Lock()
	if !rt.startsWorkLocked() {
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

// mayStart reports whether the runtime starts more work: goTracked's
// test, for a goroutine that is tracked already and would go on to
// another piece of work (runCalls).
func (rt *Runtime) mayStart() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.startsWorkLocked()
}

// startsWorkLocked is mayStart's test, under rt.mu: the runtime is
// neither stopping nor past its lease.
func (rt *Runtime) startsWorkLocked() bool { return !rt.stopped && !rt.expired }

// Idle reports whether no goroutine of the runtime is working: no session
// driver, no executor call, no Watcher batch. Together with a clock that
// has no callback running, it marks a quiescent point (tests use it to
// check invariants between steps without sleeping).
func (rt *Runtime) Idle() bool { return rt.active.Load() == 0 }

// commitCtx is the detached context of a commit: it outlives the caller
// (and a cancelled Execute) but is bounded by CommitTimeout, and ends
// when the runtime halts (its lease lost: halt).
func (rt *Runtime) commitCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rt.life), rt.opts.CommitTimeout)
	stop := context.AfterFunc(rt.haltedCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// halt marks the runtime as committing nothing more, and cancels the
// commits under way: a node that gave its lease up must not wait out
// CommitTimeout on a store it cannot reach (a partition), and what such
// a commit would have written is recovery's to find either way.
func (rt *Runtime) halt() {
	rt.halted.Store(true)
	rt.cancelHalted()
}

// callCtx is the context of one call of callee (an Executor or a
// Builder; nil when there is none): bounded by the runtime's lifetime and
// by CallTimeout, which for a CapacityWaiter runs from when it begins the
// call (BeginCall), not while it waits for an instance.
func (rt *Runtime) callCtx(callee any) (context.Context, context.CancelFunc) {
	return rt.callCtxFrom(rt.life, callee)
}

// callCtxFrom is callCtx within parent instead of the runtime's lifetime.
func (rt *Runtime) callCtxFrom(parent context.Context, callee any) (context.Context, context.CancelFunc) {
	if _, ok := callee.(CapacityWaiter); ok {
		ctx, cancel := context.WithCancel(parent)
		return WithCallTimeout(ctx, rt.opts.CallTimeout), cancel
	}
	return context.WithTimeout(parent, rt.opts.CallTimeout)
}

// runLock serializes the advances of one Run in this process: each one
// loads, decides, commits and performs on a snapshot no other advance of
// this process can make stale. (Other processes are kept out by session
// ownership and fencing.)
type runLock struct {
	// mu is the Run's advance lock: it guards no field, it serializes the
	// advances (and Submit's creation) of one Run. It is the first lock
	// of the runtime's a goroutine takes, and a goroutine holds at most
	// one Run's; see doc.go for what it may take after it.
	mu sync.Mutex
	// refs counts the goroutines that hold or wait for mu; the Runtime's
	// mu guards it (lockRun).
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

// Package runtime drives Runs. It defines the ports the rest of agenthost
// plugs into (Store, Executor, Builder, EventSink, Clock, Observer,
// Tenants) and composes them with the pure loop package into one
// execution service, Runtime.
//
// The package that uses a port defines it: badgerstore implements Store,
// host implements Executor and Builder, and conformance holds the
// in-memory twins for tests (MemStore, FakeClock, scripted executors).
// runtime never imports badgerstore or host.
//
// # How a Run moves
//
// (*Runtime).Submit builds the RunCreated event from the tenant's spec,
// folds it into the zero Run with loop.Apply, and commits it with
// Store.CreateRun; its return is the acknowledgement. The creation names
// this node as its Claimant, so that a store claims a session no one owns
// in the same transaction (CreateResult.Epoch, kept in the session
// table). It then kicks the session: (*Runtime).kick starts one driver
// goroutine per session, which runs (*Runtime).driveSession: claim the
// session for its fencing epoch (unless the creation did), find the head
// Run with Store.ActiveRuns (for a new session whose creation claimed it,
// the Run just created), and advance it.
//
// (*Runtime).advance takes the Run's advance lock, reads the snapshot
// with Store.LoadRun, or takes the one this node last committed while it
// owns the session, or the driver has just read (guessRun, ownedruns: a
// guess its commit checks), and calls (*Runtime).foldActions. foldActions applies the event that prompted the
// advance with loop.Apply, then loops on loop.Decide, turning every action
// that needs no outside answer into an event of the same batch: start,
// plan a model step (calling Builder.Build), dispatch an effect, finish.
// advance commits the batch with Store.Commit, under a command ID,
// expecting the Seq it loaded and carrying the session epoch, in a context
// detached from the caller. A version conflict reloads and plans again; a
// fenced commit is an ownership boundary; a duplicate command decides
// again from what is stored.
//
// Only after the commit does (*Runtime).perform act on it (write-ahead
// dispatch): (*Runtime).callExecutor calls Executor.Start for each dispatched
// attempt, cancels go to (*Runtime).callCancel, and wake-ups go to the
// Watcher, the one timer heap (runtime/internal/watcher) that also carries
// polls of pending attempts and deferred recovery attaches; its due items
// are carried out by (*Runtime).onWatcherFire. perform also adopts an
// executing attempt no goroutine of this process handles: one dispatched
// under another epoch goes to (*Runtime).recoverEffect.
//
// (*Runtime).onReply turns the executor's reply into an outcome.
// (*Runtime).commitSettlement commits it by running advance again with an
// EffectSettled event under loop.SettleCommandID(effect, attempt), the one
// command ID every settler of that attempt uses, so the store applies the
// first and makes every later one a no-op; a commit the store fails is
// retried under that ID (commitOutcome), never the effect. A pending
// reply registers a poll (watcher.NextPollInterval backs it off) and
// commits the handle (recordPending). One table, attempts.Table
// (runtime/internal/attempts), owns what the process does about each
// attempt (calling, watched, settling, settled), with explicit
// transitions; an illegal one panics under the invariants build tag.
//
// perform.go holds the calls (perform, launch, callExecutor, callCancel),
// settle.go the settling of their replies (onReply, commitSettlement,
// recordPending, commitOutcome), and watcherfire.go the carrying out of
// the Watcher's due items (onWatcherFire, runWatchItem). Every advance is
// asked for by one of the constructors of advanceReq in advance.go
// (driveHead, createdHead, settleOutcome, pendingHandle, deferralStart,
// timerFired, outsideInput), which says what prompts it. createdHead's is
// folded ahead of a new session's first Run's creation (firstStep, in
// execute.go) and written with it, by a store that does (FirstStepper).
//
// # Ownership and recovery
//
// Start registers a node incarnation with a lease and renews it every
// LeaseTTL/3. A session is claimed with Store.ClaimSession, which returns
// the epoch that fences every commit of its Runs. When the lease is found
// expired the runtime gives up every session and closes LeaseLost.
// RecoverNow takes over the sessions of dead incarnations; their executing
// effects go through Executor.Attach and recovery.Plan. The watchdog
// (WatchdogScan) reads the store's index of sessions with an active Run
// (Store.ActiveSessions), and reports and re-drives a head Run, in a
// session this node owns, that nothing would move.
//
// # Goroutines and locks
//
// The runtime starts these goroutines, and no others (structure_test.go
// holds this list to the code):
//
//   - Session driver: kick starts one per session at a time, when Submit,
//     an input, Wait, the end of a Run (afterAdvance), a wake-up, recovery,
//     the watchdog or the change feed asks for the session to be driven.
//     It runs driveSession, then the drives queued for its slot
//     (driverslots), and counts as tracked work from its kick. It takes
//     Runs' advance locks (advance), one at a time, and waits for the
//     commit backlog (backlog.Backlog.Wait) holding no lock.
//   - Launched call: perform starts one, through launch and goTracked, for
//     an executor's start, poll or attach (callExecutor), a cancel
//     (callCancel) or recovery's attach (recoverEffect). launch first
//     waits for a call token (Runtime.calls), holding the advance lock of
//     the Run it performs for; the call gives its token back as soon as
//     the executor answers, before it takes any Run's advance lock to
//     commit the answer (commitSettlement, recordPending, recordDeferral),
//     so a launcher waiting for a token never waits on a lock it holds.
//     When that commit obliges another call, perform hands the first one
//     to the committing goroutine (callSlot.handOver) instead of starting
//     one: runCalls makes it once the call before it has returned, and
//     waits for its token there, holding no lock. It makes none once Stop
//     or the loss of the lease has begun (mayStart).
//   - Watcher timer: the Watcher's Clock timer (Watcher.onTimer, armed by
//     Watcher.armLocked) takes the due items out under the Watcher's mu,
//     lets it go, and calls onWatcherFire, which starts the watcher
//     workers and returns.
//   - Watcher worker: onWatcherFire starts, through goTracked, up to
//     MaxConcurrentCalls for each batch; each carries out items of its
//     batch in turn (runWatchItem): a wake-up (an advance), a poll (an
//     executor call, then the commit of its answer, as a launched call's),
//     a deferred attach (recoverEffect) or a model call that waited for
//     its endpoint's budget (callExecutor; runtime/budget.go). It holds no
//     call token.
//   - Lease renewal: renewLease, on the Clock timer armRenewal arms every
//     LeaseTTL/3 (sooner after a failure). It takes Runtime.mu around the
//     store call, never across it, and may call loseLease.
//   - Trust window: trustWindowEnded, on the Clock timer armTrustLocked
//     arms at each good renewal. Once the lease's trust window has passed
//     it calls loseLease, which takes Runtime.mu, lets it go, empties the
//     session table and gives each session up (boundary).
//   - Recovery: the first pass starts through goTracked from Start
//     (startRecovery), the next ones through goTracked from the Clock
//     timer armRecovery arms, every RecoveryInterval. RecoverNow runs up
//     to recoveryClaimWorkers claim goroutines (takeOver), waits for
//     them, and kicks the sessions it took.
//   - Watchdog: the Clock timer armWatchdog arms starts WatchdogScan
//     through goTracked, every WatchdogInterval.
//   - Change-feed callback: a store that is a ChangeFeed calls onChange
//     (joinFeed subscribes it) on a goroutine of the store's. onChange
//     publishes to the Hub and kicks; after a gap in the feed (Rescan) it
//     starts repairScan through goTracked.
//   - Tail reader: a followed Run's tail starts its reader (tail.read) in
//     a goroutine of its own when a notice asks for a read and none runs
//     (tail.request), and runs it on the Clock timer newTail and
//     onFallback arm, at each fallback tick. It holds the tail's mu only
//     between its store reads.
//   - Short-lived helpers: Stop's wait for wg; the Clock timer of sleep
//     (the backoff of commitOutcome and driveSession), which closes a
//     channel; and the goroutine the context package starts, when the
//     runtime halts, for the context.AfterFunc of commitCtx, which cancels
//     one commit's context. None takes a lock of the runtime.
//
// goTracked and kick add to Runtime.wg and to the count behind Idle under
// Runtime.mu, only while the runtime is not stopped (goTracked: nor its
// lease lost), so Stop's wait for wg sees every one of them. A submission
// (submit) adds to Runtime.wg alone, the same way, for the caller's
// goroutine: Stop releases the session claims in the session table only
// once the claims the submissions under way made are in it.
//
// Every mutex of the runtime, what it guards, and what may be taken while
// it is held (each struct says the same at its fields):
//
//   - runLock.mu, a Run's advance lock (lockRun): it guards no field; it
//     serializes the advances of one Run, and Submit's creation of it. No
//     other lock of the runtime is held when it is taken, and a goroutine
//     holds at most one Run's. Under it, advance takes, one at a time,
//     Runtime.mu, sessionTable.mu, attempts.Table.mu,
//     settlequeue.Queue.mu, ownedruns.Cache.mu, backlog.Backlog.mu,
//     watcher.Watcher.mu and
//     Hub.mu (Publish, then a tail.mu), and calls the store, the builder
//     and the Observer, and waits for a call token (launch).
//   - Runtime.mu: the lifecycle flags (started, stopped, expired), the
//     lease's state (leaseFrom, renew, trust, renewing, renewErr),
//     recoveryTimer and watchdogTimer, shared and leaveFeed, waiters,
//     runLocks and each runLock's refs; and it orders wg.Add before
//     Stop's wg.Wait. Under it: sessionTable.mu and driverslots.Slots.mu
//     (kick), and the Clock (AfterFunc, Timer.Stop). It is never held
//     across a call of the store or an executor.
//   - sessionTable.mu: the sessions this process holds, and every field of
//     their sessionState. A leaf.
//   - driverslots.Slots.mu: the free driver slots and the queue of drives.
//     A leaf: no drive runs under it.
//   - backlog.Backlog.mu: the count of commits under way. A leaf: Wait
//     lets it go before it waits.
//   - settlequeue.Queue.mu: the queued settlements and their taken and
//     committed marks. A leaf.
//   - ownedruns.Cache.mu: the snapshots this node committed and the
//     histories its builders were given, of the live Runs of the sessions
//     it owns (guessRun, history, forgetRun, boundary). A leaf.
//   - attempts.Table.mu: every attempt's phase, holds and deferrals, and
//     each Run's busy count. A leaf.
//   - watcher.Watcher.mu: the heap of items, its index, the armed timer and
//     stopped. Under it only the Clock; fire is called without it.
//   - watchdog.mu: the watchdog's suspects. A leaf.
//   - Runtime.budgetWaits: guards no field; it makes a model call's
//     refusal by its endpoint's budget and the Watcher's item for it one
//     step for the wake-ups of the budget's waiters (admitModelCall,
//     wakeBudgetWaiter), which would otherwise forget a waiter whose
//     item is not yet there. Taken holding no lock; under it,
//     budget.Budget.mu, attempts.Table.mu and watcher.Watcher.mu, one at
//     a time.
//   - budget.Budget.mu (internal/budget): a model budget's calls in
//     flight, the calls that ended within its window, its token
//     allowance and its waiting calls. A leaf; the runtime takes it
//     holding no lock but budgetWaits (callExecutor, modelCallDone,
//     shareModelBudgets, BudgetWait).
//   - instanceWaits.mu: the executor calls waiting for a plugin instance.
//     A leaf; the plugin host takes it through the call's context
//     (CapacityWaitBegan), holding no lock of the runtime.
//   - Hub.mu: the subscriptions, the tails and the follower counts. Under
//     it, a tail.mu (Publish, follow, leave). Publish takes it from an
//     advance, from onChange, and from the plugin host's Emit.
//   - tail.mu: a tail's state and the fields of its followers marked so.
//     Under it only the Clock and the start of the reader's goroutine.
//   - RecoverNow's mu: the claims the store failed in one pass (unsure).
//     A leaf.
//
// The lock order is therefore: a Run's advance lock; Runtime.mu;
// sessionTable.mu or driverslots.Slots.mu; and the leaves, which are
// never held while another lock is taken. Hub.mu comes before tail.mu,
// and both after a Run's advance lock. The Clock's own lock (the
// FakeClock's, in tests) comes last: a Clock runs no callback under it.
//
// docs/DESIGN.md §5 walks through all of this with every function named,
// §6 covers recovery and the watchdog, and §11 lists the invariants with
// the tests that prove them.
package runtime

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
// Store.CreateRun; its return is the acknowledgement. It then kicks the
// session: (*Runtime).kick starts one driver goroutine per session, which
// runs (*Runtime).driveSession: claim the session for its fencing epoch,
// find the head Run with Store.ActiveRuns, and advance it.
//
// (*Runtime).advance takes the Run's advance lock, reloads the snapshot
// with Store.LoadRun (the runtime keeps no Run state between advances),
// and calls (*Runtime).foldActions. foldActions applies the event that prompted the
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
// watcher, the one timer heap (newWatcher) that also carries polls of
// pending attempts and deferred recovery attaches. perform also adopts an
// executing attempt no goroutine of this process handles: one dispatched
// under another epoch goes to (*Runtime).recoverEffect.
//
// (*Runtime).onReply turns the executor's reply into an outcome.
// (*Runtime).commitSettlement commits it by running advance again with an
// EffectSettled event under loop.SettleCommandID(effect, attempt), the one
// command ID every settler of that attempt uses, so the store applies the
// first and makes every later one a no-op; a commit the store fails is
// retried under that ID (commitOutcome), never the effect. A pending
// reply registers a poll (nextPollInterval backs it off) and commits the
// handle (recordPending). One type, attempts, owns what the process does
// about each attempt (calling, watched, settling, settled), with explicit
// transitions; an illegal one panics under the invariants build tag.
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
// docs/DESIGN.md §5 walks through all of this with every function named,
// §6 covers recovery and the watchdog, and §11 lists the invariants with
// the tests that prove them.
package runtime

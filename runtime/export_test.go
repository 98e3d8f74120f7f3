package runtime

import (
	"strconv"

	"github.com/agenthost/agenthost/loop"
)

// RunLockRefs returns how many goroutines hold or wait for a Run's
// advance lock.
func RunLockRefs(rt *Runtime, tenant, runID string) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if l := rt.runLocks[runKey(tenant, runID)]; l != nil {
		return l.refs
	}
	return 0
}

// SessionsHeld returns how many sessions the runtime holds state for.
func SessionsHeld(rt *Runtime) int { return rt.sessions.len() }

// Stopping reports whether Stop (or Halt) has begun.
func Stopping(rt *Runtime) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.stopped
}

// TrackedAttempts returns how many effect attempts the runtime holds
// bookkeeping for (in flight, watched, or settled tombstones).
func TrackedAttempts(rt *Runtime) int {
	return rt.attempts.Len()
}

// SetWatcherFireHook sets a function rt's onWatcherFire calls once it has
// started its first worker, before the rest of the batch is handed out
// (nil: none).
func SetWatcherFireHook(rt *Runtime, f func()) {
	if f == nil {
		rt.watcherFireHook.Store(nil)
		return
	}
	rt.watcherFireHook.Store(&f)
}

// ActiveWork returns how many goroutines of the runtime are doing its
// work: Idle is ActiveWork() == 0.
func ActiveWork(rt *Runtime) int64 { return rt.active.Load() }

// DriversWaiting returns how many session drivers wait for a driver slot:
// a driver kicked while every slot is taken waits from its kick on, also
// after its session was given up.
func DriversWaiting(rt *Runtime) int { return rt.drivers.Waiting() }

// Stuck is the watchdog's judgement of a session's head Run: not
// terminal, and nothing in this process will move it on.
func Stuck(rt *Runtime, run loop.Run) bool { return rt.stuck(run) }

// WakeArmed reports whether the watcher holds the wake-up perform
// schedules for a Run's loop.ActionWakeAt at atMS.
func WakeArmed(rt *Runtime, tenant, runID string, atMS int64) bool {
	return rt.watcher.Scheduled("wake/" + tenant + "/" + runID + "/" + strconv.FormatInt(atMS, 10))
}

// TrackedKeys lists the attempts the runtime tracks, each with its phase
// and holds, for failure messages.
func TrackedKeys(rt *Runtime) []string { return rt.attempts.Describe() }

// QueuedSettlements returns how many settlements wait in the settlement
// queue for their commit.
func QueuedSettlements(rt *Runtime) int { return rt.settles.Len() }

// SetGuessHook sets a function rt's advances call with each snapshot
// they may take as a guess instead of loading the Run (guessRun), under
// the Run's advance lock; when it returns false the advance loads the Run
// (nil: none, every guess is taken).
func SetGuessHook(rt *Runtime, f func(loop.Run) bool) {
	if f == nil {
		rt.guessHook.Store(nil)
		return
	}
	rt.guessHook.Store(&f)
}

// OwnedRuns returns how many Runs the runtime keeps a committed snapshot
// or a history of (ownedruns).
func OwnedRuns(rt *Runtime) int { return rt.owned.Len() }

// SetReportHook sets a function rt's advances hand their report of the
// Run (what they tell its waiters) once its lock is let go: the hook runs
// report when it likes, so that a test can make a report come after a
// later advance's (nil: none, each advance reports at once).
func SetReportHook(rt *Runtime, f func(run loop.Run, report func())) {
	if f == nil {
		rt.reportHook.Store(nil)
		return
	}
	rt.reportHook.Store(&f)
}

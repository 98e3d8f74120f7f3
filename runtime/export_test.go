package runtime

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
func SessionsHeld(rt *Runtime) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.sessions)
}

// The watcher, for its own tests.
type (
	Watcher   = watcher
	WatchItem = watchItem
)

// NewWatcher is newWatcher.
func NewWatcher(clock Clock, fire func(batch []WatchItem)) *Watcher { return newWatcher(clock, fire) }

// Stopping reports whether Stop (or Halt) has begun.
func Stopping(rt *Runtime) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.stopped
}

// TrackedAttempts returns how many effect attempts the runtime holds
// bookkeeping for (in flight, watched, or settled tombstones).
func TrackedAttempts(rt *Runtime) int {
	return rt.attempts.len()
}

// SetWatcherFireHook sets a function onWatcherFire calls once it has
// started its first worker, before the rest of the batch is handed out.
func SetWatcherFireHook(f func()) { testHookWatcherFire = f }

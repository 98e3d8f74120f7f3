package runtime

import (
	"time"

	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// Clock is the runtime's source of time. Every instant the runtime writes
// into an event, and every timer the Watcher arms, comes from it, so a test
// can drive time with conformance.FakeClock.
//
// Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed, and
	// returns a Timer that can stop it. d <= 0 fires as soon as possible.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started, and reports whether it
	// did.
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

var _ Clock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// watcherClock hands the Watcher the runtime's Clock: the same Clock, its
// timers seen as the watcher package's Timer.
type watcherClock struct{ Clock }

func (c watcherClock) AfterFunc(d time.Duration, f func()) watcher.Timer {
	return c.Clock.AfterFunc(d, f)
}

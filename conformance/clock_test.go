package conformance

import (
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFakeClockFiresOnlyWhenAdvancedPastTheInstant(t *testing.T) {
	c := NewFakeClock(time.Time{})
	var fired atomic.Int32
	c.AfterFunc(10*time.Second, func() { fired.Add(1) })
	c.Advance(9 * time.Second)
	if c.Pending() != 1 {
		t.Fatalf("timer fired early: pending=%d", c.Pending())
	}
	c.Advance(time.Second)
	waitFor(t, "timer to fire", func() bool { return fired.Load() == 1 })
	if c.Pending() != 0 {
		t.Fatalf("pending=%d after firing", c.Pending())
	}
}

func TestFakeClockStopDisarms(t *testing.T) {
	c := NewFakeClock(time.Time{})
	var fired atomic.Int32
	tm := c.AfterFunc(time.Second, func() { fired.Add(1) })
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer must report true")
	}
	if tm.Stop() {
		t.Fatal("second Stop must report false")
	}
	c.Advance(time.Hour)
	if c.Pending() != 0 || fired.Load() != 0 {
		t.Fatal("a stopped timer fired")
	}
}

func TestFakeClockNeverGoesBackwards(t *testing.T) {
	c := NewFakeClock(time.Time{})
	start := c.Now()
	c.Set(start.Add(-time.Hour))
	if !c.Now().Equal(start) {
		t.Fatalf("Set moved the clock backwards to %v", c.Now())
	}
	if at, ok := c.NextAt(); ok {
		t.Fatalf("NextAt=%v with no timers", at)
	}
}

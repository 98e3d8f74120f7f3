package runtime_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime"
)

// stopWhileSubscribing is a shared store whose SubscribeChanges lets the
// test stop the runtime between the subscription and Start's record of
// it, and counts the subscriptions still open.
type stopWhileSubscribing struct {
	*conformance.MemHandle
	during func()
	open   atomic.Int32
}

func (s *stopWhileSubscribing) SubscribeChanges(fn func(runtime.Change)) func() {
	cancel := s.MemHandle.SubscribeChanges(fn)
	s.open.Add(1)
	s.during()
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			s.open.Add(-1)
			cancel()
		}
	}
}

// A runtime halted while Start subscribes to the change feed ends that
// subscription: nothing of a stopped runtime keeps listening to the
// other nodes' commits.
func TestAStopDuringStartEndsTheFeedSubscription(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	mem := conformance.NewMemStore(clock, conformance.KVLimits{})
	store := &stopWhileSubscribing{MemHandle: mem.Handle()}
	defer store.Close()
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{}, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	store.during = rt.Halt
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := store.open.Load(); n != 0 {
		t.Fatalf("%d change-feed subscription(s) still open after the runtime stopped", n)
	}
}

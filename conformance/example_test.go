package conformance_test

import (
	"context"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime"
)

// A store is held to the Store port's contract by one test in its own
// package that hands StoreSuite a constructor. The suite calls it once
// for every case, and closes the store it gets. The store must read the
// clock it is given (the suite moves it to expire node leases) and
// enforce the KV limits it is given.
//
// This example is compiled but not run: StoreSuite needs the *testing.T of
// a test. TestMemStoreConformance runs this wiring for MemStore, and
// badgerstore's TestStoreConformance and pgstore's run it for theirs.
func ExampleStoreSuite() {
	// In a _test.go file of the store's package:
	testStoreConformance := func(t *testing.T) {
		conformance.StoreSuite(t, func(t *testing.T, cfg conformance.StoreConfig) runtime.Store {
			// A new, empty store on cfg.Clock with cfg.KV's limits; a store
			// on disk would open one in t.TempDir().
			return conformance.NewMemStore(cfg.Clock, cfg.KV)
		})
	}
	_ = testStoreConformance
}

// A FakeClock moves only when it is told to, and then fires the timers
// the move passes. Here it is the clock of a MemStore, as StoreConfig.Clock
// is the clock of a store under StoreSuite: a node's lease holds while a
// timer renews it, and once the clock passes the lease, another node takes
// the node's session over at a higher epoch (which fences every commit of
// the old owner).
func ExampleFakeClock() {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Time{}) // 2026-01-01 00:00:00 UTC
	store := conformance.NewMemStore(clock, conformance.KVLimits{})
	defer store.Close()

	const lease = 10 * time.Second
	nowMS := func() int64 { return clock.Now().UnixMilli() }
	if err := store.RegisterNode(ctx, "node-a", nowMS()+lease.Milliseconds()); err != nil {
		log.Fatal(err)
	}
	epoch, err := store.ClaimSession(ctx, "acme", "chat-1", "node-a", nowMS())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("node-a claims chat-1 at epoch", epoch)

	// node-a renews its lease from a timer, as the runtime does. The
	// callback runs in its own goroutine: wait for what it reports.
	renewed := make(chan string)
	renew := func() {
		err := store.RenewNode(ctx, "node-a", nowMS()+lease.Milliseconds())
		renewed <- fmt.Sprintf("%s node-a renews its lease: %v", clock.Now().Format(time.TimeOnly), err)
	}
	clock.AfterFunc(lease/2, renew)
	clock.Advance(lease / 2)
	fmt.Println(<-renewed)

	// The next renewal comes too late: the lease ran out at 00:00:15.
	clock.AfterFunc(4*lease, renew)
	clock.Advance(4 * lease)
	fmt.Println(<-renewed)

	if err := store.RegisterNode(ctx, "node-b", nowMS()+lease.Milliseconds()); err != nil {
		log.Fatal(err)
	}
	if epoch, err = store.ClaimSession(ctx, "acme", "chat-1", "node-b", nowMS()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("node-b claims chat-1 at epoch", epoch)

	// Output:
	// node-a claims chat-1 at epoch 1
	// 00:00:05 node-a renews its lease: <nil>
	// 00:00:45 node-a renews its lease: memstore: renew node node-a: runtime: node incarnation expired
	// node-b claims chat-1 at epoch 2
}

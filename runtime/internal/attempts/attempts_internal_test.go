package attempts

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// mustRefuse calls f, which must report an illegal transition: an error,
// or a panic under the invariants build tag.
func mustRefuse(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		err = f()
	}()
	if err == nil {
		t.Fatalf("%s was allowed; it is an illegal transition", what)
	}
}

func TestAttemptLifecycle(t *testing.T) {
	a := New()
	const key, prefix = "acme/s1/run_1.t1.0#1", "acme/s1/run_1."
	if err := a.Reserve(key); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, "reserving a reserved attempt", func() error { return a.Reserve(key) })
	if a.BeginCall(key) {
		t.Fatal("a reserved attempt was called a second time")
	}
	if watched, err := a.Watch(key); !watched || err != nil {
		t.Fatalf("watch: %v %v", watched, err)
	}
	if a.BusyRun(prefix) != 1 {
		t.Fatalf("busy %d while the pending record is being committed", a.BusyRun(prefix))
	}
	if err := a.Release(key); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, "releasing a hold nobody took", func() error { return a.Release(key) })
	if a.BusyRun(prefix) != 0 || !a.Handled(key) {
		t.Fatalf("watched: busy %d, handled %v", a.BusyRun(prefix), a.Handled(key))
	}
	if !a.TakeWatched(key) || a.TakeWatched(key) {
		t.Fatal("a due poll must take a watched attempt exactly once")
	}
	if ok, err := a.Settling(key); !ok || err != nil {
		t.Fatalf("settling: %v %v", ok, err)
	}
	if _, ok := a.BeginCancel(key); ok {
		t.Fatal("an attempt whose settlement is being committed was cancelled")
	}
	if err := a.SettledDurably(key, false); err != nil {
		t.Fatal(err)
	}
	if a.Handled(key) || a.BeginCall(key) || a.BusyRun(prefix) != 0 {
		t.Fatal("a settled attempt must never be called again")
	}
	mustRefuse(t, "settling a settled attempt without a hold", func() error { _, err := a.Settling(key); return err })
	a.ForgetRun(prefix)
	if a.Len() != 0 {
		t.Fatalf("%d entries after the Run ended", a.Len())
	}
}

// A reply that comes after its Run ended leaves nothing behind.
func TestAttemptOfAnEndedRunGoesWithItsLastWork(t *testing.T) {
	a := New()
	const key, prefix = "acme/s1/run_1.t1.0#1", "acme/s1/run_1."
	if !a.BeginCall(key) {
		t.Fatal("beginCall")
	}
	if _, ok := a.BeginCancel(key); !ok {
		t.Fatal("beginCancel")
	}
	if ok, _ := a.Settling(key); !ok {
		t.Fatal("settling the cancel")
	}
	if err := a.SettledDurably(key, true); err != nil { // the cancel ends the Run
		t.Fatal(err)
	}
	a.ForgetRun(prefix)
	if a.Len() != 1 || a.BusyRun(prefix) != 1 {
		t.Fatalf("the start call still runs: entries %d, busy %d", a.Len(), a.BusyRun(prefix))
	}
	if ok, err := a.Settling(key); ok || err != nil { // the late start reply
		t.Fatalf("a late reply on a settled attempt: %v %v", ok, err)
	}
	if err := a.SettledDurably(key, false); err != nil {
		t.Fatal(err)
	}
	if a.Len() != 0 || a.BusyRun(prefix) != 0 || len(a.ended) != 0 {
		t.Fatalf("after the late reply: entries %d, busy %d, ended %v", a.Len(), a.BusyRun(prefix), a.ended)
	}
}

// A cancel that runs beside a call keeps the attempt from being watched:
// the cancel's reply settles it.
func TestAPendingReplyDuringACancelIsNotWatched(t *testing.T) {
	a := New()
	const key = "acme/s1/run_1.t1.0#1"
	a.BeginCall(key)
	a.BeginCancel(key)
	if watched, err := a.Watch(key); watched || err != nil {
		t.Fatalf("watch during a cancel: %v %v", watched, err)
	}
	// The cancel settles it; then the call's pending reply comes.
	if ok, _ := a.Settling(key); !ok {
		t.Fatal("settling the cancel")
	}
	if err := a.SettledDurably(key, false); err != nil {
		t.Fatal(err)
	}
	if watched, err := a.Watch(key); watched || err != nil {
		t.Fatalf("watch of a settled attempt: %v %v", watched, err)
	}
	if err := a.Release(key); err != nil {
		t.Fatal(err)
	}
}

// Seeded random sequences of transitions: whatever is allowed, the busy
// count of a Run always equals the holds of its entries and is never
// negative, and the index holds exactly the entries.
func TestAttemptsBookkeepingStaysConsistent(t *testing.T) {
	keys := []string{"acme/s1/r1.t1.0#1", "acme/s1/r1.t1.1#1", "acme/s1/r10.m1#1", "acme/s10/r1.m1#2"}
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed))
		a := New()
		for step := 0; step < 200; step++ {
			key := keys[rng.IntN(len(keys))]
			func() {
				defer func() { _ = recover() }() // illegal transitions panic under the invariants tag
				switch rng.IntN(11) {
				case 0:
					_ = a.Reserve(key)
				case 1:
					a.BeginCall(key)
				case 2:
					a.BeginCancel(key)
				case 3:
					_, _ = a.Watch(key)
				case 4:
					a.TakeWatched(key)
				case 5:
					_ = a.Release(key)
				case 6:
					_, _ = a.Settling(key)
				case 7:
					_ = a.SettledDurably(key, rng.IntN(2) == 0)
				case 8:
					_ = a.Abandon(key)
				case 9:
					a.ForgetRun(runPrefix(key))
				case 10:
					a.Forget(key)
				}
			}()
			sums := map[string]int{}
			for k, e := range a.byKey {
				if e.holds < 0 {
					t.Fatalf("seed %d step %d: %s has %d holds", seed, step, k, e.holds)
				}
				sums[runPrefix(k)] += e.holds
				if _, ok := a.byRun[runPrefix(k)][k]; !ok {
					t.Fatalf("seed %d step %d: %s is missing from the index", seed, step, k)
				}
			}
			for p, n := range a.busy {
				if n <= 0 || sums[p] != n {
					t.Fatalf("seed %d step %d: busy[%s] = %d, holds sum to %d", seed, step, p, n, sums[p])
				}
			}
			for p, ks := range a.byRun {
				for k := range ks {
					if a.byKey[k] == nil || runPrefix(k) != p {
						t.Fatalf("seed %d step %d: the index holds %s under %s", seed, step, k, p)
					}
				}
			}
		}
	}
}

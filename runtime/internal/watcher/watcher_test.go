package watcher_test

import (
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime/internal/watcher"
)

// fakeClock hands a Watcher the tests' conformance.FakeClock, as the
// runtime hands it its Clock.
type fakeClock struct{ *conformance.FakeClock }

func (c fakeClock) AfterFunc(d time.Duration, f func()) watcher.Timer {
	return c.FakeClock.AfterFunc(d, f)
}

type batches struct {
	mu  sync.Mutex
	got [][]watcher.Item
}

func (b *batches) fire(batch []watcher.Item) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, batch)
}

func (b *batches) keys() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ks []string
	for _, batch := range b.got {
		for _, it := range batch {
			ks = append(ks, it.Key)
		}
	}
	return ks
}

func (b *batches) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

func TestWatcherFiresWhatFallsDueTogetherInOneBatch(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := watcher.New(fakeClock{clock}, b.fire)
	now := clock.Now()
	w.Schedule(watcher.Item{Key: "b", At: now.Add(2 * time.Second)})
	w.Schedule(watcher.Item{Key: "a", At: now.Add(time.Second)})
	w.Schedule(watcher.Item{Key: "late", At: now.Add(time.Hour)})
	if clock.Pending() != 1 {
		t.Fatalf("the watcher armed %d timers, want one for the earliest item", clock.Pending())
	}
	clock.Advance(3 * time.Second)
	conformance.Eventually(t, "a batch", func() bool { return b.count() == 1 })
	if got := strings.Join(b.keys(), ","); got != "a,b" {
		t.Fatalf("batch %q, want a,b in instant order", got)
	}
	if w.Len() != 1 {
		t.Fatalf("len %d after the batch, want 1 (late)", w.Len())
	}
	clock.Advance(time.Hour)
	conformance.Eventually(t, "the late batch", func() bool { return b.count() == 2 })
	if got := strings.Join(b.keys(), ","); got != "a,b,late" {
		t.Fatalf("batches %q, want a,b then late", got)
	}
}

func TestWatcherReplacesByKeyAndCancels(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := watcher.New(fakeClock{clock}, b.fire)
	now := clock.Now()
	w.Schedule(watcher.Item{Key: "x", At: now.Add(time.Second)})
	w.Schedule(watcher.Item{Key: "x", At: now.Add(10 * time.Second)})
	w.Schedule(watcher.Item{Key: "gone", At: now.Add(time.Second)})
	w.Cancel("gone")
	clock.Advance(5 * time.Second)
	if w.Len() != 1 {
		t.Fatalf("len %d, want the rescheduled x only", w.Len())
	}
	clock.Advance(5 * time.Second)
	conformance.Eventually(t, "x to fire", func() bool { return b.count() == 1 })
	if got := strings.Join(b.keys(), ","); got != "x" {
		t.Fatalf("fired %q", got)
	}
}

// TestHastenMakesAnItemDueEarlierOnly: Hasten moves a registered item
// earlier and re-arms the timer for it, keeps its other fields, and
// leaves alone an item already due sooner, or one not registered.
func TestHastenMakesAnItemDueEarlierOnly(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := watcher.New(fakeClock{clock}, b.fire)
	now := clock.Now()
	w.Schedule(watcher.Item{Key: "poll", At: now.Add(30 * time.Second), Interval: 30 * time.Second, Handle: "h"})
	w.Schedule(watcher.Item{Key: "soon", At: now.Add(time.Second)})
	if w.Hasten("soon", now.Add(2*time.Second)) || w.Hasten("nobody", now) {
		t.Fatal("Hasten moved an item later, or one not registered")
	}
	if !w.Hasten("poll", now.Add(time.Second)) {
		t.Fatal("Hasten did not move the poll earlier")
	}
	clock.Advance(time.Second)
	conformance.Eventually(t, "both to fire", func() bool { return len(b.keys()) == 2 })
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, it := range b.got[0] {
		if it.Key == "poll" && (it.Interval != 30*time.Second || it.Handle != "h") {
			t.Fatalf("the hastened item lost its fields: %+v", it)
		}
	}
}

func TestWatcherStopDropsEveryRegistration(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	var b batches
	w := watcher.New(fakeClock{clock}, b.fire)
	for i := 0; i < 100; i++ {
		w.Schedule(watcher.Item{Key: fmt.Sprint(i), At: clock.Now().Add(time.Duration(i+1) * time.Second)})
	}
	w.Stop()
	if w.Len() != 0 || clock.Pending() != 0 {
		t.Fatalf("after Stop: len %d, armed timers %d", w.Len(), clock.Pending())
	}
	if w.Schedule(watcher.Item{Key: "new", At: clock.Now()}) {
		t.Fatal("a stopped watcher accepted a registration")
	}
	clock.Advance(time.Hour)
	if b.count() != 0 {
		t.Fatal("a stopped watcher fired")
	}
}

// TestWatcherHammer schedules, replaces and cancels from many goroutines
// while time moves and near items fire, and checks that every far item
// that was not cancelled fires exactly once, and no cancelled one fires.
func TestWatcherHammer(t *testing.T) {
	clock := conformance.NewFakeClock(time.Time{})
	start := clock.Now()
	var mu sync.Mutex
	fired := map[string]int{}
	w := watcher.New(fakeClock{clock}, func(batch []watcher.Item) {
		mu.Lock()
		defer mu.Unlock()
		for _, it := range batch {
			fired[it.Key]++
		}
	})
	var wg sync.WaitGroup
	kept := make([][]string, 8)
	cancelled := make([][]string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			far := func() time.Time { return start.Add(time.Hour + time.Duration(rng.Intn(3600))*time.Second) }
			for i := 0; i < 500; i++ {
				// A near item fires while the hammer runs.
				near := fmt.Sprintf("near-g%d-%d", g, i)
				w.Schedule(watcher.Item{Key: near, At: clock.Now().Add(time.Duration(rng.Intn(50)+1) * time.Millisecond)})
				kept[g] = append(kept[g], near)
				key := fmt.Sprintf("far-g%d-%d", g, i)
				w.Schedule(watcher.Item{Key: key, At: far()})
				switch rng.Intn(3) {
				case 0:
					w.Cancel(key)
					cancelled[g] = append(cancelled[g], key)
					continue
				case 1:
					w.Schedule(watcher.Item{Key: key, At: far()})
				}
				kept[g] = append(kept[g], key)
			}
		}(g)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
			clock.Advance(7 * time.Millisecond)
		}
	}
	if clock.Now().Sub(start) >= time.Hour {
		t.Fatal("the hammer ran so long that far items fell due; raise their distance")
	}
	clock.Advance(3 * time.Hour)
	want := 0
	for _, k := range kept {
		want += len(k)
	}
	conformance.Eventually(t, "every kept item to fire", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fired) >= want
	})
	mu.Lock()
	defer mu.Unlock()
	for _, k := range kept {
		for _, key := range k {
			if fired[key] != 1 {
				t.Fatalf("%s fired %d times", key, fired[key])
			}
		}
	}
	for _, k := range cancelled {
		for _, key := range k {
			if fired[key] != 0 {
				t.Fatalf("cancelled %s fired", key)
			}
		}
	}
	if w.Len() != 0 {
		t.Fatalf("%d items left", w.Len())
	}
}

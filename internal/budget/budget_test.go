package budget

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestRequestsPerMinuteAdmitsAtMostRInAnyMinute(t *testing.T) {
	b := New("m", Limits{RequestsPerMinute: 3})
	for i := range 3 {
		if ok, _ := b.Admit("k", t0.Add(time.Duration(i)*time.Second)); !ok {
			t.Fatalf("call %d refused within the budget", i)
		}
		b.Done(t0.Add(time.Duration(i)*time.Second), 0)
	}
	ok, at := b.Admit("k", t0.Add(10*time.Second))
	if ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("4th call in the minute: admitted %v, retry at %v; want refused until %v", ok, at, t0.Add(time.Minute))
	}
	if ok, _ := b.Admit("k", t0.Add(time.Minute-time.Millisecond)); ok {
		t.Fatal("admitted before the first call left the window")
	}
	if ok, _ := b.Admit("k", t0.Add(time.Minute)); !ok {
		t.Fatal("refused once the first call left the window")
	}
	if b.Waits() != 1 || b.WaitedSeconds() != 50 {
		t.Fatalf("waits %d, waited %vs; want 1 and 50s", b.Waits(), b.WaitedSeconds())
	}
}

func TestTokensPerMinuteRefusesWhileInDebt(t *testing.T) {
	b := New("m", Limits{TokensPerMinute: 600})
	if ok, _ := b.Admit("a", t0); !ok {
		t.Fatal("first call refused")
	}
	b.Done(t0, 900) // 300 tokens in debt: half a minute at 600/min
	ok, at := b.Admit("b", t0)
	if ok {
		t.Fatal("admitted in debt")
	}
	if want := t0.Add(30*time.Second + time.Millisecond); !at.Equal(want) {
		t.Fatalf("retry at %v, want %v", at, want)
	}
	if ok, _ := b.Admit("b", t0.Add(29*time.Second)); ok {
		t.Fatal("admitted still in debt")
	}
	if ok, _ := b.Admit("b", at); !ok {
		t.Fatal("refused once out of debt")
	}
}

func TestConcurrencyWakesTheLongestWaiter(t *testing.T) {
	b := New("m", Limits{MaxConcurrentCalls: 1})
	if ok, _ := b.Admit("a", t0); !ok {
		t.Fatal("first call refused")
	}
	ok, at := b.Admit("b", t0.Add(time.Second))
	if ok || !at.IsZero() {
		t.Fatalf("second call: admitted %v, retry at %v; want refused until a call ends (zero time)", ok, at)
	}
	if ok, _ := b.Admit("c", t0.Add(2*time.Second)); ok {
		t.Fatal("third call admitted")
	}
	if w, ok := b.Waiting("b"); !ok || !w.Since.Equal(t0.Add(time.Second)) {
		t.Fatalf("b's wait: %+v %v", w, ok)
	}
	b.Done(t0.Add(3*time.Second), 0)
	if next := b.LongestWaiter(); next != "b" {
		t.Fatalf("Done woke %q, want b (the longest waiter)", next)
	}
	if ok, _ := b.Admit("b", t0.Add(3*time.Second)); !ok {
		t.Fatal("b refused after a call ended")
	}
	if _, ok := b.Waiting("b"); ok {
		t.Fatal("b still waiting once admitted")
	}
	b.Forget("c", t0.Add(4*time.Second))
	if next := b.LongestWaiter(); next != "" {
		t.Fatalf("Done woke %q after c was forgotten", next)
	}
}

func TestCloseUntilRefusesEveryCall(t *testing.T) {
	b := New("m", Limits{})
	b.CloseUntil(t0.Add(20 * time.Second))
	b.CloseUntil(t0.Add(5 * time.Second)) // an earlier time does not reopen it
	for _, k := range []string{"a", "b"} {
		ok, at := b.Admit(k, t0)
		if ok || !at.Equal(t0.Add(20*time.Second)) {
			t.Fatalf("%s: admitted %v, retry at %v; want refused until +20s", k, ok, at)
		}
	}
	if ok, _ := b.Admit("a", t0.Add(20*time.Second)); !ok {
		t.Fatal("refused once the endpoint reopened")
	}
}

func TestSetNodesDividesTheBudget(t *testing.T) {
	b := New("m", Limits{MaxConcurrentCalls: 4, RequestsPerMinute: 9, TokensPerMinute: 3000})
	b.SetNodes(3)
	if got, want := b.Share(), (Limits{MaxConcurrentCalls: 1, RequestsPerMinute: 3, TokensPerMinute: 1000}); got != want {
		t.Fatalf("share of 3 nodes %+v, want %+v", got, want)
	}
	for i := range 3 {
		if ok, _ := b.Admit("k", t0); !ok {
			t.Fatalf("call %d refused", i)
		}
		b.Done(t0, 0)
	}
	if ok, _ := b.Admit("k", t0); ok {
		t.Fatal("a 4th call in the minute admitted on a third of 9 per minute")
	}
	b.SetNodes(10)
	if got, want := b.Share(), (Limits{MaxConcurrentCalls: 1, RequestsPerMinute: 1, TokensPerMinute: 300}); got != want {
		t.Fatalf("share of 10 nodes %+v, want %+v (at least 1 each)", got, want)
	}
	b.SetNodes(0)
	if got := b.Share(); got != b.Limits {
		t.Fatalf("share of no node counted %+v, want the whole budget", got)
	}
}

// TestACallCountsUntilAWindowAfterItEnds: a call counts against
// requests_per_minute while in flight and for a minute after it ends, so
// a call that began long before the next is not let out of the window
// by its start.
func TestACallCountsUntilAWindowAfterItEnds(t *testing.T) {
	b := New("m", Limits{RequestsPerMinute: 2})
	for _, k := range []string{"a", "b"} {
		if ok, _ := b.Admit(k, t0); !ok {
			t.Fatalf("%s refused within the budget", k)
		}
	}
	if ok, at := b.Admit("c", t0.Add(time.Second)); ok || !at.Equal(t0.Add(61*time.Second)) {
		t.Fatalf("c with two calls in flight: admitted %v, retry at %v; want refused for at least a minute (+61s)", ok, at)
	}
	b.Done(t0.Add(30*time.Second), 0)
	if ok, at := b.Admit("c", t0.Add(70*time.Second)); ok || !at.Equal(t0.Add(90*time.Second)) {
		t.Fatalf("c a minute after a and b began: admitted %v, retry at %v; want refused until a minute after a ended (+90s)", ok, at)
	}
	b.Done(t0.Add(80*time.Second), 0)
	if ok, _ := b.Admit("c", t0.Add(90*time.Second)); !ok {
		t.Fatal("c refused once a's minute was up")
	}
	if ok, at := b.Admit("d", t0.Add(90*time.Second)); ok || !at.Equal(t0.Add(140*time.Second)) {
		t.Fatalf("d: admitted %v, retry at %v; want refused until a minute after b ended (+140s)", ok, at)
	}
}

// TestWindowScalesRequestsPerMinute: requests_per_minute 360 over a
// window of 5s admits 30 calls in any 5 s, and a node of three 10.
func TestWindowScalesRequestsPerMinute(t *testing.T) {
	b := New("m", Limits{RequestsPerMinute: 360, Window: 5 * time.Second})
	if got := b.Share().RequestsPerWindow(); got != 30 {
		t.Fatalf("%d calls a window, want 30", got)
	}
	b.SetNodes(3)
	if got := b.Share(); got.RequestsPerWindow() != 10 || got.Window != 5*time.Second {
		t.Fatalf("share of 3 nodes %+v (%d a window), want 120 a minute over 5s windows (10 a window)", got, got.RequestsPerWindow())
	}
	for i := range 10 {
		if ok, _ := b.Admit("k", t0); !ok {
			t.Fatalf("call %d refused", i)
		}
		b.Done(t0.Add(time.Second), 0)
	}
	if ok, at := b.Admit("k", t0.Add(2*time.Second)); ok || !at.Equal(t0.Add(6*time.Second)) {
		t.Fatalf("11th call: admitted %v, retry at %v; want refused until +6s", ok, at)
	}
	if ok, _ := b.Admit("k", t0.Add(6*time.Second)); !ok {
		t.Fatal("refused once the window passed")
	}
	if got := (Limits{RequestsPerMinute: 5, Window: time.Second}).RequestsPerWindow(); got != 1 {
		t.Fatalf("5 a minute over 1s windows allow %d a window, want at least 1", got)
	}
}

// TestTheProviderNeverSeesMoreThanTheWindowAllows: calls of random
// lengths, asked for at random times, each reaching the provider at a
// random moment between its start and its end; in no window does the
// provider see more requests than the budget allows.
func TestTheProviderNeverSeesMoreThanTheWindowAllows(t *testing.T) {
	const k = 4
	w := 10 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	b := New("m", Limits{RequestsPerMinute: k * 6, Window: w})
	type call struct{ start, end time.Time }
	var inFlight []call
	var arrivals []time.Time
	now := t0
	for i := range 2000 {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		// End the calls due by now, in order of their ends.
		slices.SortFunc(inFlight, func(a, b call) int { return a.end.Compare(b.end) })
		for len(inFlight) > 0 && !inFlight[0].end.After(now) {
			c := inFlight[0]
			inFlight = inFlight[1:]
			b.Done(c.end, 0)
			arrivals = append(arrivals, c.start.Add(time.Duration(rng.Int64N(int64(c.end.Sub(c.start))+1))))
		}
		if ok, _ := b.Admit(fmt.Sprint(i), now); ok {
			inFlight = append(inFlight, call{start: now, end: now.Add(time.Duration(rng.IntN(15_000)) * time.Millisecond)})
		} else {
			b.Forget(fmt.Sprint(i), now)
		}
	}
	slices.SortFunc(arrivals, time.Time.Compare)
	if len(arrivals) < 300 {
		t.Fatalf("only %d calls made it: the test exercised little", len(arrivals))
	}
	for i := range arrivals {
		j := i
		for j < len(arrivals) && arrivals[j].Sub(arrivals[i]) < w {
			j++
		}
		if j-i > k {
			t.Fatalf("the provider saw %d requests in the %s from %s, want at most %d", j-i, w, arrivals[i].Sub(t0), k)
		}
	}
}

// TestWaitersAreGivenThePlacesInTurn: calls refused under
// requests_per_minute are each told the time of the place that frees
// for them, in the order they began to wait, not all the first one.
func TestWaitersAreGivenThePlacesInTurn(t *testing.T) {
	b := New("m", Limits{RequestsPerMinute: 3})
	for i := range 3 {
		if ok, _ := b.Admit("call", t0); !ok {
			t.Fatalf("call %d refused", i)
		}
		b.Done(t0.Add(time.Duration(i+1)*time.Second), 0)
	}
	for i, want := range []time.Duration{61, 62, 63, 67} { // the last: no place frees within a minute
		k := string(rune('d' + i))
		now := t0.Add(time.Duration(4+i) * time.Second)
		if ok, at := b.Admit(k, now); ok || !at.Equal(t0.Add(want*time.Second)) {
			t.Fatalf("%s: admitted %v, retry at +%s; want refused until +%ds", k, ok, at.Sub(t0), want)
		}
	}
	if ok, _ := b.Admit("d", t0.Add(61*time.Second)); !ok {
		t.Fatal("d refused at its place")
	}
	if ok, at := b.Admit("e", t0.Add(61*time.Second)); ok || !at.Equal(t0.Add(62*time.Second)) {
		t.Fatalf("e at d's place: admitted %v, retry at +%s; want refused until +62s", ok, at.Sub(t0))
	}
}

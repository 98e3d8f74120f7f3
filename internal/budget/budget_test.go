package budget

import (
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

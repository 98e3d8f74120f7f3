package runtime

import (
	"fmt"
	"testing"
)

// The memory of sessions that exist in the store is bounded: past
// maxExistingSessions it forgets the oldest first, and a key added again
// is not counted twice.
func TestExistingSessionsForgetTheOldestPastTheirBound(t *testing.T) {
	tbl := newSessionTable()
	tbl.markExisting("acme", "s0")
	tbl.markExisting("acme", "s0")
	if n := len(tbl.existing.order); n != 1 {
		t.Fatalf("a session marked twice takes %d places, want 1", n)
	}
	for i := 1; i <= maxExistingSessions; i++ {
		tbl.markExisting("acme", fmt.Sprintf("s%d", i))
	}
	if n := len(tbl.existing.set); n != maxExistingSessions {
		t.Fatalf("%d sessions remembered, want the bound, %d", n, maxExistingSessions)
	}
	for i, want := range map[int]bool{0: false, 1: true, maxExistingSessions: true} {
		if got := tbl.known("acme", fmt.Sprintf("s%d", i)); got != want {
			t.Errorf("s%d known = %v, want %v", i, got, want)
		}
	}
}

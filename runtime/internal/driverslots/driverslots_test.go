package driverslots

import (
	"slices"
	"testing"
)

// Slots hand a freed slot to the drive queued first, and free it once
// nothing is queued.
func TestSlotsGoToQueuedDrivesInTheOrderTheyCame(t *testing.T) {
	s := New(1)
	var ran []string
	drive := func(name string) Drive {
		return func() Drive { ran = append(ran, name); return s.Next() }
	}
	if !s.TakeOrQueue(drive("first")) {
		t.Fatal("a free slot was refused")
	}
	for _, name := range []string{"b", "c", "a"} {
		if s.TakeOrQueue(drive(name)) {
			t.Fatalf("%s took a slot while none was free", name)
		}
	}
	if s.Waiting() != 3 {
		t.Fatalf("%d drives wait, want 3", s.Waiting())
	}
	// The first drive's goroutine runs the queued ones on its slot.
	for d := drive("first"); d != nil; {
		d = d()
	}
	if want := []string{"first", "b", "c", "a"}; !slices.Equal(ran, want) {
		t.Fatalf("drives ran in order %v, want %v", ran, want)
	}
	if s.Waiting() != 0 || !s.TakeOrQueue(drive("later")) {
		t.Fatal("the slot was not free again once the queue was empty")
	}
}

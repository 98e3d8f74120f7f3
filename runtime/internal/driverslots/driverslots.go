// Package driverslots bounds the session drivers that run at once, and
// hands the slots out in the order the sessions were kicked.
package driverslots

import (
	"container/list"
	"sync"
)

// Drive drives one session until it is done and returns the next drive
// queued for its slot (nil: the slot is free).
type Drive func() Drive

// Slots is the one owner of the MaxDrivers driver slots. It hands them out
// in the order the sessions were kicked: the runtime's kick takes a free
// slot for the driver it starts, or queues the session's drive, and a
// driver goroutine done with its session runs the first drive queued, on
// the same goroutine and slot. (A buffered channel would hand them out in
// the order the Go scheduler happens to run the waiting goroutines, which
// changes with the load of the machine.) A queued drive holds no
// goroutine: after a restart that finds 50,000 orphaned sessions, the
// queue is 50,000 closures, not 50,000 parked goroutines and their
// stacks.
//
// Slots are safe for concurrent use.
type Slots struct {
	// mu guards the fields below, up to the end of the struct. It is a
	// leaf: no drive is called while it is held.
	mu   sync.Mutex
	free int
	// queue holds, in kick order, the drives waiting for a slot.
	queue *list.List
}

// New returns n free slots.
func New(n int) *Slots { return &Slots{free: n, queue: list.New()} }

// TakeOrQueue takes a free slot for drive (true: the caller starts a
// goroutine for it), or queues drive for the next slot that frees up.
func (d *Slots) TakeOrQueue(drive Drive) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.free > 0 {
		d.free--
		return true
	}
	d.queue.PushBack(drive)
	return false
}

// Next is called by a drive that is done: it returns the first drive
// queued, for its goroutine to run with its slot, or nil, and the slot is
// free again.
func (d *Slots) Next() Drive {
	d.mu.Lock()
	defer d.mu.Unlock()
	if first := d.queue.Front(); first != nil {
		return d.queue.Remove(first).(Drive)
	}
	d.free++
	return nil
}

// Waiting is how many drives are queued for a slot.
func (d *Slots) Waiting() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queue.Len()
}

package backlog

import (
	"context"
	"testing"
	"time"
)

// A drive waits while the backlog is full and goes on as soon as one
// commit ends; a stopping runtime's context ends the wait.
func TestCommitBacklogHoldsNewWorkWhileFull(t *testing.T) {
	b := New(2)
	ctx := context.Background()
	if !b.Wait(ctx) {
		t.Fatal("an empty backlog holds a drive")
	}
	b.Begin()
	b.Begin()
	waited := make(chan bool)
	go func() { waited <- b.Wait(ctx) }()
	select {
	case <-waited:
		t.Fatal("a full backlog let a drive through")
	case <-time.After(20 * time.Millisecond): // a negative check: the drive must still be waiting
	}
	b.End()
	select {
	case ok := <-waited:
		if !ok {
			t.Fatal("the wait failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drive still waits once the backlog is below its bound")
	}
	b.Begin() // full again
	stop, cancel := context.WithCancel(ctx)
	go func() { waited <- b.Wait(stop) }()
	cancel()
	select {
	case ok := <-waited:
		if ok {
			t.Fatal("a cancelled wait reports the backlog below its bound")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled wait does not end")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n != 2 {
		t.Fatalf("%d commits under way, want 2", b.n)
	}
}

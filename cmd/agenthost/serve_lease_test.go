package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// A serve paused for longer than its lease can no longer commit: it must
// not go on answering as if it could. It exits 1 once it runs again, and
// the restart's recovery finishes what was in flight.
func TestServeExitsWhenItsLeaseExpires(t *testing.T) {
	conformance.SkipInShort(t, "pausing serve past its lease")
	bin := buildBinary(t)
	const token = "lease-token"
	dir := t.TempDir()
	cfgPath := slowJobServeConfig(t, dir, token, "lease_ttl: 1s\n")
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 60)

	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c := newClient(proc.Addr(), token)
	run := c.submit(t, "leased", "Please run a slow job for 2 seconds")
	c.waitRun(t, run.ID, 30*time.Second, "its slow job in flight", func(r runView) bool {
		if r.Waiting == nil {
			return false
		}
		for _, p := range r.Waiting.Pending {
			if p.Kind == "tool" {
				return true
			}
		}
		return false
	})

	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the test's input: a pause three times the lease
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, proc, 30*time.Second); code != 1 {
		t.Fatalf("after losing its lease agenthost serve exited %d, want 1", code)
	}
	logText, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logText), "node lease expired") {
		t.Fatal("the log does not say the node lease expired")
	}

	next := startServe(t, bin, cfgPath, logPath)
	mustReady(t, next, 60*time.Second)
	done := newClient(next.Addr(), token).waitRun(t, run.ID, 60*time.Second, "terminal", runView.terminal)
	if done.Status != "completed" {
		t.Fatalf("after the restart the Run is %s, want completed: %+v", done.Status, done)
	}
}

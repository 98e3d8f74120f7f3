package node

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// testVersion is a loaded version of sha256 sum without a plugin behind
// it; closed counts its closes.
func testVersion(sum string, closed *int) *pluginVersion {
	return &pluginVersion{ref: loop.PluginRef{Version: sum, SHA256: sum}, open: map[string]bool{},
		closePlugin: func(context.Context) error { *closed++; return nil }}
}

// replaced puts next in force over the version in force and ends the
// grace of the one it replaced, as if its call_timeout had passed.
func replaced(vs *pluginVersions, next *pluginVersion) *pluginVersion {
	old := vs.current
	vs.install(next, time.Hour, func(time.Duration, func(context.Context) error) {})
	vs.mu.Lock()
	old.callsDone = time.Now().Add(-time.Second)
	vs.mu.Unlock()
	return old
}

func testVersions(cur *pluginVersion) *pluginVersions {
	return &pluginVersions{id: "p", log: slog.New(slog.DiscardHandler), current: cur}
}

// TestDrainingVersionStaysLoadedWhileACallUsesIt: a call routed to a
// version before it was replaced keeps it loaded past its grace, even
// when it holds no open attempt; the version closes when the call
// returns.
func TestDrainingVersionStaysLoadedWhileACallUsesIt(t *testing.T) {
	var closed int
	vs := testVersions(testVersion("a", &closed))
	v, err := vs.begin(nil) // a Start, dispatched to the version in force
	if err != nil {
		t.Fatal(err)
	}
	replaced(vs, testVersion("b", new(int)))
	vs.sweep(context.Background())
	if closed != 0 {
		t.Fatal("the replaced version was closed while a Start was still under way on it")
	}
	vs.end(v, "k1", abi.StateDone, nil, true)
	if closed != 1 {
		t.Fatalf("the replaced version was closed %d times once its last call returned, want 1", closed)
	}
}

// TestCancelKeepsTheVersionUntilItReturns: a Cancel routed to a draining
// version while a Poll of its last open attempt ends it keeps the version
// loaded until the Cancel returns; the Cancel's reply settles the
// attempt.
func TestCancelKeepsTheVersionUntilItReturns(t *testing.T) {
	var closed int
	vs := testVersions(testVersion("a", &closed))
	held := &loop.PluginRef{Version: "a", SHA256: "a"}
	v, _ := vs.begin(held)
	vs.end(v, "k1", abi.StatePending, nil, true)
	replaced(vs, testVersion("b", new(int)))

	poll, _ := vs.begin(held)
	cancel, err := vs.begin(held)
	if err != nil || cancel != v || poll != v {
		t.Fatalf("the calls of an attempt of the draining version went to %v (err %v), want it", cancel, err)
	}
	vs.end(poll, "k1", abi.StateDone, nil, false)
	if closed != 0 {
		t.Fatal("the draining version was closed while a Cancel was under way on it")
	}
	vs.end(cancel, "k1", abi.StateCancelled, nil, false)
	if closed != 1 {
		t.Fatalf("closed %d times, want 1", closed)
	}
}

// TestFailedStartKeepsTheAttemptOpen: a Start whose outcome is unknown
// (it failed: a timeout) may be running on its version, which stays
// loaded for it; a Cancel reply settles it.
func TestFailedStartKeepsTheAttemptOpen(t *testing.T) {
	var closed int
	vs := testVersions(testVersion("a", &closed))
	v, _ := vs.begin(nil)
	vs.end(v, "k1", "", errors.New("plugin call timed out"), true)
	replaced(vs, testVersion("b", new(int)))
	vs.sweep(context.Background())
	if closed != 0 {
		t.Fatal("the version of an attempt whose Start failed was closed")
	}
	c, _ := vs.begin(&loop.PluginRef{Version: "a", SHA256: "a"})
	vs.end(c, "k1", abi.StateCancelled, nil, false)
	if closed != 1 || len(v.open) != 0 {
		t.Fatalf("after the Cancel reply: closed %d times, open %v; want 1, none", closed, v.open)
	}
}

// TestSameFileHandsOpenAttemptsOver: a reload that changes a plugin's
// keys but not its file routes the old version's attempts to the new
// one, which holds them open from then on; the old one closes after its
// grace.
func TestSameFileHandsOpenAttemptsOver(t *testing.T) {
	var closed int
	vs := testVersions(testVersion("a", &closed))
	v, _ := vs.begin(nil)
	vs.end(v, "k1", abi.StatePending, nil, true)
	next := testVersion("a", new(int))
	replaced(vs, next)
	vs.sweep(context.Background())
	if closed != 1 {
		t.Fatalf("the replaced version of the same file was closed %d times after its grace, want 1", closed)
	}
	if !next.open["k1"] {
		t.Fatalf("the new version of the same file holds %v open, want k1", next.open)
	}
	if got, _ := vs.begin(&loop.PluginRef{Version: "a", SHA256: "a"}); got != next {
		t.Fatal("a call of the attempt did not go to the new version of the same file")
	}
}

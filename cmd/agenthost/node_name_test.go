package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// nodeNameLeaseTTL is the lease of the node-name tests' nodes: far
// longer than the tests wait for anything, so that only the node name
// can hand a killed node's sessions to its restart in time.
const nodeNameLeaseTTL = 10 * time.Minute

// TestARestartUnderItsNodeNameDoesNotWaitForItsLease is issue 39's
// restart with real processes on PostgreSQL: a serve under node.name
// edge-1, with a lease of 10 minutes, is SIGKILLed while its Runs have
// slow jobs in flight, and started again with the same config. The
// restart takes the dead incarnation's sessions over at once (its
// recovery's takeover lines name the dead incarnation), and every Run
// completes well before that incarnation's lease could have run out,
// with each job run once. A second serve under the same name while the
// restart lives is refused, with a message that names node.name.
func TestARestartUnderItsNodeNameDoesNotWaitForItsLease(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	c := &cluster{t: t, bin: buildBinary(t), dsn: dsn, token: "name-token"}
	dir := t.TempDir()
	extra := fmt.Sprintf("store: {driver: postgres, dsn: %q}\nlease_ttl: %s\nnode: {name: edge-1}\n", dsn, nodeNameLeaseTTL)
	cfg := slowJobServeConfig(t, dir, c.token, extra)
	for i := range 2 {
		p := &clusterProc{cfg: cfg, log: filepath.Join(dir, fmt.Sprintf("serve-%d.log", i))}
		logTailOnFailure(t, p.log, 60)
		c.nodes = append(c.nodes, p)
	}
	first, restart := c.nodes[0], c.nodes[1]
	first.proc = startServe(t, c.bin, first.cfg, first.log)
	mustReady(t, first.proc, 60*time.Second)
	first.id = nodeIDFromLog(t, first.log)
	if !strings.HasPrefix(first.id, "edge-1/") {
		t.Fatalf("the node id %q does not carry node.name edge-1", first.id)
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, c.client(0).submit(t, fmt.Sprintf("s%d", i), "Please run a slow job for 2 seconds").ID)
	}
	waitUntil(t, time.Minute, "a slow job in flight", func() (bool, error) {
		return pendingSlowJob(c.client(0).run(t, ids[0])), nil
	})
	c.waitJobStarted(ids[0])
	if err := first.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, first.proc, 30*time.Second)

	restart.proc = startServe(t, c.bin, restart.cfg, restart.log)
	mustReady(t, restart.proc, 60*time.Second)
	restart.id = nodeIDFromLog(t, restart.log)
	for _, id := range ids {
		// A minute is a tenth of the dead incarnation's lease.
		if run := c.client(1).waitRun(t, id, time.Minute, "terminal", runView.terminal); run.Status != "completed" {
			t.Errorf("run %s: %s %+v", id, run.Status, run.Failure)
		}
	}
	// s0's session was the dead incarnation's (its job was in flight);
	// s1's and s2's may have had no owner yet (a session is claimed by
	// its driver after the Run's creation, and the kill can come first).
	// The restart took every one over in its recovery.
	fromDead, unowned := c.takeovers(first.id, 1), c.takeovers("", 1)
	if !slices.ContainsFunc(fromDead, func(tk takeover) bool { return tk.session == "s0" }) ||
		len(fromDead)+len(unowned) != len(ids) {
		t.Errorf("the restart %s took over %v from %s and %v unowned; want s0's among the first, %d in all; its recovery and session lines:\n%s",
			restart.id, fromDead, first.id, unowned, len(ids), grepLines(t, restart.log, "recovery", "session"))
	}

	// A second live process under edge-1 is refused, and exits.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := slowJobServeConfig(t, t.TempDir(), c.token, extra)
	out, err := exec.CommandContext(ctx, c.bin, "serve", "--config", other, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "node.name") || !strings.Contains(string(out), "held by another live process") {
		t.Fatalf("a second serve under node.name edge-1: %v; want a refusal naming node.name; output:\n%s", err, out)
	}
	if run := c.client(1).run(t, ids[0]); run.Status != "completed" {
		t.Fatalf("run %s after the refusal: %s", ids[0], run.Status)
	}

	if err := restart.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, restart.proc, time.Minute); code != 0 {
		t.Errorf("the restart exited %d after SIGTERM, want 0", code)
	}
	c.checkRuns(ids)
}

// grepLines returns the lines of the file at path that contain any of
// words, for a failure's message.
func grepLines(t *testing.T, path string, words ...string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

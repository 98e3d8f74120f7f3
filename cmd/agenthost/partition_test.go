package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/chaos"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/pgstore"
)

// The lease of the partition test's nodes: long enough that its margin
// (a fifth of it) dwarfs a loaded machine's scheduling delays, short
// enough that the takeover comes within seconds.
const partitionLeaseTTL = 10 * time.Second

var leaseGivenUpRe = regexp.MustCompile(`(?m)^time=(\S+) .*msg="node lease lost`)

// leaseGivenUpAt reads when a serve process's runtime gave its node lease
// up, from its log (ok false while it has not).
func leaseGivenUpAt(t *testing.T, path string) (time.Time, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := leaseGivenUpRe.FindSubmatch(b)
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, string(m[1]))
	if err != nil {
		t.Fatalf("the time of the lease-lost line, %q: %v", m[1], err)
	}
	return at, true
}

// storedLeaseEnd reads, from the database, when the lease of a node
// incarnation runs out (by the database's clock, the machine's own here).
func storedLeaseEnd(t *testing.T, dsn, nodeID string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ms int64
	if err := conn.QueryRow(ctx, "SELECT expires_ms FROM "+pgstore.DefaultSchema+".nodes WHERE node_id = $1", nodeID).Scan(&ms); err != nil {
		t.Fatalf("the lease of node %s in the database: %v", nodeID, err)
	}
	return time.UnixMilli(ms)
}

// TestANodeCutOffFromPostgresStopsTrustingItsLeaseBeforeItRunsOut is issue
// 33's partition test, with real processes on a real PostgreSQL: three
// serve nodes on one database, the first reaching it through a loopback
// TCP proxy (internal/netfault). Runs with slow jobs are submitted through
// the first node, which so owns their sessions; while the jobs are in
// flight the proxy is blackholed (every byte held both ways, nothing
// refused or closed), so that the node's lease renewals hang rather than
// fail. The node must give its lease up on its own clock before the lease
// runs out at the store (it used to wait for a renewal to fail, past
// that point, while it still said ready), and so before either other node
// takes one of its sessions over; it must then exit 1. The others take
// its sessions over and every Run completes, each job run once by the
// slow-job plugin's own counts.
func TestANodeCutOffFromPostgresStopsTrustingItsLeaseBeforeItRunsOut(t *testing.T) {
	conformance.SkipInShort(t, "partitions from PostgreSQL")
	const runs = 6
	const cut = 0
	ctx := context.Background()
	pg, err := pgserver.Start(ctx, pgserver.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "partition"); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: buildBinary(t), dsn: pg.DSN("partition"), token: "partition-token"}
	proxy, throughProxy, err := chaos.PostgresProxy(c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	for i := 0; i < 3; i++ {
		dsn := c.dsn
		if i == cut {
			dsn = throughProxy
		}
		dir := t.TempDir()
		extra := fmt.Sprintf("store: {driver: postgres, dsn: %q}\nlease_ttl: %s\n", dsn, partitionLeaseTTL)
		p := &clusterProc{cfg: slowJobServeConfig(t, dir, c.token, extra), log: filepath.Join(dir, "serve.log")}
		logTailOnFailure(t, p.log, 60)
		p.proc = startServe(t, c.bin, p.cfg, p.log)
		c.nodes = append(c.nodes, p)
	}
	for _, p := range c.nodes {
		mustReady(t, p.proc, 90*time.Second)
		p.id = nodeIDFromLog(t, p.log)
	}
	if proxy.Stats().Accepted == 0 {
		t.Fatal("the first node did not reach PostgreSQL through the proxy")
	}

	// Runs submitted through the node to cut off: its sessions. Their
	// jobs outlast the partition's effects, so that the takeover has
	// attempts in flight to attach to.
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = c.client(cut).submit(t, fmt.Sprintf("cut%d", i), "Please run a slow job for 30 seconds").ID
	}
	for _, id := range ids {
		c.client(1).waitRun(t, id, time.Minute, "waiting on its slow job", pendingSlowJob)
	}

	cutAt := time.Now()
	proxy.Blackhole()
	t.Logf("cut node %d (%s) off from PostgreSQL", cut, c.nodes[cut].id)
	var lostAt time.Time
	waitUntil(t, 6*partitionLeaseTTL, "the node cut off to give its lease up", func() (bool, error) {
		at, ok := leaseGivenUpAt(t, c.nodes[cut].log)
		lostAt = at
		return ok, nil
	})
	t.Logf("it gave its lease up %s after the partition began (lease %s)", lostAt.Sub(cutAt).Round(time.Millisecond), partitionLeaseTTL)

	// The others take its sessions over, and every Run completes.
	waitUntil(t, 2*time.Minute, "the other nodes to take over every session of the node cut off", func() (bool, error) {
		return len(c.takeovers(c.nodes[cut].id, 1, 2)) >= runs, nil
	})
	for i, id := range ids {
		run := c.client(1+i%2).waitRun(t, id, 2*time.Minute, "terminal", runView.terminal)
		if run.Status != "completed" {
			t.Errorf("run %s is %s, want completed", id, run.Status)
		}
	}

	// It gave its lease up before the lease ran out at the store, and so
	// before any takeover: no two nodes ran its effects at once.
	if end := storedLeaseEnd(t, c.dsn, c.nodes[cut].id); !lostAt.Before(end) {
		t.Errorf("the node cut off gave its lease up at %s, %s after its lease ran out at the store (%s): it trusted a lease it no longer held",
			lostAt.Format(time.RFC3339Nano), lostAt.Sub(end), end.Format(time.RFC3339Nano))
	}
	for _, tk := range c.takeovers(c.nodes[cut].id, 1, 2) {
		if !tk.at.After(lostAt) {
			t.Errorf("session %s was taken over at %s, while the node cut off still trusted its lease (it gave it up at %s)",
				tk.session, tk.at.Format(time.RFC3339Nano), lostAt.Format(time.RFC3339Nano))
		}
	}

	// It exits 1 for its supervisor to start it again, once the
	// partition heals if not before (its store connections' closes wait
	// on the network).
	proxy.Heal()
	if code := mustExit(t, c.nodes[cut].proc, 2*time.Minute); code != 1 {
		t.Errorf("the node cut off exited %d after it gave its lease up, want 1", code)
	}
	t.Logf("it exited %s after the partition began", time.Since(cutAt).Round(time.Millisecond))
	for _, i := range []int{1, 2} {
		if err := c.nodes[i].proc.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := mustExit(t, c.nodes[i].proc, time.Minute); code != 0 {
			t.Errorf("node %d exited %d after SIGTERM, want 0", i, code)
		}
	}
	c.checkRuns(ids)
}

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// slowJobPluginLine is the slow-job plugin's line in slowJobServeConfig.
var slowJobPluginLine = regexp.MustCompile(`slow-job: \{path: [^,]+, role: executor\}`)

// TestThreeNodesUpgradeOneByOne is issue 38's rolling upgrade: three
// serve nodes on one PostgreSQL database take Runs with slow jobs from a
// client that spreads them over the nodes, while the slow-job plugin is
// upgraded node by node to v2 (another file, version 2.0.0, attaches_from
// 1.0.0): node 0 by a reload, node 1 by a clean restart, node 2 by a kill
// -9 and a start once node 0 has closed v1, so that whichever node takes
// its sessions over attaches with v2 to the jobs v1 started. Every
// acknowledged Run must complete, and its log and the plugin's own counts
// must show no violation (checkServedRuns: loop.CheckEnded, one attempt
// per job, each job run once).
func TestThreeNodesUpgradeOneByOne(t *testing.T) {
	conformance.SkipInShort(t, "three serve nodes and PostgreSQL, upgraded one by one")
	c := startCluster(t, 3)
	wasm, err := os.ReadFile(conformance.ExampleWasm(t, "slow-job"))
	if err != nil {
		t.Fatal(err)
	}
	v2 := filepath.Join(t.TempDir(), "slow-job-v2.wasm")
	if err := os.WriteFile(v2, withCustomSection(wasm, "version", "2.0.0"), 0o644); err != nil {
		t.Fatal(err)
	}
	upgradeConfig := func(i int) {
		t.Helper()
		raw, err := os.ReadFile(c.nodes[i].cfg)
		if err != nil {
			t.Fatal(err)
		}
		next := slowJobPluginLine.ReplaceAll(raw, []byte(`slow-job: {path: `+v2+`, role: executor, config: {version: "2.0.0", attaches_from: "1.0.0"}}`))
		if string(next) == string(raw) {
			t.Fatalf("node %d's config has no slow-job line to upgrade", i)
		}
		if err := os.WriteFile(c.nodes[i].cfg, next, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The nodes' addresses, as the submitter sees them while nodes restart.
	var mu sync.Mutex
	addrs := []string{c.nodes[0].proc.Addr(), c.nodes[1].proc.Addr(), c.nodes[2].proc.Addr()}
	addr := func(i int) string { mu.Lock(); defer mu.Unlock(); return addrs[i%3] }

	// The client holds Run beforeKill and the later ones back until
	// resumed: node 0's v1 drains for its call_timeout and more, longer
	// than the earlier Runs take, and node 2 must still be starting v1
	// jobs when it is killed.
	const runs, beforeKill = 36, 22
	acked := make([]string, runs)
	ackedCount := make(chan int, runs)
	submitted := make(chan error, 1)
	resume := make(chan struct{})
	go func() {
		pace := time.NewTicker(150 * time.Millisecond)
		defer pace.Stop()
		for i := 0; i < runs; i++ {
			if i == beforeKill {
				select {
				case <-resume:
				case <-time.After(3 * time.Minute):
					submitted <- fmt.Errorf("the client was never resumed before Run %d", i)
					return
				}
			}
			body := map[string]any{"input": fmt.Sprintf("Please run a slow job for %d seconds", 2+i%3)}
			key := map[string]string{"Idempotency-Key": fmt.Sprintf("rolling-%03d", i)}
			for try := 0; ; try++ {
				<-pace.C
				var run runView
				code, raw, err := newClient(addr(i+try), c.token).Do("POST", fmt.Sprintf("/v1/sessions/r%03d/runs", i), body, key, &run)
				if err == nil && (code == http.StatusCreated || code == http.StatusOK) {
					mu.Lock()
					acked[i] = run.ID
					mu.Unlock()
					ackedCount <- i + 1
					break
				}
				if err == nil && code != http.StatusServiceUnavailable {
					submitted <- fmt.Errorf("submission %d: %d %s", i, code, raw)
					return
				}
				if try > 200 {
					submitted <- fmt.Errorf("submission %d never acknowledged", i)
					return
				}
			}
		}
		submitted <- nil
	}()
	// waitAcked waits until the client has n Runs acknowledged.
	got := 0
	waitAcked := func(n int) {
		t.Helper()
		for got < n {
			select {
			case got = <-ackedCount:
			case <-time.After(2 * time.Minute):
				t.Fatalf("only %d Runs acknowledged", got)
			}
		}
	}

	// jobOfV1 waits until node k drives a Run whose slow job v1 started
	// and has not finished, so that its stop leaves one to take over.
	jobOfV1 := func(k int) {
		t.Helper()
		waitUntil(t, time.Minute, fmt.Sprintf("node %d drives a pending slow job", k), func() (bool, error) {
			mu.Lock()
			ids := append([]string(nil), acked...)
			mu.Unlock()
			for i, id := range ids {
				if id == "" || i%3 != k {
					continue
				}
				var run runView
				if code, _, err := newClient(addr(k), c.token).Do("GET", "/v1/runs/"+id, nil, nil, &run); err == nil && code == http.StatusOK && pendingSlowJob(run) {
					return true, nil
				}
			}
			return false, nil
		})
	}

	// Node 0: a reload.
	waitAcked(6)
	upgradeConfig(0)
	if r := runCLI(t, c.bin, nil, "reload", "--config", c.nodes[0].cfg); r.code != 0 {
		t.Fatalf("node 0's reload: exit %d\n%s", r.code, r.stderr)
	}
	// Node 1: a clean restart.
	waitAcked(14)
	jobOfV1(1)
	upgradeConfig(1)
	if err := c.nodes[1].proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, c.nodes[1].proc, 60*time.Second); code != 0 {
		t.Fatalf("node 1 exited %d on SIGTERM", code)
	}
	c.nodes[1].proc = startServe(t, c.bin, c.nodes[1].cfg, c.nodes[1].log)
	mustReady(t, c.nodes[1].proc, 60*time.Second)
	mu.Lock()
	addrs[1] = c.nodes[1].proc.Addr()
	mu.Unlock()
	// Node 2: a kill -9 while jobs run, and a start. Node 0 must have
	// closed v1 first: while its v1 drains, node 0 attaches to v1's
	// attempts with v1 itself, so had it taken node 2's sessions over,
	// no v2 would take any attempt over and the test would not exercise
	// attaches_from.
	waitAcked(beforeKill)
	waitUntil(t, 2*time.Minute, "node 0 closes v1 once its attempts end", func() (bool, error) {
		return countLines(t, c.nodes[0].log, `plugin version closed: the attempts it held have ended" plugin=slow-job version=1.0.0`) > 0, nil
	})
	close(resume)
	jobOfV1(2)
	upgradeConfig(2)
	c.nodes[2].proc.Kill()
	c.nodes[2].proc = startServe(t, c.bin, c.nodes[2].cfg, c.nodes[2].log)
	mustReady(t, c.nodes[2].proc, 60*time.Second)
	mu.Lock()
	addrs[2] = c.nodes[2].proc.Addr()
	mu.Unlock()

	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	ids := append([]string(nil), acked...)
	mu.Unlock()
	for _, id := range ids {
		run := c.client(0).waitRun(t, id, 3*time.Minute, "ended", func(r runView) bool { return r.terminal() })
		if run.Status != "completed" {
			t.Errorf("run %s: %s %+v", id, run.Status, run.Failure)
		}
	}
	c.checkRuns(ids)
	takeovers := 0
	for i := range c.nodes {
		takeovers += countLines(t, c.nodes[i].log, "plugin version takes over an attempt")
	}
	if takeovers == 0 {
		t.Error("no node logged that v2 took over an attempt of v1: the stops left none to take over, and the test did not exercise it")
	}
	t.Logf("%d Runs over a rolling upgrade, 0 violations; v2 took over %d attempts of v1", len(ids), takeovers)
}

// countLines counts the lines of a file that contain s.
func countLines(t *testing.T, path, s string) int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return len(regexp.MustCompile(regexp.QuoteMeta(s)).FindAllIndex(raw, -1))
}

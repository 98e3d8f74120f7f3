package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
)

// The lease of the cluster tests' nodes: short, so that a dead node's
// sessions pass on within seconds.
const clusterLeaseTTL = 3 * time.Second

// cluster is several `agenthost serve` processes on one PostgreSQL
// database, each with its own config file (the same tenant and plugins)
// and log.
type cluster struct {
	t     *testing.T
	bin   string
	dsn   string
	token string
	nodes []*clusterProc
}

type clusterProc struct {
	cfg, log string
	proc     *serveproc.Child
	id       string // the node incarnation, read from its log
}

// startCluster starts a PostgreSQL server of its own (fsync on, as for
// the crash tests) and n serve processes on one database of it.
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	ctx := context.Background()
	pg, err := pgserver.Start(ctx, pgserver.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "cluster"); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: buildBinary(t), dsn: pg.DSN("cluster"), token: "cluster-token"}
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		extra := fmt.Sprintf("store: {driver: postgres, dsn: %q}\nlease_ttl: %s\n", c.dsn, clusterLeaseTTL)
		p := &clusterProc{cfg: slowJobServeConfig(t, dir, c.token, extra), log: filepath.Join(dir, "serve.log")}
		logTailOnFailure(t, p.log, 60)
		p.proc = startServe(t, c.bin, p.cfg, p.log)
		c.nodes = append(c.nodes, p)
	}
	for _, p := range c.nodes {
		mustReady(t, p.proc, 60*time.Second)
		p.id = nodeIDFromLog(t, p.log)
	}
	return c
}

var nodeIDRe = regexp.MustCompile(`msg="runtime started".* node=(\S+)`)

// nodeIDFromLog reads a serve process's node incarnation from its log.
func nodeIDFromLog(t *testing.T, path string) string {
	t.Helper()
	var id string
	waitUntil(t, 30*time.Second, "the node id in "+path, func() (bool, error) {
		b, err := os.ReadFile(path)
		if m := nodeIDRe.FindSubmatch(b); m != nil {
			id = string(m[1])
			return true, nil
		}
		return false, err
	})
	return id
}

func (c *cluster) client(i int) *apiClient { return newClient(c.nodes[i].proc.Addr(), c.token) }

// takeover is a "recovery: session taken over" line of a node's log.
type takeover struct {
	at        time.Time
	session   string
	deadOwner string
}

var takeoverRe = regexp.MustCompile(`^time=(\S+) .*msg="recovery: session taken over".* session=(\S+) dead_owner=(\S*)`)

// takeovers reads the sessions the given nodes took over from dead.
func (c *cluster) takeovers(dead string, survivors ...int) []takeover {
	var out []takeover
	for _, i := range survivors {
		f, err := os.Open(c.nodes[i].log)
		if err != nil {
			c.t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			m := takeoverRe.FindStringSubmatch(sc.Text())
			if m == nil || m[3] != dead {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				c.t.Fatalf("a takeover line's time %q: %v", m[1], err)
			}
			out = append(out, takeover{at: at, session: m[2], deadOwner: m[3]})
		}
		f.Close()
	}
	return out
}

// openStore opens the cluster's database as a store of this process's
// own, for the test to read; the caller closes it.
func (c *cluster) openStore() *pgstore.Store {
	c.t.Helper()
	store, err := pgstore.Open(context.Background(), pgstore.Options{DSN: c.dsn})
	if err != nil {
		c.t.Fatal(err)
	}
	return store
}

// checkRuns opens the database and holds every Run's log to
// loop.CheckEnded, the one log checker, and the slow-job plugin's own
// execution counts to "each job ran once".
func (c *cluster) checkRuns(ids []string) {
	c.t.Helper()
	store := c.openStore()
	defer store.Close()
	jobs := checkServedRuns(c.t, store, ids)
	if jobs < len(ids)/2 {
		c.t.Errorf("only %d slow jobs were dispatched for %d Runs: the test did not exercise the tool", jobs, len(ids))
	}
}

// follow reads a Run's event stream through one node until its terminal
// event, and checks that the events come once each, in order, from 1.
func (c *cluster) follow(node int, runID string) error {
	req, err := http.NewRequest("GET", "http://"+c.nodes[node].proc.Addr()+"/v1/runs/"+runID+"/events", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("events of %s through node %d: %s", runID, node, resp.Status)
	}
	var next int64 = 1
	ended := false
	err = readSSE(resp.Body, func(ev sseEvent) bool {
		if ev.ID == "" {
			return false
		}
		seq, perr := strconv.ParseInt(ev.ID, 10, 64)
		if perr != nil || seq != next {
			err = fmt.Errorf("run %s through node %d: event %q after %d", runID, node, ev.ID, next-1)
			return true
		}
		next++
		switch loop.EventType(ev.Event) {
		case loop.EventRunCompleted, loop.EventRunFailed, loop.EventRunCancelled:
			ended = true
			return true
		}
		return false
	})
	if err != nil {
		return err
	}
	if !ended {
		return fmt.Errorf("the stream of run %s through node %d ended after event %d without the Run's end", runID, node, next-1)
	}
	return nil
}

// waitJobStarted waits until a Run of tenant demo has a slow job whose
// start has run: until the Run's log holds an effect_pending, which the
// runtime commits once the job's start answered, and so once the
// slow-job plugin has stored the job's record. A Run's waiting view
// lists the job as soon as it is dispatched (pendingSlowJob), before its
// start has run: a node killed then leaves a job with no record, which
// recovery fails as lost (slow_job's policy, fail), where the kill tests
// mean a job in flight, to be attached to. Under load the start may take
// seconds (its KV writes are synced commits).
func (c *cluster) waitJobStarted(runID string) {
	c.t.Helper()
	ctx := context.Background()
	store := c.openStore()
	defer store.Close()
	waitUntil(c.t, time.Minute, "run "+runID+"'s slow job started", func() (bool, error) {
		evs, err := store.Events(ctx, "demo", runID, 0, 0)
		if err != nil {
			return false, err
		}
		for _, ev := range evs {
			if ev.Type == loop.EventEffectPending {
				return true, nil
			}
		}
		return false, nil
	})
}

// pendingSlowJob reports whether a Run waits on a slow job in flight.
func pendingSlowJob(run runView) bool {
	if run.Waiting == nil {
		return false
	}
	for _, p := range run.Waiting.Pending {
		if p.Tool == "slow_job" {
			return true
		}
	}
	return false
}

// TestThreeNodesSurviveAKill is issue 15's multi-node kill test, with real
// processes on a real PostgreSQL: three serve nodes on one database;
// Runs submitted round-robin through all three, each followed over SSE
// through a node other than the one that accepted it; one node SIGKILLed
// while its Runs have slow jobs in flight, and not restarted (its machine
// is gone). Every acknowledged Run completes, every stream sees every
// event once and the end, nothing is settled twice, no job runs twice, and
// the dead node's sessions are taken over within about one lease TTL.
func TestThreeNodesSurviveAKill(t *testing.T) {
	conformance.SkipInShort(t, "three serve nodes on PostgreSQL")
	const runs = 30
	c := startCluster(t, 3)
	const victim = 0
	accepted := make([]int, runs)
	ids := make([]string, runs)
	for i := 0; i < runs; i++ {
		node := i % 3
		var run runView
		code, raw, err := c.client(node).Do("POST", fmt.Sprintf("/v1/sessions/s%03d/runs", i),
			map[string]any{"input": fmt.Sprintf("Please run a slow job for %d seconds", 2+i%3)},
			map[string]string{"Idempotency-Key": fmt.Sprintf("cluster-%03d", i)}, &run)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("submission %d through node %d: %d %v %s", i, node, code, err, raw)
		}
		accepted[i], ids[i] = node, run.ID
	}
	// Three Runs of the agent lead, through the victim: each hands research
	// a slow job in a child Run, which the victim starts and owns.
	var leads []string
	for i := 0; i < 3; i++ {
		var run runView
		code, raw, err := c.client(victim).Do("POST", fmt.Sprintf("/v1/sessions/lead-%d/runs", i),
			map[string]any{"input": leadInput(strconv.Itoa(3 + i)), "agent": "lead"}, nil, &run)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("submission of lead %d through the victim: %d %v %s", i, code, err, raw)
		}
		leads = append(leads, run.ID)
	}
	// Follow each Run through another node than its own, and never
	// through the victim, whose streams end with it.
	followErrs := make(chan error, runs)
	var followers sync.WaitGroup
	for i, id := range ids {
		through := map[int]int{0: 1, 1: 2, 2: 1}[accepted[i]]
		followers.Add(1)
		go func() { defer followers.Done(); followErrs <- c.follow(through, id) }()
	}

	// Kill the victim while a Run it accepted (and so owns) waits on a
	// slow job in flight, and so does the child Run of a lead: recovery
	// then has attempts to attach to, and a parent to find its child.
	var inFlight, childInFlight string
	waitUntil(t, 60*time.Second, "a slow job in flight on the victim", func() (bool, error) {
		for i, id := range ids {
			if accepted[i] == victim && pendingSlowJob(c.client(1).run(t, id)) {
				inFlight = id
				return true, nil
			}
		}
		return false, nil
	})
	c.waitJobStarted(inFlight)
	waitUntil(t, 60*time.Second, "a child run's slow job in flight on the victim", func() (bool, error) {
		for _, id := range leads {
			p := c.client(1).subAgentRun(t, id)
			if len(p.Children) == 0 {
				continue
			}
			// A child is listed once its attempt is dispatched, and
			// exists once the attempt's start has created it.
			var child runView
			code, raw, err := c.client(1).Do("GET", "/v1/runs/"+p.Children[0].Run, nil, nil, &child)
			if err != nil || (code != http.StatusOK && code != http.StatusNotFound) {
				return false, fmt.Errorf("get child run %s: %d %v %s", p.Children[0].Run, code, err, raw)
			}
			if code == http.StatusOK && pendingSlowJob(child) {
				childInFlight = child.ID
				return true, nil
			}
		}
		return false, nil
	})
	c.waitJobStarted(childInFlight)
	killedAt := time.Now()
	if err := c.nodes[victim].proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, c.nodes[victim].proc, 30*time.Second)
	t.Logf("SIGKILLed node %d (%s)", victim, c.nodes[victim].id)

	statuses := map[string]int{}
	for _, id := range ids {
		run := c.client(1+len(statuses)%2).waitRun(t, id, 2*time.Minute, "terminal", runView.terminal)
		statuses[run.Status]++
	}
	if statuses["completed"] != runs {
		t.Errorf("runs by status %v; want all %d completed", statuses, runs)
	}
	// Each lead and its one child complete, whoever took them over.
	checked := append([]string(nil), ids...)
	for _, id := range leads {
		p := c.client(2).waitRun(t, id, 2*time.Minute, "terminal", runView.terminal)
		children := c.client(2).subAgentRun(t, id).Children
		if p.Status != "completed" || len(children) != 1 {
			t.Fatalf("lead run %s: %s %+v with children %+v; want completed with one child", id, p.Status, p.Failure, children)
		}
		if child := c.client(1).run(t, children[0].Run); child.Status != "completed" {
			t.Fatalf("child run %s of %s: %s %+v", children[0].Run, id, child.Status, child.Failure)
		}
		checked = append(checked, id, children[0].Run)
	}
	followers.Wait()
	close(followErrs)
	for err := range followErrs {
		if err != nil {
			t.Error(err)
		}
	}

	// The victim's sessions, taken over by the survivors.
	taken := c.takeovers(c.nodes[victim].id, 1, 2)
	if len(taken) == 0 {
		t.Fatalf("no survivor took over a session of the dead node %s", c.nodes[victim].id)
	}
	first, last := taken[0].at, taken[0].at
	for _, tk := range taken {
		first, last = minTime(first, tk.at), maxTime(last, tk.at)
	}
	t.Logf("the dead node's %d sessions with work were taken over from %.2f to %.2f lease TTLs after its death",
		len(taken), first.Sub(killedAt).Seconds()/clusterLeaseTTL.Seconds(), last.Sub(killedAt).Seconds()/clusterLeaseTTL.Seconds())
	// Its lease runs out at most one TTL after its death, and the next
	// recovery pass of a node sharing the store is at most TTL/3 later;
	// the bound leaves a loaded machine room to breathe.
	if bound := 4 * clusterLeaseTTL; last.Sub(killedAt) > bound {
		t.Errorf("the last takeover came %s after the death, past %s", last.Sub(killedAt), bound)
	}

	for _, i := range []int{1, 2} {
		if err := c.nodes[i].proc.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := mustExit(t, c.nodes[i].proc, time.Minute); code != 0 {
			t.Errorf("node %d exited %d after SIGTERM, want 0", i, code)
		}
	}
	c.checkRuns(checked)
}

// TestPausedNodeIsFenced pauses a node (SIGSTOP) past its lease with slow
// jobs in flight, lets the other node take its sessions over and finish
// their Runs, then resumes it (SIGCONT). The resumed node must commit
// nothing to those sessions (every Run's log is as the new owner left
// it), run none of their jobs again (the slow-job plugin's own counts),
// and, its lease gone, exit 1 for its supervisor to restart it.
func TestPausedNodeIsFenced(t *testing.T) {
	conformance.SkipInShort(t, "three serve nodes on PostgreSQL")
	const runs = 6
	c := startCluster(t, 2)
	const paused, other = 0, 1
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = c.client(paused).submit(t, fmt.Sprintf("p%d", i), "Please run a slow job for 6 seconds").ID
	}
	for _, id := range ids {
		c.client(other).waitRun(t, id, time.Minute, "waiting on its slow job", pendingSlowJob)
	}
	if err := c.nodes[paused].proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = c.nodes[paused].proc.Signal(syscall.SIGCONT)
		}
	}()
	waitUntil(t, time.Minute, "the other node to take over every session of the paused one", func() (bool, error) {
		return len(c.takeovers(c.nodes[paused].id, other)) >= runs, nil
	})
	seqs := map[string]int64{}
	for _, id := range ids {
		run := c.client(other).waitRun(t, id, 2*time.Minute, "terminal", runView.terminal)
		if run.Status != "completed" {
			t.Errorf("run %s is %s, want completed", id, run.Status)
		}
		seqs[id] = run.Seq
	}

	if err := c.nodes[paused].proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	if code := mustExit(t, c.nodes[paused].proc, time.Minute); code != 1 {
		t.Errorf("the resumed node exited %d; with its lease gone it must exit 1", code)
	}
	logText, err := os.ReadFile(c.nodes[paused].log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logText), "node lease lost") {
		t.Errorf("the resumed node's log does not say its lease was lost")
	}
	for _, id := range ids {
		if run := c.client(other).run(t, id); run.Seq != seqs[id] {
			t.Errorf("run %s went from seq %d to %d after the paused node resumed", id, seqs[id], run.Seq)
		}
	}
	if err := c.nodes[other].proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, c.nodes[other].proc, time.Minute); code != 0 {
		t.Errorf("the other node exited %d after SIGTERM, want 0", code)
	}
	c.checkRuns(ids)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

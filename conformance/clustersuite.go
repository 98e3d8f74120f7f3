package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// ClusterHarness tells ClusterSuite how to build several nodes on one
// store.
type ClusterHarness struct {
	// NewStores returns n handles on one fresh, empty store, as n
	// processes would each open it: what is committed through one is read
	// through every other, and each handle that is a runtime.ChangeFeed
	// reports the commits made through the others. The caller closes them.
	NewStores func(t *testing.T, clock runtime.Clock, n int) []runtime.Store
}

// ClusterSuite holds runtimes that share one store, as several nodes share
// a database, to the contract of docs/DESIGN.md §5 ("Several nodes"): any
// node takes any call for any session, the owner drives, other nodes'
// followers see every commit, a lost change feed costs only time, and a
// node's sessions pass to another at once when it stops and after its
// lease when it dies, with its effects in flight attached, not run again.
//
// conformance.MemStore runs it through its handles (MemHandle), pgstore
// through several Stores on one database.
func ClusterSuite(t *testing.T, h ClusterHarness) {
	for _, tc := range []struct {
		name string
		feed bool
		run  func(t *testing.T, c *clusterEnv)
	}{
		{"a run submitted through a node that does not own its session is driven by the owner", true, testSubmitThroughOther},
		{"an approval through another node is committed under the owner's epoch and acted on by the owner", true, testApproveThroughOther},
		{"a follower on another node sees every event as it is committed", true, testFollowOnOther},
		{"with the change feed lost, the owner's watchdog wakes what another node wrote at its first scan", false, testFeedLost},
		{"a node that stops gracefully hands its sessions over at once", true, testStopHandsOver},
		{"a dead node's sessions pass on after its lease, its effect in flight attached, not run again", true, testDeadNodeTakenOver},
		{"a node restarted under its node name takes its dead incarnation's sessions back before that lease ends", true, testRestartUnderNodeName},
		{"a second live process under one node name is refused at registration", true, testNodeNameHeld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newClusterEnv(t, h, 2, tc.feed))
		})
	}
}

// clusterNode is one node of a clusterEnv: its handle on the store, its
// runtime, and the executors it calls, counted apart from the other
// nodes'.
type clusterNode struct {
	store        runtime.Store
	tenant       *runtime.Tenant
	rt           *runtime.Runtime
	model, tools *CountingExecutor
}

type clusterEnv struct {
	*RuntimeEnv
	a, b *clusterNode
}

// deafFeed is a ChangeFeed that never delivers: a node whose LISTEN
// connection is down for good. The store is still shared.
type deafFeed struct{ runtime.Store }

func (deafFeed) SubscribeChanges(func(runtime.Change)) func() { return func() {} }

// WithoutFeed hides a store's ChangeFeed, so that a runtime over it
// behaves as over a store of one process. RuntimeSuite's harness on a
// shared store uses it: on a shared store the watchdog wakes a stuck Run
// at its first sighting (ClusterSuite holds that), where RuntimeSuite
// holds the single process's contract of reporting it at the second.
func WithoutFeed(s runtime.Store) runtime.Store { return withoutFeed{s} }

type withoutFeed struct{ runtime.Store }

func newClusterEnv(t *testing.T, h ClusterHarness, n int, feed bool) *clusterEnv {
	var stores []runtime.Store
	e := NewRuntimeEnv(t, RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		stores = h.NewStores(t, clock, n)
		if !feed {
			for i := range stores {
				stores[i] = deafFeed{stores[i]}
			}
		}
		return stores[0]
	}}, nil)
	c := &clusterEnv{RuntimeEnv: e, a: &clusterNode{store: stores[0], tenant: e.Tenant, rt: e.Runtime, model: e.Model, tools: e.Tools}}
	// Node b calls the same plugins (a tool service both nodes reach),
	// through counters of its own.
	b := &clusterNode{store: stores[1], model: &CountingExecutor{Next: e.Plugins.Model}, tools: &CountingExecutor{Next: e.Gate}}
	tenant := *e.Tenant
	tenant.Model = b.model
	tenant.Tools = append([]runtime.Tool(nil), e.Tenant.Tools...)
	for i := range tenant.Tools {
		tenant.Tools[i].Executor = b.tools
	}
	b.tenant = &tenant
	b.rt = e.NewRuntimeOn(b.store, &tenant, "node-b")
	c.b = b
	return c
}

// untilStored waits, without moving the clock, until the Run is terminal
// on record: only the nodes' own wake-ups may get it there.
func (c *clusterEnv) untilStored(runID string) loop.Run {
	c.T.Helper()
	var run loop.Run
	Eventually(c.T, "run "+runID+" to end on record", func() bool {
		r, err := c.Store.LoadRun(context.Background(), "acme", runID)
		run = r
		return err == nil && r.Status.Terminal()
	})
	return run
}

// checkLog holds the Run's whole log to loop.CheckEnded, the one checker.
func (c *clusterEnv) checkLog(runID string) []loop.Event {
	c.T.Helper()
	evs, err := c.Store.Events(context.Background(), "acme", runID, 1, 0)
	if err != nil {
		c.T.Fatal(err)
	}
	if v := loop.CheckEnded(evs); len(v) > 0 {
		c.T.Fatalf("run %s: the log breaks its invariants: %v", runID, v)
	}
	return evs
}

// stepClock moves the fake clock by d in steps, letting every clock
// callback (the live nodes' lease renewals) run between them.
func (c *clusterEnv) stepClock(d time.Duration) {
	c.T.Helper()
	for moved := time.Duration(0); moved < d; moved += maxJump {
		Eventually(c.T, "the clock's callbacks to return", func() bool { return c.Clock.Running() == 0 })
		c.Clock.Advance(min(maxJump, d-moved))
	}
	Eventually(c.T, "the clock's callbacks to return", func() bool { return c.Clock.Running() == 0 })
}

func (c *clusterEnv) submitOn(n *clusterNode, session, input string) loop.Run {
	c.T.Helper()
	run, _, err := n.rt.Submit(c.ctx(), runtime.Request{Tenant: "acme", Session: session, Input: input})
	if err != nil {
		c.T.Fatalf("submit %q: %v", input, err)
	}
	return run
}

func testSubmitThroughOther(t *testing.T, c *clusterEnv) {
	wantStatus(t, c.Execute("s1", "answer:one").Run, loop.StatusCompleted) // a owns s1 now
	before := c.a.model.Calls(abi.ExportStart)
	// The second Run of s1 replays the session's first script, which is
	// spent: it ends "script exhausted" after one model step.
	run := c.submitOn(c.b, "s1", "answer:two")
	done := c.untilStored(run.ID)
	wantStatus(t, done, loop.StatusCompleted)
	if done.Result != "script exhausted" {
		t.Fatalf("result %q", done.Result)
	}
	if n := c.b.model.Calls(abi.ExportStart); n != 0 {
		t.Fatalf("node b, which does not own s1, made %d model calls", n)
	}
	if n := c.a.model.Calls(abi.ExportStart) - before; n != 1 {
		t.Fatalf("the owner made %d model calls for the run, want 1", n)
	}
	c.checkLog(run.ID)
}

func testApproveThroughOther(t *testing.T, c *clusterEnv) {
	res := c.Execute("s1", `call:wire({"text":"w1"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting || len(res.Waiting.Approvals) != 1 {
		t.Fatalf("want a wait for one approval, got %s %+v", res.Kind, res.Waiting)
	}
	// A refusal from the Loop comes back from the guest as from the owner.
	if _, err := c.b.rt.Approve(c.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "nope", Approved: true}}); !errors.Is(err, loop.ErrUnknownToolCall) {
		t.Fatalf("approval of an unknown call through node b: %v", err)
	}
	if _, err := c.b.rt.Approve(c.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}},
		runtime.IfSeq(res.Run.Seq)); err != nil {
		t.Fatalf("approval through node b: %v", err)
	}
	if g := c.b.rt.Stats().GuestInputs; g != 1 {
		t.Fatalf("node b committed %d guest inputs, want 1", g)
	}
	done := c.untilStored(res.Run.ID)
	wantStatus(t, done, loop.StatusCompleted)
	if done.Result != "w1" {
		t.Fatalf("result %q", done.Result)
	}
	if c.b.tools.Calls(abi.ExportStart) != 0 || c.a.tools.Calls(abi.ExportStart) != 1 {
		t.Fatalf("tool starts: owner %d, guest %d; want 1 and 0", c.a.tools.Calls(abi.ExportStart), c.b.tools.Calls(abi.ExportStart))
	}
	c.checkLog(res.Run.ID)
}

func testFollowOnOther(t *testing.T, c *clusterEnv) {
	res := c.Execute("s1", `call:wire({"text":"w1"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	followed := make(chan []int64, 1)
	errc := make(chan error, 1)
	ctx := c.ctx()
	subscribed := make(chan struct{})
	go func() {
		var seqs []int64
		err := c.b.rt.Follow(ctx, "acme", res.Run.ID, 1, func(it runtime.StreamItem) error {
			if it.Event != nil {
				seqs = append(seqs, it.Event.Seq)
				if it.Event.Seq == res.Run.Seq {
					close(subscribed)
				}
			}
			return nil
		})
		errc <- err
		followed <- seqs
	}()
	<-subscribed
	// The follower has read the log so far and waits. Its fallback runs on
	// the fake clock, which does not move: only the change feed can wake it.
	if _, err := c.a.rt.Approve(c.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("follow on node b: %v", err)
	}
	seqs := <-followed
	evs := c.checkLog(res.Run.ID)
	if len(seqs) != len(evs) || seqs[len(seqs)-1] != evs[len(evs)-1].Seq {
		t.Fatalf("node b followed seqs %v; the log has %d events", seqs, len(evs))
	}
}

func testFeedLost(t *testing.T, c *clusterEnv) {
	wantStatus(t, c.Execute("s1", "answer:one").Run, loop.StatusCompleted)
	// a's driver may still be on s1 (it looks for the next Run once one
	// ends): let it finish, so that only the watchdog can find the next.
	Eventually(t, "node a to be idle", func() bool { return c.a.rt.Idle() })
	run := c.submitOn(c.b, "s1", "answer:two")
	// b met the owner at its claim and stepped aside; nothing told a.
	Eventually(t, "node b to step aside", func() bool { return c.b.rt.Idle() })
	if r, _ := c.Store.LoadRun(context.Background(), "acme", run.ID); r.Status != loop.StatusPending {
		t.Fatalf("run is %s before any node was told of it, want pending", r.Status)
	}
	ctx := c.ctx()
	if n := c.a.rt.WatchdogScan(ctx); n != 0 || c.a.rt.Recovery().WatchdogWakes != 1 {
		t.Fatalf("the owner's watchdog reported %d runs and woke %d; want it to wake the one, quietly", n, c.a.rt.Recovery().WatchdogWakes)
	}
	wantStatus(t, c.untilStored(run.ID), loop.StatusCompleted)
	c.checkLog(run.ID)

	// An approval through b is committed (b shares the store), and waits
	// for a's watchdog likewise.
	res := c.Execute("s2", `call:wire({"text":"w1"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	Eventually(t, "node a to be idle", func() bool { return c.a.rt.Idle() })
	if _, err := c.b.rt.Approve(ctx, "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatalf("approval through node b: %v", err)
	}
	if n := c.a.rt.WatchdogScan(ctx); n != 0 || c.a.rt.Recovery().WatchdogWakes != 2 {
		t.Fatalf("the owner's watchdog reported %d runs and woke %d in all; want it to wake the second, quietly", n, c.a.rt.Recovery().WatchdogWakes)
	}
	done := c.untilStored(res.Run.ID)
	wantStatus(t, done, loop.StatusCompleted)
	if c.a.rt.Recovery().WatchdogReports != 0 {
		t.Fatalf("the watchdog reported %d stuck runs", c.a.rt.Recovery().WatchdogReports)
	}
	c.checkLog(res.Run.ID)
}

func testStopHandsOver(t *testing.T, c *clusterEnv) {
	res := c.Execute("s1", `call:wire({"text":"w1"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.a.rt.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// No time passes: the released session is b's to claim at once.
	if _, err := c.b.rt.Approve(c.ctx(), "acme", res.Run.ID, []abi.ApprovalDecision{{ToolCallID: "call_1_1", Approved: true}}); err != nil {
		t.Fatalf("approval through node b after a stopped: %v", err)
	}
	done := c.untilStored(res.Run.ID)
	wantStatus(t, done, loop.StatusCompleted)
	if c.b.rt.Stats().GuestInputs != 0 || c.b.tools.Calls(abi.ExportStart) != 1 {
		t.Fatalf("node b: %d guest inputs, %d tool starts; want it to own the session and call the tool once",
			c.b.rt.Stats().GuestInputs, c.b.tools.Calls(abi.ExportStart))
	}
	c.checkLog(res.Run.ID)
}

func testDeadNodeTakenOver(t *testing.T, c *clusterEnv) {
	res := c.Execute("s1", `call:slow({"text":"job"})|answer:$results`)
	if res.Kind != runtime.ResultWaiting || res.Waiting == nil || len(res.Waiting.Pending) != 1 {
		t.Fatalf("want a pending effect, got %s %+v", res.Kind, res.Waiting)
	}
	c.a.rt.Halt()
	ctx := c.ctx()
	if n, err := c.b.rt.RecoverNow(ctx); err != nil || n != 0 {
		t.Fatalf("recovery while a's lease lives took %d sessions (%v), want 0", n, err)
	}
	c.stepClock(time.Minute + time.Second) // past a's lease; b renews its own on the way
	if n, err := c.b.rt.RecoverNow(ctx); err != nil || n != 1 {
		t.Fatalf("recovery after a's lease took %d sessions (%v), want 1", n, err)
	}
	done := c.UntilTerminal(c.b.rt, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, done, loop.StatusCompleted)
	if done.Result != "slow:job" {
		t.Fatalf("result %q", done.Result)
	}
	key := loop.AssignmentKey{Tenant: "acme", Session: "s1", EffectID: res.Run.ID + ".t1.0", Attempt: 1}.String()
	starts := c.a.tools.CallsFor(abi.ExportStart, key) + c.b.tools.CallsFor(abi.ExportStart, key)
	if starts != 1 || c.b.tools.CallsFor(abi.ExportAttach, key) != 1 {
		t.Fatalf("the job was started %d times and attached %d times by b; want 1 and 1", starts, c.b.tools.CallsFor(abi.ExportAttach, key))
	}
	c.checkLog(res.Run.ID)
}

// named starts a runtime under node name on n's store, with n's tenant
// and executors, and returns Start's error.
func (c *clusterEnv) named(n *clusterNode, name string) (*runtime.Runtime, error) {
	c.T.Helper()
	return c.startRuntime(runtime.Options{Store: n.store, Tenants: runtime.TenantMap{"acme": n.tenant}, NodeName: name})
}

// skipWithoutNodeNames skips a test on a store that holds no node names:
// one that serves a single process (Badger, MemStore), where every
// earlier incarnation is dead by the time a process opens the store.
func skipWithoutNodeNames(t *testing.T, c *clusterEnv) {
	if _, ok := c.a.store.(runtime.NodeNames); !ok {
		t.Skip("the store is not a runtime.NodeNames")
	}
}

func testRestartUnderNodeName(t *testing.T, c *clusterEnv) {
	skipWithoutNodeNames(t, c)
	first, err := c.named(c.a, "n")
	if err != nil {
		t.Fatal(err)
	}
	res, err := first.Execute(c.ctx(), runtime.Request{Tenant: "acme", Session: "s1", Input: `call:slow({"text":"job"})|answer:$results`})
	if err != nil || res.Kind != runtime.ResultWaiting || res.Waiting == nil || len(res.Waiting.Pending) != 1 {
		t.Fatalf("want a pending effect, got %s %+v, %v", res.Kind, res.Waiting, err)
	}
	first.Halt() // a crash: its lease runs on for a minute
	halted := c.Clock.Now()
	second, err := c.named(c.b, "n")
	if err != nil {
		t.Fatalf("the restart under node name n: %v", err)
	}
	if !c.Clock.Now().Equal(halted) {
		t.Fatalf("the clock moved by %s during the restart", c.Clock.Now().Sub(halted))
	}
	// Its first recovery pass claimed s1, with no time passed: node-b,
	// alive, is refused the session as the restart's.
	_, err = c.b.store.ClaimSession(c.ctx(), "acme", "s1", "node-b", c.Clock.Now().UnixMilli())
	var owned *runtime.SessionOwnedError
	if !errors.As(err, &owned) || owned.Owner != second.NodeID() {
		t.Fatalf("after the restart, 0 s into the halted incarnation's lease of 1 min, a claim of s1: %v; want it owned by %s",
			err, second.NodeID())
	}
	done := c.UntilTerminal(second, res.Run.ID, 100*time.Millisecond)
	wantStatus(t, done, loop.StatusCompleted)
	key := loop.AssignmentKey{Tenant: "acme", Session: "s1", EffectID: res.Run.ID + ".t1.0", Attempt: 1}.String()
	starts := c.a.tools.CallsFor(abi.ExportStart, key) + c.b.tools.CallsFor(abi.ExportStart, key)
	if starts != 1 || c.b.tools.CallsFor(abi.ExportAttach, key) != 1 {
		t.Fatalf("the job was started %d times and attached %d times by the restart; want 1 and 1", starts, c.b.tools.CallsFor(abi.ExportAttach, key))
	}
	c.checkLog(res.Run.ID)
}

func testNodeNameHeld(t *testing.T, c *clusterEnv) {
	skipWithoutNodeNames(t, c)
	first, err := c.named(c.a, "n")
	if err != nil {
		t.Fatal(err)
	}
	run, _, err := first.Submit(c.ctx(), runtime.Request{Tenant: "acme", Session: "s1", Input: `call:slow({"text":"job"})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.named(c.b, "n"); !errors.Is(err, runtime.ErrNodeNameHeld) {
		t.Fatalf("a second live process under node name n: %v; want ErrNodeNameHeld", err)
	}
	// The refusal took nothing from the live holder.
	_, err = c.b.store.ClaimSession(c.ctx(), "acme", "s1", "node-b", c.Clock.Now().UnixMilli())
	var owned *runtime.SessionOwnedError
	if !errors.As(err, &owned) || owned.Owner != first.NodeID() {
		t.Fatalf("after the refusal, a claim of s1: %v; want it owned by %s", err, first.NodeID())
	}
	done := c.UntilTerminal(first, run.ID, 100*time.Millisecond)
	wantStatus(t, done, loop.StatusCompleted)
}

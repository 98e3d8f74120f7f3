package runtime_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// readCounting is a Store that counts the loads of each Run and the reads
// of the history before it.
type readCounting struct {
	runtime.Store
	mu      sync.Mutex
	loads   map[string]int
	history map[string]int
	active  map[string]int // ActiveRuns, by session
}

func (s *readCounting) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	s.mu.Lock()
	s.active[session]++
	s.mu.Unlock()
	return s.Store.ActiveRuns(ctx, tenant, session)
}

// activeReads returns how many times each session's active Runs were
// read, and forgets them.
func (s *readCounting) activeReads() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.active
	s.active = map[string]int{}
	return out
}

func (s *readCounting) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	s.mu.Lock()
	s.loads[runID]++
	s.mu.Unlock()
	return s.Store.LoadRun(ctx, tenant, runID)
}

func (s *readCounting) CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error) {
	s.mu.Lock()
	s.history[runID]++
	s.mu.Unlock()
	return s.Store.CompletedRunsBefore(ctx, tenant, session, runID, limit)
}

// readCountingEnv is a runtime env on h's store, wrapped in a
// readCounting.
func readCountingEnv(t *testing.T, h conformance.RuntimeHarness) (*conformance.RuntimeEnv, *readCounting) {
	var s *readCounting
	hh := h
	hh.NewStore = func(t *testing.T, clock runtime.Clock) runtime.Store {
		s = &readCounting{Store: h.NewStore(t, clock), loads: map[string]int{}, history: map[string]int{}, active: map[string]int{}}
		return s
	}
	return conformance.NewRuntimeEnv(t, hh, nil), s
}

func (s *readCounting) counts(runID string) (loads, history int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads[runID], s.history[runID]
}

// The owner of a session reads back no snapshot it committed itself: each
// advance of a Run after the first starts from the snapshot of its
// previous commit, the first from the creation's. The history of the
// session's first Run is known to be empty, and is not read; a second
// Run's is read once for its two model steps.
func TestAnOwnersAdvancesReadNoSnapshotBack(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e, s := readCountingEnv(t, h)
			res := e.Execute("s1", `call:echo({"text":"a"})|answer:$results`)
			if res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusCompleted || res.Run.Result != "a" {
				t.Fatalf("result %s, run %s with %q", res.Kind, res.Run.Status, res.Run.Result)
			}
			if c := e.Runtime.Stats().Commits; c != 4 {
				t.Fatalf("%d commits after the creation, want 4", c)
			}
			if loads, history := s.counts(res.Run.ID); loads != 0 || history != 0 {
				t.Fatalf("the session's first Run's 4 advances loaded it %d times and read the history %d times; want 0 and 0", loads, history)
			}
			// The scripted model follows the session's first script, which
			// the history holds: the second Run ends when it is done.
			second := e.Execute("s1", `call:echo({"text":"b"})|answer:$results`)
			if second.Kind != runtime.ResultTerminal || second.Run.Status != loop.StatusCompleted {
				t.Fatalf("second result %s, run %s with %q", second.Kind, second.Run.Status, second.Run.Result)
			}
			if loads, history := s.counts(second.Run.ID); loads != 0 || history != 1 {
				t.Fatalf("the session's second Run's advances loaded it %d times and read the history %d times; want 0 and 1", loads, history)
			}
			conformance.Eventually(t, "the runtime to be idle", func() bool { return e.Runtime.Idle() })
			if n := runtime.OwnedRuns(e.Runtime); n != 0 {
				t.Fatalf("%d Runs still cached after the Run ended, want 0", n)
			}
		})
	}
}

// A cancel request committed to a Run under its owner's epoch but not by
// the owner, as a guest node commits an input (guestInput), makes the
// snapshot the owner committed last stale. Whichever way the owner learns
// of it (its next advance on that guess refused by the store as a version
// conflict, or a kick that reads the Run), it acts on the cancel: the Run
// ends cancelled, its log whole.
func TestAGuestsInputUnderTheOwnersEpochIsNotLostOnAGuess(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e := conformance.NewRuntimeEnv(t, h, nil)
			created := submitT(t, e, `call:block()|answer:$results`)
			conformance.Eventually(t, "the block tool to start", func() bool { return e.Tools.Calls(abi.ExportStart) == 1 })
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cur, err := e.Store.LoadRun(ctx, "acme", created.ID)
			if err != nil {
				t.Fatal(err)
			}
			ev := loop.Event{Type: loop.EventCancelRequested, Seq: cur.Seq + 1, At: e.Clock.Now().UnixMilli(), Reason: "by a guest"}
			next, err := loop.Apply(cur, ev)
			if err != nil {
				t.Fatal(err)
			}
			owners, err := e.Store.ActiveSessions(ctx, "", "", 0)
			if err != nil || len(owners) != 1 {
				t.Fatalf("active sessions %+v, %v", owners, err)
			}
			if _, err := e.Store.Commit(ctx, runtime.Commit{Tenant: "acme", Session: "s1", RunID: created.ID, CommandID: "guest-cancel",
				ExpectedSeq: cur.Seq, Epoch: owners[0].Epoch, Events: []loop.Event{ev}, Run: next}); err != nil {
				t.Fatal(err)
			}
			e.Plugins.Release()
			run := e.UntilTerminal(e.Runtime, created.ID, 100*time.Millisecond)
			if run.Status != loop.StatusCancelled {
				t.Fatalf("run %s with %q; want cancelled", run.Status, run.Result)
			}
			evs, err := e.Store.Events(ctx, "acme", run.ID, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := loop.CheckEnded(evs); err != nil {
				t.Fatalf("event log: %v", err)
			}
		})
	}
}

// A Run that recovery takes over is read from the store once, by the
// first advance of its new owner, which finds nothing to commit while
// its tool's job is in flight: the advance of the job's settlement, which
// the attach finds done, starts from that read. The builder's history of
// a session's first Run is known to be empty from the claim
// (SessionClaim.HeadOrdinal) and is not read; a second Run's is read
// once.
func TestARecoveredRunIsReadOnceAndAFirstRunsHistoryNot(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e, s := readCountingEnv(t, h)
			first := e.Execute("s1", `call:slow({"text":"x"})|answer:$results`)
			// s2's script, its first Run's input, is the session's: its
			// first Run answers, its second calls the job.
			if done := e.Execute("s2", `answer:before|call:slow({"text":"y"})|answer:$results`); done.Run.Status != loop.StatusCompleted {
				t.Fatalf("s2's first Run: %s", done.Run.Status)
			}
			second := e.Execute("s2", `go on`)
			if first.Kind != runtime.ResultWaiting || second.Kind != runtime.ResultWaiting {
				t.Fatalf("results %s and %s, want both waiting on their jobs", first.Kind, second.Kind)
			}
			e.Crash(e.Runtime)
			type reads struct{ loads, history int }
			before := map[string]reads{}
			for _, id := range []string{first.Run.ID, second.Run.ID} {
				l, h := s.counts(id)
				before[id] = reads{l, h}
			}
			tools, ok := e.Plugins.Tools.(*conformance.ScriptedTools)
			if !ok {
				t.Skipf("the harness's tools are %T, not ScriptedTools", e.Plugins.Tools)
			}
			tools.DoneAtAttach = true
			b := e.Recover("node-b")
			ctx := context.Background()
			conformance.Eventually(t, "both Runs to complete", func() bool {
				for _, id := range []string{first.Run.ID, second.Run.ID} {
					if r, err := s.Store.LoadRun(ctx, "acme", id); err != nil || r.Status != loop.StatusCompleted {
						return false
					}
				}
				return true
			})
			if r := b.Recovery(); r.SessionsTaken != 2 || r.Settle != 2 {
				t.Fatalf("sessions taken %d, settled %d; want 2 and 2", r.SessionsTaken, r.Settle)
			}
			for id, want := range map[string]reads{first.Run.ID: {1, 0}, second.Run.ID: {1, 1}} {
				l, h := s.counts(id)
				if got := (reads{l - before[id].loads, h - before[id].history}); got != want {
					t.Errorf("Run %s after the takeover: loaded %d times, its history read %d times; want %d and %d",
						id, got.loads, got.history, want.loads, want.history)
				}
			}
		})
	}
}

// The watchdog reads nothing back for a session whose Run this process
// has under way (a job it watches): that Run is not stuck, whatever the
// store says of it. A session whose Run waits for a person is read, as
// the safety net under a lost notice of another node's input.
func TestTheWatchdogReadsNoSessionWhoseRunIsUnderWayHere(t *testing.T) {
	for name, h := range harnesses() {
		t.Run(name, func(t *testing.T) {
			e, s := readCountingEnv(t, h)
			for _, session := range []string{"job1", "job2", "job3"} {
				if res := e.Execute(session, `call:slow({"text":"x"})|answer:$results`); res.Kind != runtime.ResultWaiting {
					t.Fatalf("%s: result %s, want waiting on its job", session, res.Kind)
				}
			}
			if res := e.Execute("asks", `ask:who?|answer:ok`); res.Kind != runtime.ResultWaiting || res.Waiting == nil || res.Waiting.Input == nil {
				t.Fatalf("asks: result %s %+v, want waiting for input", res.Kind, res.Waiting)
			}
			s.activeReads()
			if n := e.Runtime.WatchdogScan(context.Background()); n != 0 {
				t.Fatalf("the watchdog reported %d Runs stuck, want 0", n)
			}
			if got, want := s.activeReads(), map[string]int{"asks": 1}; !maps.Equal(got, want) {
				t.Fatalf("the watchdog read the active Runs of %v, want of %v only", got, want)
			}
		})
	}
}

package badgerstore

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The crash test re-executes the test binary as a child that commits in a
// loop on a real Badger directory and prints each acknowledged commit. The
// parent kills it with SIGKILL at random moments, several times over, then
// reopens the directory and checks that every acknowledged commit is there
// and that the indexes agree with the snapshots.

const (
	crashDirEnv    = "AGENTHOST_CRASH_CHILD_DIR"
	crashSeedEnv   = "AGENTHOST_CRASH_SEED"
	crashTenant    = "crash"
	crashSessions  = 3
	crashRounds    = 10
	crashMaxAcks   = 200
	crashWaitLimit = 20 * time.Second
)

func crashSession(i int) string { return "s" + strconv.Itoa(i) }

func TestCrashKill9KeepsEveryAcknowledgedCommit(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("running as the crash child")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", crashSeedEnv, s, err)
		}
	}
	t.Logf("crash test seed %d (rerun with %s=%d)", seed, crashSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	dir := t.TempDir()
	acked := map[string]int64{} // run → highest acknowledged Seq
	for round := range crashRounds {
		killAfter := 1 + rng.IntN(crashMaxAcks)
		n := runCrashChild(t, dir, killAfter, acked)
		t.Logf("round %d: killed the child after %d acknowledged commits", round, n)
	}
	if len(acked) == 0 {
		t.Fatal("the child acknowledged nothing")
	}

	s := openT(t, dir, Options{})
	ctx := context.Background()
	for run, seq := range acked {
		r, err := s.LoadRun(ctx, crashTenant, run)
		if err != nil {
			t.Fatalf("acknowledged run %s is lost: %v", run, err)
		}
		if r.Seq < seq {
			t.Fatalf("run %s is at Seq %d; Seq %d was acknowledged", run, r.Seq, seq)
		}
		evs, err := s.Events(ctx, crashTenant, run, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var replay loop.Run
		for i, ev := range evs {
			if ev.Seq != int64(i+1) {
				t.Fatalf("run %s: event %d has Seq %d", run, i+1, ev.Seq)
			}
			if replay, err = loop.Apply(replay, ev); err != nil {
				t.Fatalf("run %s: replay of event %d: %v", run, ev.Seq, err)
			}
		}
		if !sameRun(replay, r) {
			t.Fatalf("run %s: the event log (%d events) does not rebuild the snapshot (Seq %d)", run, len(evs), r.Seq)
		}
	}
	var sessions []string
	for i := range crashSessions {
		sessions = append(sessions, crashSession(i))
	}
	if err := conformance.CheckIndexes(ctx, s, crashTenant, sessions); err != nil {
		t.Fatalf("after %d crashes: %v", crashRounds, err)
	}
	t.Logf("%d runs checked", len(acked))
}

func sameRun(a, b loop.Run) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// runCrashChild starts the child on dir, records its acknowledgements in
// acked, and kills it with SIGKILL once it has acknowledged killAfter
// commits. It returns how many it saw.
func runCrashChild(t *testing.T, dir string, killAfter int, acked map[string]int64) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	deadline := time.NewTimer(crashWaitLimit)
	defer deadline.Stop()
	n := 0
	for n < killAfter {
		select {
		case line, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("the child exited before it was killed, after %d acks:\n%s", n, stderr.String())
			}
			run, seq, isAck := parseAck(line)
			if !isAck {
				continue
			}
			if seq > acked[run] {
				acked[run] = seq
			}
			n++
		case <-deadline.C:
			_ = cmd.Process.Kill()
			t.Fatalf("no progress from the child within %v (%d acks):\n%s", crashWaitLimit, n, stderr.String())
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL on Unix
		t.Fatal(err)
	}
	// Acks printed before the kill landed were acknowledged too.
	for line := range lines {
		if run, seq, ok := parseAck(line); ok && seq > acked[run] {
			acked[run] = seq
			n++
		}
	}
	_ = cmd.Wait()
	return n
}

func parseAck(line string) (run string, seq int64, ok bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "ack" {
		return "", 0, false
	}
	seq, err := strconv.ParseInt(f[2], 10, 64)
	return f[1], seq, err == nil
}

// TestCrashChild is the child of the crash test; it runs only when the
// parent sets AGENTHOST_CRASH_CHILD_DIR. It drives Runs in crashSessions
// sessions concurrently, one commit per step, and prints "ack RUN SEQ"
// after each acknowledged commit, until it is killed.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("only runs as the crash test's child")
	}
	s, err := Open(dir, Options{Logger: quietLogger(), GCInterval: 50 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	node := fmt.Sprintf("child-%d", os.Getpid())
	if err := s.RegisterNode(ctx, node, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var out sync.Mutex
	ack := func(run string, seq int64) {
		out.Lock()
		fmt.Fprintf(os.Stdout, "ack %s %d\n", run, seq)
		out.Unlock()
	}
	var wg sync.WaitGroup
	for i := range crashSessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := crashDrive(ctx, s, node, crashSession(i), ack); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
		}()
	}
	wg.Wait()
}

// crashDrive takes a session over and moves its Runs forward forever: the
// head Run one step per commit, and a new Run once the head ends.
func crashDrive(ctx context.Context, s *Store, node, session string, ack func(string, int64)) error {
	epoch, err := s.ClaimSession(ctx, crashTenant, session, node, time.Now().UnixMilli())
	if err != nil {
		return err
	}
	for {
		active, err := s.ActiveRuns(ctx, crashTenant, session)
		if err != nil {
			return err
		}
		if len(active) == 0 {
			all, err := s.SessionRuns(ctx, crashTenant, session, 0, 0)
			if err != nil {
				return err
			}
			id := fmt.Sprintf("%s-r%d", session, len(all)+1)
			spec := loop.Spec{Tenant: crashTenant, Session: session, ID: id, Input: "crash me",
				Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
			ev := loop.RunCreated(spec, time.Now().UnixMilli())
			r, err := loop.Apply(loop.Run{}, ev)
			if err != nil {
				return err
			}
			res, err := s.CreateRun(ctx, runtime.CreateRun{Run: r, Event: ev, CommandID: "create-" + id})
			if err != nil {
				return err
			}
			ack(id, res.Run.Seq)
			continue
		}
		r := active[0]
		evs := crashNext(r, epoch)
		c := runtime.Commit{Tenant: crashTenant, Session: session, RunID: r.ID, ExpectedSeq: r.Seq, Epoch: epoch,
			CommandID: fmt.Sprintf("step-%d", r.Seq)}
		for _, ev := range evs {
			ev.At = time.Now().UnixMilli()
			if r, err = loop.Apply(r, ev); err != nil {
				return fmt.Errorf("apply %s: %w", ev.Type, err)
			}
			ev.Seq = r.Seq
			c.Events = append(c.Events, ev)
		}
		c.Run = r
		res, err := s.Commit(ctx, c)
		if err != nil {
			return err
		}
		ack(r.ID, res.Seq)
	}
}

// crashNext is the next step of a Run: start and plan, dispatch, pend,
// then settle and complete.
func crashNext(r loop.Run, epoch uint64) []loop.Event {
	eff := loop.ModelEffectID(r.ID, 1)
	switch {
	case r.Status == loop.StatusPending:
		return []loop.Event{{Type: loop.EventRunStarted},
			{Type: loop.EventModelStepPlanned, Step: 1, Request: json.RawMessage(`{"model":"crash"}`)}}
	case r.Verdict != nil:
		return []loop.Event{{Type: loop.EventRunCompleted}}
	case len(r.Effects) > 0 && r.Effects[0].State == loop.EffectReady:
		return []loop.Event{{Type: loop.EventEffectDispatched, EffectID: eff, Attempt: 1, Epoch: epoch}}
	case len(r.Effects) > 0 && r.Effects[0].Handle == "":
		return []loop.Event{{Type: loop.EventEffectPending, EffectID: eff, Attempt: 1, Handle: "job-" + r.ID}}
	default:
		return []loop.Event{loop.Settled(eff, 1, loop.Outcome{State: loop.OutcomeDone,
			Model: &abi.ModelOutcome{Message: abi.Message{Content: "done"}}}, 0), {Type: loop.EventRunCompleted}}
	}
}

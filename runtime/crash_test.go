package runtime_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The crash test's child modes, chosen by environment variable.
const (
	crashDirEnv  = "AGENTHOST_CRASH_DIR"
	crashModeEnv = "AGENTHOST_CRASH_MODE" // "drive" or "recover"
	crashRuns    = 20
)

// crashScript asks for one slow job of 1.5 s of host time.
const crashScript = `call:slow({"duration_ms":1500})|answer:$results`

// TestCrashRecoveryReattaches: a child process drives Runs whose slow-job
// effects go pending, over a real Badger directory; the parent kills it
// with SIGKILL; a second child recovers. Every acknowledged Run must
// complete, and every slow job must be re-attached (attempt 1 finishes),
// never started again.
func TestCrashRecoveryReattaches(t *testing.T) {
	if os.Getenv(crashModeEnv) != "" {
		crashChild(t)
		return
	}
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	// Build the plugins here, so the children only read the cache.
	for _, name := range []string{conformance.PluginBuilder, conformance.PluginScripted, conformance.PluginSlowJob} {
		if _, err := conformance.BuildPlugin(name); err != nil {
			t.Fatal(err)
		}
	}
	deadline := crashDeadline(t)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	drive := crashCommand(ctx, dir, "drive", deadline)
	out, err := drive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	drive.Stderr = os.Stderr
	if err := drive.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	var said strings.Builder // the child's other output: its failure, if it fails
	allPending := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if id, ok := strings.CutPrefix(line, "ACK "); ok {
			acked[id] = true
			continue
		}
		if line == "ALL-PENDING" {
			allPending = true
			break
		}
		said.WriteString(line + "\n")
	}
	if !allPending {
		_ = drive.Wait()
		if ctx.Err() != nil {
			t.Fatalf("the driving child acknowledged %d of %d runs and was killed at the test's deadline (%s):\n%s",
				len(acked), crashRuns, deadline.Format(time.TimeOnly), said.String())
		}
		t.Fatalf("the driving child ended (%v) having acknowledged %d of %d runs:\n%s", drive.ProcessState, len(acked), crashRuns, said.String())
	}
	if len(acked) != crashRuns {
		t.Fatalf("the driving child acknowledged %d runs, want %d", len(acked), crashRuns)
	}
	if err := drive.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, out)
	_ = drive.Wait()

	rec := crashCommand(ctx, dir, "recover", deadline)
	rec.Stderr = os.Stderr
	raw, err := rec.Output()
	if err != nil && ctx.Err() != nil {
		t.Fatalf("the recovering child was killed at the test's deadline (%s):\n%s", deadline.Format(time.TimeOnly), raw)
	}
	if err != nil {
		t.Fatalf("recovering child: %v\n%s", err, raw)
	}
	var report crashReport
	_, line, found := strings.Cut(string(raw), "REPORT ")
	line, _, _ = strings.Cut(line, "\n")
	if err := json.Unmarshal([]byte(line), &report); !found || err != nil {
		t.Fatalf("no report from the recovering child (%v):\n%s", err, raw)
	}
	for id := range acked {
		r, ok := report.Runs[id]
		if !ok {
			t.Fatalf("acknowledged run %s lost", id)
		}
		if r.Status != loop.StatusCompleted || r.Result != "slow:"+id+".t1.0#1" {
			t.Errorf("run %s: %s %q, want completed by attempt 1 of its slow job", id, r.Status, r.Result)
		}
	}
	if report.Starts != 0 {
		t.Errorf("the recovering process started %d slow jobs; it must re-attach them", report.Starts)
	}
	if report.Reattach != crashRuns || report.Attaches < crashRuns {
		t.Errorf("reattach decisions %d, attach calls %d; want %d", report.Reattach, report.Attaches, crashRuns)
	}
}

type crashReport struct {
	Runs map[string]struct {
		Status loop.Status `json:"status"`
		Result string      `json:"result"`
	} `json:"runs"`
	Starts   int   `json:"starts"`
	Attaches int   `json:"attaches"`
	Reattach int64 `json:"reattach"`
}

// crashMargin is the time left, before the test binary's own timeout, for
// the parent to kill a child and say what it was doing.
const crashMargin = 10 * time.Second

// crashDeadline is when both children must have finished: a guard against a
// child that hangs, never a measure of speed. A child under -race on a loaded
// machine can take minutes just to load its three plugins, so any fixed
// figure is a flake; the guard is the test's own deadline less crashMargin,
// or ten minutes under -timeout 0. In a child (whose -test.timeout the parent
// set) it comes crashMargin before the parent's kill, and bounds the child's
// waits and plugin calls.
func crashDeadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-crashMargin)
	}
	return time.Now().Add(10 * time.Minute)
}

// crashCommand runs this test binary as a child in mode, killed when ctx
// ends. Its own -test.timeout is the time left until deadline, so it bounds
// its waits by the same deadline (crashWait) and a driving child orphaned by
// a dead parent still exits.
func crashCommand(ctx context.Context, dir, mode string, deadline time.Time) *exec.Cmd {
	left := max(time.Until(deadline), time.Second) // 0 would mean no timeout
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestCrashRecoveryReattaches$", "-test.count=1", "-test.timeout="+left.String())
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashModeEnv+"="+mode)
	return cmd
}

// crashWait waits in a child until cond holds, up to crashDeadline, so that
// a wait that never ends fails saying what it waited for before the parent
// kills the child.
func crashWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := crashDeadline(t)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// crashNode is one process's runtime over the shared directory.
type crashNode struct {
	store *badgerstore.Store
	host  *host.Host
	rt    *runtime.Runtime
	slow  *conformance.CountingExecutor
}

// crashEpoch is where the children's fake clocks start: the driving child's
// stands still there, so its slow jobs can never finish before the kill,
// whatever the machine's speed; the recovering child's starts 500 ms later
// (inside the jobs' 1.5 s), so attach must answer pending.
var crashEpoch = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func openCrashNode(t *testing.T, dir string, clock runtime.Clock) *crashNode {
	ctx := context.Background()
	// A plugin call's wall-clock bound is not what this test checks, and on
	// a loaded machine a poll, whose KV write queues behind the others' and
	// an fsync, passed the 10 s default: plugin_timeout, and the Run failed.
	// The calls are bounded by the child's deadline instead.
	callTimeout := max(time.Until(crashDeadline(t)), time.Second)
	store, err := badgerstore.Open(dir, badgerstore.Options{Logger: quiet, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(host.Config{CacheDir: conformance.WazeroCacheDir(), KV: store, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	load := func(name, plugin string, role abi.Role) *host.Plugin {
		path, err := conformance.BuildPlugin(plugin)
		if err != nil {
			t.Fatal(err)
		}
		p, err := h.Load(ctx, host.PluginSpec{Name: name, Path: path, Role: role, Limits: host.Limits{PoolSize: 8, CallTimeout: callTimeout}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	b, _ := load("builder", conformance.PluginBuilder, abi.RoleBuilder).Builder()
	m, _ := load("model", conformance.PluginScripted, abi.RoleExecutor).Executor()
	sp := load("slowjob", conformance.PluginSlowJob, abi.RoleExecutor)
	sx, _ := sp.Executor()
	n := &crashNode{store: store, host: h, slow: &conformance.CountingExecutor{Next: sx}}
	tenant := &runtime.Tenant{ID: "acme", Builder: b, Model: m, Limits: loop.DefaultLimits,
		Tools: []runtime.Tool{{Descriptor: sp.Describe().Tools[0], Spec: loop.ToolSpec{Name: "slow", Policy: loop.Policy{Mode: loop.PolicyFail}}, Executor: n.slow}}}
	n.rt, err = runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock,
		Logger: quiet, PollMin: 100 * time.Millisecond, PollMax: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

func crashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	ctx := context.Background()
	switch os.Getenv(crashModeEnv) {
	case "drive":
		n := openCrashNode(t, dir, conformance.NewFakeClock(crashEpoch))
		for i := 0; i < crashRuns; i++ {
			res, err := n.rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: crashScript})
			if err != nil || res.Kind != runtime.ResultWaiting || len(res.Waiting.Pending) != 1 {
				t.Fatalf("run %d: %v %s %+v", i, err, res.Kind, res.Waiting)
			}
			fmt.Printf("ACK %s\n", res.Run.ID)
		}
		fmt.Println("ALL-PENDING")
		select {} // until SIGKILL
	case "recover":
		clock := conformance.NewFakeClock(crashEpoch.Add(500 * time.Millisecond))
		n := openCrashNode(t, dir, clock)
		idle := func() {
			crashWait(t, "the recovering runtime to be idle", func() bool { return n.rt.Idle() && clock.Running() == 0 })
		}
		crashWait(t, "recovery's first pass", n.rt.Ready)
		idle()
		report := crashReport{Runs: map[string]struct {
			Status loop.Status `json:"status"`
			Result string      `json:"result"`
		}{}}
		for step := 0; step < 200 && len(report.Runs) < crashRuns; step++ {
			clock.Advance(250 * time.Millisecond)
			idle()
			for i := 0; i < crashRuns; i++ {
				sruns, err := n.store.SessionRuns(ctx, "acme", fmt.Sprintf("s%d", i), 0, 0)
				if err != nil || len(sruns) == 0 || !sruns[0].Run.Status.Terminal() {
					continue
				}
				r := sruns[0].Run
				report.Runs[r.ID] = struct {
					Status loop.Status `json:"status"`
					Result string      `json:"result"`
				}{r.Status, r.Result}
			}
		}
		report.Starts = n.slow.Calls(abi.ExportStart)
		report.Attaches = n.slow.Calls(abi.ExportAttach)
		report.Reattach = n.rt.Recovery().Reattach
		_ = n.rt.Stop(ctx)
		_ = n.host.Close(ctx)
		_ = n.store.Close()
		raw, _ := json.Marshal(report)
		fmt.Printf("\nREPORT %s\n", raw)
	}
}

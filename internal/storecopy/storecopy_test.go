package storecopy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// transcriptBuilder passes a Run's own transcript, without the session's
// history, so that each Run of a session follows its own script.
type transcriptBuilder struct{}

func (transcriptBuilder) Build(_ context.Context, _ string, in abi.BuildInput) (abi.BuildOutput, error) {
	return abi.BuildOutput{Request: abi.ModelRequest{Messages: in.Transcript, Tools: in.Tools}}, nil
}

// copyTenant is a tenant of the copy tests: the transcript builder, the
// scripted model, and tools (wire waits for approval; every tool fails on
// a missing effect).
func copyTenant(id string, tools *conformance.ScriptedTools) *runtime.Tenant {
	t := &runtime.Tenant{ID: id, Builder: transcriptBuilder{}, Model: &conformance.ScriptedModel{},
		Limits: loop.Limits{MaxSteps: 8, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4}}
	for _, tl := range tools.Tools() {
		t.Tools = append(t.Tools, runtime.Tool{Descriptor: tl, Executor: tools,
			Spec: loop.ToolSpec{Name: tl.Name, Approval: tl.Name == "wire", Policy: loop.Policy{Mode: loop.PolicyFail}}})
	}
	return t
}

func startRuntime(t *testing.T, st runtime.Store, tools *conformance.ScriptedTools) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Store: st, Clock: runtime.SystemClock{}, Logger: quietLog,
		Tenants: runtime.TenantMap{"acme": copyTenant("acme", tools), "globex": copyTenant("globex", tools)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rt
}

// halt crashes a runtime: nothing it has in flight is finished or
// released.
func halt(t *testing.T, rt *runtime.Runtime) {
	t.Helper()
	rt.Halt()
	waitUntil(t, 30*time.Second, "the halted runtime to be idle", func() (bool, error) { return rt.Idle(), nil })
}

var quietLog = slog.New(slog.DiscardHandler)

// waitUntil polls cond until it holds, failing the test at the deadline.
var waitUntil = conformance.WaitUntil

// waitRun polls a Run until cond holds.
func waitRun(t *testing.T, st runtime.Store, tenant, id, what string, cond func(loop.Run) bool) {
	t.Helper()
	waitUntil(t, 30*time.Second, what, func() (bool, error) {
		r, err := st.LoadRun(context.Background(), tenant, id)
		return err == nil && cond(r), err
	})
}

func toolExecuting(tool string) func(loop.Run) bool {
	return func(r loop.Run) bool {
		for _, e := range r.Executing() {
			if e.Tool == tool {
				return true
			}
		}
		return false
	}
}

// seedStore fills a Badger store through the runtime, in two
// incarnations, and leaves it closed. It holds, in tenants acme and
// globex: completed Runs (one session of three, one submitted with an
// idempotency key), a Run waiting for an approval, a Run cancelled, a Run
// whose slow job is pending, and in session "epoch" a Run whose tool call
// the second incarnation dispatched (under epoch 2) and was blocked in at
// the crash; and plugin KV of both tenants. It returns the epoch
// session's in-flight Run.
func seedStore(t *testing.T, dir string) (epochRun string) {
	t.Helper()
	ctx := context.Background()
	open := func() *badgerstore.Store {
		st, err := badgerstore.Open(dir, badgerstore.Options{Logger: quietLog, GCInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	execute := func(rt *runtime.Runtime, tenant, session, input, key string, want runtime.ResultKind) loop.Run {
		t.Helper()
		res, err := rt.Execute(ctx, runtime.Request{Tenant: tenant, Session: session, Input: input, IdempotencyKey: key})
		if err != nil || res.Kind != want {
			t.Fatalf("seed %s/%s %q: %v, %s (status %s), want %s", tenant, session, input, err, res.Kind, res.Run.Status, want)
		}
		return res.Run
	}
	tools := &conformance.ScriptedTools{SlowPolls: 1 << 30} // slow jobs stay pending
	st := open()
	rt := startRuntime(t, st, tools)
	for i := range 3 {
		key := ""
		if i == 1 {
			key = "idem-1"
		}
		execute(rt, "acme", "many", fmt.Sprintf(`call:echo({"text":"%d"}),echo({"text":"x"})|answer:$results`, i), key, runtime.ResultTerminal)
	}
	execute(rt, "globex", "g1", `answer:hello`, "", runtime.ResultTerminal)
	execute(rt, "acme", "approve", `call:wire({"text":"w"})|answer:$results`, "", runtime.ResultWaiting)
	execute(rt, "acme", "slow", `call:slow({"text":"s"})|answer:$results`, "", runtime.ResultWaiting)
	gone := execute(rt, "globex", "cancel", `call:wire({"text":"w"})|answer:$results`, "", runtime.ResultWaiting)
	if _, err := rt.Cancel(ctx, "globex", gone.ID, "no longer needed"); err != nil {
		t.Fatal(err)
	}
	waitRun(t, st, "globex", gone.ID, "the cancelled Run to end", func(r loop.Run) bool { return r.Status == loop.StatusCancelled })
	// Session "epoch": A blocks in its tool call; B waits behind it.
	a, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "epoch", Input: `call:block()|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "epoch", Input: `call:block()|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, st, "acme", a.ID, "A's tool call in flight", toolExecuting("block"))
	for _, kv := range []struct{ tenant, plugin, key, value string }{
		{"acme", "slow-job", "exec/1", "1"}, {"acme", "slow-job", "exec/2", "2"},
		{"acme", "prompt-builder", "\x00binary\xff", "v"}, {"globex", "slow-job", "k", strings.Repeat("x", 3000)},
	} {
		if err := st.KVSet(ctx, kv.tenant, kv.plugin, []byte(kv.key), []byte(kv.value)); err != nil {
			t.Fatal(err)
		}
	}
	halt(t, rt)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// The second incarnation takes the session over under epoch 2: A's
	// attach finds no job (it fails, and A completes with a tool error),
	// then B's tool call is dispatched under epoch 2 and blocks.
	st = open()
	rt = startRuntime(t, st, tools)
	waitRun(t, st, "acme", a.ID, "A to complete in the second incarnation", func(r loop.Run) bool { return r.Status.Terminal() })
	waitRun(t, st, "acme", b.ID, "B's tool call in flight", toolExecuting("block"))
	halt(t, rt)
	defer st.Close()
	rb := mustLoad(t, st, "acme", b.ID)
	for _, e := range rb.Executing() {
		if e.Epoch != 2 {
			t.Fatalf("B's tool call was dispatched under epoch %d, want 2", e.Epoch)
		}
	}
	return b.ID
}

func mustLoad(t *testing.T, st runtime.Store, tenant, id string) loop.Run {
	t.Helper()
	r, err := st.LoadRun(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// storeContent is everything the copy carries, read from a store.
type storeContent struct {
	runs     map[string]string // tenant/session/ordinal → snapshot JSON
	logs     map[string]string // tenant/run → event log JSON
	epochs   map[string]uint64 // tenant/session → epoch, for the sessions with Runs in flight
	commands map[string]string // tenant/run → its command IDs with their Seqs
}

// readContent reads a store's Runs through the port, for the sessions
// listed. A copy (copy set) must have no session owner.
func readContent(t *testing.T, st runtime.Store, sessions [][2]string, copy bool) storeContent {
	t.Helper()
	ctx := context.Background()
	c := storeContent{runs: map[string]string{}, logs: map[string]string{}, epochs: map[string]uint64{}, commands: map[string]string{}}
	for _, s := range sessions {
		runs, err := st.SessionRuns(ctx, s[0], s[1], 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, sr := range runs {
			b, _ := json.Marshal(sr.Run)
			c.runs[fmt.Sprintf("%s/%s/%d", s[0], s[1], sr.Ordinal)] = string(b)
			evs, err := st.Events(ctx, s[0], sr.Run.ID, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = json.Marshal(evs)
			c.logs[s[0]+"/"+sr.Run.ID] = string(b)
			if ex, ok := st.(exporter); ok {
				var cmds []string
				if err := ex.ExportCommands(ctx, s[0], sr.Run.ID, func(id string, seq int64) error {
					cmds = append(cmds, fmt.Sprintf("%s@%d", id, seq))
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				c.commands[s[0]+"/"+sr.Run.ID] = strings.Join(cmds, " ")
			}
		}
	}
	if err := (&copier{}).activeSessions(ctx, st, func(o runtime.SessionOwner) error {
		if copy && o.Owner != "" {
			t.Errorf("session %s/%s is owned by %s", o.Tenant, o.Session, o.Owner)
		}
		c.epochs[o.Tenant+"/"+o.Session] = o.Epoch
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func sameContent(t *testing.T, what string, want, got storeContent, withCommands bool) {
	t.Helper()
	for _, m := range []struct {
		name      string
		want, got map[string]string
	}{{"snapshots", want.runs, got.runs}, {"event logs", want.logs, got.logs}} {
		if len(m.want) != len(m.got) {
			t.Errorf("%s: %d %s, want %d", what, len(m.got), m.name, len(m.want))
		}
		for k, v := range m.want {
			if m.got[k] != v {
				t.Errorf("%s: %s of %s differ:\n got %s\nwant %s", what, m.name, k, m.got[k], v)
			}
		}
	}
	if withCommands && !reflect.DeepEqual(want.commands, got.commands) {
		t.Errorf("%s: command IDs differ:\n got %v\nwant %v", what, got.commands, want.commands)
	}
	if !reflect.DeepEqual(want.epochs, got.epochs) {
		t.Errorf("%s: the epochs of the sessions with Runs in flight are %v, want %v", what, got.epochs, want.epochs)
	}
}

func exportedSessions(t *testing.T, ex exporter) [][2]string {
	t.Helper()
	var out [][2]string
	if err := ex.ExportSessions(context.Background(), func(tenant, session string, _ uint64) error {
		out = append(out, [2]string{tenant, session})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func exportedKV(t *testing.T, ex exporter) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := ex.ExportKV(context.Background(), func(tenant, plugin string, key, value []byte) error {
		out[tenant+"/"+plugin+"/"+string(key)] = string(value)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func copyOpts(from, to string) Options {
	return Options{From: from, To: to, Parallel: 4, Log: quietLog}
}

// TestStoreCopyBadgerToPostgresAndBack copies a Badger store holding
// completed, waiting, cancelled and in-flight Runs and plugin KV to
// PostgreSQL and from there to a new Badger directory, and compares every
// Run's snapshot and log, the session order, the command IDs, the KV and
// the epochs of the sessions with Runs in flight. A runtime on the last
// copy then recovers the Runs in flight, under an epoch above the
// source's: every ended log passes loop.CheckEnded.
func TestStoreCopyBadgerToPostgresAndBack(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	epochRun := seedStore(t, dirA)
	dsn := pgserver.NewDatabase(t)

	var out bytes.Buffer
	if err := Copy(ctx, &out, copyOpts("badger:"+dirA, "postgres:"+dsn)); err != nil {
		t.Fatal(err)
	}
	t.Logf("badger → postgres:\n%s", out.String())
	for _, want := range []string{
		"copied badger " + dirA + " to postgres ",
		"  tenant acme: 7 Runs (3 in flight), ",
		"  tenant globex: 2 Runs (0 in flight), ",
		"  total: 2 tenants, 9 Runs (3 in flight), ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if n := strings.Count(out.String(), "\n"); n != 4 {
		t.Errorf("the output has %d lines, want 4 (a heading, a line per tenant, the total)", n)
	}

	a, err := badgerstore.Open(dirA, badgerstore.Options{Logger: quietLog, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	sessions := exportedSessions(t, a)
	want := readContent(t, a, sessions, false)
	wantKV := exportedKV(t, a)
	if len(want.runs) != 9 || len(wantKV) != 4 || want.epochs["acme/epoch"] != 2 {
		t.Fatalf("the seeded store holds %d Runs, %d KV entries, epoch %d in session epoch; want 9, 4 and 2", len(want.runs), len(wantKV), want.epochs["acme/epoch"])
	}
	wantStored := map[string]int64{}
	for _, tenant := range []string{"acme", "globex"} {
		if wantStored[tenant], err = a.TenantStoredBytes(ctx, tenant); err != nil || wantStored[tenant] == 0 {
			t.Fatalf("stored bytes of %s in the source: %d, %v", tenant, wantStored[tenant], err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	pg, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	sameContent(t, "postgres copy", want, readContent(t, pg, sessions, true), false)
	// Every Run was copied with its whole log and command IDs, so each
	// tenant holds as many bytes in the copy as in the source (its
	// storage quota means the same there).
	for tenant, n := range wantStored {
		if got, err := pg.TenantStoredBytes(ctx, tenant); err != nil || got != n {
			t.Errorf("postgres copy: tenant %s holds %d stored bytes (%v), the source %d", tenant, got, err, n)
		}
	}
	for k, v := range wantKV {
		parts := strings.SplitN(k, "/", 3)
		got, err := pg.KVGet(ctx, parts[0], parts[1], []byte(parts[2]))
		if err != nil || string(got) != v {
			t.Errorf("postgres copy: KV %q is %q (%v), want %q", k, got, err, v)
		}
	}
	_, pgExports := any(pg).(exporter)
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}

	back := copyOpts("postgres:"+dsn, "badger:"+dirB)
	if !pgExports {
		// pgstore cannot list its tenants or KV keys: the tenants come
		// from the config, and the KV stays behind.
		back.TenantsFrom = &config.Config{Tenants: map[string]config.Tenant{"acme": {}, "globex": {}}}
		back.SkipKV = true
	}
	out.Reset()
	if err := Copy(ctx, &out, back); err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres → badger:\n%s", out.String())
	b, err := badgerstore.Open(dirB, badgerstore.Options{Logger: quietLog, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := exportedSessions(t, b); len(got) != len(sessions) {
		t.Errorf("the copy back has %d sessions, want %d", len(got), len(sessions))
	}
	sameContent(t, "badger copy of the postgres copy", want, readContent(t, b, sessions, true), pgExports)
	if pgExports && !reflect.DeepEqual(exportedKV(t, b), wantKV) {
		t.Errorf("KV after the round trip: %v, want %v", exportedKV(t, b), wantKV)
	}

	// The first node on the copy recovers the Runs in flight: B's tool
	// call was dispatched under epoch 2, so this node's must be 3.
	rt := startRuntime(t, b, &conformance.ScriptedTools{SlowPolls: 1})
	defer rt.Stop(ctx)
	waitRun(t, b, "acme", epochRun, "the Run in flight to end after the copy", func(r loop.Run) bool { return r.Status.Terminal() })
	evs, err := b.Events(ctx, "acme", epochRun, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range loop.CheckEnded(evs) {
		t.Errorf("run %s after the copy: %s", epochRun, v)
	}
	last := uint64(0)
	for _, ev := range evs {
		if ev.Type == loop.EventEffectDispatched {
			last = ev.Epoch
		}
	}
	if last != 3 {
		t.Errorf("the last dispatch after the copy was under epoch %d, want 3 (the source's 2, plus the new owner's claim)", last)
	}
}

// TestStoreCopyRefuses checks what copy refuses before it writes
// anything: a spec it cannot read, the same store on both sides, a source
// that does not exist or is in use, a target that is not empty, and a
// source with pruned Runs (unless --skip-pruned).
func TestStoreCopyRefuses(t *testing.T) {
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	st, err := badgerstore.Open(src, badgerstore.Options{Logger: quietLog, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	rt := startRuntime(t, st, &conformance.ScriptedTools{})
	for i := range 3 {
		if _, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: fmt.Sprintf("s%d", i), Input: "answer:hi"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	refused := func(t *testing.T, o Options, wants ...string) {
		t.Helper()
		var out bytes.Buffer
		err := Copy(ctx, &out, o)
		if err == nil {
			t.Fatalf("the copy was not refused; it printed:\n%s", out.String())
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the refusal %q does not say %q", err, w)
			}
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the refusal shows a password: %s", err)
		}
	}
	t.Run("the source in use", func(t *testing.T) {
		refused(t, copyOpts("badger:"+src, "badger:"+t.TempDir()), "--from badger "+src, "another agenthost process is using")
	})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("specs", func(t *testing.T) {
		refused(t, copyOpts("mysql:x", "badger:y"), `--from "mysql:x" is not a store: want badger:DIR or postgres:DSN`)
		refused(t, copyOpts("badger:"+src, "postgres:"), "--to postgres: names no DSN and AGENTHOST_STORE_DSN is empty")
		refused(t, copyOpts("badger:"+src, "badger:"+src), "--from and --to name the same store")
		refused(t, copyOpts("badger:"+filepath.Join(t.TempDir(), "nothing"), "badger:"+t.TempDir()), "there is no store in that directory")
		refused(t, copyOpts("badger:"+src, "postgres:host=/nonexistent/agenthost user=u password=s3cret connect_timeout=2"), "--to postgres ", "password=xxxxx")
	})
	t.Run("a target that is not empty", func(t *testing.T) {
		dsn := pgserver.NewDatabase(t)
		if err := Copy(ctx, &bytes.Buffer{}, copyOpts("badger:"+src, "postgres:"+dsn)); err != nil {
			t.Fatal(err)
		}
		refused(t, copyOpts("badger:"+src, "postgres:"+dsn), "is not empty", "copy into an empty store")
		other := t.TempDir()
		if err := Copy(ctx, &bytes.Buffer{}, copyOpts("badger:"+src, "badger:"+other)); err != nil {
			t.Fatal(err)
		}
		refused(t, copyOpts("badger:"+src, "badger:"+other), "is not empty (it has Runs in session acme/s")
	})
	t.Run("a postgres source a live node owns", func(t *testing.T) {
		dsn := pgserver.NewDatabase(t)
		pg, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, Logger: quietLog})
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		rt := startRuntime(t, pg, &conformance.ScriptedTools{SlowPolls: 1 << 30})
		defer halt(t, rt)
		if _, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "busy", Input: `call:slow()|answer:$results`}); err != nil {
			t.Fatal(err)
		}
		o := copyOpts("postgres:"+dsn, "badger:"+t.TempDir())
		o.TenantsFrom, o.SkipKV = &config.Config{Tenants: map[string]config.Tenant{"acme": {}}}, true
		refused(t, o, "is in use: the live node "+rt.NodeID()+" owns session acme/busy", "stop every agenthost node")
	})
	t.Run("pruned Runs", func(t *testing.T) {
		st, err := badgerstore.Open(src, badgerstore.Options{Logger: quietLog, GCInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Prune(ctx, time.Now().Add(time.Hour).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		refused(t, copyOpts("badger:"+src, "badger:"+t.TempDir()), "3 terminal Runs", "retention pruned", "--skip-pruned")
		o := copyOpts("badger:"+src, "badger:"+t.TempDir())
		o.SkipPruned = true
		var out bytes.Buffer
		if err := Copy(ctx, &out, o); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "tenant acme: 0 Runs (0 in flight), 0 events, 0 KV entries; 3 pruned Runs left out") {
			t.Errorf("the output does not count the pruned Runs:\n%s", out.String())
		}
	})
}

// TestStoreCopyCommand runs `agenthost store copy` as the CLI does: its
// flags, its output, and a refusal's exit status.
func TestStoreCopyCommand(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	seedStore(t, src)
	dsn := pgserver.NewDatabase(t)
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		cmd := NewCommand(func() (*config.Config, error) { return nil, nil })
		cmd.SetArgs(args)
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		err := cmd.Execute()
		code := 0
		if err != nil {
			code = 1
			stderr.WriteString(err.Error())
		}
		return code, stdout.String(), stderr.String()
	}
	t.Setenv("AGENTHOST_STORE_DSN", dsn+" password=s3cret")
	code, stdout, stderr := run("--from", "badger:"+src, "--to", "postgres:", "--parallel", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "tenant acme: 7 Runs (3 in flight)") || strings.Contains(stdout+stderr, "s3cret") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	code, _, stderr = run("--from", "badger:"+src, "--to", "postgres:")
	if code != 1 || !strings.Contains(stderr, "is not empty") || strings.Contains(stderr, "s3cret") {
		t.Errorf("a second copy into the same database: exit %d, %s", code, stderr)
	}
	if code, _, stderr = run("--from", "badger:"+src); code != 1 || !strings.Contains(stderr, "both --from and --to are required") {
		t.Errorf("no --to: exit %d, %s", code, stderr)
	}
}

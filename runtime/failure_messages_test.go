package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// What a tenant reads of a Run's failure (its snapshot's failure, its
// events' failures and outcome errors, and so the tool errors the model
// reads) is the class and a message in the runtime's words: none of the
// host's wrapping, the store's or the network's errors, addresses or
// paths. The server's log has the detail, on a line with the Run's ID.
// A plugin's own words about its work still reach the tenant.

// internals are the texts that must never reach a tenant.
var internals = []string{"host:", "plugin[", "export[", "faultstore", "dial tcp", "127.0.0.1", "runtime:", "/srv/"}

// failEnv is a RuntimeEnv whose runtime logs to a buffer, over a
// FaultStore.
type failEnv struct {
	*conformance.RuntimeEnv
	rt     *runtime.Runtime
	faults *conformance.FaultStore
	log    *conformance.LogBuffer
}

func newFailEnv(t *testing.T, mutate func(*runtime.Tenant)) *failEnv {
	t.Helper()
	var faults *conformance.FaultStore
	e := conformance.NewRuntimeEnv(t, conformance.RuntimeHarness{NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
		s := conformance.NewMemStore(clock, conformance.KVLimits{})
		t.Cleanup(func() { _ = s.Close() })
		faults = conformance.NewFaultStore(s, conformance.FaultOptions{})
		return faults
	}}, mutate)
	// The env's own runtime logs nowhere: this one, with a log, takes its
	// place before any Run is made.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Runtime.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	log := &conformance.LogBuffer{}
	rt, err := runtime.New(runtime.Options{Store: faults, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: "node-log", PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		MaxDefer: 30 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conformance.Eventually(t, "node-log's first recovery pass", rt.Ready)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	return &failEnv{RuntimeEnv: e, rt: rt, faults: faults, log: log}
}

// execute submits a Run and waits for it to end.
func (e *failEnv) execute(input string) loop.Run {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := e.rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s1", Input: input})
	if err != nil {
		e.T.Fatalf("execute %q: %v", input, err)
	}
	if res.Kind == runtime.ResultTerminal {
		return res.Run
	}
	return e.UntilTerminal(e.rt, res.Run.ID, time.Second)
}

// tenantTexts is everything of a Run's failures a tenant reads: its
// failure, and every event of its log (failures, outcome errors, the
// result), as the API and the CLI show them.
func (e *failEnv) tenantTexts(run loop.Run) string {
	e.T.Helper()
	evs, err := e.Store.Events(context.Background(), "acme", run.ID, 1, 0)
	if err != nil {
		e.T.Fatal(err)
	}
	snap, _ := json.Marshal(run)
	all, _ := json.Marshal(evs)
	return string(snap) + "\n" + string(all)
}

func noInternalsIn(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range internals {
		if i := strings.Index(text, s); i >= 0 {
			t.Errorf("%s shows the tenant %q: …%s…", what, s, text[max(i-120, 0):min(i+80, len(text))])
		}
	}
}

// failingBuilder fails every build with err.
type failingBuilder struct{ err error }

func (b failingBuilder) Build(context.Context, string, abi.BuildInput) (abi.BuildOutput, error) {
	return abi.BuildOutput{}, b.err
}

func TestAFailedPlanningShowsTheTenantNoInternals(t *testing.T) {
	const detail = "wasm error: unreachable (stderr: panic: open /srv/agenthost/prompts: dial tcp 127.0.0.1:5432: connect: connection refused)"
	for _, tc := range []struct {
		name       string
		builder    runtime.Builder
		storeFault bool // the session's history cannot be read
		class      abi.ErrorClass
		message    string // the whole failure message the tenant reads
		logged     string // what the log line has of the cause
	}{
		{
			name:    "the builder traps",
			builder: failingBuilder{&runtime.PluginError{Class: abi.ClassPluginTrap, Plugin: "prompt-builder", Export: abi.ExportBuild, Err: errors.New(detail)}},
			class:   abi.ClassPluginTrap,
			message: "planning model step 1 failed (plugin_trap): the builder crashed",
			logged:  "host: plugin[prompt-builder] export[build]: plugin_trap: " + detail,
		},
		{
			name:    "the builder cannot be called",
			builder: failingBuilder{fmt.Errorf("host: plugin[prompt-builder] export[build]: no instance: %w", errors.New(detail))},
			class:   abi.ClassExecutorUnavailable,
			message: "planning model step 1 failed (executor_unavailable): the builder could not be called",
			logged:  "host: plugin[prompt-builder] export[build]: no instance: " + detail,
		},
		{
			name: "the builder refuses with its own words",
			builder: failingBuilder{&runtime.PluginError{Class: abi.ClassPluginProtocol, Plugin: "prompt-builder", Export: abi.ExportBuild,
				Err: fmt.Errorf("the plugin returned status 1: %w", &runtime.PluginMessage{Text: "the question is empty; ask something"})}},
			class:   abi.ClassPluginProtocol,
			message: "planning model step 1 failed (plugin_protocol): the builder returned an error: the question is empty; ask something",
			logged:  "host: plugin[prompt-builder] export[build]: plugin_protocol: the plugin returned status 1: the question is empty",
		},
		{
			name:       "the store fails while the session's history is read",
			storeFault: true,
			class:      abi.ClassExecutorUnavailable,
			message:    "planning model step 1 failed (executor_unavailable): the session's earlier Runs could not be read for the builder",
			logged:     "faultstore: CompletedRunsBefore",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFailEnv(t, func(tn *runtime.Tenant) {
				if tc.builder != nil {
					tn.Builder = tc.builder
				}
			})
			if tc.storeFault {
				// The session's first Run has no history to read; the
				// second reads the first's.
				if first := e.execute("answer:earlier"); first.Status != loop.StatusCompleted {
					t.Fatalf("the session's first Run: %s", first.Status)
				}
				e.faults.FailNext("CompletedRunsBefore", conformance.FaultError, 1)
			}
			run := e.execute("answer:never")
			if run.Status != loop.StatusFailed || run.Failure == nil {
				t.Fatalf("run %s, failure %+v", run.Status, run.Failure)
			}
			if run.Failure.Class != tc.class || run.Failure.Message != tc.message {
				t.Errorf("failure %s: %q\nwant      %s: %q", run.Failure.Class, run.Failure.Message, tc.class, tc.message)
			}
			noInternalsIn(t, "the Run", e.tenantTexts(run))
			if l := e.log.Lines(`"run":"`+run.ID+`"`, tc.logged); len(l) == 0 {
				t.Errorf("no log line names the Run and says %q; the log:\n%s", tc.logged, strings.Join(e.log.Lines(run.ID), "\n"))
			}
		})
	}
}

// unreachable is an executor whose every call fails to connect, as a
// remote model server that is down would.
type unreachable struct{ err error }

func (u unreachable) Start(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{}, u.err
}

func (u unreachable) Poll(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{}, u.err
}

func (u unreachable) Attach(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{}, u.err
}

func (u unreachable) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{}, u.err
}

// dialError is a real error of dialling a closed port on loopback.
func dialError(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c, err := net.Dial("tcp", addr)
	if err == nil {
		_ = c.Close()
		t.Skipf("%s still answers", addr)
	}
	return fmt.Errorf("model server: %w", err)
}

func TestAnExecutorThatStaysUnavailableShowsTheTenantNoDialError(t *testing.T) {
	dial := dialError(t)
	e := newFailEnv(t, func(tn *runtime.Tenant) { tn.Model = unreachable{dial} })
	run := e.execute("answer:never")
	if run.Status != loop.StatusFailed || run.Failure == nil || run.Failure.Class != abi.ClassExecutorUnavailable {
		t.Fatalf("run %s, failure %+v", run.Status, run.Failure)
	}
	// Two attempts (the suite's model policy), each deferred to max_defer.
	const want = "model step 1 failed after 2 attempt(s) (executor_unavailable): the executor stayed unavailable for "
	if !strings.HasPrefix(run.Failure.Message, want) || !strings.HasSuffix(run.Failure.Message, " ms (max_defer)") {
		t.Errorf("failure %q, want %q… ms (max_defer)", run.Failure.Message, want)
	}
	noInternalsIn(t, "the Run", e.tenantTexts(run))
	for _, attempt := range []string{"#1", "#2"} {
		key := "acme/s1/" + loop.ModelEffectID(run.ID, 1) + attempt
		if l := e.log.Lines(`"assignment_key":"`+key+`"`, `"decision":`, dial.Error()); len(l) == 0 {
			t.Errorf("no log line of attempt %s holds the dial error %q; the log:\n%s", key, dial, strings.Join(e.log.Lines(run.ID), "\n"))
		}
	}
}

// wordyTools answers the tool "fail" with a failure in many words, and
// "trap" with an error as the host gives it for a trap; everything else
// goes to next.
type wordyTools struct {
	runtime.Executor
	words string
}

func (w wordyTools) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	switch c.Input.Effect.Tool {
	case "fail":
		return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: w.words}}, nil
	case "flaky": // stands in for a tool that traps
		return abi.EffectReply{}, &runtime.PluginError{Class: abi.ClassPluginTrap, Plugin: "tools", Export: abi.ExportStart,
			Err: errors.New("wasm error: out of bounds memory access (stderr: panic at /srv/tools/main.go:12)")}
	}
	return w.Executor.Start(ctx, c)
}

func TestAToolsOwnWordsReachTheModelAndTheHostsDoNot(t *testing.T) {
	t.Run("a short failure message is the tool's own, whole", func(t *testing.T) {
		e := newFailEnv(t, nil)
		run := e.execute(`call:fail()|answer:$results`)
		if run.Status != loop.StatusCompleted || run.Result != "error (plugin_failed): tool failed on purpose" {
			t.Fatalf("run %s, result %q", run.Status, run.Result)
		}
		settled := settlementsOf(t, e.Store, run.ID, run.ID+".t1.0")
		if len(settled) != 1 || settled[0].Outcome.Error == nil || settled[0].Outcome.Error.Message != "tool failed on purpose" {
			t.Fatalf("settlements %+v", settled)
		}
	})

	t.Run("a long one is cut, and the log keeps it whole", func(t *testing.T) {
		words := "the tool says: " + strings.Repeat("é", 2000) + " END"
		e := newFailEnv(t, func(tn *runtime.Tenant) {
			for i := range tn.Tools {
				tn.Tools[i].Executor = wordyTools{Executor: tn.Tools[i].Executor, words: words}
			}
		})
		run := e.execute(`call:fail()|answer:$results`)
		settled := settlementsOf(t, e.Store, run.ID, run.ID+".t1.0")
		if len(settled) != 1 || settled[0].Outcome.Error == nil {
			t.Fatalf("settlements %+v", settled)
		}
		msg := settled[0].Outcome.Error.Message
		if len(msg) > runtime.MaxPluginMessageBytes || !strings.HasPrefix(msg, "the tool says: éé") || !strings.HasSuffix(msg, "é…") {
			t.Errorf("the message (%d bytes) is not the tool's cut at %d bytes: %.80q…%q", len(msg), runtime.MaxPluginMessageBytes, msg, msg[max(len(msg)-10, 0):])
		}
		if !strings.Contains(run.Result, msg) {
			t.Errorf("the model did not read the tool's words: result %.100q", run.Result)
		}
		if l := e.log.Lines(`"run":"`+run.ID+`"`, " END"); len(l) == 0 {
			t.Errorf("the log does not keep the whole message")
		}
	})

	t.Run("a trap of the tool shows the class, not the host's error", func(t *testing.T) {
		e := newFailEnv(t, func(tn *runtime.Tenant) {
			for i := range tn.Tools {
				tn.Tools[i].Executor = wordyTools{Executor: tn.Tools[i].Executor}
				if tn.Tools[i].Spec.Name == "flaky" {
					tn.Tools[i].Spec.Policy = loop.Policy{Mode: loop.PolicyFail}
				}
			}
		})
		run := e.execute(`call:flaky()|answer:$results`)
		if run.Status != loop.StatusCompleted || run.Result != `error (plugin_trap): the executor of tool "flaky" crashed` {
			t.Fatalf("run %s, result %q", run.Status, run.Result)
		}
		noInternalsIn(t, "the Run", e.tenantTexts(run))
		key := "acme/s1/" + run.ID + ".t1.0#1"
		if l := e.log.Lines(`"assignment_key":"`+key+`"`, "plugin[tools] export[start]", "out of bounds memory access"); len(l) == 0 {
			t.Errorf("no log line of %s holds the host's error; the log:\n%s", key, strings.Join(e.log.Lines(run.ID), "\n"))
		}
	})
}

package runtime_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// refusingModel is a model executor whose every start fails for good,
// and that keeps no record of its attempts. It names its endpoint.
type refusingModel struct{}

func (refusingModel) Endpoint() string { return "refusing-model" }

func (refusingModel) Start(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: "the model refuses this prompt"}}, nil
}

func (refusingModel) Poll(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{State: abi.StateUnknown}, nil
}

func (refusingModel) Attach(context.Context, runtime.EffectCall) (abi.EffectReply, error) {
	return abi.EffectReply{State: abi.StateUnknown}, nil
}

func (refusingModel) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{State: abi.StateUnknown}, nil
}

// runFailedRecords returns the log records that report a Run failed.
func runFailedRecords(t *testing.T, log *conformance.LogBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range log.Lines(`"msg":"a Run failed"`) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

func TestAFailedRunIsLogged(t *testing.T) {
	e := newFailEnv(t, func(tn *runtime.Tenant) { tn.Model = refusingModel{} })
	run := e.execute("answer:never")
	if run.Status != loop.StatusFailed || run.Failure == nil || run.Failure.Class != abi.ClassPluginFailed {
		t.Fatalf("run %s, failure %+v", run.Status, run.Failure)
	}
	check := func(when string) {
		t.Helper()
		recs := runFailedRecords(t, e.log)
		if len(recs) != 1 {
			t.Fatalf("%s: %d records report a Run failed, want 1; the log:\n%s", when, len(recs), e.log.String())
		}
		rec := recs[0]
		for k, want := range map[string]string{
			"level": slog.LevelWarn.String(), "tenant": "acme", "session": "s1", "run": run.ID,
			"class": string(run.Failure.Class), "message": run.Failure.Message,
			"agent": runtime.DefaultAgent, "endpoint": "refusing-model", "effect": loop.ModelEffectID(run.ID, 1),
		} {
			if got, _ := rec[k].(string); got != want {
				t.Errorf("%s: the record's %s is %q, want %q; the record: %v", when, k, got, want, rec)
			}
		}
	}
	check("after the Run failed")

	// Another node recovers the session: it finds the Run ended and logs
	// nothing more about it.
	e.rt.Halt()
	e.Clock.Advance(2 * time.Minute)
	rt2, err := runtime.New(runtime.Options{Store: e.faults, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: "node-b", PollMin: 100 * time.Millisecond, PollMax: time.Second, LeaseTTL: time.Minute,
		MaxDefer: 30 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt2.Stop(ctx)
	})
	conformance.Eventually(t, "node-b's first recovery pass", rt2.Ready)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := rt2.Wait(ctx, "acme", run.ID)
	if err != nil || res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusFailed {
		t.Fatalf("node-b's Wait: %+v, %v", res, err)
	}
	check("after another node recovered the session")
}

// A Run that fails for a reason of its own (here a limit), not a model
// step's, is logged with its agent and without an endpoint.
func TestARunFailedByALimitIsLoggedWithoutAnEndpoint(t *testing.T) {
	e := newFailEnv(t, func(tn *runtime.Tenant) {
		tn.Model = namedModel{Executor: tn.Model}
		tn.Limits.MaxSteps = 1
	})
	run := e.execute(`call:echo({"text":"a"})|answer:never`)
	if run.Status != loop.StatusFailed || run.Failure == nil || run.Failure.Class != abi.ClassLimitExceeded {
		t.Fatalf("run %s, failure %+v", run.Status, run.Failure)
	}
	recs := runFailedRecords(t, e.log)
	if len(recs) != 1 {
		t.Fatalf("%d records report a Run failed, want 1; the log:\n%s", len(recs), e.log.String())
	}
	rec := recs[0]
	if rec["agent"] != runtime.DefaultAgent || rec["class"] != string(abi.ClassLimitExceeded) {
		t.Errorf("the record: %v", rec)
	}
	for _, k := range []string{"endpoint", "effect"} {
		if v, ok := rec[k]; ok {
			t.Errorf("the record names %s %v; the failure was not a model step's: %v", k, v, rec)
		}
	}
}

// namedModel is the scripted model, naming its endpoint.
type namedModel struct{ runtime.Executor }

func (namedModel) Endpoint() string { return "scripted" }

package runtime_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

type recordingObserver struct {
	mu       sync.Mutex
	statuses []string
	settled  []string
	usage    abi.Usage
	commits  int
}

func (o *recordingObserver) Committed(time.Duration, error) { o.mu.Lock(); o.commits++; o.mu.Unlock() }
func (o *recordingObserver) RunStatus(_ string, from, to loop.Status) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.statuses = append(o.statuses, string(from)+">"+string(to))
}
func (o *recordingObserver) EffectSettled(_ string, kind abi.EffectKind, state loop.OutcomeState, class abi.ErrorClass) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.settled = append(o.settled, string(kind)+":"+string(state)+":"+string(class))
}
func (o *recordingObserver) Usage(_ string, u abi.Usage) {
	o.mu.Lock()
	o.usage = o.usage.Add(u)
	o.mu.Unlock()
}
func (o *recordingObserver) RecoveryDecision(string) {}
func (o *recordingObserver) WatchdogReport(string)   {}

func TestObserverSeesStatusesSettlementsAndUsage(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	obs := &recordingObserver{}
	rt, err := runtime.New(runtime.Options{Store: e.Store, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: "observed", Observer: obs, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer rt.Stop(t.Context())
	res, err := rt.Execute(t.Context(), runtime.Request{Tenant: "acme", Session: "obs", Input: `call:echo({"text":"a"}),fail()|answer:$results`})
	if err != nil || res.Run.Status != loop.StatusCompleted {
		t.Fatalf("%v %s %+v %v", err, res.Kind, res.Run.Status, res.Err)
	}
	// The stats count every settlement before Execute hears of the end:
	// read at once, they are whole.
	if n := rt.Stats().EffectsSettled.Load(); n != 4 {
		t.Errorf("Stats().EffectsSettled = %d when Execute returned, want 4", n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got := strings.Join(obs.statuses, " "); got != ">pending pending>running running>completed" {
		t.Fatalf("statuses %q", got)
	}
	got := slices.Clone(obs.settled)
	slices.Sort(got) // the two tool calls run in parallel and finish in either order
	if strings.Join(got, " ") != "model:done: model:done: tool:done: tool:failed:plugin_failed" {
		t.Fatalf("settlements %q", obs.settled)
	}
	if obs.usage != res.Run.Usage || obs.commits < 5 {
		t.Fatalf("usage %+v (run %+v), commits %d", obs.usage, res.Run.Usage, obs.commits)
	}
}

func TestInFlightCountsATenantsPendingEffects(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	res := e.Execute("s1", `call:slow(),slow()|answer:$results`)
	if res.Kind != runtime.ResultWaiting {
		t.Fatalf("result %s", res.Kind)
	}
	if n := e.Runtime.InFlight("acme"); n != 2 {
		t.Fatalf("in flight %d, want 2", n)
	}
	if n := e.Runtime.InFlight("other"); n != 0 {
		t.Fatalf("another tenant has %d in flight", n)
	}
	e.UntilTerminal(e.Runtime, res.Run.ID, 100*time.Millisecond)
	if n := e.Runtime.InFlight("acme"); n != 0 {
		t.Fatalf("in flight %d after the run ended", n)
	}
}

package runtime_test

import (
	"context"
	"fmt"
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
	ended    []string
}

func (o *recordingObserver) Committed(time.Duration, error) { o.mu.Lock(); o.commits++; o.mu.Unlock() }
func (o *recordingObserver) RunStatus(_ string, from, to loop.Status) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.statuses = append(o.statuses, string(from)+">"+string(to))
}
func (o *recordingObserver) RunEnded(_ string, agent string, status loop.Status, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = append(o.ended, fmt.Sprintf("%s:%s:%s", agent, status, d))
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

// startObserved starts a runtime of the env's tenant over store, with obs
// as its Observer; it is stopped when the test ends.
func startObserved(t *testing.T, e *conformance.RuntimeEnv, store runtime.Store, obs runtime.Observer) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": e.Tenant}, Clock: e.Clock,
		NodeID: "observed", Observer: obs, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Stop(ctx)
	})
	return rt
}

func TestObserverSeesStatusesSettlementsAndUsage(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	obs := &recordingObserver{}
	rt := startObserved(t, e, e.Store, obs)
	res, err := rt.Execute(t.Context(), runtime.Request{Tenant: "acme", Session: "obs", Input: `call:echo({"text":"a"}),fail()|answer:$results`})
	if err != nil || res.Run.Status != loop.StatusCompleted {
		t.Fatalf("%v %s %+v %v", err, res.Kind, res.Run.Status, res.Err)
	}
	// The stats count every settlement before Execute hears of the end:
	// read at once, they are whole.
	if n := rt.Stats().EffectsSettled; n != 4 {
		t.Errorf("Stats().EffectsSettled = %d when Execute returned, want 4", n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got := strings.Join(obs.statuses, " "); got != ">pending pending>running running>completed" {
		t.Fatalf("statuses %q", got)
	}
	took := time.Duration(res.Run.UpdatedAt-res.Run.CreatedAt) * time.Millisecond
	if got, want := strings.Join(obs.ended, " "), fmt.Sprintf("default:completed:%s", took); got != want {
		t.Fatalf("Run ends reported %q, want %q", got, want)
	}
	got := slices.Clone(obs.settled)
	slices.Sort(got) // the two tool calls run in parallel and finish in either order
	if strings.Join(got, " ") != "model:done: model:done: tool:done: tool:failed:plugin_failed" {
		t.Fatalf("settlements %q", obs.settled)
	}
	// Every commit is observed. The Run takes 5 after its creation (start
	// and the first plan; the model's answer and both dispatches; each
	// tool's settlement, the second with the next plan; the answer and the
	// end), or 4 when the two tool settlements arrive together and share
	// one (settlequeue): which one depends on how the two calls finish.
	st := rt.Stats()
	if obs.usage != res.Run.Usage || int64(obs.commits) != st.Commits+st.Conflicts+st.DuplicateCommits || st.Commits != 5-st.MergedSettlements {
		t.Fatalf("usage %+v (run %+v), commits observed %d; stats %+v", obs.usage, res.Run.Usage, obs.commits, st)
	}
}

// createHookStore calls afterCreate once a Run's creation is stored, before
// CreateRun returns to Submit.
type createHookStore struct {
	runtime.Store
	afterCreate func(runtime.CreateRun)
}

func (s createHookStore) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	res, err := s.Store.CreateRun(ctx, c)
	if err == nil {
		s.afterCreate(c)
	}
	return res, err
}

// A driver that finds a Run the moment it is stored (here through Wait; in
// CI it was the recovery pass Start begins) must not report the Run's start
// before Submit reports its creation.
func TestObserverHearsACreationBeforeTheStartOfTheRun(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	obs := &recordingObserver{}
	var rt *runtime.Runtime
	store := createHookStore{Store: e.Store, afterCreate: func(c runtime.CreateRun) {
		go rt.Wait(context.Background(), c.Run.Tenant, c.Run.ID) //nolint:errcheck // it kicks the session's driver
		// Until the driver has either started the Run or queued on its lock.
		// Not conformance.Eventually: its Fatal would end the goroutine
		// inside Submit, with the Run's lock held.
		deadline := time.Now().Add(20 * time.Second)
		for runtime.RunLockRefs(rt, c.Run.Tenant, c.Run.ID) < 2 {
			obs.mu.Lock()
			started := len(obs.statuses) > 0
			obs.mu.Unlock()
			if started {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("the driver neither started run %s nor waited for its lock in 20s", c.Run.ID)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}}
	rt = startObserved(t, e, store, obs)
	res, err := rt.Execute(t.Context(), runtime.Request{Tenant: "acme", Session: "early", Input: `answer:done`})
	if err != nil || res.Run.Status != loop.StatusCompleted {
		t.Fatalf("%v %s %+v %v", err, res.Kind, res.Run.Status, res.Err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if got := strings.Join(obs.statuses, " "); got != ">pending pending>running running>completed" {
		t.Fatalf("statuses %q", got)
	}
}

// endBlockingObserver holds the report of a Run's end until released.
type endBlockingObserver struct {
	runtime.NopObserver
	ending, release chan struct{}
}

func (o *endBlockingObserver) RunStatus(_ string, _, to loop.Status) {
	if to.Terminal() {
		close(o.ending)
		<-o.release
	}
}

// Wait may find a Run already terminal in the store while the advance that
// ended it is still reporting that; it must not return before the report.
func TestWaitReturnsARunsEndAfterTheObserverHeardIt(t *testing.T) {
	e := conformance.NewRuntimeEnv(t, harnesses()["memstore"], nil)
	obs := &endBlockingObserver{ending: make(chan struct{}), release: make(chan struct{})}
	rt := startObserved(t, e, e.Store, obs)
	run, _, err := rt.Submit(t.Context(), runtime.Request{Tenant: "acme", Session: "late", Input: `answer:done`})
	if err != nil {
		t.Fatal(err)
	}
	<-obs.ending
	waited := make(chan runtime.Result, 1)
	go func() {
		res, err := rt.Wait(context.Background(), "acme", run.ID)
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	release := sync.OnceFunc(func() { close(obs.release) })
	defer release() // before the cleanup's Stop, which waits for the held report
	var early *runtime.Result
	conformance.Eventually(t, "Wait to return or to queue behind the report", func() bool {
		select {
		case res := <-waited:
			early = &res
			return true
		default:
			return runtime.RunLockRefs(rt, "acme", run.ID) >= 2
		}
	})
	if early != nil {
		t.Fatalf("Wait returned %s (%s) while the observer was still hearing of the end", early.Kind, early.Run.Status)
	}
	release()
	if res := <-waited; res.Kind != runtime.ResultTerminal || res.Run.Status != loop.StatusCompleted {
		t.Fatalf("Wait: %s %s", res.Kind, res.Run.Status)
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

package runtime_test

import (
	"bytes"
	"context"
	goruntime "runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// goroutineOf is an Executor that records, in log, for each call it
// starts, the goroutine that made it.
type goroutineOf struct {
	runtime.Executor
	log *callLog
}

// callLog is the calls some executors started, in order.
type callLog struct {
	mu    sync.Mutex
	calls []startedOn
}

type startedOn struct {
	effect    string
	goroutine uint64
}

func (g goroutineOf) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	g.log.mu.Lock()
	g.log.calls = append(g.log.calls, startedOn{effect: c.Input.Effect.ID, goroutine: goroutineID()})
	g.log.mu.Unlock()
	return g.Executor.Start(ctx, c)
}

func (l *callLog) started() []startedOn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]startedOn(nil), l.calls...)
}

// goroutineID is the calling goroutine's ID, from the first line of its
// stack ("goroutine 42 [running]:").
func goroutineID() uint64 {
	buf := make([]byte, 64)
	buf = buf[:goruntime.Stack(buf, false)]
	buf = bytes.TrimPrefix(buf, []byte("goroutine "))
	id, err := strconv.ParseUint(string(buf[:bytes.IndexByte(buf, ' ')]), 10, 64)
	if err != nil {
		panic("goroutineID: " + err.Error())
	}
	return id
}

// startLogged starts a runtime on a MemStore whose tenant has the
// scripted model and tools, with the calls of its tools, and of its model
// too when model is set, recorded in log.
func startLogged(t *testing.T, log *callLog, model bool) (*runtime.Runtime, *conformance.MemStore) {
	t.Helper()
	clock := conformance.NewFakeClock(time.Time{})
	store := conformance.NewMemStore(clock, conformance.KVLimits{})
	tools := &conformance.ScriptedTools{}
	tenant := benchTenant(tools)
	if model {
		tenant.Model = goroutineOf{Executor: tenant.Model, log: log}
	}
	for i := range tenant.Tools {
		tenant.Tools[i].Executor = goroutineOf{Executor: tools, log: log}
	}
	rt, err := runtime.New(runtime.Options{Store: store, Tenants: runtime.TenantMap{"acme": tenant}, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Halt)
	return rt, store
}

// A Run's next call is made on the goroutine whose answer obliged it
// (runtime launch, runCalls): the model's answer asks for a tool, whose
// answer asks for the model again, and all three calls run on the
// goroutine the first one started on, none on a goroutine of its own.
func TestTheNextCallRunsOnTheGoroutineOfTheAnswerBeforeIt(t *testing.T) {
	rec := &callLog{}
	rt, _ := startLogged(t, rec, true)
	ctx := context.Background()
	res, err := rt.Execute(ctx, runtime.Request{Tenant: "acme", Session: "s", RunID: "r", Input: `call:echo({"text":"x"})|answer:$results`})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Status != loop.StatusCompleted {
		t.Fatalf("the Run is %s, want completed", res.Run.Status)
	}
	calls := rec.started()
	if len(calls) != 3 {
		t.Fatalf("%d calls started (%v); want 3: the model, the tool, the model", len(calls), calls)
	}
	for _, c := range calls[1:] {
		if c.goroutine != calls[0].goroutine {
			t.Fatalf("the calls ran on goroutines %v; want each on the goroutine of the answer before it", calls)
		}
	}
}

// A call handed to the goroutine of the answer that obliged it is not
// made once the runtime is stopping: Stop begins after the answer's
// commit dispatched the tool call, before that goroutine gets to it, and
// the tool is never called; its attempt stays executing in the store,
// for recovery, and Stop returns.
func TestAHandedCallIsNotMadeOnceStopBegins(t *testing.T) {
	toolCalls := &callLog{}
	rt, store := startLogged(t, toolCalls, false)
	ctx := context.Background()
	// The report of the commit that dispatched the tool call is made on
	// the goroutine the call is handed to, before it gets to it: it waits
	// there until Stop has begun.
	dispatched, goOn := make(chan struct{}), make(chan struct{})
	letGo := sync.OnceFunc(func() { close(goOn) })
	t.Cleanup(letGo)
	var once atomic.Bool
	runtime.SetReportHook(rt, func(run loop.Run, report func()) {
		if ex := run.Executing(); len(ex) == 1 && ex[0].Kind == abi.KindTool && once.CompareAndSwap(false, true) {
			close(dispatched)
			<-goOn
		}
		report()
	})
	if _, _, err := rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: "s", RunID: "r", Input: `call:echo({"text":"x"})|answer:$results`}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dispatched:
	case <-time.After(time.Minute):
		t.Fatal("no commit dispatched the tool call within a minute")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- rt.Stop(ctx) }()
	conformance.Eventually(t, "Stop to begin", func() bool { return runtime.Stopping(rt) })
	letGo()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return within a minute")
	}
	if calls := toolCalls.started(); len(calls) != 0 {
		t.Fatalf("the tool was called after Stop began: %v", calls)
	}
	run, err := store.LoadRun(ctx, "acme", "r")
	if err != nil {
		t.Fatal(err)
	}
	if ex := run.Executing(); len(ex) != 1 || ex[0].Kind != abi.KindTool {
		t.Fatalf("the stored Run executes %v; want the tool call, left for recovery", ex)
	}
}

package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/budget"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// TestARunShowsItsModelStepWaitingForTheBudget: with a model budget of 1
// request per minute, a second Run's model step waits; GET
// /v1/runs/{id} names the endpoint and the time the budget expects to
// admit it, as the OpenAPI document says; the Run completes once the
// minute is up, and the metrics count the wait and its minute.
func TestARunShowsItsModelStepWaitingForTheBudget(t *testing.T) {
	b := budget.New("openai", budget.Limits{RequestsPerMinute: 1})
	e := newEnv(t, func(_ *httpapi.Config, o *runtime.Options) {
		o.Tenants.(runtime.TenantMap)["acme"].ModelBudget = b
	})
	require.NoError(t, e.m.RegisterModelBudgets(map[string]*budget.Budget{"openai": b}))
	api := loadOpenAPI(t, e)
	start := e.clock.Now()
	first := e.submit(tokenAcme, "s1", "answer:one")
	e.waitStatus(tokenAcme, first.ID, loop.StatusCompleted)
	second := e.submit(tokenAcme, "s2", "answer:two")
	got := e.waitRun(tokenAcme, second.ID, "to wait for the budget", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Budget != nil
	})
	want := start.Add(time.Minute).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	require.Equal(t, &httpapi.BudgetWaitJSON{Endpoint: "openai", Until: want}, got.Waiting.Pending[0].Budget)
	api.check("GET", "/v1/runs/{id}", http.StatusOK, e.do("GET", "/v1/runs/"+second.ID, tokenAcme, ""))
	// Time moves in steps shorter than the lease, each once the clock's
	// callbacks of the last one have run (a renewal among them).
	for range 6 {
		conformance.Eventually(t, "the clock's callbacks to return", func() bool { return e.clock.Running() == 0 })
		e.clock.Advance(10 * time.Second)
	}
	done := e.waitStatus(tokenAcme, second.ID, loop.StatusCompleted)
	require.Equal(t, "two", done.Result.Content)
	m := e.scrape()
	require.Equal(t, 1.0, m[`agenthost_model_budget_waits_total{plugin=openai}`])
	require.Equal(t, 60.0, m[`agenthost_model_budget_wait_seconds_total{plugin=openai}`])
}

// instanceWaitingModel is a model executor whose every start first waits
// for an instance of its plugin, as the plugin host's does when
// max_instances are busy: it says so through the call's context
// (runtime.CapacityWaitBegan) and waits until the test lets it go.
type instanceWaitingModel struct {
	runtime.Executor
	free chan struct{}
}

func (m *instanceWaitingModel) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	ended := runtime.CapacityWaitBegan(ctx, "openai")
	<-m.free
	ended()
	return m.Executor.Start(ctx, c)
}

// TestARunShowsItsCallWaitingForAnInstance: while a model step's call
// waits for an instance of its plugin, GET /v1/runs/{id} names the
// plugin and since when, as the OpenAPI document says; once the call has
// its instance the Run's JSON no longer shows it, and the Run completes.
func TestARunShowsItsCallWaitingForAnInstance(t *testing.T) {
	model := &instanceWaitingModel{free: make(chan struct{})}
	e := newEnv(t, func(_ *httpapi.Config, o *runtime.Options) {
		acme := o.Tenants.(runtime.TenantMap)["acme"]
		model.Executor = acme.Model
		acme.Model = model
	})
	api := loadOpenAPI(t, e)
	since := e.clock.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00")
	run := e.submit(tokenAcme, "s1", "answer:one")
	got := e.waitRun(tokenAcme, run.ID, "to wait for an instance", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Instance != nil
	})
	require.Equal(t, &httpapi.InstanceWaitJSON{Plugin: "openai", Since: since}, got.Waiting.Pending[0].Instance)
	require.Nil(t, got.Waiting.Pending[0].Budget)
	api.check("GET", "/v1/runs/{id}", http.StatusOK, e.do("GET", "/v1/runs/"+run.ID, tokenAcme, ""))
	close(model.free)
	done := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	require.Equal(t, "one", done.Result.Content)
	require.Nil(t, done.Waiting)
}

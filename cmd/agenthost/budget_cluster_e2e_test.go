package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/internal/serveproc"
)

// providerSeen returns when each request came to f, in order, from its
// request from on, and when the last 429 was sent (zero when none was).
func providerSeen(f *conformance.FakeOpenAI, from int) (arrivals []time.Time, limitAt time.Time) {
	for _, r := range f.Requests()[from:] {
		arrivals = append(arrivals, r.Received)
		if r.Status == http.StatusTooManyRequests {
			limitAt = r.Answered
		}
	}
	return arrivals, limitAt
}

// newCountingProvider is a fake OpenAI-compatible provider that answers
// "hello: QUESTION".
func newCountingProvider(t *testing.T) *conformance.FakeOpenAI {
	f := conformance.NewFakeOpenAI(t, "not-a-real-key")
	f.Script(func(req conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		return conformance.OpenAIAnswer{Content: "hello: " + req.LastUser()}, true
	})
	return f
}

// mostInAnyWindow returns the most of the sorted times that fall in one
// window of length w, and where that window begins.
func mostInAnyWindow(times []time.Time, w time.Duration) (most int, from time.Time) {
	j := 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) < w {
			j++
		}
		if j-i > most {
			most, from = j-i, times[i]
		}
	}
	return most, from
}

// budgetLeaseTTL is the lease of a budgetCluster's nodes: no node dies in
// these tests, and a lease long enough that a loaded machine cannot make
// one miss its renewals keeps the Runs where they are. Each node re-reads
// the live node count at every renewal (lease_ttl/3).
const budgetLeaseTTL = 15 * time.Second

// budgetNode is one serve process of a budgetCluster.
type budgetNode struct {
	log  string
	proc *serveproc.Child
}

// budgetCluster is three `agenthost serve` processes on one PostgreSQL
// database whose tenant demo runs the prompt-builder and the openai
// example plugin against model, with budget as plugins.openai.budget.
type budgetCluster struct {
	token string
	nodes []*budgetNode
}

func startBudgetCluster(t *testing.T, model *conformance.FakeOpenAI, budget string) *budgetCluster {
	t.Helper()
	bin := buildBinary(t)
	dsn := pgserver.NewDatabase(t)
	paths := map[string]string{}
	for _, name := range []string{"prompt-builder", "openai"} {
		paths[name] = conformance.ExampleWasm(t, name)
	}
	c := &budgetCluster{token: "budget-cluster-token"}
	for range 3 {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, `
data_dir: `+filepath.Join(dir, "data")+`
store: {driver: postgres, dsn: "`+dsn+`"}
lease_ttl: `+budgetLeaseTTL.String()+`
cache_dir: `+conformance.WazeroCacheDir()+`
log: {format: text, level: info}
plugins:
  prompt-builder: {path: `+paths["prompt-builder"]+`, role: builder}
  openai:
    path: `+paths["openai"]+`
    role: executor
    allowed_hosts: ["`+model.Addr+`"]
    config: {base_url: "`+model.URL+`", model: counted-model, api_key: not-a-real-key}
    budget: `+budget+`
tenants:
  demo:
    tokens_sha256: [`+httpapi.HashToken(c.token)+`]
    builder: prompt-builder
    model: openai
    model_policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 1s}
`)
		n := &budgetNode{log: filepath.Join(dir, "serve.log")}
		logTailOnFailure(t, n.log, 40)
		n.proc = startServe(t, bin, cfg, n.log)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		mustReady(t, n.proc, 90*time.Second)
	}
	return c
}

func (c *budgetCluster) client(i int) *apiClient { return newClient(c.nodes[i].proc.Addr(), c.token) }

var sharedAmong3 = regexp.MustCompile(`msg="model budget shared among the live nodes".* endpoint=openai live_nodes=3 `)

// waitForSharesOfThree waits until every node has taken its share of the
// budget among three live nodes: each re-reads the live node count at
// every lease renewal (lease_ttl/3) and logs its new share.
func (c *budgetCluster) waitForSharesOfThree(t *testing.T) {
	t.Helper()
	for i, n := range c.nodes {
		waitUntil(t, 30*time.Second, fmt.Sprintf("node %d to share the budget among 3 live nodes", i), func() (bool, error) {
			b, err := os.ReadFile(n.log)
			return sharedAmong3.Match(b), err
		})
	}
}

// budgetWaits sums agenthost_model_budget_waits_total{plugin="openai"}
// over the nodes' metrics.
func (c *budgetCluster) budgetWaits(t *testing.T) (int, []int) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^agenthost_model_budget_waits_total\{plugin="openai"\} (\d+)$`)
	total, each := 0, []int{}
	for i, n := range c.nodes {
		code, raw, err := newClient(n.proc.MetricsAddr(), "").Do("GET", "/metrics", nil, nil, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("node %d's /metrics: %d %v", i, code, err)
		}
		m := re.FindSubmatch(raw)
		if m == nil {
			t.Fatalf("node %d's /metrics has no agenthost_model_budget_waits_total for openai", i)
		}
		v, _ := strconv.Atoi(string(m[1]))
		total += v
		each = append(each, v)
	}
	return total, each
}

// submitAll submits n Runs, round-robin through the nodes, all at once,
// and returns each Run's ID and the node that accepted it.
func (c *budgetCluster) submitAll(t *testing.T, n int, prefix string) (ids []string, via []int) {
	t.Helper()
	ids, via = make([]string, n), make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via[i] = i % len(c.nodes)
			ids[i] = c.client(via[i]).submit(t, fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("%s question %d", prefix, i)).ID
		}()
	}
	wg.Wait()
	return ids, via
}

// The budget of TestModelBudgetsAcrossThreeNodes: 360 requests a minute
// over windows of 5 s, 30 a window over the nodes. The window keeps the
// test to seconds: a budget of 30 a minute would hold it for minutes.
const (
	clusterRPM    = 360
	clusterWindow = 5 * time.Second
)

// TestModelBudgetsAcrossThreeNodes: three serve nodes on one PostgreSQL
// share a model endpoint's budget (one cluster for both halves, since
// starting one is most of the time).
func TestModelBudgetsAcrossThreeNodes(t *testing.T) {
	conformance.SkipInShort(t, "three serve nodes on PostgreSQL")
	model := newCountingProvider(t)
	c := startBudgetCluster(t, model, fmt.Sprintf("{requests_per_minute: %d, window: %s}", clusterRPM, clusterWindow))
	c.waitForSharesOfThree(t)
	t.Run("the provider sees at most the budget", func(t *testing.T) { testBudgetHoldsTheProviderToTheRate(t, c, model) })
	t.Run("a 429 closes the endpoint on every node", func(t *testing.T) { testARateLimitedAnswerClosesTheEndpoint(t, c, model) })
}

// testBudgetHoldsTheProviderToTheRate: the three nodes share the budget
// (10 a window each once all three see each other), and 75 Runs, 25
// through each node at once, ask for more. The fake provider, counting
// the requests by their arrival, sees at most 30 (+10 %) in any 5 s and
// 360 (+10 %) in any minute; every Run completes; and every node made
// calls wait for the budget.
func testBudgetHoldsTheProviderToTheRate(t *testing.T, c *budgetCluster, model *conformance.FakeOpenAI) {
	const (
		runs   = 75
		rpm    = clusterRPM
		window = clusterWindow
		per    = rpm * int(window/time.Second) / 60 // 30 in a window, over the nodes
	)
	first := model.Count()

	ids, via := c.submitAll(t, runs, "rate")
	for i, id := range ids {
		done := c.client(via[i]).waitRun(t, id, 60*time.Second, "to end", runView.terminal)
		if done.Status != "completed" || done.Result == nil || done.Result.Content != fmt.Sprintf("hello: rate question %d", i) {
			t.Fatalf("run %s: %s, result %+v, failure %+v", id, done.Status, done.Result, done.Failure)
		}
	}
	arrivals, _ := providerSeen(model, first)
	if len(arrivals) != runs {
		t.Fatalf("the provider saw %d requests for %d Runs of one model call each", len(arrivals), runs)
	}
	mostInWindow, from := mostInAnyWindow(arrivals, window)
	mostInMinute, _ := mostInAnyWindow(arrivals, time.Minute)
	t.Logf("the provider saw %d requests over %s: at most %d in any %s (from +%s), at most %d in any minute; the budget allows %d and %d",
		len(arrivals), arrivals[len(arrivals)-1].Sub(arrivals[0]).Round(time.Millisecond), mostInWindow, window,
		from.Sub(arrivals[0]).Round(time.Millisecond), mostInMinute, per, rpm)
	if limit := per * 110 / 100; mostInWindow > limit {
		t.Errorf("the provider saw %d requests in the %s from +%s; the budget allows %d over the nodes (%d with 10 %%)",
			mostInWindow, window, from.Sub(arrivals[0]), per, limit)
	}
	if limit := rpm * 110 / 100; mostInMinute > limit {
		t.Errorf("the provider saw %d requests in a minute; the budget allows %d (%d with 10 %%)", mostInMinute, rpm, limit)
	}
	total, each := c.budgetWaits(t)
	for i, n := range each {
		if n == 0 {
			t.Errorf("node %d made no call wait for the budget (waits by node %v): the test did not load it past its share", i, each)
		}
	}
	t.Logf("model calls that waited for the budget: %d (by node %v)", total, each)
}

// testARateLimitedAnswerClosesTheEndpoint: the provider answers node 0's
// next call with 429 and "Retry-After: 20". Runs submitted through the
// other two nodes afterwards wait for the endpoint's budget until then,
// as their JSON says, and the provider sees no request, from any node,
// before the 20 s are up; every Run completes after.
func testARateLimitedAnswerClosesTheEndpoint(t *testing.T, c *budgetCluster, model *conformance.FakeOpenAI) {
	const retryAfter = 20 * time.Second
	from := model.Count()
	model.FailNext(conformance.OpenAIFailure{Status: http.StatusTooManyRequests, RetryAfter: strconv.Itoa(int(retryAfter / time.Second))})

	first := c.client(0).submit(t, "limited", "limited question")
	// Once the 429 has settled the attempt, the node has closed the
	// endpoint in the store (it writes the closure before it commits the
	// settlement).
	settledRateLimited(t, c.client(0), first.ID)
	_, limitAt := providerSeen(model, from)
	if limitAt.IsZero() {
		t.Fatal("the attempt settled as rate-limited, but the provider sent no 429")
	}

	var ids []string
	var via []int
	for i := range 6 {
		node := 1 + i%2
		ids = append(ids, c.client(node).submit(t, fmt.Sprintf("after-%d", i), fmt.Sprintf("after question %d", i)).ID)
		via = append(via, node)
	}
	for i, id := range ids {
		run := c.client(via[i]).waitRun(t, id, 30*time.Second, "to wait for the endpoint's budget", func(r runView) bool {
			return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Budget != nil || r.terminal()
		})
		if run.Waiting == nil || len(run.Waiting.Pending) != 1 {
			t.Errorf("run %s through node %d ended %s without waiting for the endpoint's budget", id, via[i], run.Status)
			continue
		}
		b := run.Waiting.Pending[0].Budget
		until, err := time.Parse(time.RFC3339Nano, b.Until)
		if b.Endpoint != "openai" || err != nil || until.Before(limitAt.Add(retryAfter).Add(-time.Second)) {
			t.Errorf("run %s through node %d waits with %+v; want the endpoint openai closed until %s after the 429 (%s)",
				id, via[i], *b, retryAfter, limitAt.Add(retryAfter).Format(time.RFC3339Nano))
		}
	}
	for i, id := range append([]string{first.ID}, ids...) {
		node := 0
		if i > 0 {
			node = via[i-1]
		}
		if done := c.client(node).waitRun(t, id, 60*time.Second, "to end", runView.terminal); done.Status != "completed" {
			t.Fatalf("run %s: %s %+v", id, done.Status, done.Failure)
		}
	}
	arrivals, _ := providerSeen(model, from)
	early := 0
	for _, at := range arrivals[1:] {
		if at.Before(limitAt.Add(retryAfter)) {
			early++
			t.Errorf("a request came %s after the 429 that asked every caller to wait %s", at.Sub(limitAt).Round(time.Millisecond), retryAfter)
		}
	}
	if len(arrivals) != 1+1+len(ids) {
		t.Errorf("the provider saw %d requests; want the 429's, its retry and one for each of the %d other Runs", len(arrivals), len(ids))
	}
	t.Logf("the provider saw %d requests: the 429, then %d within the %s it asked for, the first after it %s after the 429",
		len(arrivals), early, retryAfter, arrivals[1].Sub(limitAt).Round(time.Millisecond))
}

// settledRateLimited reads the Run's events through c until an attempt
// settles as rate_limited.
func settledRateLimited(t *testing.T, c *apiClient, runID string) {
	t.Helper()
	req, err := http.NewRequest("GET", c.Base+"/v1/runs/"+runID+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	found := false
	err = readSSE(resp.Body, func(ev sseEvent) bool {
		found = ev.Event == "effect_settled" && strings.Contains(ev.Data, `"class":"rate_limited"`)
		return found || ev.Event == "run_completed" || ev.Event == "run_failed" || ev.Event == "run_cancelled"
	})
	if err != nil || !found {
		t.Fatalf("run %s's events: no rate-limited settlement (%v)", runID, err)
	}
}

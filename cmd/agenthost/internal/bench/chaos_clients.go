package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/cmd/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/cmd/agenthost/internal/serveproc"
)

// The chaos bench's clients: each submits Runs of a random kind, follows
// them (answering approvals) and retries every request the faults cut
// off, a submission always with the same Idempotency-Key.

// chaosKinds are the kinds of Run the clients submit, in the summary's
// order.
var chaosKinds = []string{"instant", "slow_job", "slow", "failing", "approval", "input", "hostile", "queued", "cancel", "lost"}

// hostileTools are the misbehaviours of the hostile plugin the clients
// call; each must fail cleanly and leave the server serving.
var hostileTools = []string{"loop", "oom", "trap", "huge_output", "not_json", "bad_schema", "nonzero", "file_read", "http"}

// chaosScripts returns the inputs (scripts of the conformance model, one
// per Run, all in one session) of a Run of kind.
func chaosScripts(kind string, rng *rand.Rand) []string {
	switch kind {
	case "instant":
		return []string{`call:echo({"text":"hello"}),ok({})|answer:$results`}
	case "slow_job":
		return []string{fmt.Sprintf(`call:slow_job({"seconds":%d,"label":"chaos"})|answer:$results`, 1+rng.IntN(3))}
	case "slow":
		return []string{`call:slow({"text":"later"}),echo({"text":"now"})|answer:$results`}
	case "failing":
		return []string{`call:fail({}),flaky({"text":"second time lucky"})|answer:$results`}
	case "approval":
		if rng.IntN(2) == 0 {
			return []string{`call:wire({"text":"transfer"})|answer:$results`}
		}
		return []string{`call:wire({"text":"one"}),wire({"text":"two"}),echo({"text":"free"})|answer:$results`}
	case "input":
		// The model asks the user one or two questions; the clients answer
		// each with chaosAnswer, under If-Match.
		if rng.IntN(2) == 0 {
			return []string{`ask:Which city?|answer:noted`}
		}
		return []string{`ask:Which city?|call:echo({"text":"booked"})|ask:Which day?|answer:$results`}
	case "hostile":
		tool := hostileTools[rng.IntN(len(hostileTools))]
		args := "{}"
		if tool == "http" {
			args = `{"url":"http://example.com/"}`
		}
		return []string{fmt.Sprintf(`call:%s(%s)|answer:$results`, tool, args)}
	case "cancel":
		// The client cancels it while the tools are in flight (follow).
		return []string{`call:slow_job({"seconds":4,"label":"doomed"}),slow({"text":"doomed"})|answer:$results`}
	case "lost":
		// The lost tool answers pending, then unknown: its policy
		// (fail_run in chaosConfig) fails the Run.
		return []string{`call:lost({}),echo({"text":"bystander"})|answer:$results`}
	case "queued":
		// The second Run waits in the session until the first ends; its
		// model sees the first in its history and answers at once.
		return []string{fmt.Sprintf(`call:slow_job({"seconds":1,"label":"first"}),slow({"text":"first"})|answer:$results`), `answer:queued`}
	}
	panic("chaos: unknown kind " + kind)
}

// ackedRun is a Run the server acknowledged (201, or 200 replaying its
// Idempotency-Key).
type ackedRun struct {
	Tenant, Token, ID, Kind, Key string
}

// chaosClients is the clients' shared state. It is safe for concurrent
// use.
type chaosClients struct {
	srv     *chaosServer
	http    *http.Client
	tenants []chaosTenant
	seed    uint64
	timeout time.Duration // bound on one request

	mu         sync.Mutex
	acked      []ackedRun
	violations []string

	submitted, retries, errors, approved, denied, answered, cancels counter
	stopping                                                        atomic.Bool  // the chaos phase is over: start nothing new
	giveUp                                                          atomic.Int64 // unix nanos after which a submission stops retrying
}

type chaosTenant struct{ ID, Token string }

func newChaosClients(srv *chaosServer, tenants []chaosTenant, seed uint64, timeout time.Duration) *chaosClients {
	return &chaosClients{srv: srv, tenants: tenants, seed: seed, timeout: timeout,
		http: &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}}
}

func (c *chaosClients) violation(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// do sends one request to whichever server is up now.
func (c *chaosClients) do(token, method, path string, body any, header map[string]string, out any) (int, []byte, error) {
	addr := c.srv.addr()
	if addr == "" {
		return 0, nil, errors.New("no server")
	}
	bc := &serveproc.Client{Base: "http://" + addr, Token: token, HTTP: c.http}
	return bc.Do(method, path, body, header, out)
}

// retryPause is the pause between two tries of a request the faults cut
// off.
const retryPause = 100 * time.Millisecond

// worker submits and follows Runs until the chaos phase is over.
func (c *chaosClients) worker(id int) {
	rng := rand.New(rand.NewPCG(c.seed, uint64(id)+1))
	for n := 0; !c.stopping.Load(); n++ {
		// Each worker starts with a different kind, so that even a short
		// run has every kind; then the kinds are random.
		kind := chaosKinds[(id+n)%len(chaosKinds)]
		if n >= len(chaosKinds) {
			kind = chaosKinds[rng.IntN(len(chaosKinds))]
		}
		tenant := c.tenants[rng.IntN(len(c.tenants))]
		session := fmt.Sprintf("w%d-%d", id, n)
		var runs []ackedRun
		for i, input := range chaosScripts(kind, rng) {
			key := fmt.Sprintf("chaos-%d-w%d-%d-%d", c.seed, id, n, i)
			run, ok := c.submit(tenant, session, kind, key, input)
			if !ok {
				return
			}
			runs = append(runs, run)
		}
		for _, r := range runs {
			c.follow(r, rng, 60*time.Second)
		}
	}
}

// submit sends a submission until the server acknowledges it, with the
// same Idempotency-Key every time. It gives up (false) only past the
// give-up time, which the drain sets.
func (c *chaosClients) submit(t chaosTenant, session, kind, key, input string) (ackedRun, bool) {
	c.submitted.Add(1)
	body := map[string]any{"input": input}
	hdr := map[string]string{"Idempotency-Key": key}
	for try := 0; ; try++ {
		if try > 0 {
			c.retries.Add(1)
			if g := c.giveUp.Load(); g != 0 && time.Now().UnixNano() > g {
				c.violation("submission %s (tenant %s) was never acknowledged: the server did not answer it before the drain's deadline", key, t.ID)
				return ackedRun{}, false
			}
			time.Sleep(retryPause)
		}
		var run httpapi.RunJSON
		code, raw, err := c.do(t.Token, "POST", "/v1/sessions/"+session+"/runs", body, hdr, &run)
		switch {
		case err != nil || code == 0:
			c.errors.Add(1)
			continue
		case code == http.StatusServiceUnavailable:
			continue // draining or not ready: try again
		case code == http.StatusCreated || code == http.StatusOK:
			a := ackedRun{Tenant: t.ID, Token: t.Token, ID: run.ID, Kind: kind, Key: key}
			c.mu.Lock()
			c.acked = append(c.acked, a)
			c.mu.Unlock()
			return a, true
		default:
			c.violation("submission %s (tenant %s) answered %d: %s", key, t.ID, code, truncateBytes(raw, 200))
			return ackedRun{}, false
		}
	}
}

// follow polls a Run until it is terminal, answering its approvals (a
// random yes or no each), until bound passes or the chaos phase is over;
// the drain takes over from there.
func (c *chaosClients) follow(r ackedRun, rng *rand.Rand, bound time.Duration) {
	deadline := time.Now().Add(bound)
	cancelled := false
	for !c.stopping.Load() && time.Now().Before(deadline) {
		run, ok := c.step(r, rng)
		if ok && run.Status.Terminal() {
			return
		}
		if ok && r.Kind == "cancel" && !cancelled && run.Waiting != nil && len(run.Waiting.Pending) > 0 {
			cancelled = c.cancel(r)
		}
		time.Sleep(150 * time.Millisecond) // the poll's cadence, bounded by deadline
	}
}

// cancel asks for a Run's cancellation once; it reports whether the
// server answered (202, or 409 when the Run had ended: either way there
// is nothing more to ask). A request a fault cut off is asked again at
// the next look.
func (c *chaosClients) cancel(r ackedRun) bool {
	code, raw, err := c.do(r.Token, "POST", "/v1/runs/"+r.ID+"/cancel", map[string]any{"reason": "chaos cancels it"}, nil, nil)
	switch {
	case err != nil:
		c.errors.Add(1)
		return false
	case code == http.StatusAccepted:
		c.cancels.Add(1)
		return true
	case code == http.StatusConflict:
		return true
	case code == http.StatusServiceUnavailable:
		return false
	}
	c.violation("cancel of run %s/%s answered %d: %s", r.Tenant, r.ID, code, truncateBytes(raw, 200))
	return true
}

// step looks at a Run once and answers its approvals (each yes or no at
// random; all yes when rng is nil) or its question. It returns the Run as
// it saw it, and false if it could not see it.
func (c *chaosClients) step(r ackedRun, rng *rand.Rand) (httpapi.RunJSON, bool) {
	var run httpapi.RunJSON
	code, _, err := c.do(r.Token, "GET", "/v1/runs/"+r.ID, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		if err != nil {
			c.errors.Add(1)
		}
		return run, false
	}
	if run.Status.Terminal() || run.Waiting == nil {
		return run, true
	}
	if q := run.Waiting.Input; q != nil {
		// An answer cut off by a fault may have been recorded, and a
		// request the server read before a SIGSTOP is served after the
		// SIGCONT, so this answer may reach the Run after it moved on to
		// its next question: If-Match makes the server refuse it then
		// (412), and the next look answers the question of that moment.
		hdr := map[string]string{"If-Match": fmt.Sprintf(`"%d"`, run.Seq)}
		code, raw, err := c.do(r.Token, "POST", "/v1/runs/"+r.ID+"/input", map[string]any{"message": chaosAnswer(q.Prompt)}, hdr, nil)
		switch {
		case err != nil:
			c.errors.Add(1)
		case code == http.StatusOK:
			c.answered.Add(1)
		case code == http.StatusPreconditionFailed, code == http.StatusConflict, code == http.StatusServiceUnavailable:
			// It moved on, it ended, or the server is not ready: look again.
		default:
			c.violation("answer to run %s/%s answered %d: %s", r.Tenant, r.ID, code, truncateBytes(raw, 200))
		}
		return run, true
	}
	if len(run.Waiting.Approvals) == 0 {
		return run, true
	}
	var decisions []map[string]any
	for _, a := range run.Waiting.Approvals {
		yes := rng == nil || rng.IntN(3) != 0
		d := map[string]any{"tool_call_id": a.ToolCallID, "approved": yes}
		if !yes {
			d["reason"] = "chaos says no"
		}
		decisions = append(decisions, d)
	}
	// A decision cut off by a fault may have been recorded: the next look
	// at the Run tells, and a repeat is refused harmlessly.
	code, _, err = c.do(r.Token, "POST", "/v1/runs/"+r.ID+"/input", map[string]any{"approvals": decisions}, nil, nil)
	if err != nil {
		c.errors.Add(1)
		return run, true
	}
	if code == http.StatusOK {
		for _, d := range decisions {
			if d["approved"] == true {
				c.approved.Add(1)
			} else {
				c.denied.Add(1)
			}
		}
	}
	return run, true
}

func (c *chaosClients) snapshot() ([]ackedRun, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ackedRun(nil), c.acked...), append([]string(nil), c.violations...)
}

func truncateBytes(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

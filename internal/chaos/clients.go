package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/serveproc"
)

// The chaos harness's clients: each submits Runs of a random kind, round
// robin through the nodes, follows each one's event stream through a node
// other than the one that acknowledged it (answering its approvals and
// questions, and cancelling it, through any node), and retries every
// request the faults cut off on another node, a submission always with
// the same Idempotency-Key.

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

// ackedRun is a Run a node acknowledged (201, or 200 replaying its
// Idempotency-Key).
type ackedRun struct {
	Tenant, Token, ID, Kind, Key string
	Node                         int // the node that acknowledged it
}

// chaosClients is the clients' shared state. It is safe for concurrent
// use.
type chaosClients struct {
	nodes   []*chaosServer
	http    *http.Client // requests, each bounded by timeout
	stream  *http.Client // event streams: only their connection and headers are bounded
	tenants []chaosTenant
	seed    uint64
	timeout time.Duration // bound on one request

	mu         sync.Mutex
	acked      []ackedRun
	violations []string
	reported   map[string]bool       // violations reported once (by key)
	streams    map[string]*runStream // by Run ID: what its event streams delivered
	failures   []int64               // unix nanos of every failed request: a transport error or a 5xx answer

	rr     atomic.Uint64 // the round robin of submissions
	lastOK atomic.Int64  // unix nanos of the last request a node answered below 500

	submitted, retries, errors, approved, denied, answered, cancels counter
	// The event streams: opened (and of those, on a node other than the
	// one that acknowledged the Run), events received, and given up
	// before their Run's end: cut off, silent past chaosStreamIdle, or
	// behind the store past chaosStreamStale.
	streamsOpened, streamsCrossNode, streamEvents, streamsBroken, streamsIdle, streamsStale counter

	stopping atomic.Bool  // the chaos phase is over: start nothing new
	giveUp   atomic.Int64 // unix nanos after which a submission stops retrying
}

type chaosTenant struct{ ID, Token string }

// counter is an atomic count of the clients' doings.
type counter struct{ atomic.Int64 }

func (c *counter) get() int64 { return c.Load() }

func newChaosClients(nodes []*chaosServer, tenants []chaosTenant, seed uint64, timeout time.Duration) *chaosClients {
	dial := (&net.Dialer{Timeout: timeout}).DialContext
	return &chaosClients{nodes: nodes, tenants: tenants, seed: seed, timeout: timeout,
		reported: map[string]bool{}, streams: map[string]*runStream{},
		http: &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}},
		stream: &http.Client{Transport: &http.Transport{DialContext: dial, ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}},
	}
}

func (c *chaosClients) violation(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// violationOnce reports a violation the first time key is seen: a Run
// looked at again and again reports its fault once.
func (c *chaosClients) violationOnce(key, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reported[key] {
		return
	}
	c.reported[key] = true
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// errNodeDown is a request not sent: its node is not running.
var errNodeDown = errors.New("the node is not running")

// pick chooses a node for a request at random: one that runs and that no
// request failed on a moment ago, other than avoid if it can; -1 when no
// node runs.
func (c *chaosClients) pick(avoid int, tried map[int]bool) int {
	var good, fair, all []int
	for i, n := range c.nodes {
		if tried[i] || n.addr() == "" {
			continue
		}
		all = append(all, i)
		if i == avoid {
			continue
		}
		fair = append(fair, i)
		if !n.suspected() {
			good = append(good, i)
		}
	}
	for _, set := range [][]int{good, fair, all} {
		if len(set) > 0 {
			return set[rand.IntN(len(set))] // which node: not part of the seed's replay
		}
	}
	return -1
}

// doOn sends one request to node i.
func (c *chaosClients) doOn(i int, token, method, path string, body any, header map[string]string, out any) (int, []byte, error) {
	addr := c.nodes[i].addr()
	if addr == "" {
		return 0, nil, errNodeDown
	}
	bc := &serveproc.Client{Base: "http://" + addr, Token: token, HTTP: c.http}
	code, raw, err := bc.Do(method, path, body, header, out)
	c.note(i, code, err)
	return code, raw, err
}

// note counts a request's outcome: a transport error (which makes its
// node suspect), a 5xx answer, or a success.
func (c *chaosClients) note(i, code int, err error) {
	switch {
	case err != nil:
		c.errors.Add(1)
		c.nodes[i].suspect()
		c.failed()
	case code >= 500:
		c.failed()
	default:
		c.lastOK.Store(time.Now().UnixNano())
	}
}

func (c *chaosClients) failed() {
	now := time.Now().UnixNano()
	c.mu.Lock()
	c.failures = append(c.failures, now)
	c.mu.Unlock()
}

// failuresSince returns how many requests failed at or after t, and when
// the last of them failed (zero if none did).
func (c *chaosClients) failuresSince(t time.Time) (int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	from := t.UnixNano()
	k := sort.Search(len(c.failures), func(j int) bool { return c.failures[j] >= from })
	if k == len(c.failures) {
		return 0, time.Time{}
	}
	return len(c.failures) - k, time.Unix(0, c.failures[len(c.failures)-1])
}

// doAny sends a request to a node chosen at random (other than avoid if
// it can), and when that node cannot be reached or answers 503, to
// another, until every running node was tried. It returns the last
// answer and the node that gave it.
func (c *chaosClients) doAny(avoid int, token, method, path string, body any, header map[string]string, out any) (int, []byte, int, error) {
	tried := map[int]bool{}
	code, raw, node, err := 0, []byte(nil), -1, error(errNodeDown)
	for len(tried) < len(c.nodes) {
		i := c.pick(avoid, tried)
		if i < 0 {
			if len(tried) == 0 {
				c.failed() // no node runs: a request no node can serve
			}
			break
		}
		tried[i] = true
		code, raw, err = c.doOn(i, token, method, path, body, header, out)
		node = i
		if err == nil && code != http.StatusServiceUnavailable && code != http.StatusBadGateway {
			break
		}
	}
	return code, raw, node, err
}

// retryPause is the pause between two tries of a request the faults cut
// off, once every node has been tried.
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

// submit sends a submission until a node acknowledges it, with the same
// Idempotency-Key every time: to the next node of the round robin first,
// then, while the nodes cannot be reached or answer 503, to each next
// one. It gives up (false) only past the give-up time, which the drain
// sets.
func (c *chaosClients) submit(t chaosTenant, session, kind, key, input string) (ackedRun, bool) {
	c.submitted.Add(1)
	body := map[string]any{"input": input}
	hdr := map[string]string{"Idempotency-Key": key}
	first := int(c.rr.Add(1) % uint64(len(c.nodes)))
	down := 0 // nodes not running, in this round of tries
	for try := 0; ; try++ {
		i := (first + try) % len(c.nodes)
		if try > 0 {
			c.retries.Add(1)
			if g := c.giveUp.Load(); g != 0 && time.Now().UnixNano() > g {
				c.violation("submission %s (tenant %s) was never acknowledged: no node answered it before the drain's deadline", key, t.ID)
				return ackedRun{}, false
			}
			if try%len(c.nodes) == 0 {
				if down == len(c.nodes) {
					c.failed() // no node runs: a request no node can serve
				}
				down = 0
				time.Sleep(retryPause)
			}
		}
		var run httpapi.RunJSON
		code, raw, err := c.doOn(i, t.Token, "POST", "/v1/sessions/"+session+"/runs", body, hdr, &run)
		switch {
		case errors.Is(err, errNodeDown):
			down++
			continue
		case err != nil || code == 0:
			continue
		case code == http.StatusServiceUnavailable:
			continue // draining, not ready, or its store is unreachable: try the next node
		case code == http.StatusCreated || code == http.StatusOK:
			a := ackedRun{Tenant: t.ID, Token: t.Token, ID: run.ID, Kind: kind, Key: key, Node: i}
			c.mu.Lock()
			c.acked = append(c.acked, a)
			c.mu.Unlock()
			return a, true
		default:
			c.violation("submission %s (tenant %s) answered %d on node %d: %s", key, t.ID, code, i, truncateBytes(raw, 200))
			return ackedRun{}, false
		}
	}
}

// cancel asks for a Run's cancellation once, through any node; it
// reports whether a node answered (202, or 409 when the Run had ended:
// either way there is nothing more to ask). A request a fault cut off is
// asked again at the next look.
func (c *chaosClients) cancel(r ackedRun) bool {
	code, raw, node, err := c.doAny(-1, r.Token, "POST", "/v1/runs/"+r.ID+"/cancel", map[string]any{"reason": "chaos cancels it"}, nil, nil)
	switch {
	case err != nil:
		return false
	case code == http.StatusAccepted:
		c.cancels.Add(1)
		return true
	case code == http.StatusConflict:
		return true
	case code >= 500:
		return false
	}
	c.violation("cancel of run %s/%s answered %d on node %d: %s", r.Tenant, r.ID, code, node, truncateBytes(raw, 200))
	return true
}

// step looks at a Run once, through any node, and answers its approvals
// (each yes or no at random; all yes when rng is nil) or its question,
// through any node. It returns the Run as it saw it, and false if it
// could not see it.
func (c *chaosClients) step(r ackedRun, rng *rand.Rand) (httpapi.RunJSON, bool) {
	var run httpapi.RunJSON
	code, raw, node, err := c.doAny(-1, r.Token, "GET", "/v1/runs/"+r.ID, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		if err == nil && code == http.StatusNotFound {
			c.violationOnce("404 "+r.ID, "run %s/%s, acknowledged by node %d, is unknown to node %d (404): %s", r.Tenant, r.ID, r.Node, node, truncateBytes(raw, 200))
		}
		return run, false
	}
	if run.Status.Terminal() || run.Waiting == nil {
		return run, true
	}
	if q := run.Waiting.Input; q != nil {
		// An answer cut off by a fault may have been recorded, and a
		// request a node read before a SIGSTOP is served after the
		// SIGCONT, so this answer may reach the Run after it moved on to
		// its next question: If-Match makes the node refuse it then
		// (412), and the next look answers the question of that moment.
		hdr := map[string]string{"If-Match": fmt.Sprintf(`"%d"`, run.Seq)}
		code, raw, node, err := c.doAny(-1, r.Token, "POST", "/v1/runs/"+r.ID+"/input", map[string]any{"message": chaosAnswer(q.Prompt)}, hdr, nil)
		switch {
		case err != nil:
		case code == http.StatusOK:
			c.answered.Add(1)
		case code == http.StatusPreconditionFailed, code == http.StatusConflict, code >= 500:
			// It moved on, it ended, or the node is not ready: look again.
		default:
			c.violation("answer to run %s/%s answered %d on node %d: %s", r.Tenant, r.ID, code, node, truncateBytes(raw, 200))
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
	code, _, _, err = c.doAny(-1, r.Token, "POST", "/v1/runs/"+r.ID+"/input", map[string]any{"approvals": decisions}, nil, nil)
	if err == nil && code == http.StatusOK {
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

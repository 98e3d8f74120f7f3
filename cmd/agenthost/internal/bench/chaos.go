package bench

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/cmd/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/loop"
)

// The plugins chaos loads, by their paths under --plugins as `make
// plugins` lays them out (internal/plugincatalog names them for the
// tests, the bench and the Makefile alike).
const (
	chaosBuilder  = plugincatalog.ConformanceDir + plugincatalog.Builder
	chaosScripted = plugincatalog.ConformanceDir + plugincatalog.Scripted
	chaosHostile  = plugincatalog.ConformanceDir + plugincatalog.Hostile
	chaosSlowJob  = plugincatalog.SlowJobTool
)

// chaosOptions are the flags of `agenthost bench chaos`.
type chaosOptions struct {
	duration    time.Duration
	seed        uint64
	concurrency int
	faultEvery  durRange
	faults      faultKinds
	pause       durRange
	resumeBound time.Duration
	termBound   time.Duration
	drain       time.Duration
	timeout     time.Duration
}

func newBenchChaosCmd(bf *benchFlags) *cobra.Command {
	o := &chaosOptions{faultEvery: durRange{3 * time.Second, 10 * time.Second}, pause: durRange{time.Second, 4 * time.Second},
		faults: faultKinds{faultKill, faultPause, faultTerm}}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Kill, pause and restart a real server under load, then check that no acknowledged Run was lost or mishandled",
		Long: `chaos starts ` + "`agenthost serve`" + ` as a child process on a fresh data dir, with two
tenants whose Runs use the conformance plugins, and for --duration lets
--concurrency clients submit Runs of every kind: instant tools, slow tools
(slow_job, slow), failing tools (fail, flaky), tools that wait for an
approval (the clients approve or deny them), a model that asks the user
one or two questions (the clients answer each, under If-Match), slow ones
the clients cancel while in flight, one that loses its work (its policy
fails the Run), and hostile ones (an endless loop, a memory bomb, a trap,
huge or malformed output, a file read, HTTP to a host not allowed). Every
--fault-every it does one of the --faults: kill SIGKILLs the server and
restarts it on the same data dir; pause SIGSTOPs it for --pause and
SIGCONTs it; term restarts it gracefully: SIGTERM, which must make it exit
0 within --term-bound, then a start on the same data dir. The first faults
are each kind once, in a seeded order, so that even a short run has every
kind; then the kind is drawn at random. The clients see their requests time
out or answer 503 and retry them, a submission with the same
Idempotency-Key.

Then it stops the faults, waits for every acknowledged Run to end (approving
and answering what still waits), stops the server with SIGTERM (it must exit 0), reopens
the data dir with Badger and checks docs/DESIGN.md §9's invariants on every
acknowledged Run: it is terminal; its event log passes the Loop's log
check (loop.LogCheck): numbered 1..n with one terminal event, last; no
effect attempt settled twice, or without its dispatch; a gated call
dispatched only once approved; every approval and every input answers what
the Run was waiting on, once; no effect dispatched more attempts than its
policy allows; and the rest of that check's rules. No slow job ran twice (the
plugin counts its executions in its KV); the watchdog found no stuck Run; the
server answered within --resume-bound after every SIGCONT; and it exited 0
within --term-bound after every SIGTERM.

It prints the faults survived (kills, pauses, graceful restarts), the Runs
by kind and status, the effects settled, recovery's decisions, and the
violations; it exits non-zero if there is any, naming them, and keeps the
work dir for a post-mortem. The
seed (--seed, printed at the start) replays the same choices: kinds,
tenants, fault times; the timing of the processes is not replayed.`,
		Example: `  make plugins build
  bin/agenthost bench chaos --duration 10m
  bin/agenthost bench chaos --duration 2m --seed 42 --fault-every 2s-5s --pause 1s-3s --json
  bin/agenthost bench chaos --duration 5m --faults term`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runChaos(cmd, bf, o) },
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the faults and the load go on (the drain and the checks come after)")
	f.Uint64Var(&o.seed, "seed", 0, "the seed of the random choices (0: a fresh one, printed)")
	f.IntVar(&o.concurrency, "concurrency", 8, "clients submitting and following Runs at once")
	f.Var(&o.faultEvery, "fault-every", "time between two faults, a range drawn uniformly (e.g. 3s-10s)")
	f.Var(&o.faults, "faults", "the kinds of fault to draw from: kill (SIGKILL, restart), pause (SIGSTOP, SIGCONT), term (SIGTERM, restart)")
	f.Var(&o.pause, "pause", "how long a SIGSTOP lasts before its SIGCONT, a range (e.g. 1s-4s)")
	f.DurationVar(&o.resumeBound, "resume-bound", 15*time.Second, "the server must answer /readyz this soon after a SIGCONT")
	f.DurationVar(&o.termBound, "term-bound", 45*time.Second, "the server must exit 0 this soon after a SIGTERM (its own grace: 10s for requests, 20s for the runtime)")
	f.DurationVar(&o.drain, "drain-timeout", 3*time.Minute, "bound on waiting for every acknowledged Run to end after the faults stop")
	f.DurationVar(&o.timeout, "request-timeout", 2*time.Second, "bound on one HTTP request of the clients")
	return cmd
}

// chaosParams are the parameters, for --json.
type chaosParams struct {
	Seed           uint64  `json:"seed"`
	DurationS      float64 `json:"duration_s"`
	Concurrency    int     `json:"concurrency"`
	FaultEvery     string  `json:"fault_every"`
	Faults         string  `json:"faults"`
	Pause          string  `json:"pause"`
	ResumeBoundS   float64 `json:"resume_bound_s"`
	TermBoundS     float64 `json:"term_bound_s"`
	DrainTimeoutS  float64 `json:"drain_timeout_s"`
	RequestTimeout float64 `json:"request_timeout_s"`
}

// chaosResult is what a chaos run found, for --json.
type chaosResult struct {
	Seed       uint64  `json:"seed"`
	ElapsedS   float64 `json:"elapsed_s"`
	Kills      int     `json:"kills"`
	Pauses     int     `json:"pauses"`
	Restarts   int     `json:"graceful_restarts"`
	MaxReadyMS float64 `json:"max_ready_after_restart_ms"`
	MaxResumMS float64 `json:"max_answer_after_sigcont_ms"`
	MaxExitMS  float64 `json:"max_exit_after_sigterm_ms"`

	Submitted    int64                     `json:"submitted"`
	Acknowledged int                       `json:"acknowledged"`
	Kinds        map[string]map[string]int `json:"runs_by_kind"` // kind → status (and "acknowledged") → Runs
	ByStatus     map[string]int            `json:"runs_by_status"`
	Retries      int64                     `json:"submission_retries"`
	ClientErrors int64                     `json:"client_errors"`
	PauseErrors  int64                     `json:"client_errors_during_pauses"`
	Approved     int64                     `json:"approved"`
	Cancels      int64                     `json:"cancels"`
	Denied       int64                     `json:"denied"`
	Answered     int64                     `json:"answered"`

	Dispatched     int            `json:"attempts_dispatched"`
	EffectsSettled map[string]int `json:"effects_settled"` // "kind state" → attempts settled
	SlowJobs       int            `json:"slow_jobs_checked"`
	Recovery       map[string]int `json:"recovery_decisions"`
	SessionsTaken  int            `json:"sessions_taken_over"`
	Watchdog       int            `json:"watchdog_reports"`
	DrainS         float64        `json:"drain_s"`
	// UnusualEnds lists the Runs that did not end as their kind usually
	// does (lost: failed; cancel: cancelled; the others: completed), with
	// why: not violations, but what to read first after a run.
	UnusualEnds []string `json:"unusual_ends"`

	Violations []string `json:"violations"`
}

func runChaos(cmd *cobra.Command, bf *benchFlags, o *chaosOptions) error {
	if o.concurrency < 1 {
		return fmt.Errorf("bench chaos: --concurrency must be at least 1")
	}
	if len(o.faults) == 0 {
		return fmt.Errorf("bench chaos: --faults must name at least one of kill, pause and term")
	}
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	bin, err := bf.binary()
	if err != nil {
		return err
	}
	plugins, err := bf.pluginPaths(chaosBuilder, chaosScripted, chaosHostile, chaosSlowJob)
	if err != nil {
		return err
	}
	cache, err := bf.cachePath()
	if err != nil {
		return err
	}
	dir, cleanup, err := bf.tempDir("chaos")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			cleanup()
		}
	}()
	bf.progressf(cmd, "chaos: seed %d (replay with --seed %d), %s of faults (%s) every %s (pauses %s), %d clients, work dir %s",
		o.seed, o.seed, o.duration, &o.faults, &o.faultEvery, &o.pause, o.concurrency, dir)

	tenants := []chaosTenant{{"alpha", "chaos-alpha-token"}, {"beta", "chaos-beta-token"}}
	cfg, err := writeBenchConfig(dir, chaosConfig(plugins, cache, tenants))
	if err != nil {
		return fmt.Errorf("bench chaos: config: %w", err)
	}
	srv := &chaosServer{bin: bin, cfgPath: filepath.Join(dir, "agenthost.yaml"), logPath: filepath.Join(dir, "serve.log")}
	if _, err := srv.start(); err != nil {
		return fmt.Errorf("bench chaos: starting the server: %w", err)
	}

	began := time.Now()
	res := &chaosResult{Seed: o.seed, Kinds: map[string]map[string]int{}, ByStatus: map[string]int{},
		EffectsSettled: map[string]int{}, Recovery: map[string]int{}}
	clients := newChaosClients(srv, tenants, o.seed, o.timeout)
	defer func() {
		// On an early return: stop the clients' retries and the child.
		clients.stopping.Store(true)
		clients.giveUp.Store(1)
		if p := srv.current(); !p.Exited() {
			p.Kill()
		}
	}()
	var workers sync.WaitGroup
	for i := 0; i < o.concurrency; i++ {
		workers.Add(1)
		go func() { defer workers.Done(); clients.worker(i) }()
	}
	// Progress is printed by this goroutine only (between faults, see
	// wait), never by a meter's: cmd's stderr need not be safe for
	// concurrent writes.
	lastProgress := time.Now()
	wait := func(d time.Duration) {
		for d > 0 {
			step := min(d, 5*time.Second)
			time.Sleep(step) // the fault's input: when it falls
			d -= step
			if time.Since(lastProgress) < 5*time.Second {
				continue
			}
			lastProgress = time.Now()
			acked, _ := clients.snapshot()
			bf.progressf(cmd, "chaos: %s runs submitted %d, acknowledged %d; kills %d, pauses %d, graceful restarts %d",
				time.Since(began).Round(time.Second), clients.submitted.get(), len(acked), res.Kills, res.Pauses, res.Restarts)
		}
	}

	var faultViolations []string
	rng := rand.New(rand.NewPCG(o.seed, 0))
	// The first faults are each kind once, in a seeded order, so that even
	// a short run has every kind; then the kinds are random.
	first := append(faultKinds(nil), o.faults...)
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	end := began.Add(o.duration)
	for n := 1; ; n++ {
		next := o.faultEvery.draw(rng)
		if time.Now().Add(next).After(end) {
			wait(time.Until(end)) // the rest of the chaos phase, with no fault
			break
		}
		wait(next)
		if p := srv.current(); p.Exited() {
			faultViolations = append(faultViolations, fmt.Sprintf("the server exited by itself before fault %d: %v", n, p.Err()))
			if _, err := srv.start(); err != nil {
				return fmt.Errorf("bench chaos: restarting the server: %w", err)
			}
		}
		kind := o.faults[rng.IntN(len(o.faults))]
		if n <= len(first) {
			kind = first[n-1]
		}
		at := time.Since(began).Round(100 * time.Millisecond)
		switch kind {
		case faultKill:
			ready, err := srv.kill()
			if err != nil {
				keep = true
				return fmt.Errorf("bench chaos: seed %d: the server did not come back after SIGKILL %d: %w (work dir kept: %s)", o.seed, res.Kills+1, err, dir)
			}
			res.Kills++
			res.MaxReadyMS = max(res.MaxReadyMS, msf(ready))
			bf.progressf(cmd, "chaos: %s kill %d: SIGKILL, restarted on the same data dir, ready in %s", at, res.Kills, ready.Round(time.Millisecond))
		case faultTerm:
			exited, stopErr := srv.stop(o.termBound)
			if stopErr != nil {
				faultViolations = append(faultViolations, fmt.Sprintf("graceful restart %d: %v", res.Restarts+1, stopErr))
				bf.progressf(cmd, "chaos: %s graceful restart %d: VIOLATION: %v", at, res.Restarts+1, stopErr)
			}
			ready, err := srv.start()
			if err != nil {
				keep = true
				return fmt.Errorf("bench chaos: seed %d: the server did not come back after SIGTERM %d: %w (work dir kept: %s)", o.seed, res.Restarts+1, err, dir)
			}
			res.Restarts++
			res.MaxExitMS = max(res.MaxExitMS, msf(exited))
			res.MaxReadyMS = max(res.MaxReadyMS, msf(ready))
			bf.progressf(cmd, "chaos: %s graceful restart %d: SIGTERM, exited in %s, restarted on the same data dir, ready in %s", at, res.Restarts, exited.Round(time.Millisecond), ready.Round(time.Millisecond))
		case faultPause:
			d := o.pause.draw(rng)
			errorsBefore := clients.errors.get()
			answered, err := srv.pause(d, o.resumeBound)
			cutOff := clients.errors.get() - errorsBefore
			res.PauseErrors += cutOff
			res.Pauses++
			if err != nil {
				faultViolations = append(faultViolations, fmt.Sprintf("pause %d: the server did not answer within %s of SIGCONT: %v", res.Pauses, o.resumeBound, err))
				bf.progressf(cmd, "chaos: %s pause %d: VIOLATION: %v", at, res.Pauses, err)
				continue
			}
			res.MaxResumMS = max(res.MaxResumMS, msf(answered))
			bf.progressf(cmd, "chaos: %s pause %d: SIGSTOP for %s (%d requests cut off), ready %s after SIGCONT", at, res.Pauses, d.Round(time.Millisecond), cutOff, answered.Round(time.Millisecond))
		}
	}

	// The drain: no new Runs; a submission in flight retries until the
	// drain's deadline; then every acknowledged Run must end.
	drainBegan := time.Now()
	deadline := drainBegan.Add(o.drain)
	clients.stopping.Store(true)
	clients.giveUp.Store(deadline.UnixNano())
	if p := srv.current(); p.Exited() {
		faultViolations = append(faultViolations, fmt.Sprintf("the server exited by itself during the last phase: %v", p.Err()))
		if _, err := srv.start(); err != nil {
			return fmt.Errorf("bench chaos: restarting the server: %w", err)
		}
	}
	workers.Wait()
	acked, clientViolations := clients.snapshot()
	bf.progressf(cmd, "chaos: faults stopped after %s; waiting for %d acknowledged Runs to end", time.Since(began).Round(time.Second), len(acked))
	notEnded := chaosDrain(clients, acked, deadline, func(format string, args ...any) { bf.progressf(cmd, format, args...) })
	res.DrainS = time.Since(drainBegan).Seconds()
	if len(notEnded) > 0 {
		faultViolations = append(faultViolations, fmt.Sprintf("%d acknowledged Runs did not end within the drain's %s: %s", len(notEnded), o.drain, strings.Join(firstN(notEnded, 10), ", ")))
	}
	watchdogMetric := scrapeCounter(clients, "agenthost_watchdog_reports_total")

	// A clean stop: SIGTERM, exit 0.
	if _, err := srv.stop(2 * time.Minute); err != nil {
		faultViolations = append(faultViolations, "the last stop: "+err.Error())
	}
	bf.progressf(cmd, "chaos: server stopped; checking the data dir")

	res.ElapsedS = time.Since(began).Seconds()
	res.Submitted = clients.submitted.get()
	res.Acknowledged = len(acked)
	res.Retries, res.ClientErrors = clients.retries.get(), clients.errors.get()
	res.Approved, res.Denied, res.Answered, res.Cancels = clients.approved.get(), clients.denied.get(), clients.answered.get(), clients.cancels.get()
	res.Violations = append(res.Violations, faultViolations...)
	res.Violations = append(res.Violations, clientViolations...)
	res.Violations = append(res.Violations, chaosCheckStore(cmd.Context(), cfg.DataDir, acked, tenants, res)...)
	res.Violations = append(res.Violations, chaosReadLog(srv.logPath, res)...)
	if watchdogMetric > res.Watchdog {
		res.Watchdog = watchdogMetric
	}
	if res.Watchdog > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("the watchdog reported %d stuck Runs (see \"watchdog: run is stuck\" in %s)", res.Watchdog, srv.logPath))
	}
	if res.Violations == nil {
		res.Violations = []string{}
	}
	if res.UnusualEnds == nil {
		res.UnusualEnds = []string{}
	}

	params := chaosParams{Seed: o.seed, DurationS: o.duration.Seconds(), Concurrency: o.concurrency,
		FaultEvery: o.faultEvery.String(), Faults: o.faults.String(), Pause: o.pause.String(), ResumeBoundS: o.resumeBound.Seconds(),
		TermBoundS: o.termBound.Seconds(), DrainTimeoutS: o.drain.Seconds(), RequestTimeout: o.timeout.Seconds()}
	if err := bf.emit(cmd.OutOrStdout(), benchOutput{Bench: "chaos", Started: began, Machine: bf.thisMachine(), Params: params, Result: res},
		chaosTables(res)...); err != nil {
		return err
	}
	if n := len(res.Violations); n > 0 {
		keep = true
		return fmt.Errorf("bench chaos: seed %d: %d violations (work dir kept: %s):\n  %s", o.seed, n, dir, strings.Join(firstN(res.Violations, 20), "\n  "))
	}
	return nil
}

// chaosConfig is the child server's config: the conformance builder and
// model, the scripted, hostile and slow-job executors, and tenants with
// one token each, an approval-gated tool (wire), retry policies on the
// tools that can be retried, and fail_run on the one that loses its work.
func chaosConfig(plugins map[string]string, cache string, tenants []chaosTenant) string {
	var b strings.Builder
	fmt.Fprintf(&b, `data_dir: data
sync_writes: true
cache_dir: %q
retention: 0
# Scans often enough that the watchdog sees each incarnation's Runs (a
# stuck one is reported after two scans): its count must stay 0.
watchdog_interval: 1s
log: {format: text, level: info}
plugins:
  builder: {path: %q, role: builder}
  scripted: {path: %q, role: executor}
  hostile: {path: %q, role: executor, call_timeout: 2s, memory_pages: 256, pool_size: 2}
  slow-job: {path: %q, role: executor}
tenants:
`, cache, plugins[chaosBuilder], plugins[chaosScripted], plugins[chaosHostile], plugins[chaosSlowJob])
	for _, t := range tenants {
		fmt.Fprintf(&b, `  %s:
    tokens_sha256: [%s]
    builder: builder
    model: scripted
    tool_executors: [scripted, hostile, slow-job]
    model_policy: {mode: retry, max_attempts: 8, backoff: 100ms, max_backoff: 1s}
    tools:
      wire: {approval: always}
      flaky: {policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 500ms}}
      slow: {policy: {mode: retry, max_attempts: 3, backoff: 100ms, max_backoff: 500ms}}
      lost: {policy: {mode: fail_run}}
`, t.ID, httpapi.HashToken(t.Token))
	}
	return b.String()
}

// chaosDrain waits until every acknowledged Run is terminal, approving
// what waits for a person, until deadline; it returns the Runs that did
// not end.
func chaosDrain(c *chaosClients, acked []ackedRun, deadline time.Time, progressf func(string, ...any)) []string {
	open := map[string]ackedRun{}
	for _, r := range acked {
		open[r.ID] = r
	}
	last := time.Now()
	for len(open) > 0 && time.Now().Before(deadline) {
		if time.Since(last) >= 5*time.Second {
			progressf("chaos: draining: %d Runs not ended yet", len(open))
			last = time.Now()
		}
		for id, r := range open {
			if run, ok := c.step(r, nil); ok && run.Status.Terminal() {
				delete(open, id)
			}
		}
		if len(open) > 0 {
			time.Sleep(250 * time.Millisecond) // the poll's cadence, bounded by deadline
		}
	}
	var out []string
	for id, r := range open {
		out = append(out, r.Tenant+"/"+id)
	}
	sort.Strings(out)
	return out
}

// scrapeCounter sums a counter over its labels from the server's
// /metrics (0 if it cannot be read).
func scrapeCounter(c *chaosClients, name string) int {
	code, raw, err := c.do("", "GET", "/metrics", nil, nil, nil)
	if err != nil || code != http.StatusOK {
		return 0
	}
	total := 0.0
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return int(total)
}

// chaosCheckStore reopens the data dir and checks the invariants over
// every acknowledged Run, adding its figures to res.
func chaosCheckStore(ctx context.Context, dataDir string, acked []ackedRun, tenants []chaosTenant, res *chaosResult) []string {
	store, err := badgerstore.Open(dataDir, badgerstore.Options{})
	if err != nil {
		return []string{fmt.Sprintf("the data dir did not reopen after the clean stop: %v", err)}
	}
	defer store.Close()
	var out []string
	for _, r := range acked {
		byKind := res.Kinds[r.Kind]
		if byKind == nil {
			byKind = map[string]int{}
			res.Kinds[r.Kind] = byKind
		}
		byKind["acknowledged"]++
		run, err := store.LoadRun(ctx, r.Tenant, r.ID)
		if err != nil {
			out = append(out, fmt.Sprintf("acknowledged run %s/%s is not in the store: %v", r.Tenant, r.ID, err))
			continue
		}
		byKind[string(run.Status)]++
		if usual := usualEnd(r.Kind); run.Status.Terminal() && run.Status != usual {
			why := ""
			if run.Failure != nil {
				why = ": " + run.Failure.Error()
			}
			res.UnusualEnds = append(res.UnusualEnds, fmt.Sprintf("%s/%s (%s) %s%s", r.Tenant, r.ID, r.Kind, run.Status, why))
		}
		res.ByStatus[string(run.Status)]++
		if !run.Status.Terminal() {
			out = append(out, fmt.Sprintf("run %s/%s (%s) is %s, not terminal", r.Tenant, r.ID, r.Kind, run.Status))
		}
		evs, err := store.Events(ctx, r.Tenant, r.ID, 1, 1_000_000)
		if err != nil {
			out = append(out, fmt.Sprintf("events of run %s/%s: %v", r.Tenant, r.ID, err))
			continue
		}
		for _, v := range chaosCheckLog(evs) {
			out = append(out, fmt.Sprintf("run %s/%s (%s): %s", r.Tenant, r.ID, r.Kind, v))
		}
		recs := loop.LogEffects(evs)
		jobs, v, err := CheckSlowJobs(ctx, store, r.Tenant, chaosSlowJob, recs)
		if err != nil {
			out = append(out, fmt.Sprintf("run %s/%s: reading the slow-job KV: %v", r.Tenant, r.ID, err))
		}
		out = append(out, v...)
		res.SlowJobs += jobs
		for _, e := range recs {
			res.Dispatched += e.Dispatched
			for _, o := range e.Settled {
				if o != nil {
					res.EffectsSettled[e.Kind+" "+string(o.State)]++
				}
			}
		}
	}
	// Nothing the clients did not hear about may be left running either.
	for _, t := range tenants {
		for _, st := range []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting} {
			ids, err := store.RunsByStatus(ctx, t.ID, st, "", 20)
			if err != nil {
				out = append(out, fmt.Sprintf("tenant %s: runs %s: %v", t.ID, st, err))
			} else if len(ids) > 0 {
				out = append(out, fmt.Sprintf("tenant %s: Runs still %s in the store: %s", t.ID, st, strings.Join(ids, ", ")))
			}
		}
	}
	return out
}

// usualEnd is how a Run of a kind ends when nothing goes wrong: a lost
// one fails (its policy is fail_run), a cancelled one is cancelled (unless
// it ended before its cancellation), every other completes.
func usualEnd(kind string) loop.Status {
	switch kind {
	case "lost":
		return loop.StatusFailed
	case "cancel":
		return loop.StatusCancelled
	}
	return loop.StatusCompleted
}

// chaosReadLog counts recovery's decisions, the sessions taken over and
// the watchdog's reports in the servers' log (every incarnation appends
// to it), and reports a panic as a violation.
func chaosReadLog(path string, res *chaosResult) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{fmt.Sprintf("reading the server log: %v", err)}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `msg="recovery decision"`):
			if _, d, ok := strings.Cut(line, " decision="); ok {
				res.Recovery[strings.Fields(d)[0]]++
			}
		case strings.Contains(line, "recovery: session taken over"):
			res.SessionsTaken++
		case strings.Contains(line, "watchdog: run is stuck"):
			res.Watchdog++
		case strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:"):
			out = append(out, "the server log has a Go "+line)
		}
	}
	if err := sc.Err(); err != nil {
		out = append(out, fmt.Sprintf("reading the server log: %v", err))
	}
	return out
}

// chaosTables is the human-readable summary.
func chaosTables(res *chaosResult) []table {
	faults := table{Title: "Faults", Header: []string{"kills", "pauses", "graceful restarts", "slowest ready after restart (ms)", "slowest answer after SIGCONT (ms)", "slowest exit after SIGTERM (ms)", "submission retries", "client errors", "of which during pauses"},
		Rows: [][]string{{strconv.Itoa(res.Kills), strconv.Itoa(res.Pauses), strconv.Itoa(res.Restarts), fmt.Sprintf("%.0f", res.MaxReadyMS), fmt.Sprintf("%.0f", res.MaxResumMS),
			fmt.Sprintf("%.0f", res.MaxExitMS), strconv.FormatInt(res.Retries, 10), strconv.FormatInt(res.ClientErrors, 10), strconv.FormatInt(res.PauseErrors, 10)}},
		Notes: []string{fmt.Sprintf("seed %d; %.0f s in all, of which %.0f s draining; approvals answered: %d yes, %d no; questions answered: %d; cancellations asked: %d", res.Seed, res.ElapsedS, res.DrainS, res.Approved, res.Denied, res.Answered, res.Cancels)}}
	statuses := []string{"completed", "failed", "cancelled", "pending", "running", "waiting"}
	runs := table{Title: "Runs", Header: append([]string{"kind", "acknowledged"}, statuses...)}
	for _, k := range append(append([]string(nil), chaosKinds...), "total") {
		var byStatus map[string]int
		if k == "total" {
			byStatus = map[string]int{"acknowledged": res.Acknowledged}
			for s, n := range res.ByStatus {
				byStatus[s] = n
			}
		} else {
			byStatus = res.Kinds[k]
		}
		row := []string{k, strconv.Itoa(byStatus["acknowledged"])}
		for _, s := range statuses {
			row = append(row, strconv.Itoa(byStatus[s]))
		}
		runs.Rows = append(runs.Rows, row)
	}
	runs.Notes = []string{fmt.Sprintf("%d submissions started, %d acknowledged; %d ended otherwise than their kind usually does", res.Submitted, res.Acknowledged, len(res.UnusualEnds))}
	for _, u := range firstN(res.UnusualEnds, 10) {
		runs.Notes = append(runs.Notes, "  "+u)
	}
	effects := countTable("Effects", []string{"settled", "attempts"}, res.EffectsSettled)
	effects.Notes = []string{fmt.Sprintf("%d attempts dispatched; %d slow jobs checked against the plugin's execution counts", res.Dispatched, res.SlowJobs)}
	recovery := countTable("Recovery", []string{"decision", "count"}, res.Recovery)
	recovery.Notes = []string{fmt.Sprintf("%d sessions taken over from a killed or stopped server; %d watchdog reports", res.SessionsTaken, res.Watchdog)}
	verdict := table{Title: fmt.Sprintf("Violations: %d", len(res.Violations)), Header: []string{"#", "violation"}}
	for i, v := range res.Violations {
		verdict.Rows = append(verdict.Rows, []string{strconv.Itoa(i + 1), v})
	}
	if len(res.Violations) == 0 {
		verdict.Header, verdict.Notes = nil, []string{"every invariant held"}
	}
	return []table{faults, runs, effects, recovery, verdict}
}

// countTable is a table of counts by name, sorted by name.
func countTable(title string, header []string, counts map[string]int) table {
	t := table{Title: title, Header: header}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Rows = append(t.Rows, []string{k, strconv.Itoa(counts[k])})
	}
	return t
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(append([]string(nil), s[:n]...), fmt.Sprintf("… and %d more", len(s)-n))
	}
	return s
}

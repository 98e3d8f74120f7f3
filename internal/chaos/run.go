package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/netfault"
	"github.com/agenthost/agenthost/pgstore"
)

// chaosRun is one run of the chaos harness: its store, its nodes, its
// clients, and what it found. Only Run's goroutine touches it; the
// clients have their own state.
type chaosRun struct {
	env Env
	o   *Options
	ctx context.Context // Run's: its end interrupts the run

	dir     string
	keep    bool // keep the work dir: there were violations
	store   *chaosStore
	nodes   []*chaosServer
	dataDir string // node 0's data dir (Badger)
	ttl     time.Duration
	clients *chaosClients
	began   time.Time
	res     *Result
	// checked is set once the checks are done: res and params are then
	// the run's Report.
	checked bool
	params  Params

	// proxies are the nodes' ways to PostgreSQL, by node, for the
	// partition fault (nil without it).
	proxies    []*netfault.Proxy
	partitions []chaosPartitionMark

	deaths        []Death
	violations    []string // the faults' and the nodes' (the clients keep theirs)
	lastPause     []chaosPauseMark
	lastPgRestart time.Time
	lastProgress  time.Time
}

// chaosPauseMark is the last pause of a node: the incarnation paused, and
// when, so that its exit for a lost lease is put down to the pause.
type chaosPauseMark struct {
	owner string
	at    time.Time
	d     time.Duration
}

var errChaosInterrupted = errors.New("bench chaos: interrupted")

// Run does one chaos run with o (see Options.Check) in a fresh directory
// under env.WorkDir, until its faults and load are over and its checks
// are done, or ctx ends. It returns a Report once the checks are done:
// with a nil error when every invariant held, else with an error that
// names the violations (and the directory it kept for a post-mortem: the
// nodes' logs, and the run's own PostgreSQL data). A run that could not
// go through to its checks (bad options, a node that did not come back,
// ctx ended) returns only an error.
func Run(ctx context.Context, env Env, o Options) (*Report, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	for _, p := range Plugins() {
		if env.Plugins[p] == "" {
			return nil, fmt.Errorf("bench chaos: no path for plugin %s: Env.Plugins must map each of chaos.Plugins() to its .wasm file", p)
		}
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	dir, err := workDir(env.WorkDir)
	if err != nil {
		return nil, err
	}
	r := &chaosRun{env: env, o: &o, ctx: ctx, dir: dir}
	err = r.run()
	if !r.keep {
		_ = os.RemoveAll(dir)
	}
	if !r.checked {
		return nil, err
	}
	return &Report{Started: r.began, Params: r.params, Result: *r.res}, err
}

// workDir makes a fresh directory for a run under parent ("" for the
// system's temp dir).
func workDir(parent string) (string, error) {
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return "", fmt.Errorf("--work-dir: %w", err)
		}
	}
	dir, err := os.MkdirTemp(parent, "agenthost-bench-chaos-")
	if err != nil {
		return "", fmt.Errorf("bench: temporary directory: %w (set --work-dir to a writable directory)", err)
	}
	return dir, nil
}

// writeConfig writes a node's config file into dir and loads it, so
// that the run sees the config exactly as the node's `serve` does.
func writeConfig(dir, yaml string) (*config.Config, error) {
	path := filepath.Join(dir, "agenthost.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	return config.Load(path)
}

// msf is a duration in milliseconds, for the Result.
func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (r *chaosRun) progressf(format string, args ...any) {
	if r.env.Progress != nil {
		r.env.Progress(format, args...)
	}
}

func (r *chaosRun) since(t time.Time) time.Duration {
	return t.Sub(r.began).Round(100 * time.Millisecond)
}

func (r *chaosRun) run() error {
	o := r.o
	bin, plugins, cache := r.env.Binary, r.env.Plugins, r.env.CacheDir
	var err error
	r.store, err = openChaosStore(r.ctx, o, r.dir)
	if err != nil {
		return err
	}
	defer func() {
		if err := r.store.close(); err != nil {
			r.progressf("chaos: stopping PostgreSQL: %v", err)
		}
	}()

	tenants := []chaosTenant{{"alpha", "chaos-alpha-token"}, {"beta", "chaos-beta-token"}}
	var watchdog time.Duration
	defer func() {
		for _, p := range r.proxies {
			if p != nil {
				_ = p.Close()
			}
		}
	}()
	for i := 0; i < o.Nodes; i++ {
		nodeDir := filepath.Join(r.dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return fmt.Errorf("bench chaos: %w", err)
		}
		dsn := ""
		if o.Faults.Has(FaultPartition) {
			// The node reaches PostgreSQL through a proxy of its own, for
			// the partition fault to cut; it outlives the node's
			// incarnations, whose config names its port.
			p, through, err := PostgresProxy(r.store.dsn)
			if err != nil {
				return fmt.Errorf("bench chaos: the partition fault's proxy for node %d: %w", i, err)
			}
			r.proxies = append(r.proxies, p)
			dsn = through
		}
		cfg, err := writeConfig(nodeDir, chaosConfig(plugins, cache, tenants, r.store.configYAML(dsn), o.LeaseTTL))
		if err != nil {
			return fmt.Errorf("bench chaos: config: %w", err)
		}
		if cfg.Store.Driver != o.Store {
			return fmt.Errorf("bench chaos: the nodes' config says store.driver %s, not %s: unset %s_STORE_DRIVER and %s_STORE_DSN, which override the config the bench writes",
				cfg.Store.Driver, o.Store, config.EnvPrefix, config.EnvPrefix)
		}
		if i == 0 {
			r.ttl, r.dataDir, watchdog = cfg.LeaseTTL, cfg.DataDir, cfg.WatchdogInterval
		}
		r.nodes = append(r.nodes, &chaosServer{idx: i, bin: bin, cfgPath: filepath.Join(nodeDir, "agenthost.yaml"), logPath: filepath.Join(nodeDir, "serve.log")})
	}
	r.lastPause = make([]chaosPauseMark, o.Nodes)
	if o.LongPause.Lo == 0 {
		o.LongPause = DurRange{(r.ttl * 12 / 10).Round(100 * time.Millisecond), (r.ttl * 16 / 10).Round(100 * time.Millisecond)}
	}
	if o.Partition.Lo == 0 {
		o.Partition = DurRange{(r.ttl * 12 / 10).Round(100 * time.Millisecond), (r.ttl * 16 / 10).Round(100 * time.Millisecond)}
	}
	if o.Faults.Has(FaultPartition) && o.Partition.Lo < r.ttl {
		return fmt.Errorf("bench chaos: --partition %s: a partition must last at least the nodes' lease TTL, %s, for the node cut off to have to give its lease up", &o.Partition, r.ttl)
	}
	longPauses := ""
	if o.LongPauses > 0 {
		longPauses = fmt.Sprintf(", %.0f%% of them %s, past the %s lease", 100*o.LongPauses, &o.LongPause, r.ttl)
	}
	partitions := ""
	if o.Faults.Has(FaultPartition) {
		partitions = fmt.Sprintf(", partitions from PostgreSQL %s", &o.Partition)
	}
	r.progressf("chaos: seed %d (replay with --seed %d), %s of faults (%s) every %s (pauses %s%s%s), %d clients, %d node(s) on %s, work dir %s",
		o.Seed, o.Seed, o.Duration, &o.Faults, &o.FaultEvery, &o.Pause, longPauses, partitions, o.Concurrency, o.Nodes, r.store.where(filepath.Join(r.dir, "node0")), r.dir)

	defer func() {
		// On an early return: stop the clients' retries and the children.
		if r.clients != nil {
			r.clients.stopping.Store(true)
			r.clients.giveUp.Store(1)
		}
		for _, n := range r.nodes {
			if p := n.current(); p != nil && !p.Exited() {
				p.Kill()
			}
		}
	}()
	startErrs := make([]error, len(r.nodes))
	var starts sync.WaitGroup
	for i, n := range r.nodes {
		starts.Add(1)
		go func() { defer starts.Done(); _, startErrs[i] = n.start() }()
	}
	starts.Wait()
	for i, err := range startErrs {
		if err != nil {
			return fmt.Errorf("bench chaos: starting node %d: %w", i, err)
		}
	}

	r.began = time.Now()
	r.lastProgress = r.began
	r.res = &Result{Seed: o.Seed, Store: o.Store, Nodes: o.Nodes, Kinds: map[string]map[string]int{}, ByStatus: map[string]int{},
		EffectsSettled: map[string]int{}, Recovery: map[string]int{}}
	res := r.res
	r.clients = newChaosClients(r.nodes, tenants, o.Seed, o.RequestTimeout)
	clients := r.clients
	var workers sync.WaitGroup
	for i := 0; i < o.Concurrency; i++ {
		workers.Add(1)
		go func() { defer workers.Done(); clients.worker(i) }()
	}

	if err := r.faults(); err != nil {
		return err
	}

	// The drain: no new Runs; a submission in flight retries until the
	// drain's deadline; then every acknowledged Run must end.
	drainBegan := time.Now()
	deadline := drainBegan.Add(o.DrainTimeout)
	clients.stopping.Store(true)
	clients.giveUp.Store(deadline.UnixNano())
	workersDone := make(chan struct{})
	go func() { workers.Wait(); close(workersDone) }()
	for waiting := true; waiting; {
		select {
		case <-workersDone:
			waiting = false
		case <-time.After(250 * time.Millisecond): // supervising the nodes meanwhile
			if err := r.supervise(); err != nil {
				return err
			}
		}
	}
	acked, clientViolations := clients.snapshot()
	r.progressf("chaos: faults stopped after %s; waiting for %d acknowledged Runs to end", time.Since(r.began).Round(time.Second), len(acked))
	notEnded, err := chaosDrain(clients, acked, deadline, r.progressf, r.supervise)
	if err != nil {
		return err
	}
	res.DrainS = time.Since(drainBegan).Seconds()
	if len(notEnded) > 0 {
		r.violations = append(r.violations, fmt.Sprintf("%d acknowledged Runs did not end within the drain's %s: %s", len(notEnded), o.DrainTimeout, strings.Join(firstN(notEnded, 10), ", ")))
	}
	if err := r.supervise(); err != nil {
		return err
	}
	watchdogMetric := 0
	for _, n := range r.nodes {
		watchdogMetric += scrapeCounter(clients, n.idx, "agenthost_watchdog_reports_total")
	}

	// A clean stop of every node at once: SIGTERM, exit 0.
	stopErrs := make([]error, len(r.nodes))
	var stops sync.WaitGroup
	for i, n := range r.nodes {
		stops.Add(1)
		go func() {
			defer stops.Done()
			if p := n.current(); p != nil && !p.Exited() {
				_, stopErrs[i] = n.stop(2 * time.Minute)
			}
		}()
	}
	stops.Wait()
	for i, err := range stopErrs {
		if err != nil {
			r.violations = append(r.violations, fmt.Sprintf("the last stop of node %d: %v", i, err))
		}
	}
	r.progressf("chaos: nodes stopped; checking the store")

	res.ElapsedS = time.Since(r.began).Seconds()
	res.Submitted = clients.submitted.get()
	res.Acknowledged = len(acked)
	res.Retries, res.ClientErrors = clients.retries.get(), clients.errors.get()
	res.Approved, res.Denied, res.Answered, res.Cancels = clients.approved.get(), clients.denied.get(), clients.answered.get(), clients.cancels.get()
	res.Streams = StreamStats{Opened: clients.streamsOpened.get(), CrossNode: clients.streamsCrossNode.get(), Events: clients.streamEvents.get(),
		Broken: clients.streamsBroken.get(), Idle: clients.streamsIdle.get(), Stale: clients.streamsStale.get()}
	res.Violations = append(res.Violations, r.violations...)
	res.Violations = append(res.Violations, clientViolations...)
	if store, closeStore, err := r.store.open(r.ctx, r.dataDir); err != nil {
		res.Violations = append(res.Violations, err.Error())
	} else {
		res.Violations = append(res.Violations, chaosCheckStore(r.ctx, store, acked, tenants, clients.streams, res)...)
		closeStore()
	}
	for _, n := range r.nodes {
		for _, v := range chaosReadLog(n.logPath, res) {
			res.Violations = append(res.Violations, fmt.Sprintf("node %d: %s", n.idx, v))
		}
	}
	if watchdogMetric > res.Watchdog {
		res.Watchdog = watchdogMetric
	}
	if res.Watchdog > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("the watchdog reported %d stuck Runs (see \"watchdog: run is stuck\" in the nodes' serve.log under %s)", res.Watchdog, r.dir))
	}
	if o.Store == config.DriverPostgres {
		takeovers, ids := chaosReadTakeovers(r.nodes)
		res.Violations = append(res.Violations, chaosCheckPartitions(r.partitions, takeovers, r.began)...)
		rep := chaosTimeTakeovers(r.deaths, takeovers, ids, len(r.nodes), r.ttl, r.began)
		res.Takeovers = &rep
	}
	if res.Violations == nil {
		res.Violations = []string{}
	}
	if res.UnusualEnds == nil {
		res.UnusualEnds = []string{}
	}

	r.params = Params{Seed: o.Seed, DurationS: o.Duration.Seconds(), Concurrency: o.Concurrency,
		FaultEvery: o.FaultEvery.String(), Faults: o.Faults.String(), Pause: o.Pause.String(), ResumeBoundS: o.ResumeBound.Seconds(),
		TermBoundS: o.TermBound.Seconds(), DrainTimeoutS: o.DrainTimeout.Seconds(), RequestTimeout: o.RequestTimeout.Seconds(),
		Store: o.Store, Nodes: o.Nodes, LeaseTTLS: r.ttl.Seconds(), LongPauses: o.LongPauses, WatchdogInterval: watchdog.String()}
	if o.DSN != "" {
		r.params.DSN = pgstore.RedactDSN(o.DSN)
	}
	if o.LongPauses > 0 {
		r.params.LongPause = o.LongPause.String()
	}
	if o.Faults.Has(FaultPgRestart) {
		r.params.PgRecoverBoundS = o.PgRecoverBound.Seconds()
	}
	if o.Faults.Has(FaultPartition) {
		r.params.Partition = o.Partition.String()
	}
	r.checked = true
	if n := len(res.Violations); n > 0 {
		r.keep = true
		kept := ""
		if o.DSN != "" {
			kept = fmt.Sprintf("; the Runs stay in schema %s of the --dsn database (DROP SCHEMA %s CASCADE when done)", r.store.schema, r.store.schema)
		}
		return fmt.Errorf("bench chaos: seed %d: %d violations (work dir kept: %s%s):\n  %s", o.Seed, n, r.dir, kept, strings.Join(firstN(res.Violations, 20), "\n  "))
	}
	if o.DSN != "" {
		if err := r.store.dropSchema(context.WithoutCancel(r.ctx)); err != nil {
			r.progressf("chaos: dropping schema %s of the --dsn database: %v (drop it with DROP SCHEMA %s CASCADE)", r.store.schema, err, r.store.schema)
		}
	}
	return nil
}

// faults does the faults until --duration has passed, and at least one
// of each kind.
func (r *chaosRun) faults() error {
	o := r.o
	rng := rand.New(rand.NewPCG(o.Seed, 0))
	// The first faults are each kind once, in a seeded order, so that even
	// a short run has every kind (the run goes on until they are done);
	// then the kinds are random.
	first := append(FaultKinds(nil), o.Faults...)
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	end := r.began.Add(o.Duration)
	for n := 1; ; n++ {
		next := o.FaultEvery.draw(rng)
		if n > len(first) && time.Now().Add(next).After(end) {
			return r.wait(time.Until(end)) // the rest of the chaos phase, with no fault
		}
		if err := r.wait(next); err != nil {
			return err
		}
		kind := o.Faults[rng.IntN(len(o.Faults))]
		if n <= len(first) {
			kind = first[n-1]
		}
		node := r.nodes[0]
		if len(r.nodes) > 1 {
			node = r.nodes[rng.IntN(len(r.nodes))]
		}
		if err := r.supervise(); err != nil { // every node runs when a fault falls
			return err
		}
		var err error
		switch kind {
		case FaultKill:
			err = r.kill(node)
		case FaultTerm:
			err = r.term(node)
		case FaultPause:
			err = r.pause(node, rng)
		case FaultPgRestart:
			err = r.pgRestart()
		case FaultPartition:
			err = r.partition(node, o.Partition.draw(rng))
		}
		if err != nil {
			return err
		}
	}
}

// wait lets d pass (the fault's input: when the next one falls) while
// supervising the nodes, and prints the progress every 5 s.
func (r *chaosRun) wait(d time.Duration) error {
	until := time.Now().Add(d)
	for time.Now().Before(until) {
		time.Sleep(min(time.Until(until), 250*time.Millisecond))
		if r.ctx.Err() != nil {
			return errChaosInterrupted
		}
		if err := r.supervise(); err != nil {
			return err
		}
		if time.Since(r.lastProgress) < 5*time.Second {
			continue
		}
		r.lastProgress = time.Now()
		acked, _ := r.clients.snapshot()
		pg := ""
		if r.o.Store == config.DriverPostgres {
			pg = fmt.Sprintf(", PostgreSQL restarts %d, partitions %d, lease-lost exits %d", r.res.PgRestarts, r.res.Partitions, r.res.LeaseLostExits)
		}
		r.progressf("chaos: %s runs submitted %d, acknowledged %d; kills %d, pauses %d, graceful restarts %d%s",
			time.Since(r.began).Round(time.Second), r.clients.submitted.get(), len(acked), r.res.Kills, r.res.Pauses, r.res.Restarts, pg)
	}
	return nil
}

// supervise starts again, as a supervisor would, every node that exited
// by itself. An exit 1 for a lost node lease is what a node must do when
// it was paused (or starved) past its lease, or could not renew it while
// PostgreSQL restarted (docs/DESIGN.md §5.3): it is counted, and put down
// to the node's last pause or to the last PostgreSQL restart when one
// explains it. Any other exit is a violation.
func (r *chaosRun) supervise() error {
	var exited []*chaosServer
	for _, n := range r.nodes {
		p := n.current()
		if p == nil || !p.Exited() {
			continue
		}
		exited = append(exited, n)
		owner, _ := n.incarnation()
		lost, why := n.exitedForLostLease(p)
		now := time.Now()
		d := Death{Node: n.idx, Kind: "exit", Owner: owner, at: now}
		switch mark := r.lastPause[n.idx]; {
		case !lost:
			r.violations = append(r.violations, fmt.Sprintf("node %d exited by itself at %s: %s", n.idx, r.since(now), why))
			r.progressf("chaos: %s node %d: VIOLATION: it exited by itself: %s", r.since(now), n.idx, why)
		case owner != "" && mark.owner == owner:
			d.Kind, d.at, d.PauseS = FaultPause, mark.at, mark.d.Seconds()
			r.res.LeaseLostExits++
			r.res.PausesPastLease++
			r.progressf("chaos: %s node %d exited 1: its lease expired while it was paused for %s; starting it again", r.since(now), n.idx, mark.d.Round(time.Millisecond))
		case !r.lastPgRestart.IsZero() && now.Sub(r.lastPgRestart) < r.ttl+r.o.PgRecoverBound:
			d.Kind, d.at = FaultPgRestart, r.lastPgRestart
			r.res.LeaseLostExits++
			r.progressf("chaos: %s node %d exited 1: it could not renew its lease while PostgreSQL restarted; starting it again", r.since(now), n.idx)
		default:
			d.Kind = chaosLeaseLost
			r.res.LeaseLostExits++
			r.progressf("chaos: %s node %d exited 1: its lease expired (no fault explains it: starved of CPU?); starting it again", r.since(now), n.idx)
		}
		d.AtS = d.at.Sub(r.began).Seconds()
		r.deaths = append(r.deaths, d)
	}
	if len(exited) == 0 {
		return nil
	}
	// Started again all at once, as each one's supervisor would.
	ready := make([]time.Duration, len(exited))
	errs := make([]error, len(exited))
	var starts sync.WaitGroup
	for i, n := range exited {
		starts.Add(1)
		go func() { defer starts.Done(); ready[i], errs[i] = n.start() }()
	}
	starts.Wait()
	for i, n := range exited {
		if errs[i] != nil {
			r.keep = true
			return fmt.Errorf("bench chaos: seed %d: node %d did not come back after it exited: %w (work dir kept: %s)", r.o.Seed, n.idx, errs[i], r.dir)
		}
		r.res.MaxReadyMS = max(r.res.MaxReadyMS, msf(ready[i]))
	}
	return nil
}

// allRunning tells whether every node runs (it may not be ready yet).
func (r *chaosRun) allRunning() bool {
	for _, n := range r.nodes {
		if n.addr() == "" {
			return false
		}
	}
	return true
}

func (r *chaosRun) died(n *chaosServer, kind, owner string, at time.Time, pause time.Duration) {
	r.deaths = append(r.deaths, Death{Node: n.idx, Kind: kind, Owner: owner, at: at, AtS: at.Sub(r.began).Seconds(), PauseS: pause.Seconds()})
}

func (r *chaosRun) kill(n *chaosServer) error {
	owner, _ := n.incarnation()
	at := time.Now()
	ready, err := n.kill()
	if err != nil {
		r.keep = true
		return fmt.Errorf("bench chaos: seed %d: node %d did not come back after SIGKILL %d: %w (work dir kept: %s)", r.o.Seed, n.idx, r.res.Kills+1, err, r.dir)
	}
	r.res.Kills++
	r.res.MaxReadyMS = max(r.res.MaxReadyMS, msf(ready))
	r.died(n, FaultKill, owner, at, 0)
	r.progressf("chaos: %s kill %d: node %d SIGKILLed, restarted on the same store, ready in %s", r.since(at), r.res.Kills, n.idx, ready.Round(time.Millisecond))
	return nil
}

func (r *chaosRun) term(n *chaosServer) error {
	owner, _ := n.incarnation()
	at := time.Now()
	exited, stopErr := n.stop(r.o.TermBound)
	if stopErr != nil {
		r.violations = append(r.violations, fmt.Sprintf("graceful restart %d (node %d): %v", r.res.Restarts+1, n.idx, stopErr))
		r.progressf("chaos: %s graceful restart %d: node %d: VIOLATION: %v", r.since(at), r.res.Restarts+1, n.idx, stopErr)
	}
	ready, err := n.start()
	if err != nil {
		r.keep = true
		return fmt.Errorf("bench chaos: seed %d: node %d did not come back after SIGTERM %d: %w (work dir kept: %s)", r.o.Seed, n.idx, r.res.Restarts+1, err, r.dir)
	}
	r.res.Restarts++
	r.res.MaxExitMS = max(r.res.MaxExitMS, msf(exited))
	r.res.MaxReadyMS = max(r.res.MaxReadyMS, msf(ready))
	r.died(n, FaultTerm, owner, at, 0)
	r.progressf("chaos: %s graceful restart %d: node %d SIGTERMed, exited in %s, restarted on the same store, ready in %s", r.since(at), r.res.Restarts, n.idx, exited.Round(time.Millisecond), ready.Round(time.Millisecond))
	return nil
}

// pause SIGSTOPs a node: for --pause, or, for a share of the pauses (and
// the first, with several nodes), for --long-pause, past its lease.
func (r *chaosRun) pause(n *chaosServer, rng *rand.Rand) error {
	o := r.o
	long := false
	if o.LongPauses > 0 {
		long = rng.Float64() < o.LongPauses || (r.res.Pauses == 0 && len(r.nodes) > 1)
	}
	span := o.Pause
	if long {
		span = o.LongPause
	}
	d := span.draw(rng)
	pastLease := d >= r.ttl
	owner, _ := n.incarnation()
	at := time.Now()
	r.lastPause[n.idx] = chaosPauseMark{owner: owner, at: at, d: d}
	errorsBefore := r.clients.errors.get()
	bound := o.ResumeBound
	if pastLease {
		// It stops as for a SIGTERM, within the same bound.
		bound = max(bound, o.TermBound)
	}
	out, err := n.pause(d, bound, pastLease)
	cutOff := r.clients.errors.get() - errorsBefore
	r.res.PauseErrors += cutOff
	r.res.Pauses++
	if err != nil {
		r.violations = append(r.violations, fmt.Sprintf("pause %d (node %d, %s): %v", r.res.Pauses, n.idx, d.Round(time.Millisecond), err))
		r.progressf("chaos: %s pause %d: node %d: VIOLATION: %v", r.since(at), r.res.Pauses, n.idx, err)
		if p := n.current(); p.Exited() {
			r.died(n, "exit", owner, time.Now(), 0)
			if _, err := n.start(); err != nil {
				r.keep = true
				return fmt.Errorf("bench chaos: seed %d: node %d did not come back after pause %d: %w (work dir kept: %s)", o.Seed, n.idx, r.res.Pauses, err, r.dir)
			}
		}
		return nil
	}
	if out.leaseLost {
		r.res.PausesPastLease++
		r.res.LeaseLostExits++
		r.died(n, FaultPause, owner, at, d)
		ready, err := n.start()
		if err != nil {
			r.keep = true
			return fmt.Errorf("bench chaos: seed %d: node %d did not come back after pause %d: %w (work dir kept: %s)", o.Seed, n.idx, r.res.Pauses, err, r.dir)
		}
		r.res.MaxReadyMS = max(r.res.MaxReadyMS, msf(ready))
		r.progressf("chaos: %s pause %d: node %d SIGSTOPped for %s (%d requests cut off; lease %s), exited 1 for its lost lease %s after SIGCONT, started again, ready in %s",
			r.since(at), r.res.Pauses, n.idx, d.Round(time.Millisecond), cutOff, r.ttl, out.exitedIn.Round(time.Millisecond), ready.Round(time.Millisecond))
		return nil
	}
	r.res.MaxResumMS = max(r.res.MaxResumMS, msf(out.answered))
	r.progressf("chaos: %s pause %d: node %d SIGSTOPped for %s (%d requests cut off), ready %s after SIGCONT", r.since(at), r.res.Pauses, n.idx, d.Round(time.Millisecond), cutOff, out.answered.Round(time.Millisecond))
	return nil
}

// chaosQuiet is how long the clients' requests must go without a failure
// for the service to count as recovered from a PostgreSQL restart.
const chaosQuiet = 2 * time.Second

// pgRestart crashes and restarts PostgreSQL under the load, then waits
// until the clients' requests succeed again (for chaosQuiet, the nodes
// supervised meanwhile), which must happen within --pg-recover-bound.
func (r *chaosRun) pgRestart() error {
	o := r.o
	t0 := time.Now()
	r.lastPgRestart = t0
	lostBefore := r.res.LeaseLostExits
	if err := r.store.restart(r.ctx); err != nil {
		r.keep = true
		return fmt.Errorf("bench chaos: seed %d: PostgreSQL did not come back after restart %d: %w (work dir kept: %s)", o.Seed, r.res.PgRestarts+1, err, r.dir)
	}
	took := time.Since(t0)
	restarted := time.Now()
	r.res.PgRestarts++
	rec := PgRestart{AtS: t0.Sub(r.began).Seconds(), RestartMS: msf(took)}
	deadline := t0.Add(o.PgRecoverBound)
	for {
		if err := r.supervise(); err != nil {
			return err
		}
		failed, lastFail := r.clients.failuresSince(t0)
		lastOK := time.Unix(0, r.clients.lastOK.Load())
		now := time.Now()
		if (lastFail.IsZero() || now.Sub(lastFail) >= chaosQuiet) && lastOK.After(lastFail) && lastOK.After(restarted) && r.allRunning() {
			rec.Failed = failed
			if !lastFail.IsZero() {
				rec.ErrorWindowS = lastFail.Sub(t0).Seconds()
			}
			break
		}
		if now.After(deadline) {
			rec.Failed, rec.ErrorWindowS = failed, now.Sub(t0).Seconds()
			r.violations = append(r.violations, fmt.Sprintf("PostgreSQL restart %d: the clients' requests still failed %s after it began (%d failed)", r.res.PgRestarts, o.PgRecoverBound, failed))
			r.progressf("chaos: %s PostgreSQL restart %d: VIOLATION: the clients' requests still fail", r.since(t0), r.res.PgRestarts)
			break
		}
		if r.ctx.Err() != nil {
			return errChaosInterrupted
		}
		time.Sleep(100 * time.Millisecond) // the look's cadence, bounded by deadline
	}
	rec.LeaseLost = r.res.LeaseLostExits - lostBefore
	r.res.PgRestartFigures = append(r.res.PgRestartFigures, rec)
	r.progressf("chaos: %s PostgreSQL restart %d: pg_ctl restart -m immediate took %s; the clients' requests failed for %.2f s (%d failed); %d lease-lost exits",
		r.since(t0), r.res.PgRestarts, took.Round(time.Millisecond), rec.ErrorWindowS, rec.Failed, rec.LeaseLost)
	return nil
}

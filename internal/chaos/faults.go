package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/internal/serveproc"
)

// DurRange is a range of durations, and a flag (a pflag.Value) that
// holds one, "3s-10s" (or one duration, "5s"); draw picks one
// uniformly. The zero DurRange stands for an option's default.
type DurRange struct{ Lo, Hi time.Duration }

func (r *DurRange) String() string {
	if r.Lo == r.Hi {
		return r.Lo.String()
	}
	return r.Lo.String() + "-" + r.Hi.String()
}

func (r *DurRange) Set(s string) error {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err := time.ParseDuration(strings.TrimSpace(lo))
	if err != nil {
		return fmt.Errorf("want a range of durations such as 3s-10s: %w", err)
	}
	b, err := time.ParseDuration(strings.TrimSpace(hi))
	if err != nil {
		return fmt.Errorf("want a range of durations such as 3s-10s: %w", err)
	}
	if a <= 0 || b < a {
		return fmt.Errorf("want a range of positive durations, low first, such as 3s-10s; got %q", s)
	}
	r.Lo, r.Hi = a, b
	return nil
}

func (r *DurRange) Type() string { return "range" }

func (r DurRange) draw(rng *rand.Rand) time.Duration {
	if r.Hi == r.Lo {
		return r.Lo
	}
	return r.Lo + time.Duration(rng.Int64N(int64(r.Hi-r.Lo)+1))
}

// The kinds of fault: SIGKILL and restart, SIGSTOP then SIGCONT, a
// graceful restart (SIGTERM, a clean exit, then start again), with
// PostgreSQL a partition of a node from the database (partition.go),
// and, when the store is the run's own PostgreSQL server, a crash and
// restart of that server (pg_ctl restart -m immediate).
const (
	FaultKill      = "kill"
	FaultPause     = "pause"
	FaultTerm      = "term"
	FaultPgRestart = "pgrestart"
	FaultPartition = "partition"
)

// FaultKinds are the kinds of fault a chaos run draws from, and a flag
// (a pflag.Value) that holds them, a comma-separated list of kill,
// pause, term, pgrestart and partition.
type FaultKinds []string

func (f *FaultKinds) String() string { return strings.Join(*f, ",") }

func (f *FaultKinds) Set(s string) error {
	var kinds []string
	seen := map[string]bool{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		switch k {
		case FaultKill, FaultPause, FaultTerm, FaultPgRestart, FaultPartition:
		default:
			return fmt.Errorf("want a comma-separated list of kill, pause, term, pgrestart and partition; got %q", k)
		}
		if !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
	}
	*f = kinds
	return nil
}

func (f *FaultKinds) Type() string { return "kinds" }

func (f FaultKinds) Has(kind string) bool {
	for _, k := range f {
		if k == kind {
			return true
		}
	}
	return false
}

// chaosServer is one `agenthost serve` node the chaos harness kills, pauses
// and restarts (on the same data dir, or the same PostgreSQL database);
// the clients ask it for its current address. It is safe for concurrent
// use.
type chaosServer struct {
	idx                   int // the node's number, 0 … --nodes-1
	bin, cfgPath, logPath string

	// suspectUntil (unix nanos) steers the clients away from a node a
	// request just failed on: a paused one costs each of them a timeout.
	suspectUntil atomic.Int64

	mu     sync.Mutex
	cur    *serveproc.Child
	nodeID string // the runtime's node ID of cur's incarnation
	logAt  int64  // where cur's incarnation begins in logPath
}

// readyBound bounds a (re)start: the child's start, its recovery's first
// pass and /readyz answering 200.
const readyBound = 90 * time.Second

// start starts a fresh child and waits until it is ready; it returns how
// long that took.
func (s *chaosServer) start() (time.Duration, error) {
	began := time.Now()
	var logAt int64
	if fi, err := os.Stat(s.logPath); err == nil {
		logAt = fi.Size()
	}
	p, err := serveproc.Start(s.bin, s.cfgPath, s.logPath, readyBound)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.cur, s.nodeID, s.logAt = p, "", logAt
	s.mu.Unlock()
	if err := p.WaitReady(readyBound); err != nil {
		p.Kill()
		return 0, fmt.Errorf("%w\n%s", err, serveproc.TailFile(s.logPath, 40))
	}
	id := chaosNodeIDIn(s.logPath, logAt)
	s.mu.Lock()
	s.nodeID = id
	s.mu.Unlock()
	s.suspectUntil.Store(0)
	return time.Since(began), nil
}

func (s *chaosServer) current() *serveproc.Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// incarnation is the node ID of the current child's runtime ("" when
// not known) and where its lines begin in the log.
func (s *chaosServer) incarnation() (nodeID string, logAt int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodeID, s.logAt
}

// addr is the current child's address ("" before the first start, and
// once it has exited).
func (s *chaosServer) addr() string {
	if p := s.current(); p != nil && !p.Exited() {
		return p.Addr()
	}
	return ""
}

// metricsAddr is the current child's /metrics address ("" as for addr).
func (s *chaosServer) metricsAddr() string {
	if p := s.current(); p != nil && !p.Exited() {
		return p.MetricsAddr()
	}
	return ""
}

// suspect marks the node as one a request just failed on, for a moment.
func (s *chaosServer) suspect() { s.suspectUntil.Store(time.Now().Add(time.Second).UnixNano()) }

func (s *chaosServer) suspected() bool { return time.Now().UnixNano() < s.suspectUntil.Load() }

// kill SIGKILLs the current child, waits for it to exit, and starts a new
// one on the same store; it returns how long the new one took to be
// ready.
func (s *chaosServer) kill() (time.Duration, error) {
	s.current().Kill()
	return s.start()
}

// stop SIGTERMs the current child and waits up to bound for it to exit,
// and returns how long that took. A child that does not exit within
// bound (it is SIGKILLed then), or exits with a code other than 0, is an
// error: SIGTERM must stop the server cleanly.
func (s *chaosServer) stop(bound time.Duration) (time.Duration, error) {
	p := s.current()
	began := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return 0, fmt.Errorf("SIGTERM: %w", err)
	}
	code, err := p.WaitExit(bound)
	took := time.Since(began)
	if err != nil {
		p.Kill()
		return took, fmt.Errorf("after SIGTERM: %w", err)
	}
	if code != 0 {
		return took, fmt.Errorf("after SIGTERM agenthost serve exited %d, want 0", code)
	}
	return took, nil
}

// pauseOutcome is what a node did after its SIGCONT.
type pauseOutcome struct {
	answered time.Duration // from the SIGCONT to /readyz answering 200
	// leaseLost is set when the node exited 1 because its node lease
	// expired while it was stopped (docs/DESIGN.md §5.3), as it must after
	// a pause past its lease: it is left exited, for the caller to start
	// again.
	leaseLost bool
	exitedIn  time.Duration // from the SIGCONT to that exit
}

// pause SIGSTOPs the current child for d and SIGCONTs it. Then, when the
// pause outlasted the lease (pastLease), the node must exit 1 for its
// lost lease within bound (it stops as for a SIGTERM); otherwise it must answer /readyz within bound
// again, or exit 1 for a lost lease (a pause can outlast what is left of
// the lease since its last renewal).
func (s *chaosServer) pause(d, bound time.Duration, pastLease bool) (pauseOutcome, error) {
	p := s.current()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return pauseOutcome{}, fmt.Errorf("SIGSTOP: %w", err)
	}
	time.Sleep(d) // the fault's input: how long the server is frozen
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return pauseOutcome{}, fmt.Errorf("SIGCONT: %w", err)
	}
	resumed := time.Now()
	if pastLease {
		if _, err := p.WaitExit(bound); err != nil {
			return pauseOutcome{}, fmt.Errorf("paused for %s, past its lease, it still ran %s after SIGCONT: a node whose lease expired must exit 1 (docs/DESIGN.md §5.3)", d.Round(time.Millisecond), bound)
		}
		if lost, why := s.exitedForLostLease(p); !lost {
			return pauseOutcome{}, fmt.Errorf("paused for %s, past its lease: %s", d.Round(time.Millisecond), why)
		}
		return pauseOutcome{leaseLost: true, exitedIn: time.Since(resumed)}, nil
	}
	err := p.WaitReady(bound)
	if err != nil && p.Exited() {
		lost, why := s.exitedForLostLease(p)
		if !lost {
			return pauseOutcome{}, fmt.Errorf("after SIGCONT: %s", why)
		}
		return pauseOutcome{leaseLost: true, exitedIn: time.Since(resumed)}, nil
	}
	if err != nil {
		return pauseOutcome{}, fmt.Errorf("after SIGCONT: %w", err)
	}
	return pauseOutcome{answered: time.Since(resumed)}, nil
}

// chaosLeaseLostLine is what `serve` logs when it stops because its node
// lease expired (cmd/agenthost/serve.go), before it exits 1.
const chaosLeaseLostLine = "node lease expired"

// exitedForLostLease tells whether an exited child exited 1 having logged
// that its node lease expired; if not, why not, for a violation.
func (s *chaosServer) exitedForLostLease(p *serveproc.Child) (bool, string) {
	code := exitCode(p.Err())
	_, logAt := s.incarnation()
	logged := chaosLogHas(s.logPath, logAt, chaosLeaseLostLine)
	switch {
	case code == 1 && logged:
		return true, ""
	case logged:
		return false, fmt.Sprintf("it logged that its node lease expired but exited %d (%v), want 1", code, p.Err())
	}
	return false, fmt.Sprintf("it exited %d (%v) without a lost lease in its log:\n%s", code, p.Err(), serveproc.TailFile(s.logPath, 20))
}

// exitCode is a child's exit code from cmd.Wait's error: 0 for nil, -1
// when a signal killed it.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// chaosLogHas tells whether the log at path holds a line with text from
// byte offset from on.
func chaosLogHas(path string, from int64, text string) bool {
	found := false
	chaosScanLog(path, from, func(line string) bool {
		found = strings.Contains(line, text)
		return !found
	})
	return found
}

// chaosNodeIDIn is the node ID the runtime of the incarnation whose log
// begins at from logged when it started ("" if it has not).
func chaosNodeIDIn(path string, from int64) string {
	id := ""
	chaosScanLog(path, from, func(line string) bool {
		if strings.Contains(line, `msg="runtime started"`) {
			id = logAttr(line, "node")
		}
		return true
	})
	return id
}

// chaosScanLog calls fn on each line of the log at path from byte offset
// from on, until fn returns false.
func chaosScanLog(path string, from int64, fn func(string) bool) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		if !fn(sc.Text()) {
			return
		}
	}
}

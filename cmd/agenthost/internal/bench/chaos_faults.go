package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/cmd/agenthost/internal/serveproc"
)

// durRange is a flag that holds a range of durations, "3s-10s" (or one
// duration, "5s"); draw picks one uniformly.
type durRange struct{ lo, hi time.Duration }

func (r *durRange) String() string {
	if r.lo == r.hi {
		return r.lo.String()
	}
	return r.lo.String() + "-" + r.hi.String()
}

func (r *durRange) Set(s string) error {
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
	r.lo, r.hi = a, b
	return nil
}

func (r *durRange) Type() string { return "range" }

func (r durRange) draw(rng *rand.Rand) time.Duration {
	if r.hi == r.lo {
		return r.lo
	}
	return r.lo + time.Duration(rng.Int64N(int64(r.hi-r.lo)+1))
}

// The kinds of fault: SIGKILL and restart, SIGSTOP then SIGCONT, and a
// graceful restart (SIGTERM, a clean exit, then start again).
const (
	faultKill  = "kill"
	faultPause = "pause"
	faultTerm  = "term"
)

// faultKinds is a flag that holds the kinds of fault a chaos run draws
// from, a comma-separated list of kill, pause and term.
type faultKinds []string

func (f *faultKinds) String() string { return strings.Join(*f, ",") }

func (f *faultKinds) Set(s string) error {
	var kinds []string
	seen := map[string]bool{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		switch k {
		case faultKill, faultPause, faultTerm:
		default:
			return fmt.Errorf("want a comma-separated list of kill, pause and term; got %q", k)
		}
		if !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
	}
	*f = kinds
	return nil
}

func (f *faultKinds) Type() string { return "kinds" }

// chaosServer is the `agenthost serve` child the chaos bench kills,
// pauses and restarts on the same data dir; the clients ask it for the
// current address. It is safe for concurrent use.
type chaosServer struct {
	bin, cfgPath, logPath string

	mu  sync.Mutex
	cur *serveproc.Child
}

// readyBound bounds a (re)start: the child's start, its recovery's first
// pass and /readyz answering 200.
const readyBound = 90 * time.Second

// start starts a fresh child and waits until it is ready; it returns how
// long that took.
func (s *chaosServer) start() (time.Duration, error) {
	began := time.Now()
	p, err := serveproc.Start(s.bin, s.cfgPath, s.logPath, readyBound)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.cur = p
	s.mu.Unlock()
	if err := p.WaitReady(readyBound); err != nil {
		p.Kill()
		return 0, fmt.Errorf("%w\n%s", err, serveproc.TailFile(s.logPath, 40))
	}
	return time.Since(began), nil
}

func (s *chaosServer) current() *serveproc.Child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// addr is the current child's address ("" before the first start).
func (s *chaosServer) addr() string {
	if p := s.current(); p != nil {
		return p.Addr()
	}
	return ""
}

// kill SIGKILLs the current child, waits for it to exit, and starts a new
// one on the same data dir; it returns how long the new one took to be
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

// pause SIGSTOPs the current child for d, SIGCONTs it, and returns how
// long after the SIGCONT /readyz answered 200 again, or an error if it
// did not within bound.
func (s *chaosServer) pause(d, bound time.Duration) (time.Duration, error) {
	p := s.current()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return 0, fmt.Errorf("SIGSTOP: %w", err)
	}
	time.Sleep(d) // the fault's input: how long the server is frozen
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return 0, fmt.Errorf("SIGCONT: %w", err)
	}
	resumed := time.Now()
	if err := p.WaitReady(bound); err != nil {
		return 0, fmt.Errorf("after SIGCONT: %w", err)
	}
	return time.Since(resumed), nil
}

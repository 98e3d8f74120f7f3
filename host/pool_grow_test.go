package host

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// holdingServer answers every request only once the test lets it go, as
// a slow model would: it counts the requests that arrived.
type holdingServer struct {
	url     string
	arrived atomic.Int64
	release chan struct{}
	once    sync.Once
}

// let answers the requests held and every later one.
func (s *holdingServer) let() { s.once.Do(func() { close(s.release) }) }

func newHoldingServer(t *testing.T) *holdingServer {
	s := &holdingServer{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.arrived.Add(1)
		select {
		case <-s.release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "answered")
	}))
	t.Cleanup(func() { s.let(); srv.Close() })
	s.url = srv.URL
	return s
}

// slowHTTPPlugin loads the hostile plugin, whose http tool calls
// agenthost_http, allowed to reach s. The call and HTTP timeouts are
// raised so that a slow machine making many instances cannot time the
// held requests out; the pool limits are the defaults unless mod sets
// them.
func slowHTTPPlugin(t *testing.T, e *env, s *holdingServer, mod func(*Limits)) *Executor {
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	return e.executor(t, conformance.PluginHostile, func(sp *PluginSpec) {
		sp.Sandbox.AllowedHosts = []string{u.Host}
		sp.Sandbox.HTTPTimeout = 5 * time.Minute
		sp.Limits.CallTimeout = 5 * time.Minute
		if mod != nil {
			mod(&sp.Limits)
		}
	})
}

// startHTTPCalls starts n calls of the http tool to s, of tenant acme,
// and returns a channel that receives each call's outcome.
func startHTTPCalls(x *Executor, s *holdingServer, n int) <-chan error {
	done := make(chan error, n)
	for i := range n {
		go func() {
			r, err := x.Start(context.Background(), toolCall("acme", fmt.Sprintf("r.t1.%d", i), 1, "http", map[string]string{"url": s.url}))
			var o abi.ToolOutcome
			if err == nil && (r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil || o.Content != "200 answered") {
				err = fmt.Errorf("reply %+v", r)
			}
			done <- err
		}()
	}
	return done
}

func collect(t *testing.T, done <-chan error, n int) {
	t.Helper()
	for range n {
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(5 * time.Minute):
			t.Fatal("timed out waiting for the calls to finish")
		}
	}
}

// TestPoolGrowsForCallsWaitingOnTheNetwork: with the default limits,
// three times pool_size calls that each wait on the network all reach
// the network at once (none queues behind pool_size, none waits for an
// instance), and all stay idle afterwards for a next wave, until
// burstLinger has passed unused: then pool_size instances stay warm. On
// both call paths, which share the pool.
func TestPoolGrowsForCallsWaitingOnTheNetwork(t *testing.T) {
	for _, path := range []CallPath{CallPathNative, CallPathSDK} {
		t.Run(string(path), func(t *testing.T) {
			const n = 3 * DefaultPoolSize
			s := newHoldingServer(t)
			e := newEnv(t, Config{CallPath: path})
			// The host makes GOMAXPROCS instances at once; under -race on
			// a loaded machine the last of n came more than the 5 s
			// after the first that the plugin's request waits for its
			// answer. Growth is what is tested here, not the turns
			// (TestACallWaitingForATurnToMakeAnInstanceTakesOneReleased):
			// all n are made at once.
			e.h.makers = make(chan struct{}, n)
			x := slowHTTPPlugin(t, e, s, nil)
			done := startHTTPCalls(x, s, n)
			waitFor(t, fmt.Sprintf("all %d calls to reach the server", n), 5*time.Minute, func() bool {
				if st := x.Plugin().Stats("acme"); st.Waiting != 0 {
					t.Fatalf("a call is waiting for an instance while %d are held on the network: %+v", s.arrived.Load(), st)
				}
				return s.arrived.Load() == n
			})
			if st := x.Plugin().Stats("acme"); st.InUse != n || st.Waiting != 0 || st.Waited != 0 {
				t.Fatalf("with %d calls held on the network: %+v; want all %d in use and none waiting", n, st, n)
			}
			s.let()
			collect(t, done, n)
			if st := x.Plugin().Stats("acme"); st.Created != n || st.Idle != n || st.InUse != 0 {
				t.Fatalf("after the calls: %+v; want all %d kept idle for a next wave", st, n)
			}
			waitFor(t, "the idle sweep to be armed", time.Minute, func() bool { return e.clock.Pending() == 1 })
			e.clock.Advance(burstLinger)
			waitFor(t, "the idle beyond pool_size to be closed", time.Minute, func() bool {
				st := x.Plugin().Stats("acme")
				return st.Idle == DefaultPoolSize && st.Trimmed == n-DefaultPoolSize && e.clock.Running() == 0
			})
			if st := x.Plugin().Stats("acme"); st.Created != n || st.InUse != 0 {
				t.Fatalf("burstLinger after the calls: %+v; want %d created, pool_size %d kept idle and the other %d closed",
					st, n, DefaultPoolSize, n-DefaultPoolSize)
			}
			if w := x.Plugin().InstanceWaits(); w.Waits != 0 {
				t.Fatalf("instance waits %+v; want none", w)
			}
		})
	}
}

// TestPoolMaxInstancesBoundsCalls: beyond max_instances a call waits for
// an instance, and the wait is counted.
func TestPoolMaxInstancesBoundsCalls(t *testing.T) {
	s := newHoldingServer(t)
	e := newEnv(t, Config{})
	x := slowHTTPPlugin(t, e, s, func(l *Limits) { l.PoolSize, l.MaxInstances = 1, 3 })
	done := startHTTPCalls(x, s, 4)
	waitFor(t, "three calls at the server and the fourth waiting for an instance", 5*time.Minute, func() bool {
		st := x.Plugin().Stats("acme")
		return s.arrived.Load() == 3 && st.InUse == 3 && st.Waiting == 1
	})
	if got := s.arrived.Load(); got != 3 {
		t.Fatalf("%d calls reached the server; max_instances is 3", got)
	}
	s.let()
	collect(t, done, 4)
	st := x.Plugin().Stats("acme")
	if st.Created != 3 || st.Waited != 1 || st.Idle != 3 {
		t.Fatalf("after the calls: %+v; want 3 created, 1 call that waited, all 3 idle (burstLinger has not passed)", st)
	}
	if w := x.Plugin().InstanceWaits(); w.Waits != 1 || w.Waited <= 0 {
		t.Fatalf("instance waits %+v; want one, of some time", w)
	}
}

// TestMaxInstancesUnderPoolSizeRefused: the limits are checked at load.
func TestMaxInstancesUnderPoolSizeRefused(t *testing.T) {
	e := newEnv(t, Config{})
	_, err := e.h.Load(context.Background(), PluginSpec{
		Name: conformance.PluginExecutor, Path: pluginPath(t, conformance.PluginExecutor), Role: abi.RoleExecutor,
		Limits: Limits{PoolSize: 8, MaxInstances: 2},
	})
	if err == nil || !strings.Contains(err.Error(), "max_instances 2 is under pool_size 8") {
		t.Fatalf("load with max_instances under pool_size: %v", err)
	}
	for _, c := range []struct{ in, want Limits }{
		{Limits{}, Limits{PoolSize: DefaultPoolSize, MaxInstances: DefaultMaxInstances}},
		{Limits{PoolSize: 100}, Limits{PoolSize: 100, MaxInstances: 100}},
		{Limits{MaxInstances: 2}, Limits{PoolSize: 2, MaxInstances: 2}},
		{Limits{PoolSize: 1}, Limits{PoolSize: 1, MaxInstances: DefaultMaxInstances}},
	} {
		got := c.in.withDefaults()
		if got.PoolSize != c.want.PoolSize || got.MaxInstances != c.want.MaxInstances {
			t.Errorf("%+v with defaults: pool_size %d, max_instances %d; want %d, %d", c.in, got.PoolSize, got.MaxInstances, c.want.PoolSize, c.want.MaxInstances)
		}
	}
}

// TestAWaitForAnInstanceIsReportedToTheCaller: with max_instances 1 and
// a call held on the network, a second call waits for the instance and
// says so through its context (runtime.CapacityWaitBegan), naming the
// plugin, and says the wait ended once it has the instance; the first
// call, which never waited, says nothing.
func TestAWaitForAnInstanceIsReportedToTheCaller(t *testing.T) {
	s := newHoldingServer(t)
	e := newEnv(t, Config{})
	x := slowHTTPPlugin(t, e, s, func(l *Limits) { l.PoolSize, l.MaxInstances = 1, 1 })
	type report struct {
		call, plugin string
		ended        bool
	}
	reports := make(chan report, 4)
	ctxOf := func(call string) context.Context {
		return runtime.WithCapacityWaitReport(context.Background(), func(plugin string) func() {
			reports <- report{call: call, plugin: plugin}
			return func() { reports <- report{call: call, plugin: plugin, ended: true} }
		})
	}
	done := make(chan error, 2)
	for _, call := range []string{"first", "second"} {
		if call == "second" {
			waitFor(t, "the first call at the server", time.Minute, func() bool { return s.arrived.Load() == 1 })
		}
		go func() {
			r, err := x.Start(ctxOf(call), toolCall("acme", "r.t1."+call, 1, "http", map[string]string{"url": s.url}))
			if err == nil && r.State != abi.StateDone {
				err = fmt.Errorf("%s: reply %+v", call, r)
			}
			done <- err
		}()
	}
	select {
	case r := <-reports:
		if r != (report{call: "second", plugin: x.Plugin().Name()}) {
			t.Fatalf("first report %+v; want the second call's wait for %q", r, x.Plugin().Name())
		}
	case <-time.After(time.Minute):
		t.Fatal("the second call never said it waits for an instance")
	}
	select {
	case r := <-reports:
		t.Fatalf("%+v reported while the first call still holds the only instance", r)
	default:
	}
	s.let()
	collect(t, done, 2)
	select {
	case r := <-reports:
		if r != (report{call: "second", plugin: x.Plugin().Name(), ended: true}) {
			t.Fatalf("report %+v; want the end of the second call's wait", r)
		}
	default:
		t.Fatal("the second call's wait never ended")
	}
	if len(reports) != 0 {
		t.Fatalf("%d more reports", len(reports))
	}
}

// TestACallWaitingForATurnToMakeAnInstanceTakesOneReleased: at most
// GOMAXPROCS instances are made at once over the host, and a call that
// waits for its turn to make one takes an instance another call releases
// meanwhile rather than making its own. (Each of a restart's 20 attaches,
// and then each of the Runs' builder and model calls, made its own
// instance at once: 57 instances, made 20 at a time, for 20 Runs whose
// calls take milliseconds.) On both call paths.
func TestACallWaitingForATurnToMakeAnInstanceTakesOneReleased(t *testing.T) {
	for _, path := range []CallPath{CallPathNative, CallPathSDK} {
		t.Run(string(path), func(t *testing.T) {
			s := newHoldingServer(t)
			e := newEnv(t, Config{CallPath: path})
			x := slowHTTPPlugin(t, e, s, nil)
			waiting := make(chan struct{}, 1)
			e.h.onMakerWait = func() {
				select {
				case waiting <- struct{}{}:
				default:
				}
			}
			first := startHTTPCalls(x, s, 1)
			waitFor(t, "the first call at the server", 5*time.Minute, func() bool { return s.arrived.Load() == 1 })
			// Every turn taken (as by calls making instances of other
			// plugins), the second call finds nothing idle and waits.
			for range cap(e.h.makers) {
				e.h.makers <- struct{}{}
			}
			second := startHTTPCalls(x, s, 1)
			select {
			case <-waiting:
			case <-time.After(5 * time.Minute):
				t.Fatal("the second call did not wait for a turn to make an instance")
			}
			s.let()
			collect(t, first, 1)
			collect(t, second, 1)
			for range cap(e.h.makers) {
				<-e.h.makers
			}
			if st := x.Plugin().Stats("acme"); st.Created != 1 || st.Waited != 0 || st.Idle != 1 {
				t.Fatalf("after the calls: %+v; want the one instance made by the first call, taken by the second, now idle", st)
			}
		})
	}
}

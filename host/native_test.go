package host

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// A caller that gives up stops a spinning call on either path: the call
// returns the caller's error, not plugin_timeout (the plugin did not run
// past its own timeout), and the instance is discarded.
func TestCallerCancelStopsASpinningCall(t *testing.T) {
	for _, path := range []CallPath{CallPathNative, CallPathSDK} {
		t.Run(string(path), func(t *testing.T) {
			e := newEnv(t, Config{CallPath: path})
			p := e.load(t, conformance.PluginHostile, abi.RoleExecutor, func(s *PluginSpec) { s.Limits.CallTimeout = time.Hour })
			x, err := p.Executor()
			if err != nil {
				t.Fatal(err)
			}
			// Warm the instance, so that the cancel lands in the spin and
			// not in a new instance's initialisation (which
			// TestCallerGivingUpDuringGuestInitialisationIsNotThePluginsFault
			// covers).
			doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t0.0", 1, "ok", nil)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := x.Start(ctx, toolCall("acme", "r.t1.0", 1, "loop", nil))
				done <- err
			}()
			waitFor(t, "the call to be in flight", time.Minute, func() bool { return p.Stats("acme").InUse == 1 })
			cancel()
			var got error
			select {
			case got = <-done:
			case <-testDeadline(t):
				t.Fatal("the spinning call did not stop when its caller gave up")
			}
			var pe *runtime.PluginError
			if errors.As(got, &pe) {
				t.Fatalf("a caller that gave up is not the plugin's fault, got %s: %v", pe.Class, got)
			}
			if !errors.Is(got, context.Canceled) || !strings.Contains(got.Error(), "the caller gave up") {
				t.Fatalf("want the caller's context.Canceled, got %v", got)
			}
			waitFor(t, "the instance to be discarded", time.Minute, func() bool { return p.Stats("acme").Failed == 1 })
			// The pool serves again with a fresh instance.
			doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t2.0", 1, "ok", nil)))
		})
	}
}

// On the native path a plugin's logs reach the host's log when it logs at
// debug, with the plugin's name, and get_log_level says so.
func TestNativePluginLogsReachTheHostLog(t *testing.T) {
	var buf conformance.LogBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, Config{Logger: log})
	if got := e.h.pluginLogLevel(); got != extismLogDebug {
		t.Fatalf("get_log_level with a debug log: %d, want %d", got, extismLogDebug)
	}
	quiet := newEnv(t, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if got := quiet.h.pluginLogLevel(); got != extismLogOff {
		t.Fatalf("get_log_level with an info log: %d, want off (%d)", got, extismLogOff)
	}
	g := &nativeGuest{log: log, plugin: "probe", k: testKernel(t)}
	off := g.k.alloc(5)
	g.k.write(uint32(off), []byte("hello"))
	g.logMessage(2, off, e.h.pluginLogLevel())
	if !strings.Contains(buf.String(), "plugin=probe") || !strings.Contains(buf.String(), "message=hello") {
		t.Fatalf("the host's log has no plugin log line:\n%s", buf.String())
	}
	if n := g.k.length(off); n != 0 {
		t.Fatalf("the message's block was not freed: length %d", n)
	}
}

// testKernel is a kernel on an uncapped memory.
func testKernel(t testing.TB) *kernel {
	t.Helper()
	var mem []byte
	k, ok := newKernel(func(n uint64) []byte {
		if n <= uint64(len(mem)) {
			return mem[:n]
		}
		mem = append(mem, make([]byte, int(n)-len(mem))...)
		return mem
	}, nil)
	if !ok {
		t.Fatal("no kernel memory")
	}
	return k
}

// testDeadline closes a little before the test binary's own deadline (or
// after 2 minutes without one), so that a wait reports what it waited for.
func testDeadline(t *testing.T) <-chan time.Time {
	d, ok := t.Deadline()
	if !ok {
		d = time.Now().Add(2 * time.Minute)
	}
	return time.After(time.Until(d) - 5*time.Second)
}

package host

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// httpFixture is a real HTTP server on 127.0.0.1, reached under two names:
// "127.0.0.1" (allowed, literally with its port) and "localhost" (not
// allowed).
type httpFixture struct {
	srv     *httptest.Server
	port    string
	secrets atomic.Int32 // hits on /secret, which no plugin may reach
}

func newHTTPFixture(t *testing.T) *httpFixture {
	f := &httpFixture{}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from localhost") })
	mux.HandleFunc("/secret", func(w http.ResponseWriter, r *http.Request) {
		f.secrets.Add(1)
		fmt.Fprint(w, "the secret")
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://localhost:"+f.port+"/secret", http.StatusFound)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 2<<20)) })
	mux.HandleFunc("/redirect-to", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc("/big-headers", func(w http.ResponseWriter, r *http.Request) {
		for i := range 100 { // 100 KiB of headers
			w.Header().Set(fmt.Sprintf("X-Filler-%d", i), strings.Repeat("h", 1<<10))
		}
		fmt.Fprint(w, "small body")
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	_, f.port, _ = net.SplitHostPort(f.srv.Listener.Addr().String())
	return f
}

func (f *httpFixture) url(host, path string) string { return "http://" + host + ":" + f.port + path }

// TestHostileContained runs every misbehaviour of the hostile plugin and
// checks that it is classified, that the faulty instance is discarded,
// and that the host keeps serving: the hostile plugin's "ok" tool and the
// well-behaved executor both work after each case.
func TestHostileContained(t *testing.T) {
	web := newHTTPFixture(t)
	e := newEnv(t, Config{})
	hostile := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Limits.CallTimeout = 5 * time.Second
		s.Limits.MemoryPages = 512 // 32 MiB
		s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port}
		s.Sandbox.MaxHTTPResponseBytes = 1 << 20
	})
	good := e.executor(t, conformance.PluginExecutor, nil)
	ctx := context.Background()

	cases := []struct {
		tool    string
		args    map[string]string
		class   abi.ErrorClass
		discard bool     // the instance must be thrown away
		want    []string // fragments of the error
	}{
		{"loop", nil, abi.ClassPluginTimeout, true, []string{"timeout of 5s"}},
		{"oom", nil, abi.ClassPluginOOM, true, []string{"out of memory", "512 pages"}},
		{"trap", nil, abi.ClassPluginTrap, true, []string{"nil map"}},
		{"huge_output", nil, abi.ClassPluginOutputTooBig, true, []string{"max_output_bytes of 1048576"}},
		{"not_json", nil, abi.ClassPluginProtocol, false, []string{"not valid JSON"}},
		{"bad_schema", nil, abi.ClassPluginProtocol, false, []string{`"exploded"`}},
		{"nonzero", nil, abi.ClassPluginProtocol, false, []string{"status 1", "refusing on purpose"}},
		{"file_read", nil, abi.ClassPluginDenied, false, []string{`open "/etc/passwd" refused`}},
		{"file_read", map[string]string{"path": "/proc/self/environ"}, abi.ClassPluginDenied, false, []string{"refused"}},
		{"http", map[string]string{"url": web.url("localhost", "/secret")}, abi.ClassPluginDenied, false, []string{`"localhost" is not in the plugin's allowed hosts`}},
		{"http", map[string]string{"url": web.url("127.0.0.1", "/redirect")}, abi.ClassPluginDenied, false, []string{`"localhost" is not in the plugin's allowed hosts`}},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%s/%d", c.tool, i), func(t *testing.T) {
			before := hostile.Plugin().Stats("acme")
			started := time.Now()
			r, err := hostile.Start(ctx, toolCall("acme", fmt.Sprintf("r.t1.%d", i), 1, c.tool, c.args))
			if err == nil {
				t.Fatalf("reply %+v; want a %s error", r, c.class)
			}
			if got := classOf(t, err); got != c.class {
				t.Fatalf("class %s, want %s: %v", got, c.class, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if c.tool == "loop" && time.Since(started) > 30*time.Second {
				t.Errorf("the endless loop took %s to stop", time.Since(started))
			}
			after := hostile.Plugin().Stats("acme")
			if discarded := after.Failed - before.Failed; (discarded == 1) != c.discard {
				t.Errorf("instances discarded: %d, want discard=%v (%+v)", discarded, c.discard, after)
			}
			// The host goes on serving.
			if got := doneIn(t)(hostile.Start(ctx, toolCall("acme", "r.ok", 1, "ok", nil))); got != "ok" {
				t.Fatalf("hostile ok after %s: %q", c.tool, got)
			}
			if got := doneIn(t)(good.Start(ctx, toolCall("acme", "r.good", 1, "echo", map[string]string{"text": "alive"}))); got != "alive" {
				t.Fatalf("good executor after %s: %q", c.tool, got)
			}
		})
	}
	if n := web.secrets.Load(); n != 0 {
		t.Fatalf("the non-allowed host was reached %d times", n)
	}
	if peak := int64(512) * 65536; e.h.MemoryInUse() > 4*peak {
		t.Errorf("memory in use %d after the cases", e.h.MemoryInUse())
	}
}

func TestHTTPAllowedAndLimited(t *testing.T) {
	web := newHTTPFixture(t)
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port}
		s.Sandbox.MaxHTTPResponseBytes = 1 << 20
	})
	ctx := context.Background()
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.0", 1, "http", map[string]string{"url": web.url("127.0.0.1", "/hello")}))); got != "200 hello from localhost" {
		t.Fatalf("allowed request: %q", got)
	}
	r, err := x.Start(ctx, toolCall("acme", "r.t1.1", 1, "http", map[string]string{"url": web.url("127.0.0.1", "/big")}))
	if err != nil || r.State != abi.StateFailed || !strings.Contains(r.Error.Message, "too_large") {
		t.Fatalf("over-size response: %+v %v", r, err)
	}
	// The port is part of the rule: another port on the address is refused.
	r, err = x.Start(ctx, toolCall("acme", "r.t1.2", 1, "http", map[string]string{"url": "http://127.0.0.1:1/"}))
	if classOf(t, err) != abi.ClassPluginDenied {
		t.Fatalf("other port: %+v %v", r, err)
	}
}

func TestHTTPGateRules(t *testing.T) {
	g, err := newHTTPGate(Sandbox{AllowedHosts: []string{"api.example.com", "*.svc.internal", "10.0.0.1:8080"}}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, port string
		ok         bool
	}{
		{"api.example.com", "443", true}, {"API.example.com.", "80", true}, {"evil.com", "443", false},
		{"a.svc.internal", "80", true}, {"svc.internal", "80", false}, {"a.svc.internal.evil", "80", false},
		{"10.0.0.1", "8080", true}, {"10.0.0.1", "80", false},
		// An entry without a port allows 80 and 443 only.
		{"api.example.com", "8080", false}, {"a.svc.internal", "22", false}, {"api.example.com", "0443", true},
	} {
		if got := g.allows(c.host, c.port); got != c.ok {
			t.Errorf("allows(%s, %s) = %v", c.host, c.port, got)
		}
	}
	// Even a request the first check passed is re-checked at the dial.
	_, err = g.transport.DialContext(context.Background(), "tcp", "127.0.0.1:80")
	if err == nil || !strings.Contains(err.Error(), "not in the plugin's allowed hosts") {
		t.Fatalf("dial of a non-allowed address: %v", err)
	}
	if _, err := newHTTPGate(Sandbox{AllowedHosts: []string{"http://x/"}}); err == nil {
		t.Fatal("a URL was accepted as a host rule")
	}
}

// A plugin cannot reach another tenant's KV, whatever key it crafts.
func TestHostileCannotReadOtherTenantKV(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginHostile, nil)
	ctx := context.Background()
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.0", 1, "kv_put", map[string]string{"key": "secret", "value": "acme-only"}))); got != "stored" {
		t.Fatalf("kv_put: %q", got)
	}
	for _, key := range []string{"secret", "acme/secret", "5:acme/7:hostile/secret", "../acme/secret"} {
		r, err := x.Start(ctx, toolCall("globex", "r.t1.1", 1, "kv_read", map[string]string{"key": key}))
		if err != nil {
			t.Fatalf("kv_read %q: %v", key, err)
		}
		if r.State != abi.StateFailed || !strings.Contains(r.Error.Message, "not found") {
			t.Fatalf("kv_read %q from globex leaked: %+v (%s)", key, r, r.Outcome)
		}
	}
	// The owner still reads it: the refusal above is isolation, not loss.
	if got := doneIn(t)(x.Start(ctx, toolCall("acme", "r.t1.2", 1, "kv_read", map[string]string{"key": "secret"}))); got != "acme-only" {
		t.Fatalf("acme's own read: %q", got)
	}
	if a, g := x.Plugin().Stats("acme"), x.Plugin().Stats("globex"); a.Created == 0 || g.Created == 0 {
		t.Fatalf("each tenant should have its own instances: acme %+v globex %+v", a, g)
	}
}

func TestInputTooLarge(t *testing.T) {
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginExecutor, func(s *PluginSpec) { s.Limits.MaxInputBytes = 1024 })
	_, err := x.Start(context.Background(), toolCall("acme", "r.t1.0", 1, "echo", map[string]string{"text": strings.Repeat("x", 2000)}))
	if classOf(t, err) != abi.ClassLimitExceeded || !strings.Contains(err.Error(), "max_input_bytes of 1024") {
		t.Fatalf("big input: %v", err)
	}
}

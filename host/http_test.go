package host

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// fakeResolver answers agenthost_http's lookups from a table, as a
// hijacked or rebinding DNS server would. A name not in it does not
// resolve, with the real resolver's error (which names the resolver);
// "hang.test" answers only when the lookup gives up.
type fakeResolver map[string][]netip.Addr

const fakeResolverAddr = "10.9.9.9:53"

func (f fakeResolver) lookup(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if host == "hang.test" {
		<-ctx.Done()
		return nil, &net.DNSError{Err: "i/o timeout", Name: host, Server: fakeResolverAddr, IsTimeout: true}
	}
	ips, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, Server: fakeResolverAddr, IsNotFound: true}
	}
	return ips, nil
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func newLoggedEnv(t *testing.T) (*env, *conformance.LogBuffer) {
	logs := &conformance.LogBuffer{}
	return newEnv(t, Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}), logs
}

// fetch asks the hostile plugin's http tool for rawURL and returns the
// error its failed reply carries ("" when the request succeeded).
func fetch(t *testing.T, x *Executor, effect, rawURL string) string {
	t.Helper()
	r, err := x.Start(context.Background(), toolCall("acme", effect, 1, "http", map[string]string{"url": rawURL}))
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	if r.State == abi.StateDone {
		return ""
	}
	if r.State != abi.StateFailed || r.Error == nil {
		t.Fatalf("GET %s: reply %+v", rawURL, r)
	}
	return r.Error.Message
}

func TestHTTPRefusedAddresses(t *testing.T) {
	for _, c := range []struct {
		addr string
		why  string // "" for a public address
	}{
		{"127.0.0.1", "loopback"}, {"127.3.2.1", "loopback"}, {"::1", "loopback"},
		{"::ffff:127.0.0.1", "IPv4-mapped loopback"}, {"::127.0.0.1", "IPv4-compatible loopback"},
		{"::8.8.8.8", "IPv4-compatible"}, {"::ffff:0:127.0.0.1", "IPv4-translated loopback"},
		{"64:ff9b::7f00:1", "NAT64 loopback"}, {"64:ff9b::a9fe:a9fe", "NAT64 link-local"}, {"2002:7f00:1::1", "6to4 loopback"},
		{"64:ff9b:1::8.8.8.8", "local-use NAT64"},
		{"10.0.0.5", "private"}, {"172.16.0.1", "private"}, {"172.31.255.255", "private"}, {"192.168.1.1", "private"},
		{"fc00::1", "private"}, {"fd12:3456::1", "private"}, {"::ffff:10.1.2.3", "IPv4-mapped private"},
		{"169.254.169.254", "link-local"}, {"::ffff:169.254.169.254", "IPv4-mapped link-local"}, {"fe80::1", "link-local"}, {"fe80::1%eth0", "link-local"},
		{"100.64.0.1", "CGNAT"}, {"100.127.255.254", "CGNAT"},
		{"224.0.0.1", "multicast"}, {"239.255.255.250", "multicast"}, {"ff02::1", "multicast"}, {"ff05::2", "multicast"},
		{"0.0.0.0", "unspecified"}, {"::", "unspecified"}, {"0.1.2.3", "this network"},
		{"255.255.255.255", "broadcast"}, {"240.0.0.1", "reserved"},
		{"192.0.2.1", "documentation"}, {"2001:db8::1", "documentation"}, {"198.18.0.1", "benchmarking"},
		{"fec0::1", "site-local"},
		// Public.
		{"8.8.8.8", ""}, {"93.184.216.34", ""}, {"172.32.0.1", ""}, {"100.128.0.1", ""}, {"2606:4700:4700::1111", ""},
		{"::ffff:8.8.8.8", ""}, {"64:ff9b::808:808", ""}, {"2002:808:808::1", ""},
	} {
		got := refusedReason(netip.MustParseAddr(c.addr))
		if (got == "") != (c.why == "") || !strings.Contains(got, c.why) {
			t.Errorf("refusedReason(%s) = %q, want %q", c.addr, got, c.why)
		}
	}
}

func TestHTTPHostRuleForms(t *testing.T) {
	g, err := newHTTPGate(Sandbox{AllowedHosts: []string{"[::1]", "[::1]:8080", "::2", "127.0.0.1:11434", "API.example.com.:8443"}}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, port string
		ok         bool
	}{
		{"::1", "443", true}, {"::1", "8080", true}, {"::1", "8081", false}, {"::2", "80", true}, {"::2", "8080", false},
		{"127.0.0.1", "11434", true}, {"::ffff:127.0.0.1", "11434", true}, {"127.0.0.1", "80", false},
		{"localhost", "11434", false}, {"api.example.com", "8443", true}, {"api.example.com", "443", false},
	} {
		if got := g.allows(c.host, c.port); got != c.ok {
			t.Errorf("allows(%s, %s) = %v", c.host, c.port, got)
		}
	}
	for _, bad := range []string{"127.0.0.1:0", "127.0.0.1:65536", "host:http", "[::1]x", "a b"} {
		if _, err := newHTTPGate(Sandbox{AllowedHosts: []string{bad}}); err == nil {
			t.Errorf("allowed host %q was accepted", bad)
		}
	}
}

// A host name on the list never reaches a refused address, whatever it
// resolves to, directly or through a redirect; the plugin learns nothing
// of why, the server's log does, and the loopback server is never hit.
func TestHTTPNameNeverReachesRefusedAddress(t *testing.T) {
	web := newHTTPFixture(t)
	e, logs := newLoggedEnv(t)
	resolver := fakeResolver{
		"allowed.test":  addrs("127.0.0.1"),
		"mapped.test":   addrs("::ffff:127.0.0.1"),
		"alias.test":    addrs("127.0.0.1"), // the address is listed too, but literally
		"rfc1918.test":  addrs("10.0.0.5"),
		"metadata.test": addrs("169.254.169.254"),
		"mixed.test":    addrs("93.184.216.34", "127.0.0.1"), // a rebinding answer
		"v6.test":       addrs("::1"),
	}
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.lookupIP = resolver.lookup
		s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port, "metadata.test"}
		for name := range resolver {
			s.Sandbox.AllowedHosts = append(s.Sandbox.AllowedHosts, name+":"+web.port)
		}
	})
	// The literal address is the operator's exception: it works.
	if msg := fetch(t, x, "r.t1.0", web.url("127.0.0.1", "/hello")); msg != "" {
		t.Fatalf("the literal address: %s", msg)
	}
	cases := []struct{ url, dest, logged string }{
		{web.url("allowed.test", "/secret"), "allowed.test:" + web.port, "allowed.test resolved to 127.0.0.1, which is loopback"},
		{web.url("mapped.test", "/secret"), "mapped.test:" + web.port, "which is IPv4-mapped loopback"},
		{web.url("alias.test", "/secret"), "alias.test:" + web.port, "alias.test resolved to 127.0.0.1"},
		{web.url("rfc1918.test", "/secret"), "rfc1918.test:" + web.port, "which is private"},
		{"http://metadata.test/latest/meta-data/", "metadata.test:80", "resolved to 169.254.169.254, which is link-local"},
		{web.url("mixed.test", "/secret"), "mixed.test:" + web.port, "mixed.test resolved to 127.0.0.1"},
		{web.url("v6.test", "/secret"), "v6.test:" + web.port, "v6.test resolved to ::1"},
		// A redirect from the allowed literal address to an allowed name
		// that resolves to loopback.
		{web.url("127.0.0.1", "/redirect-to?to="+url.QueryEscape(web.url("allowed.test", "/secret"))), "allowed.test:" + web.port, "allowed.test resolved to 127.0.0.1"},
	}
	for i, c := range cases {
		msg := fetch(t, x, fmt.Sprintf("r.t1.%d", i+1), c.url)
		want := "http: failed: the request to " + c.dest + " was not allowed or could not be made"
		if !strings.HasPrefix(msg, want) {
			t.Errorf("GET %s: %q, want %q", c.url, msg, want)
		}
		for _, leak := range []string{"127.0.0.1", "::1", "169.254", "10.0.0.5", "loopback", "private", "refused"} {
			if strings.Contains(msg, leak) {
				t.Errorf("GET %s: the plugin's error %q tells it %q", c.url, msg, leak)
			}
		}
		if !strings.Contains(logs.String(), c.logged) {
			t.Errorf("GET %s: the log does not say %q:\n%s", c.url, c.logged, logs)
		}
	}
	if n := web.secrets.Load(); n != 0 {
		t.Fatalf("the loopback server was reached %d times through a name", n)
	}
	if got := x.Plugin().HTTPStats().Refused; got != int64(len(cases)) {
		t.Errorf("HTTPStats().Refused = %d, want %d", got, len(cases))
	}
}

// A refused address, a name that does not resolve, a lookup that times
// out and a port that refuses the connection all give the plugin the same
// answer, which names no address and no resolver.
func TestHTTPRefusalLooksLikeAnyFailure(t *testing.T) {
	web := newHTTPFixture(t)
	e, logs := newLoggedEnv(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort, _ := net.SplitHostPort(closed.Addr().String())
	closed.Close()
	resolver := fakeResolver{"refused.test": addrs("127.0.0.1")}
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.lookupIP = resolver.lookup
		s.Sandbox.HTTPTimeout = 300 * time.Millisecond
		s.Sandbox.AllowedHosts = []string{"refused.test:" + web.port, "nx.test:" + web.port, "hang.test:" + web.port, "127.0.0.1:" + closedPort}
	})
	cases := []struct{ url, dest string }{
		{web.url("refused.test", "/secret"), "refused.test:" + web.port},
		{web.url("nx.test", "/secret"), "nx.test:" + web.port},
		{web.url("hang.test", "/secret"), "hang.test:" + web.port},
		{"http://127.0.0.1:" + closedPort + "/", "127.0.0.1:" + closedPort},
	}
	var first string
	for i, c := range cases {
		msg := strings.ReplaceAll(fetch(t, x, fmt.Sprintf("r.t1.%d", i), c.url), c.dest, "DEST")
		if strings.Contains(msg, strings.Split(fakeResolverAddr, ":")[0]) || strings.Contains(msg, "lookup") {
			t.Errorf("GET %s: the plugin's error %q tells it of the resolver", c.url, msg)
		}
		if i == 0 {
			first = msg
		} else if msg != first {
			t.Errorf("GET %s: %q, but a refused address gave %q: the plugin can tell them apart", c.url, msg, first)
		}
	}
	if !strings.Contains(first, "http: failed: the request to DEST was not allowed or could not be made") {
		t.Errorf("the answer %q", first)
	}
	// The log keeps what the plugin is not told.
	for _, want := range []string{"refused.test resolved to 127.0.0.1", "lookup nx.test on " + fakeResolverAddr, "hang.test", "connection refused"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs)
		}
	}
	if n := web.secrets.Load(); n != 0 {
		t.Fatalf("the loopback server was reached %d times", n)
	}
}

// An entry without a port allows ports 80 and 443 only, even on an
// address listed literally.
func TestHTTPPortlessEntryMeansWebPorts(t *testing.T) {
	web := newHTTPFixture(t)
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.lookupIP = fakeResolver{"api.test": addrs("93.184.216.34")}.lookup
		s.Sandbox.AllowedHosts = []string{"127.0.0.1", "api.test"}
	})
	for i, c := range []struct{ url, host string }{
		{web.url("127.0.0.1", "/secret"), "127.0.0.1"},
		{"http://api.test:8080/", "api.test"},
		{"https://api.test:8443/", "api.test"},
	} {
		r, err := x.Start(context.Background(), toolCall("acme", fmt.Sprintf("r.t1.%d", i), 1, "http", map[string]string{"url": c.url}))
		if err == nil {
			t.Fatalf("GET %s: reply %+v, want plugin_denied", c.url, r)
		}
		if classOf(t, err) != abi.ClassPluginDenied || !strings.Contains(err.Error(), fmt.Sprintf("%q is not in the plugin's allowed hosts", c.host)) {
			t.Errorf("GET %s: %v", c.url, err)
		}
	}
	if n := web.secrets.Load(); n != 0 {
		t.Fatalf("the port-less entry let the plugin reach port %s (%d times)", web.port, n)
	}
	if got := x.Plugin().HTTPStats().Denied; got != 3 {
		t.Errorf("HTTPStats().Denied = %d, want 3", got)
	}
}

// An IPv6 literal on the list, with its port in brackets, is reached.
func TestHTTPLiteralIPv6Allowed(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello over IPv6") }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	e := newEnv(t, Config{})
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.AllowedHosts = []string{"[::1]:" + port}
	})
	if got := doneIn(t)(x.Start(context.Background(), toolCall("acme", "r.t1.0", 1, "http", map[string]string{"url": "http://[::1]:" + port + "/"}))); got != "200 hello over IPv6" {
		t.Fatalf("the literal IPv6 address: %q", got)
	}
}

// Response headers are capped like the body: 100 KiB of them is over the
// default of 64 KiB, and the plugin is told which limit it hit.
func TestHTTPResponseHeadersCapped(t *testing.T) {
	web := newHTTPFixture(t)
	e := newEnv(t, Config{})
	load := func(name string, limit int64) *Executor {
		return e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
			s.Name = name
			s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port}
			s.Sandbox.MaxHTTPResponseHeaderBytes = limit
		})
	}
	x := load("hostile", 0)
	msg := fetch(t, x, "r.t1.0", web.url("127.0.0.1", "/big-headers"))
	want := fmt.Sprintf("http: too_large: response headers from 127.0.0.1:%s are over the limit of %d bytes", web.port, DefaultMaxHTTPResponseHeaderBytes)
	if msg != want {
		t.Fatalf("100 KiB of headers: %q, want %q", msg, want)
	}
	// Small headers pass, and so do big ones under a higher limit.
	if msg := fetch(t, x, "r.t1.1", web.url("127.0.0.1", "/hello")); msg != "" {
		t.Fatalf("small headers: %s", msg)
	}
	if msg := fetch(t, load("hostile-roomy", 256<<10), "r.t1.2", web.url("127.0.0.1", "/big-headers")); msg != "" {
		t.Fatalf("100 KiB of headers under a limit of 256 KiB: %s", msg)
	}
}

// Every dial of this package's tests stays on this machine, whatever the
// gate decides: a test that names a private, link-local or public
// address checks that the gate refuses it, and a gate that did not would
// otherwise send traffic off the machine.
func init() {
	testHookDial = func(network, address string) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			offMachineDials.Add(1)
			return fmt.Errorf("test guard: refusing to dial %s %s, which is not on loopback", network, address)
		}
		return nil
	}
}

// offMachineDials counts the dials the guard refused; TestMain fails the
// package's run when there was one.
var offMachineDials atomic.Int64

package connlimit_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/connlimit"
)

// pipeListener is a net.Listener whose connections come from any remote
// address a test names: one end of a net.Pipe each.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 64), closed: make(chan struct{})}
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}

func (p *pipeListener) Close() error   { p.once.Do(func() { close(p.closed) }); return nil }
func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv6loopback, Port: 8080} }

type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// from queues a connection from the address ip and returns the client's
// end.
func (p *pipeListener) from(t *testing.T, ip string) net.Conn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	p.conns <- remoteConn{Conn: server, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	return client
}

func TestIPv6ClientsAreGroupedBySlash64(t *testing.T) {
	key := func(s string, bits int) string { return connlimit.ClientKey(netip.MustParseAddr(s), bits).String() }
	// One /64 is one client, whatever the interface identifier.
	require.Equal(t, "2001:db8:1:2::", key("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 0))
	require.Equal(t, key("2001:db8:1:2::1", 0), key("2001:db8:1:2:ffff:ffff:ffff:ffff", 64))
	require.NotEqual(t, key("2001:db8:1:2::1", 0), key("2001:db8:1:3::1", 0), "another /64 is another client")
	require.Equal(t, "fe80::", key("fe80::1%eth0", 0), "the zone is not part of the client")
	// A shorter or longer prefix, as configured.
	require.Equal(t, key("2001:db8:1:2::1", 48), key("2001:db8:1:7::1", 48))
	require.NotEqual(t, key("2001:db8:1:2::1", 128), key("2001:db8:1:2::2", 128), "128: each address alone")
	// IPv4, and IPv4 mapped into IPv6, stay themselves.
	require.Equal(t, "192.0.2.7", key("192.0.2.7", 0))
	require.Equal(t, "192.0.2.7", key("::ffff:192.0.2.7", 0))
	require.NotEqual(t, key("192.0.2.7", 0), key("192.0.2.8", 0))

	// The per-client cap counts the /64: a host that takes addresses of
	// its /64 one after another does not get a cap for each.
	inner := newPipeListener()
	l := connlimit.NewListener(inner, connlimit.Limits{Max: 100, PerClient: 2, Hard: 200}, nil)
	defer l.Close()
	ch := accepted(t, l)
	for i := 1; i <= 2; i++ {
		inner.from(t, fmt.Sprintf("2001:db8:1:2::%x", i))
		require.Empty(t, next(t, ch).OverCap(), "connection %d of the /64", i)
	}
	inner.from(t, "2001:db8:1:2:dead:beef:0:1")
	require.Equal(t, connlimit.ReasonPerClient, next(t, ch).OverCap(), "a third address of the same /64 is over the per-client cap")
	inner.from(t, "2001:db8:1:3::1")
	require.Empty(t, next(t, ch).OverCap(), "another /64 is another client")
	_, from := l.Open(netip.MustParseAddr("2001:db8:1:2::77"))
	require.Equal(t, 3, from, "Open counts the client's /64")

	// With ipv6_client_prefix 128 every address is a client of its own.
	inner128 := newPipeListener()
	l128 := connlimit.NewListener(inner128, connlimit.Limits{Max: 100, PerClient: 2, Hard: 200, IPv6ClientPrefix: 128}, nil)
	defer l128.Close()
	ch128 := accepted(t, l128)
	for i := 1; i <= 3; i++ {
		inner128.from(t, fmt.Sprintf("2001:db8:1:2::%x", i))
		require.Empty(t, next(t, ch128).OverCap(), "address %d, each alone", i)
	}
}

// A connection over the share of the connections without a token is
// admitted when its request carries a valid token (and there is room
// under Max), and shed when it closes without one; one that authenticates
// leaves the share, making room for another.
func TestAConnectionPastTheUnauthenticatedShareIsServedWithAValidToken(t *testing.T) {
	inner := newPipeListener()
	var mu sync.Mutex
	shed := map[string]int{}
	l := connlimit.NewListener(inner, connlimit.Limits{Max: 4, Hard: 16, MaxUnauthenticated: 2}, func(reason string) {
		mu.Lock()
		shed[reason]++
		mu.Unlock()
	})
	defer l.Close()
	ch := accepted(t, l)
	conn := func(ip string) *connlimit.Conn {
		t.Helper()
		inner.from(t, ip)
		return next(t, ch)
	}

	a1, a2 := conn("192.0.2.1"), conn("192.0.2.2")
	require.Empty(t, a1.OverCap())
	require.Empty(t, a2.OverCap())
	require.Equal(t, 2, l.Unauthenticated())
	// The share is taken: the next connection is marked, even though the
	// server holds 2 of its 4.
	b := conn("192.0.2.3")
	require.Equal(t, connlimit.ReasonUnauthenticated, b.OverCap())
	require.True(t, b.Unauthenticated())
	b.Authenticated()
	require.Empty(t, b.OverCap(), "a valid token lifts the mark")
	require.False(t, b.Unauthenticated())
	require.Equal(t, 2, l.Unauthenticated(), "the tenant's connection is not in the share")
	// One that closes without a token was shed.
	x := conn("192.0.2.8")
	require.Equal(t, connlimit.ReasonUnauthenticated, x.OverCap())
	require.NoError(t, x.Close())

	// A connection of the share that authenticates leaves it.
	a1.Authenticated()
	require.Equal(t, 1, l.Unauthenticated())
	c := conn("192.0.2.4")
	require.Empty(t, c.OverCap(), "the share has room again")
	require.Equal(t, 2, l.Unauthenticated())

	// Four are within the caps now (a1, a2, b, c): past Max, a token
	// does not lift the mark.
	d := conn("192.0.2.5")
	require.Equal(t, connlimit.ReasonTotal, d.OverCap())
	d.Authenticated()
	require.Equal(t, connlimit.ReasonTotal, d.OverCap(), "no room under Max")
	e := conn("192.0.2.6")
	require.Equal(t, connlimit.ReasonTotal, e.OverCap())
	// Once a connection within the caps closes, a marked one with a
	// token is served even though the shed ones still count against Max
	// at accept.
	require.NoError(t, c.Close())
	e.Authenticated()
	require.Empty(t, e.OverCap())
	require.NoError(t, d.Close())
	require.Equal(t, 1, l.Unauthenticated(), "a2 is the only one of the share left")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{connlimit.ReasonTotal: 1, connlimit.ReasonUnauthenticated: 1}, shed)
}

// serveWithTokens serves l with a handler that marks a request with the
// header Token: valid as authenticated (as the API does with a bearer
// token), with the server's idle and read-header timeouts an hour long.
// A request for /slow closes started, then is answered once release is
// closed ("cancelled" if its context ended first).
func serveWithTokens(t *testing.T, l net.Listener, started chan<- struct{}, release <-chan struct{}) {
	t.Helper()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Token") == "valid" {
				connlimit.Authenticated(r.Context())
			}
			if r.URL.Path == "/slow" {
				close(started)
				select {
				case <-release:
				case <-r.Context().Done():
					_, _ = io.WriteString(w, "cancelled")
					return
				}
			}
			_, _ = io.WriteString(w, "ok")
		}),
		ReadHeaderTimeout: time.Hour,
		IdleTimeout:       time.Hour,
		ConnContext:       connlimit.WithConn,
		ConnState:         connlimit.ConnState,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// get sends one request on c and reads its answer.
func get(t *testing.T, c net.Conn, r *bufio.Reader, token string) {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nToken: %s\r\n\r\n", token)
	require.NoError(t, err)
	require.Equal(t, "ok", answer(t, c, r))
}

// answer reads the answer to a request sent on c.
func answer(t *testing.T, c net.Conn, r *bufio.Reader) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	return string(b)
}

// closedByServer waits, up to within, for the server to close c.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		return true
	}
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// A connection that has carried no valid token is closed after the
// listener's unauthenticated idle timeout, idle after a request or
// silent from the start, while one that has carried a token keeps the
// server's own idle timeout (an hour here). The timeout bounds the waits
// for a request only: a request without a token that takes longer is
// served to its end.
func TestIdleConnectionsWithoutATokenCloseAfterTheShorterTimeout(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// Short, but long enough for a loaded machine to read a request that
	// is already sent.
	const idleTimeout = 2 * time.Second
	l := connlimit.NewListener(inner, connlimit.Limits{Max: 100, Hard: 200, MaxUnauthenticated: 50,
		UnauthenticatedIdleTimeout: idleTimeout}, nil)
	started, release := make(chan struct{}), make(chan struct{})
	serveWithTokens(t, l, started, release)
	addr := inner.Addr().String()

	tenant := dialFrom(t, "127.0.0.1", addr)
	tenantR := bufio.NewReader(tenant)
	get(t, tenant, tenantR, "valid")
	// Idle from before the others opened.

	slow := dialFrom(t, "127.0.0.4", addr)
	_, err = io.WriteString(slow, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow request never reached its handler")
	}

	idle := dialFrom(t, "127.0.0.2", addr)
	get(t, idle, bufio.NewReader(idle), "none")
	silent := dialFrom(t, "127.0.0.3", addr)

	require.True(t, closedByServer(idle, 30*time.Second), "an idle connection without a token must be closed after its idle timeout (2s), not the server's hour")
	require.True(t, closedByServer(silent, 30*time.Second), "a connection that sends nothing must be closed after the unauthenticated idle timeout")
	// The tenant's connection, idle for longer than both, is still served.
	get(t, tenant, tenantR, "valid")
	// The slow request, in its handler since before the idle ones
	// opened, is answered in full.
	close(release)
	require.Equal(t, "ok", answer(t, slow, bufio.NewReader(slow)), "a request without a token in progress must not be cut by the idle timeout")
}

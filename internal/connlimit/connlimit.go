// Package connlimit bounds the connections `agenthost serve` holds open,
// so that no client can exhaust the process's file descriptors, nor shut
// the tenants out: a Listener counts its connections, overall, per client
// and among those that have carried no valid token yet, and marks those
// past a cap. A marked connection gets one request and OverCapGrace to
// send it and be answered: the HTTP server answers it with 503 (only
// /healthz is served as usual) and closes it, so that a flood is shed
// rather than queued; past the hard cap, which stays below the process's
// open-file limit, a connection is closed as soon as it is accepted.
//
// The caps count connections, not requests: idle keep-alive connections
// count until the server's idle timeout closes them, which is what makes
// the two work together (a client that opens connections and sends
// nothing holds each one for the read-header timeout at most, or the
// unauthenticated idle timeout when it is shorter).
//
// Anyone who reaches the port can open connections, so the ones that have
// carried no valid token may hold only a share of Max
// (Limits.MaxUnauthenticated), and are closed after a shorter idle time
// (Limits.UnauthenticatedIdleTimeout): the rest of Max stays for the
// tenants. A connection marked only because the share or Max is taken is
// served after all when its first request carries a valid token and the
// connections within the caps are fewer than Max (the HTTP server says so
// with Authenticated): connections being shed do not keep a tenant out.
//
// A client is an IPv4 address, or an IPv6 prefix (a /64 by default): a
// host is commonly given a whole /64, and would otherwise pass for as
// many clients as it likes.
package connlimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// The reasons a connection is over a cap, as Conn.OverCap and the
// OnShed hook name them (and the metrics label them).
const (
	// ReasonTotal: the server holds Limits.Max connections already.
	ReasonTotal = "max_connections"
	// ReasonPerClient: the client holds Limits.PerClient.
	ReasonPerClient = "max_connections_per_client"
	// ReasonHard: past the hard cap; the connection was closed at accept.
	ReasonHard = "max_connections_hard"
	// ReasonUnauthenticated: the connections that have carried no valid
	// token hold Limits.MaxUnauthenticated already; this one is served
	// only if its first request carries one.
	ReasonUnauthenticated = "max_unauthenticated_connections"
)

// DefaultIPv6ClientPrefix is how many leading bits of an IPv6 address
// name one client when Limits.IPv6ClientPrefix is 0: a /64, the block a
// host or a home network is commonly given.
const DefaultIPv6ClientPrefix = 64

// Limits are a Listener's caps.
type Limits struct {
	// Max is how many connections the server serves at once; the ones
	// past it are answered 503 and closed.
	Max int
	// PerClient is how many of them one client may hold; the ones past it
	// are answered 503 and closed. 0: no per-client cap (for a server
	// behind a reverse proxy, whose connections all come from the proxy).
	PerClient int
	// Hard is how many connections the process holds at all, the shed
	// ones included; past it a connection is closed at accept. It is at
	// least Max and stays below the open-file limit.
	Hard int
	// MaxUnauthenticated is how many of the Max connections may be ones
	// that have carried no valid token yet; past it a new connection is
	// served only if its first request carries one. 0: no share of their
	// own (they may take all of Max).
	MaxUnauthenticated int
	// UnauthenticatedIdleTimeout bounds every wait for a request of a
	// connection that has carried no valid token yet: from its opening,
	// or idle after an answer, to the end of the request's headers (the
	// server's ConnState must be ConnState, else every read of such a
	// connection is bounded). 0: the server's own timeouts only.
	UnauthenticatedIdleTimeout time.Duration
	// IPv6ClientPrefix is how many leading bits of an IPv6 address name
	// a client, for PerClient (and ClientOf); 0: DefaultIPv6ClientPrefix,
	// 128: every address is a client of its own.
	IPv6ClientPrefix int
}

// reserve is what Resolve keeps of the open-file limit for everything
// that is not a client connection: the store's files or connection pool,
// plugin files, the compilation cache, logs.
const reserve = 128

// DefaultMax is the default Max when the open-file limit allows it.
const DefaultMax = 4096

// Resolve returns the caps for a process whose open-file limit is nofile
// (0: unknown), from max (0: the default) and perClient (0: none). Hard
// is what the reserve leaves of the limit (a half of it, on a small
// limit); the default Max is three quarters of Hard, at most DefaultMax,
// so that a quarter of the connections is there to shed load and answer
// health checks. A max above Hard is lowered to it, with a warning that
// says so; perClient is never above Max.
func Resolve(maxConns, perClient int, nofile uint64) (Limits, string) {
	hard := 1 << 20
	if nofile > 0 {
		res := min(uint64(reserve), nofile/2)
		hard = int(min(nofile-res, uint64(hard)))
	}
	var warn string
	switch {
	case maxConns == 0:
		maxConns = min(hard*3/4, DefaultMax)
	case maxConns > hard:
		warn = fmt.Sprintf("http.max_connections %d does not fit under the process's open-file limit %d with room for the store and plugins: serving at most %d; raise the limit (ulimit -n, systemd LimitNOFILE) to serve more", maxConns, nofile, hard)
		maxConns = hard
	}
	return Limits{Max: maxConns, PerClient: min(perClient, maxConns), Hard: hard}, warn
}

// UnauthenticatedShare is Limits.MaxUnauthenticated for a configured n:
// 0 takes half of maxConns (at least 1), so that the other half stays for
// connections with a valid token; n is never above maxConns.
func UnauthenticatedShare(n, maxConns int) int {
	if n == 0 {
		return max(maxConns/2, 1)
	}
	return min(n, maxConns)
}

// OpenFileLimit is the process's current open-file limit (RLIMIT_NOFILE),
// or 0 when it cannot be read.
func OpenFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// ClientKey is what a client address counts as: an IPv4 address (or an
// IPv4-mapped IPv6 one) as itself, an IPv6 address as its first
// ipv6Prefix bits (0: DefaultIPv6ClientPrefix), without its zone.
func ClientKey(a netip.Addr, ipv6Prefix int) netip.Addr {
	a = a.Unmap()
	if !a.Is6() {
		return a
	}
	if ipv6Prefix <= 0 || ipv6Prefix > 128 {
		ipv6Prefix = DefaultIPv6ClientPrefix
	}
	p, err := a.WithZone("").Prefix(ipv6Prefix)
	if err != nil {
		return a
	}
	return p.Addr()
}

// Listener is a net.Listener that counts its connections and marks the
// ones over a cap. It is safe for concurrent use.
type Listener struct {
	net.Listener
	limits Limits
	onShed func(reason string)

	mu       sync.Mutex
	open     int // every connection accepted and not closed: for Hard, and Max at accept
	admitted int // the ones within the caps, at accept or once a token lifted their mark
	// unauthenticated is how many of the admitted ones have carried no
	// valid token yet.
	unauthenticated int
	byClient        map[netip.Addr]int // open connections by ClientKey
}

// NewListener wraps inner with the caps of l (see Resolve).
// onShed, if not nil, is called for every connection a cap refused, with
// its reason: at accept for the hard and per-client caps; for Max and the
// unauthenticated share, which a valid token may yet lift, when the
// connection closes without one having lifted it.
func NewListener(inner net.Listener, l Limits, onShed func(reason string)) *Listener {
	if onShed == nil {
		onShed = func(string) {}
	}
	return &Listener{Listener: inner, limits: l, onShed: onShed, byClient: map[netip.Addr]int{}}
}

// Limits returns the listener's caps.
func (l *Listener) Limits() Limits { return l.limits }

// Open returns how many connections are open, and how many of them
// come from client (counted as ClientKey counts it).
func (l *Listener) Open(client netip.Addr) (total, fromClient int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.byClient[ClientKey(client, l.limits.IPv6ClientPrefix)]
}

// Unauthenticated returns how many of the connections within the caps
// have carried no valid token yet.
func (l *Listener) Unauthenticated() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unauthenticated
}

// Accept returns the next connection that is under the hard cap, marked
// when it is over Max, PerClient or MaxUnauthenticated. A connection
// past the hard cap is closed at once, and Accept waits for the next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := ClientKey(clientAddr(c.RemoteAddr()), l.limits.IPv6ClientPrefix)
		l.mu.Lock()
		if l.open >= l.limits.Hard {
			l.mu.Unlock()
			l.onShed(ReasonHard)
			_ = c.Close()
			continue
		}
		var over string
		switch {
		case l.open >= l.limits.Max:
			over = ReasonTotal
		case l.limits.PerClient > 0 && l.byClient[client] >= l.limits.PerClient:
			over = ReasonPerClient
		case l.limits.MaxUnauthenticated > 0 && l.unauthenticated >= l.limits.MaxUnauthenticated:
			over = ReasonUnauthenticated
		}
		l.open++
		l.byClient[client]++
		if over == "" {
			l.admitted++
			l.unauthenticated++
		}
		l.mu.Unlock()
		conn := &Conn{Conn: c, l: l, client: client, over: over, admitted: over == "", unauthenticated: true, waiting: true}
		switch over {
		case "":
			if l.limits.UnauthenticatedIdleTimeout > 0 {
				_ = c.SetReadDeadline(time.Now().Add(l.limits.UnauthenticatedIdleTimeout))
			}
		case ReasonPerClient:
			l.onShed(over)
			fallthrough
		default:
			// It gets one request, and a short time to send it.
			conn.graceEnd = time.Now().Add(OverCapGrace)
			_ = c.SetDeadline(conn.graceEnd)
		}
		return conn, nil
	}
}

// release counts a closed connection out.
func (l *Listener) release(client netip.Addr, admitted, unauthenticated bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if admitted {
		l.admitted--
		if unauthenticated {
			l.unauthenticated--
		}
	}
	if n := l.byClient[client] - 1; n > 0 {
		l.byClient[client] = n
	} else {
		delete(l.byClient, client)
	}
}

// clientAddr is the IP of a remote address, unmapped (an IPv4 client
// counts as itself whether it came over IPv4 or IPv6).
func clientAddr(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// OverCapGrace is how long a connection over a cap is kept, however the
// server sets its deadlines: time to send its request and be answered.
const OverCapGrace = 2 * time.Second

// Conn is a connection a Listener accepted. It keeps the deadlines the
// server asks for within its grace while it is over a cap, and, until it
// carries a valid token, its read deadlines while it waits for a request
// within the listener's UnauthenticatedIdleTimeout.
type Conn struct {
	net.Conn
	l      *Listener
	client netip.Addr // as ClientKey counts it
	once   sync.Once

	mu              sync.Mutex
	over            string
	admitted        bool      // counted among the listener's admitted connections
	unauthenticated bool      // no request of it has carried a valid token
	waiting         bool      // for a request: new, or idle after an answer (ConnState)
	closed          bool      // Close counted it out
	graceEnd        time.Time // over a cap: no deadline is set past it
	// The deadlines the server asked for, before the clamps: set again
	// when a valid token lifts them.
	readDeadline, writeDeadline time.Time
}

// clamp keeps a deadline within the connection's grace when it is over a
// cap, and a read deadline within the unauthenticated idle timeout from
// now while the connection waits for a request and has carried no valid
// token. c.mu is held.
func (c *Conn) clamp(t time.Time, read bool, now time.Time) time.Time {
	earlier := func(limit time.Time) {
		if t.IsZero() || limit.Before(t) {
			t = limit
		}
	}
	if d := c.l.limits.UnauthenticatedIdleTimeout; read && c.unauthenticated && c.waiting && d > 0 {
		earlier(now.Add(d))
	}
	if !c.graceEnd.IsZero() {
		earlier(c.graceEnd)
	}
	return t
}

// SetDeadline implements net.Conn, within the connection's clamps.
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline, c.writeDeadline = t, t
	now := time.Now()
	if err := c.Conn.SetReadDeadline(c.clamp(t, true, now)); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(c.clamp(t, false, now))
}

// SetReadDeadline implements net.Conn, within the connection's clamps.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	return c.Conn.SetReadDeadline(c.clamp(t, true, time.Now()))
}

// SetWriteDeadline implements net.Conn, within the connection's clamps.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeDeadline = t
	return c.Conn.SetWriteDeadline(c.clamp(t, false, time.Now()))
}

// OverCap is the cap the connection is over (ReasonTotal,
// ReasonPerClient or ReasonUnauthenticated), or "" when it is within the
// caps.
func (c *Conn) OverCap() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over
}

// Unauthenticated reports whether no request of the connection has
// carried a valid token yet.
func (c *Conn) Unauthenticated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unauthenticated
}

// Authenticated records that a request of the connection carries a
// valid token: from now on the connection counts outside the
// unauthenticated share, and keeps the server's own read deadlines. A
// connection marked only because Max or the unauthenticated share was
// taken is admitted after all when the connections within the caps are
// fewer than Max (else it stays marked, as over Max); one over the
// per-client cap stays marked.
func (c *Conn) Authenticated() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.unauthenticated {
		return
	}
	c.unauthenticated = false
	l := c.l
	l.mu.Lock()
	switch {
	case c.admitted:
		l.unauthenticated--
	case c.over == ReasonTotal || c.over == ReasonUnauthenticated:
		if l.admitted < l.limits.Max {
			l.admitted++
			c.admitted = true
			c.over = ""
			c.graceEnd = time.Time{}
		} else {
			c.over = ReasonTotal
		}
	}
	l.mu.Unlock()
	// The server's deadlines as it asked for them, with what clamps are
	// left.
	now := time.Now()
	_ = c.Conn.SetReadDeadline(c.clamp(c.readDeadline, true, now))
	_ = c.Conn.SetWriteDeadline(c.clamp(c.writeDeadline, false, now))
}

// Close closes the connection and counts it out, once.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		admitted, unauthenticated, over := c.admitted, c.unauthenticated, c.over
		c.mu.Unlock()
		c.l.release(c.client, admitted, unauthenticated)
		if over == ReasonTotal || over == ReasonUnauthenticated {
			// No valid token lifted the mark: it was shed.
			c.l.onShed(over)
		}
	})
	return err
}

// ConnState is an http.Server ConnState hook for a server on a Listener:
// it tells each connection when it waits for a request (new, or idle
// after an answer) and when it serves one, so that the unauthenticated
// idle timeout bounds the waits only: not the reads net/http makes while
// a handler runs (a request without a token that takes long, such as a
// /metrics scrape, is not cut).
func ConnState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*Conn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew, http.StateIdle:
		lc.mu.Lock()
		lc.waiting = true
		lc.mu.Unlock()
	case http.StateActive:
		// The request's headers are in; the deadlines set while they came
		// keep their bound.
		lc.mu.Lock()
		lc.waiting = false
		lc.mu.Unlock()
	}
}

type connKey struct{}

// WithConn is an http.Server ConnContext: it records the connection in
// ctx, for OverCap, Authenticated, Unauthenticated and ClientOf.
func WithConn(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*Conn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

func connOf(ctx context.Context) *Conn {
	c, _ := ctx.Value(connKey{}).(*Conn)
	return c
}

// OverCap is the cap the request's connection is over, or "" (a request
// of a connection within the caps, or of a server without a Listener).
func OverCap(ctx context.Context) string {
	if c := connOf(ctx); c != nil {
		return c.OverCap()
	}
	return ""
}

// Unauthenticated reports whether the request's connection has carried
// no valid token yet (false on a server without a Listener).
func Unauthenticated(ctx context.Context) bool {
	if c := connOf(ctx); c != nil {
		return c.Unauthenticated()
	}
	return false
}

// Authenticated records that the request carries a valid token, for its
// connection (see Conn.Authenticated); nothing on a server without a
// Listener.
func Authenticated(ctx context.Context) {
	if c := connOf(ctx); c != nil {
		c.Authenticated()
	}
}

// ClientOf is the client of the request's connection as the Listener
// counts it (see ClientKey), or false on a server without a Listener.
func ClientOf(ctx context.Context) (netip.Addr, bool) {
	if c := connOf(ctx); c != nil {
		return c.client, true
	}
	return netip.Addr{}, false
}

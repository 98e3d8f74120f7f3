// Package connlimit bounds the connections `agenthost serve` holds open,
// so that no client can exhaust the process's file descriptors: a
// Listener counts its connections, overall and per client address, and
// marks those past either cap. A marked connection gets one request and
// OverCapGrace to send it and be answered: the HTTP server answers it
// with 503 (only /healthz is served as usual) and closes it, so that a
// flood is shed rather than queued; past the hard cap, which stays below
// the process's open-file limit, a connection is closed as soon as it is
// accepted.
//
// The caps count connections, not requests: idle keep-alive connections
// count until the server's idle timeout closes them, which is what makes
// the two work together (a client that opens connections and sends
// nothing holds each one for the read-header timeout at most).
package connlimit

import (
	"context"
	"fmt"
	"net"
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
	// ReasonPerClient: the client's address holds Limits.PerClient.
	ReasonPerClient = "max_connections_per_client"
	// ReasonHard: past the hard cap; the connection was closed at accept.
	ReasonHard = "max_connections_hard"
)

// Limits are a Listener's caps.
type Limits struct {
	// Max is how many connections the server serves at once; the ones
	// past it are answered 503 and closed.
	Max int
	// PerClient is how many of them one client address may hold; the
	// ones past it are answered 503 and closed. 0: no per-client cap (for
	// a server behind a reverse proxy, whose connections all come from
	// the proxy).
	PerClient int
	// Hard is how many connections the process holds at all, the shed
	// ones included; past it a connection is closed at accept. It is at
	// least Max and stays below the open-file limit.
	Hard int
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

// OpenFileLimit is the process's current open-file limit (RLIMIT_NOFILE),
// or 0 when it cannot be read.
func OpenFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// Listener is a net.Listener that counts its connections and marks the
// ones over a cap. It is safe for concurrent use.
type Listener struct {
	net.Listener
	limits Limits
	onShed func(reason string)

	mu       sync.Mutex
	total    int
	byClient map[netip.Addr]int
}

// NewListener wraps inner with the caps of l (see Resolve).
// onShed, if not nil, is called for every connection over a cap, with
// its reason.
func NewListener(inner net.Listener, l Limits, onShed func(reason string)) *Listener {
	if onShed == nil {
		onShed = func(string) {}
	}
	return &Listener{Listener: inner, limits: l, onShed: onShed, byClient: map[netip.Addr]int{}}
}

// Limits returns the listener's caps.
func (l *Listener) Limits() Limits { return l.limits }

// Open returns how many connections are open, and how many of them
// come from client.
func (l *Listener) Open(client netip.Addr) (total, fromClient int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.byClient[client]
}

// Accept returns the next connection that is under the hard cap, marked
// when it is over Max or PerClient. A connection past the hard cap is
// closed at once, and Accept waits for the next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientAddr(c.RemoteAddr())
		l.mu.Lock()
		if l.total >= l.limits.Hard {
			l.mu.Unlock()
			l.onShed(ReasonHard)
			_ = c.Close()
			continue
		}
		var over string
		switch {
		case l.total >= l.limits.Max:
			over = ReasonTotal
		case l.limits.PerClient > 0 && l.byClient[client] >= l.limits.PerClient:
			over = ReasonPerClient
		}
		l.total++
		l.byClient[client]++
		l.mu.Unlock()
		conn := &Conn{Conn: c, l: l, client: client, over: over}
		if over != "" {
			l.onShed(over)
			// It gets one request, and a short time to send it.
			conn.deadline = time.Now().Add(OverCapGrace)
			_ = c.SetDeadline(conn.deadline)
		}
		return conn, nil
	}
}

func (l *Listener) release(client netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
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

// Conn is a connection a Listener accepted.
type Conn struct {
	net.Conn
	l        *Listener
	client   netip.Addr
	over     string
	deadline time.Time // over a cap: no deadline is set past it
	once     sync.Once
}

// clamp keeps a deadline of a connection over a cap within its grace.
func (c *Conn) clamp(t time.Time) time.Time {
	if c.deadline.IsZero() || (!t.IsZero() && t.Before(c.deadline)) {
		return t
	}
	return c.deadline
}

// SetDeadline implements net.Conn, within the grace of a connection over
// a cap.
func (c *Conn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.clamp(t)) }

// SetReadDeadline implements net.Conn, within the grace of a connection
// over a cap.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.clamp(t)) }

// SetWriteDeadline implements net.Conn, within the grace of a connection
// over a cap.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.clamp(t)) }

// OverCap is the cap the connection is over (ReasonTotal or
// ReasonPerClient), or "" when it is within the caps.
func (c *Conn) OverCap() string { return c.over }

// Close closes the connection and counts it out, once.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.client) })
	return err
}

type overCapKey struct{}

// WithConn is an http.Server ConnContext: it records in ctx whether the
// connection is over a cap, for OverCap.
func WithConn(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*Conn); ok && lc.over != "" {
		return context.WithValue(ctx, overCapKey{}, lc.over)
	}
	return ctx
}

// OverCap is the cap the request's connection is over, or "" (a request
// of a connection within the caps, or of a server without a Listener).
func OverCap(ctx context.Context) string {
	s, _ := ctx.Value(overCapKey{}).(string)
	return s
}

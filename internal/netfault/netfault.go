// Package netfault is a loopback TCP proxy that a test, or `agenthost
// bench chaos`, can cut off from its upstream as a network partition
// would: Blackhole stops every byte in both directions, on the
// connections already open and on the ones accepted meanwhile, without
// answering and without closing anything, so that a client sees its
// requests go unanswered until its own timeouts fire (not a refused
// connection, nor a reset, which it would notice at once). Heal lets the
// traffic through again: what was held is delivered then, as TCP
// retransmits what a partition swallowed, and a connection that one side
// closed meanwhile is closed on the other side then.
//
//	p, err := netfault.Listen("unix", "/tmp/pg/sock/.s.PGSQL.5432")
//	if err != nil { … }
//	defer p.Close()
//	// point the client at p.Addr() (127.0.0.1:port)
//	p.Blackhole() // the partition begins
//	p.Heal()      // and ends
//
// It imports no testing, and is safe for concurrent use.
package netfault

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// dialTimeout bounds the dial of the upstream for one accepted
// connection. A client whose upstream cannot be reached sees its
// connection closed, as it would see the upstream refuse it.
const dialTimeout = 10 * time.Second

// Proxy forwards each TCP connection it accepts on 127.0.0.1 to its
// upstream, byte for byte, while it is not blackholed.
type Proxy struct {
	ln                net.Listener
	network, upstream string

	mu     sync.Mutex
	gate   chan struct{} // closed while the traffic flows; open (blocking) while blackholed
	closed bool
	conns  map[net.Conn]struct{} // every connection, accepted or dialled, until it closes
	done   chan struct{}         // closed by Close
	wg     sync.WaitGroup

	accepted, held int64
}

// Listen starts a proxy on a free port of 127.0.0.1 that forwards to
// upstream on network ("tcp" or "unix"), dialled anew for each
// connection it accepts.
func Listen(network, upstream string) (*Proxy, error) {
	switch network {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		return nil, fmt.Errorf("netfault: upstream network %q: want tcp or unix", network)
	}
	if upstream == "" {
		return nil, errors.New("netfault: the upstream address is empty")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listening on 127.0.0.1: %w", err)
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{ln: ln, network: network, upstream: upstream, gate: gate, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream is where the proxy forwards to, as network and address.
func (p *Proxy) Upstream() (network, address string) { return p.network, p.upstream }

// Blackhole begins a partition: from now on no byte passes in either
// direction, on any connection, and a connection accepted meanwhile is
// neither forwarded nor refused. Nothing is closed. A second call does
// nothing more.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // blackholed already
	}
}

// Heal ends a partition: what was held passes, and the connections
// accepted meanwhile are forwarded now. A call while none lasts does
// nothing.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Blackholed reports whether a partition lasts.
func (p *Proxy) Blackholed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		return false
	default:
		return true
	}
}

// Stats are what a proxy has done: the connections it accepted, and the
// times a connection's traffic was held up by a partition (a read or
// write, or a connection waiting to be forwarded).
type Stats struct {
	Accepted int64
	Held     int64
}

// Stats returns the proxy's counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Accepted: p.accepted, Held: p.held}
}

// Close stops the proxy: it stops accepting, closes every connection,
// held or not, and waits for its goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// pass waits until no partition lasts, and reports false when the proxy
// closed first. It counts a wait as a hold.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	gate := p.gate
	select {
	case <-gate:
		p.mu.Unlock()
		return true
	default:
		p.held++
	}
	p.mu.Unlock()
	select {
	case <-gate:
		return true
	case <-p.done:
		return false
	}
}

// track records a connection for Close, or closes it and reports false
// when the proxy closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		if !p.track(c) {
			return
		}
		p.mu.Lock()
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

// forward carries one client connection: it dials the upstream once no
// partition lasts, then copies both ways until either side ends, and
// closes both.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if !p.pass() {
		return
	}
	up, err := net.DialTimeout(p.network, p.upstream, dialTimeout)
	if err != nil || !p.track(up) {
		return
	}
	defer p.untrack(up)
	ended := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		p.copy(dst, src)
		// Either side's end ends the connection: close both, so that
		// the other copy returns too.
		_ = dst.Close()
		_ = src.Close()
		ended <- struct{}{}
	}
	go copyHalf(up, client)
	go copyHalf(client, up)
	<-ended
	<-ended
}

// copy copies src to dst until src ends or fails, or dst fails. While a
// partition lasts it holds what it read, the end of src included (a
// close, on either side, is not seen across a partition either), and
// reads no more, so that the sender's own buffers fill, as over a
// partitioned network.
func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

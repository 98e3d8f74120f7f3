package netfault

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// upstream is a TCP server that echoes what it reads, and keeps each
// connection it accepted, for the test to look at from its side.
type upstream struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		u.wg.Wait()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, c := range u.conns {
			_ = c.Close()
		}
	})
	return u
}

func (u *upstream) accepted() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}

func (u *upstream) conn(i int) net.Conn {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.conns[i]
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // a condition poll's cadence
	}
}

// readN reads exactly len(want) bytes from c and checks them.
func readN(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading %q: %v", want, err)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// silent checks that nothing, neither a byte nor the connection's end,
// arrives on c for a while. It can only fail if something arrives: a
// slow machine makes it no less true.
func silent(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read %d bytes, err %v; want nothing across a partition", what, n, err)
	}
}

// A blackholed proxy is a partition: bytes sent either way are held, not
// answered, a connection made meanwhile is accepted but not forwarded,
// and a close on either side is not passed on; nothing is refused or
// closed. Once it heals, what was held is delivered, the connection made
// meanwhile is forwarded, and the close is passed on.
func TestABlackholedProxyHoldsTheTrafficWithoutClosingAnythingUntilItHeals(t *testing.T) {
	up := newUpstream(t)
	p, err := Listen("tcp", up.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	a, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// The proxy dials the upstream for each connection on a goroutine of
	// its own: the second is made only once the first has arrived, so
	// that the upstream's first connection is a's.
	waitFor(t, "the first connection to reach the upstream", func() bool { return up.accepted() == 1 })
	closing, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both connections to reach the upstream", func() bool { return up.accepted() == 2 })
	upA, upClosing := up.conn(0), up.conn(1)
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	readN(t, upA, "hello")
	if _, err := upA.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	readN(t, a, "hi")

	p.Blackhole()
	if !p.Blackholed() {
		t.Fatal("Blackholed is false after Blackhole")
	}
	// Both ways are held.
	if _, err := a.Write([]byte("lost?")); err != nil {
		t.Fatalf("a write across the partition failed at once: %v", err)
	}
	if _, err := upA.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	silent(t, upA, "the upstream, after the client wrote")
	silent(t, a, "the client, after the upstream wrote")
	// A new connection is accepted, not refused, and not forwarded.
	b, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("a connection across the partition was refused: %v", err)
	}
	defer b.Close()
	if _, err := b.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	silent(t, b, "a connection made during the partition")
	if n := up.accepted(); n != 2 {
		t.Fatalf("the upstream accepted %d connections during the partition, want none more than the 2 before", n)
	}
	// A close is not passed on.
	_ = closing.Close()
	silent(t, upClosing, "the upstream, after the client closed")
	if p.Stats().Held == 0 {
		t.Fatal("the proxy counted no traffic held")
	}

	p.Heal()
	if p.Blackholed() {
		t.Fatal("Blackholed is true after Heal")
	}
	readN(t, upA, "lost?")
	readN(t, a, "late")
	waitFor(t, "the connection made during the partition to reach the upstream", func() bool { return up.accepted() == 3 })
	readN(t, up.conn(2), "new")
	_ = upClosing.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := upClosing.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the upstream read %d bytes, err %v, after the heal; want the client's close", n, err)
	}

	// Close ends every connection.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = a.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection still works after Close")
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
}

// Listen says what is wrong with its arguments.
func TestListenRefusesABadUpstream(t *testing.T) {
	if _, err := Listen("udp", "127.0.0.1:1"); err == nil || err.Error() != `netfault: upstream network "udp": want tcp or unix` {
		t.Fatalf("udp upstream: %v", err)
	}
	if _, err := Listen("tcp", ""); err == nil {
		t.Fatal("an empty upstream was accepted")
	}
}

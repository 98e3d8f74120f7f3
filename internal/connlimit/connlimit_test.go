package connlimit_test

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/connlimit"
)

func TestResolveKeepsARoomForTheRestOfTheProcess(t *testing.T) {
	l, warn := connlimit.Resolve(0, 128, 1<<20)
	require.Empty(t, warn)
	require.Equal(t, connlimit.Limits{Max: connlimit.DefaultMax, PerClient: 128, Hard: 1<<20 - 128}, l)

	l, warn = connlimit.Resolve(0, 128, 256)
	require.Empty(t, warn)
	require.Equal(t, connlimit.Limits{Max: 96, PerClient: 96, Hard: 128}, l, "a small limit keeps half of it for the rest")

	l, warn = connlimit.Resolve(5000, 0, 1024)
	require.Contains(t, warn, "http.max_connections 5000")
	require.Contains(t, warn, "open-file limit 1024")
	require.Equal(t, connlimit.Limits{Max: 896, PerClient: 0, Hard: 896}, l)
}

// accepted serves l, handing each accepted connection to the channel.
func accepted(t *testing.T, l net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ch
}

func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func next(t *testing.T, ch <-chan net.Conn) *connlimit.Conn {
	t.Helper()
	select {
	case c := <-ch:
		return c.(*connlimit.Conn)
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

func TestListenerMarksTheConnectionsOverACapAndClosesThosePastTheHardOne(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	shed := map[string]int{}
	l := connlimit.NewListener(inner, connlimit.Limits{Max: 3, PerClient: 2, Hard: 4}, func(reason string) {
		mu.Lock()
		shed[reason]++
		mu.Unlock()
	})
	defer l.Close()
	ch := accepted(t, l)
	addr := inner.Addr().String()

	// Two connections from 127.0.0.2: within both caps.
	_ = dialFrom(t, "127.0.0.2", addr)
	a1 := next(t, ch)
	_ = dialFrom(t, "127.0.0.2", addr)
	a2 := next(t, ch)
	require.Empty(t, a1.OverCap())
	require.Empty(t, a2.OverCap())
	// A third from the same address is over the per-client cap.
	_ = dialFrom(t, "127.0.0.2", addr)
	a3 := next(t, ch)
	require.Equal(t, connlimit.ReasonPerClient, a3.OverCap())
	// One from another address: the server holds Max (3) already.
	_ = dialFrom(t, "127.0.0.3", addr)
	b1 := next(t, ch)
	require.Equal(t, connlimit.ReasonTotal, b1.OverCap())
	total, from := l.Open(netip.MustParseAddr("127.0.0.2"))
	require.Equal(t, 4, total)
	require.Equal(t, 3, from)

	// The fifth is past the hard cap: closed at accept, never handed out.
	c5 := dialFrom(t, "127.0.0.4", addr)
	require.NoError(t, c5.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c5.Read(make([]byte, 1))
	require.Error(t, err, "the connection past the hard cap must be closed by the server")
	require.False(t, strings.Contains(err.Error(), "timeout"), "closed, not left open: %v", err)

	// Closing counts out, once, however often Close is called.
	require.NoError(t, a1.Close())
	_ = a1.Close()
	require.NoError(t, b1.Close())
	total, from = l.Open(netip.MustParseAddr("127.0.0.2"))
	require.Equal(t, 2, total)
	require.Equal(t, 2, from)
	_ = dialFrom(t, "127.0.0.3", addr)
	require.Empty(t, next(t, ch).OverCap(), "a connection within the caps again once others closed")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{connlimit.ReasonPerClient: 1, connlimit.ReasonTotal: 1, connlimit.ReasonHard: 1}, shed)
}

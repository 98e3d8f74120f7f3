package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/console"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/runtime"
)

// chunked is a JSON body in the chunked coding, in one chunk.
var chunked = fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(`{"input": "smuggle"}`), `{"input": "smuggle"}`)

// RFC 9112 §6.1: a request with both Content-Length and
// Transfer-Encoding may be an attempt at request smuggling, and the
// server must close the connection after answering it. The bytes after
// its chunked body, which a proxy going by the Content-Length would have
// sent as a request of their own, must never be answered as one.
func TestContentLengthWithTransferEncodingClosesTheConnection(t *testing.T) {
	e := newEnv(t)
	smuggled := "GET /v1/whoami HTTP/1.1\r\nHost: agenthost\r\nAuthorization: Bearer " + tokenGlobex + "\r\n\r\n"
	for name, first := range map[string]string{
		// The handler reads the body (a submission with a valid token).
		"a submission": "POST /v1/sessions/s1/runs HTTP/1.1\r\nHost: agenthost\r\nAuthorization: Bearer " + tokenAcme +
			"\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
		// The handler leaves the body to net/http, which reads it to
		// reuse the connection.
		"a health check": "GET /healthz HTTP/1.1\r\nHost: agenthost\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", e.ts.Listener.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			_, err = io.WriteString(c, first+smuggled)
			require.NoError(t, err)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !resp.Close {
				t.Errorf("the answer (%d) must say Connection: close; headers %v", resp.StatusCode, resp.Header)
			}
			second, err := http.ReadResponse(br, nil)
			if err == nil {
				b, _ := io.ReadAll(second.Body)
				t.Fatalf("the bytes after the chunked body were answered as a request of their own: %d %s", second.StatusCode, b)
			}
			require.NotContains(t, err.Error(), "timeout", "the server must close the connection, not leave it open")
		})
	}

	// A request with a Content-Length only keeps its connection.
	c, err := net.Dial("tcp", e.ts.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agenthost\r\nContent-Length: 2\r\n\r\n{}"+smuggled)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	br := bufio.NewReader(c)
	for _, want := range []int{http.StatusOK, http.StatusOK} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode)
		require.False(t, resp.Close)
	}
}

// The console's security headers are on every answer to a path of the
// console, the ones the server's routing gives before the console's
// handler runs included: the redirects that clean the path and the 405s.
func TestConsoleRedirectsAnd405sCarrySecurityHeaders(t *testing.T) {
	e := newEnv(t)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/console", http.StatusMovedPermanently},
		{"GET", "/console//js/app.js", http.StatusMovedPermanently},
		{"GET", "/console/./js/../index.html", http.StatusMovedPermanently},
		{"POST", "/console/", http.StatusMethodNotAllowed},
		{"DELETE", "/console/js/app.js", http.StatusMethodNotAllowed},
		{"PUT", "/console", http.StatusMethodNotAllowed},
	} {
		// The path goes on the wire as it is: http.NewRequest would clean
		// nothing, but a URL's String could.
		req, err := http.NewRequest(tc.method, e.ts.URL, nil)
		require.NoError(t, err)
		req.URL.Opaque = tc.path
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		what := tc.method + " " + tc.path
		if tc.status == http.StatusMovedPermanently {
			require.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect}, resp.StatusCode, what)
		} else {
			require.Equal(t, tc.status, resp.StatusCode, what)
		}
		require.Equal(t, console.ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), what)
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), what)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), what)
		require.Equal(t, "no-referrer", resp.Header.Get("Referrer-Policy"), what)
		require.Equal(t, "same-origin", resp.Header.Get("Cross-Origin-Opener-Policy"), what)
	}
	// The API's own answers do not take the console's policy.
	r := e.do("GET", "/healthz", "", "")
	require.Equal(t, http.StatusOK, r.Status)
	require.Empty(t, r.Header.Get("Content-Security-Policy"))
}

// The rate of requests without a valid token counts an IPv6 /64 as one
// client: a host that sends each request from another address of its
// /64 gets no fresh bucket for each.
func TestTheUnauthenticatedRateCountsAnIPv6Slash64AsOneClient(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) {
		c.UnauthenticatedRate = httpapi.Rate{PerSecond: slowRefill, Burst: 2}
	})
	h := e.srv.Handler()
	status := func(remote string) int {
		req := httptest.NewRequest("GET", "/v1/runs/r1", nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for i := 1; i <= 2; i++ {
		require.Equal(t, http.StatusUnauthorized, status(fmt.Sprintf("[2001:db8:1:2::%x]:4000%d", i, i)))
	}
	require.Equal(t, http.StatusTooManyRequests, status("[2001:db8:1:2:ffff::1]:40003"), "a third address of the same /64 shares its bucket")
	require.Equal(t, http.StatusUnauthorized, status("[2001:db8:1:3::1]:40004"), "another /64 has a bucket of its own")
	require.Equal(t, http.StatusUnauthorized, status("192.0.2.1:40005"))
}

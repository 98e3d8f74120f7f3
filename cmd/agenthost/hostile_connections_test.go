package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// TestIdleUnauthenticatedConnectionsCannotShutTenantsOut is issue 33's
// finding, at a smaller scale: clients without a token open as many
// connections as the server serves, from four addresses, each within the
// per-client cap, send one GET /healthz on each and leave them idle.
// Before, every tenant request then answered 503 overloaded until the
// idle timeout. Now connections without a valid token hold only their
// share of http.max_connections (half, by default), the flood's
// connections past it are answered and closed, and a tenant's requests,
// each on a new connection, are served while the flood still holds its
// share. The unauthenticated idle timeout is off here, so that the flood
// stays for the whole test and only the share lets the tenant in.
func TestIdleUnauthenticatedConnectionsCannotShutTenantsOut(t *testing.T) {
	conformance.SkipInShort(t, "hostile clients waiting out serve's timeouts")
	const maxConns = 24
	_, addr := lowFileLimitServe(t, fmt.Sprintf("http: {max_connections: %d, idle_timeout: 60s, unauthenticated_idle_timeout: 0}\n", maxConns))
	var flood []net.Conn
	for a := 2; a <= 5; a++ {
		for i := 0; i < maxConns/4; i++ {
			cn := dialFrom(t, fmt.Sprintf("127.0.0.%d", a), addr)
			if _, err := io.WriteString(cn, "GET /healthz HTTP/1.1\r\nHost: agenthost\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			if st, err := readStatus(cn); err != nil || st != http.StatusOK {
				t.Fatalf("flood connection %d from 127.0.0.%d: healthz answered %d %v", i, a, st, err)
			}
			flood = append(flood, cn)
		}
	}

	// The tenant, from 127.0.0.1, a new connection for each request.
	tenant := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	refused := 0
	for i := 0; i < 10; i++ {
		req, err := http.NewRequest("GET", "http://"+addr+"/v1/whoami", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer hostile-token")
		resp, err := tenant.Do(req)
		if err != nil {
			t.Fatalf("tenant request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			refused++
			t.Logf("tenant request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if refused > 0 {
		t.Fatalf("%d of 10 tenant requests were refused while idle connections without a token held the server; want all served", refused)
	}

	// The flood still holds its share, no more: those of its connections
	// still open answer another health check.
	held := 0
	for _, cn := range flood {
		if _, err := io.WriteString(cn, "GET /healthz HTTP/1.1\r\nHost: agenthost\r\n\r\n"); err != nil {
			continue
		}
		if st, err := readStatus(cn); err == nil && st == http.StatusOK {
			held++
		}
	}
	if held == 0 || held > maxConns/2 {
		t.Fatalf("the flood holds %d connections after the tenant's requests; want some, and at most the share of connections without a token (%d)", held, maxConns/2)
	}
	t.Logf("the flood held %d connections of the %d the server serves while the tenant was served", held, maxConns)
}

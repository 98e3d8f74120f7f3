package host

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// TestAGatedClientKeepsPluginsRules: the client of NewGatedClient reaches
// an address listed literally, refuses a name that resolves to loopback
// (IsRefusedAddress) and a redirect to a host off the list
// (IsDeniedHost), as agenthost_http does.
func TestAGatedClientKeepsPluginsRules(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/away" {
			http.Redirect(w, r, "http://elsewhere.example.com/", http.StatusFound)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	lookup := func(context.Context, string, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	c, err := NewGatedClient(GatedClientOptions{AllowedHosts: []string{"127.0.0.1:" + port, "tools.example.com:" + port}, LookupIP: lookup})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatalf("the literal address: %v", err)
	}
	resp.Body.Close()
	if _, err := c.Get("http://tools.example.com:" + port + "/"); !IsRefusedAddress(err) {
		t.Fatalf("a name resolving to loopback: %v, want refused", err)
	}
	if _, err := c.Get(srv.URL + "/away"); !IsDeniedHost(err) || IsRefusedAddress(err) {
		t.Fatalf("a redirect off the list: %v, want denied", err)
	}
	if IsRefusedAddress(errors.New("x")) || IsDeniedHost(nil) {
		t.Fatal("an unrelated error reads as a refusal")
	}
}

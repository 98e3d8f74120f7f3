package config

import (
	"strings"
	"testing"
	"time"
)

// The settings that keep unauthenticated connections from shutting the
// tenants out (issue 33): their defaults, their values, and a prefix too
// short to name one IPv6 client refused with what to set.
func TestUnauthenticatedConnectionSettings(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.HTTP; h.MaxUnauthenticatedConnections != 0 || h.UnauthenticatedIdleTimeout != 5*time.Second || h.IPv6ClientPrefix != 64 {
		t.Errorf("defaults: max_unauthenticated_connections %d, unauthenticated_idle_timeout %s, ipv6_client_prefix %d; want 0 (half of max_connections), 5s, 64",
			h.MaxUnauthenticatedConnections, h.UnauthenticatedIdleTimeout, h.IPv6ClientPrefix)
	}

	cfg, err = parse(t, minimal+`
http:
  max_unauthenticated_connections: 100
  unauthenticated_idle_timeout: 0
  ipv6_client_prefix: 128
`)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.HTTP; h.MaxUnauthenticatedConnections != 100 || h.UnauthenticatedIdleTimeout != 0 || h.IPv6ClientPrefix != 128 {
		t.Errorf("set: %+v", h)
	}

	for yaml, want := range map[string]string{
		"http: {ipv6_client_prefix: 8}\n":               "http.ipv6_client_prefix: 8 is too short a prefix",
		"http: {ipv6_client_prefix: 129}\n":             "http.ipv6_client_prefix",
		"http: {max_unauthenticated_connections: -1}\n": "http.max_unauthenticated_connections",
	} {
		_, err := parse(t, minimal+yaml)
		if err == nil {
			t.Errorf("%q: no problem", yaml)
			continue
		}
		if text := strings.Join(problems(t, err), "\n"); !strings.Contains(text, want) {
			t.Errorf("%q: no problem says %q; got:\n%s", yaml, want, text)
		}
	}
}

package host

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"time"
)

// GatedClientOptions configures NewGatedClient.
type GatedClientOptions struct {
	// AllowedHosts are the destinations the client may reach, in the
	// syntax of Sandbox.AllowedHosts.
	AllowedHosts []string
	// DialTimeout bounds a connection's dial and TLS handshake (default
	// DefaultHTTPTimeout). Requests themselves are bounded by their
	// contexts only, so that a long response (a stream of events) can
	// last.
	DialTimeout time.Duration
	// MaxResponseHeaderBytes bounds a response's status line and headers
	// (default DefaultMaxHTTPResponseHeaderBytes).
	MaxResponseHeaderBytes int64
	// MaxRedirects bounds the redirects one request follows (default
	// DefaultMaxHTTPRedirects).
	MaxRedirects int
	// LookupIP resolves a host name; nil is the system's resolver.
	LookupIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// NewGatedClient returns an HTTP client behind the gate of agenthost_http
// (httpGate): it reaches only the allowed hosts, checks every redirect,
// dials a host name only at addresses on the public internet (an address
// listed literally, and named so by the URL, reaches loopback or a
// private network), resolves names itself against DNS rebinding, and
// never goes through a proxy. The host's own outbound connections that
// the plugins' rules bind use it: the MCP servers' streamable HTTP.
// Bounding a response's body is the caller's.
func NewGatedClient(o GatedClientOptions) (*http.Client, error) {
	s := Sandbox{
		AllowedHosts: o.AllowedHosts, HTTPTimeout: o.DialTimeout,
		MaxHTTPResponseHeaderBytes: o.MaxResponseHeaderBytes, MaxHTTPRedirects: o.MaxRedirects,
		lookupIP: o.LookupIP,
	}.withDefaults()
	g, err := newHTTPGate(s)
	if err != nil {
		return nil, err
	}
	// A request's context bounds it; the gate's timeout stays on the dial
	// and the TLS handshake.
	g.transport.ResponseHeaderTimeout = 0
	return g.client, nil
}

// IsRefusedAddress reports whether err (from a client of NewGatedClient)
// is a dial the gate refused because the host name resolved to an address
// a name never reaches (loopback, private, link-local, …).
func IsRefusedAddress(err error) bool {
	var f *dialFailure
	return errors.As(err, &f) && f.refused
}

// IsDeniedHost reports whether err (from a client of NewGatedClient) is a
// request or redirect to a destination outside the allowed hosts.
func IsDeniedHost(err error) bool {
	var d *errDenied
	return errors.As(err, &d)
}

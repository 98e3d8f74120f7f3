package httpapi

import (
	"net/http"
	"net/netip"

	"github.com/agenthost/agenthost/internal/connlimit"
)

// guardConnection applies, before any route, the rules that belong to
// the request's connection rather than to the route:
//
//   - A request with a chunked body is the last of its connection. RFC
//     9112 §6.1: a request with both Transfer-Encoding and Content-Length
//     may be an attempt at request smuggling (a proxy in front that goes
//     by the Content-Length would send the bytes after the chunked body
//     as a request of its own), and the server must close the connection
//     after answering it. net/http drops the Content-Length of a chunked
//     request before a handler sees it, so every chunked request is
//     closed: the bytes after its body are never read as a request.
//   - A request with a valid token tells connlimit so, the first time on
//     its connection: the connection leaves the share of the connections
//     without a token, and its mark, if only the share or
//     http.max_connections was taken, is lifted when there is room
//     (connlimit.Conn.Authenticated).
//   - A connection still marked over the share of the connections
//     without a token is answered 503 overloaded and closed (/healthz is
//     served as usual, then closed, by shedOverCap).
func (s *Server) guardConnection(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		ctx := r.Context()
		if connlimit.Unauthenticated(ctx) {
			if _, ok := s.authenticate(r); ok {
				connlimit.Authenticated(ctx)
			}
		}
		if connlimit.OverCap(ctx) == connlimit.ReasonUnauthenticated && r.URL.Path != "/healthz" {
			closeWithoutBody(w, r)
			e := errorf(http.StatusServiceUnavailable, CodeOverloaded,
				"the server holds as many connections without a valid token as it serves (http.max_unauthenticated_connections); this connection is closed: send your token with the request, reuse a connection that carried it, or retry after the Retry-After delay")
			e.RetryAfter = s.cfg.RetryAfter
			writeAPIError(w, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clientKey is the client a request counts as for the unauthenticated
// rate: its connection's client as connlimit counts it (an IPv6 address
// by its prefix, http.ipv6_client_prefix), or, on a server without a
// connlimit.Listener, its remote address with IPv6 grouped by
// connlimit.DefaultIPv6ClientPrefix.
func clientKey(r *http.Request) netip.Addr {
	if c, ok := connlimit.ClientOf(r.Context()); ok {
		return c
	}
	return connlimit.ClientKey(clientIP(r.RemoteAddr), connlimit.DefaultIPv6ClientPrefix)
}

package host

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agenthost/agenthost/plugins/abi"
)

// httpGate is one plugin's agenthost_http: an HTTP client that reaches only
// the plugin's allowed hosts, and through a host name only addresses on the
// public internet. The list is checked on the request, on every redirect
// (CheckRedirect) and again at the dial (dial), which resolves the name
// itself, checks every address it got and connects to a checked one, so
// that no other answer of the resolver (DNS rebinding) comes in between. It
// never uses the environment's proxies.
type httpGate struct {
	allowed        []hostRule
	timeout        time.Duration
	maxBytes       int64
	maxHeaderBytes int64
	maxRedirects   int
	lookupIP       func(ctx context.Context, network, host string) ([]netip.Addr, error)
	dialer         *net.Dialer
	client         *http.Client
	transport      *http.Transport

	denied  atomic.Int64 // requests refused for a host or port off the list
	refused atomic.Int64 // dials refused for the address a name resolved to
}

// hostRule is one allowed-hosts entry: a name, a wildcard or a literal
// address, with one port or, when it names none, ports 80 and 443.
type hostRule struct {
	name     string     // lower case, no trailing dot; ".suffix" for a wildcard; "" for an address
	addr     netip.Addr // a literal entry's address, unmapped; invalid for a name
	port     uint16     // 0 for ports 80 and 443
	wildcard bool
}

func (r hostRule) allowsPort(port uint16) bool {
	if r.port == 0 {
		return port == 80 || port == 443
	}
	return port == r.port
}

// errDenied marks a destination outside the allowed hosts.
type errDenied struct{ host string }

func (e *errDenied) Error() string {
	return fmt.Sprintf("host %q is not in the plugin's allowed hosts", e.host)
}

// errTooManyRedirects ends a request that redirects more than the limit.
type errTooManyRedirects struct{ limit int }

func (e *errTooManyRedirects) Error() string {
	return fmt.Sprintf("stopped after %d redirects", e.limit)
}

// dialFailure is a dial that did not connect: the name did not resolve,
// resolved to a refused address, or no address answered. Its text names
// addresses and the resolver's error, so it goes to the server's log
// only; the plugin gets the one message of notConnected.
type dialFailure struct {
	refused bool // a name resolved to an address refusedReason refuses
	err     error
}

func (e *dialFailure) Error() string { return e.err.Error() }
func (e *dialFailure) Unwrap() error { return e.err }

func parseHostRules(entries []string) ([]hostRule, error) {
	rules := make([]hostRule, 0, len(entries))
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		var r hostRule
		host := e
		if h, p, err := net.SplitHostPort(e); err == nil {
			n, perr := strconv.ParseUint(p, 10, 16)
			if perr != nil || n == 0 {
				return nil, fmt.Errorf("allowed host %q: port %q is not a number from 1 to 65535", e, p)
			}
			host, r.port = h, uint16(n)
		} else if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
			host = e[1 : len(e)-1] // "[::1]": an IPv6 address without a port
		}
		if a, err := netip.ParseAddr(host); err == nil {
			r.addr = a.Unmap()
			rules = append(rules, r)
			continue
		}
		if strings.HasPrefix(host, "*.") {
			r.wildcard = true
			host = host[1:] // ".example.com"
		}
		r.name = strings.TrimSuffix(host, ".")
		if r.name == "" || r.name == "." || strings.ContainsAny(r.name, "/*@ []%:") {
			return nil, fmt.Errorf("allowed host %q is not a host name, a *.domain wildcard or an IP address, each optionally with :port (an IPv6 address with a port in brackets: [::1]:8080)", e)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// allows reports whether host:port is on the list. An IP address matches
// only a literal entry of the same address (an IPv4-mapped IPv6 form is
// the IPv4 address), a name only name and wildcard entries.
func (g *httpGate) allows(host, port string) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return false
	}
	p := uint16(n)
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		for _, r := range g.allowed {
			if r.addr.IsValid() && r.addr == a && r.allowsPort(p) {
				return true
			}
		}
		return false
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, r := range g.allowed {
		if r.name == "" || !r.allowsPort(p) {
			continue
		}
		if r.wildcard {
			if strings.HasSuffix(host, r.name) && len(host) > len(r.name) {
				return true
			}
			continue
		}
		if host == r.name {
			return true
		}
	}
	return false
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

func newHTTPGate(s Sandbox) (*httpGate, error) {
	rules, err := parseHostRules(s.AllowedHosts)
	if err != nil {
		return nil, err
	}
	g := &httpGate{
		allowed:        rules,
		timeout:        s.HTTPTimeout,
		maxBytes:       s.MaxHTTPResponseBytes,
		maxHeaderBytes: s.MaxHTTPResponseHeaderBytes,
		maxRedirects:   s.MaxHTTPRedirects,
		lookupIP:       s.lookupIP,
		dialer:         &net.Dialer{Timeout: s.HTTPTimeout, Control: dialControl},
	}
	if g.lookupIP == nil {
		g.lookupIP = net.DefaultResolver.LookupNetIP
	}
	g.transport = &http.Transport{
		Proxy:                  nil, // never through a proxy: the dialled address is the destination
		DialContext:            g.dial,
		TLSHandshakeTimeout:    s.HTTPTimeout,
		ResponseHeaderTimeout:  s.HTTPTimeout,
		MaxResponseHeaderBytes: s.MaxHTTPResponseHeaderBytes,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        30 * time.Second,
	}
	g.client = &http.Client{
		Transport: g.transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > g.maxRedirects {
				return &errTooManyRedirects{limit: g.maxRedirects}
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return &errDenied{host: req.URL.Host}
			}
			port := req.URL.Port()
			if port == "" {
				port = defaultPort(req.URL.Scheme)
			}
			if !g.allows(req.URL.Hostname(), port) {
				return &errDenied{host: req.URL.Hostname()}
			}
			return nil
		},
	}
	return g, nil
}

// dial is the transport's DialContext; addr is the URL's host:port, as
// proxies are off. A literal address on the list is dialled as it is. A
// name is resolved here and dialled only if every address it resolved to
// is public (refusedReason), at one of those addresses: a name entry never
// reaches loopback, a private range or the cloud metadata address,
// whatever the resolver answers.
func (g *httpGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if !g.allows(host, port) {
		return nil, &errDenied{host: host}
	}
	n, _ := strconv.ParseUint(port, 10, 16) // allows parsed it
	// The transport detaches a dial from the request's deadline (it may
	// serve a later request); the gate's timeout bounds it instead.
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if a, err := netip.ParseAddr(host); err == nil {
		return g.connect(ctx, network, host, []netip.Addr{a}, uint16(n))
	}
	ips, err := g.lookupIP(ctx, ipNetwork(network), host)
	if err == nil && len(ips) == 0 {
		err = errors.New("no addresses")
	}
	if err != nil {
		return nil, &dialFailure{err: fmt.Errorf("resolving %s: %w", host, err)}
	}
	for _, ip := range ips {
		if why := refusedReason(ip); why != "" {
			g.refused.Add(1)
			return nil, &dialFailure{refused: true, err: fmt.Errorf(
				"%s resolved to %s, which is %s: a name in allowed_hosts never reaches such an address (all addresses: %v); to reach it, list the address with its port and have the plugin use the address in its URL",
				host, ip, why, ips)}
		}
	}
	return g.connect(ctx, network, host, ips, uint16(n))
}

// testHookDial, when set (by this package's tests), sees every address
// the gate is about to connect to, whichever path led there, and may
// refuse it: the tests refuse everything outside loopback, so that a
// broken gate can never make them reach another machine.
var testHookDial func(network, address string) error

// dialControl is the gate's net.Dialer Control: it runs the test hook.
func dialControl(network, address string, _ syscall.RawConn) error {
	if testHookDial != nil {
		return testHookDial(network, address)
	}
	return nil
}

// connect dials the checked addresses in turn, each with its share of the
// time left, as net.Dialer does with the addresses it resolves.
func (g *httpGate) connect(ctx context.Context, network, host string, ips []netip.Addr, port uint16) (net.Conn, error) {
	var errs []error
	for i, ip := range ips {
		attempt, cancel := ctx, context.CancelFunc(func() {})
		if left := len(ips) - i; left > 1 {
			attempt, cancel = context.WithDeadline(ctx, partialDeadline(ctx, left))
		}
		c, err := g.dialer.DialContext(attempt, network, netip.AddrPortFrom(ip.Unmap(), port).String())
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, &dialFailure{err: fmt.Errorf("connecting to %s: %w", host, errors.Join(errs...))}
}

// partialDeadline gives one of left addresses its share of the time to the
// context's deadline, but at least 2s while there is that much.
func partialDeadline(ctx context.Context, left int) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(2 * time.Second)
	}
	remaining := time.Until(deadline)
	share := remaining / time.Duration(left)
	if share < 2*time.Second {
		share = min(2*time.Second, remaining)
	}
	return time.Now().Add(share)
}

// ipNetwork is the resolver's network for a dial's.
func ipNetwork(network string) string {
	switch network {
	case "tcp4":
		return "ip4"
	case "tcp6":
		return "ip6"
	}
	return "ip"
}

func (g *httpGate) close() { g.transport.CloseIdleConnections() }

// HTTPStats counts a plugin's agenthost_http refusals.
type HTTPStats struct {
	Denied  int64 // requests to a host or port not in the allowed hosts
	Refused int64 // dials refused for the address a host name resolved to
}

// HTTPStats returns the plugin's agenthost_http counters, over every
// tenant.
func (p *Plugin) HTTPStats() HTTPStats {
	return HTTPStats{Denied: p.http.denied.Load(), Refused: p.http.refused.Load()}
}

// hop follows the connection of a request's latest hop (the request, then
// each redirect), through httptrace: a request that fails before its hop
// got a connection failed in the dial.
type hop struct {
	mu        sync.Mutex
	dest      string // host:port
	connected bool
}

func (h *hop) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GetConn: func(hostPort string) {
			h.mu.Lock()
			h.dest, h.connected = hostPort, false
			h.mu.Unlock()
		},
		GotConn: func(httptrace.GotConnInfo) {
			h.mu.Lock()
			h.connected = true
			h.mu.Unlock()
		},
	}
}

func (h *hop) state() (dest string, connected bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dest, h.connected
}

// httpFailure is the error of a request the gate refused or that failed.
func httpFailure(code, msg string) *abi.HTTPError {
	return &abi.HTTPError{Code: code, Message: msg}
}

// requestTimeout is the bound of req: its timeout_ms, capped by the
// gate's timeout; 0 takes the gate's.
func (g *httpGate) requestTimeout(req abi.HTTPRequest) time.Duration {
	if req.TimeoutMS > 0 && time.Duration(req.TimeoutMS)*time.Millisecond < g.timeout {
		return time.Duration(req.TimeoutMS) * time.Millisecond
	}
	return g.timeout
}

// do performs one request and buffers its body (agenthost_http); a
// refusal or failure comes back in the response's error, never as a trap.
func (g *httpGate) do(ctx context.Context, s *callScope, req abi.HTTPRequest) abi.HTTPResponse {
	timeout := g.requestTimeout(req)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, dest, failure := g.send(ctx, s, req, timeout)
	if failure != nil {
		return abi.HTTPResponse{Error: failure}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, g.maxBytes+1))
	if err != nil {
		return abi.HTTPResponse{Error: g.bodyFailure(ctx, s, dest, err, fmt.Sprintf("response body not read within %s", timeout))}
	}
	if int64(len(b)) > g.maxBytes {
		return abi.HTTPResponse{Error: g.bodyTooLarge()}
	}
	out := abi.HTTPResponse{Status: resp.StatusCode, Headers: responseHeaders(resp)}
	if utf8.Valid(b) {
		out.Body = string(b)
	} else {
		out.BodyBase64 = base64.StdEncoding.EncodeToString(b)
	}
	return out
}

// send sends req under ctx, which bounds it, and returns the response
// once its head has come, with the destination of its last hop; the
// caller reads and closes the body. Both agenthost_http and
// agenthost_http_open go through it: the allow-list on the URL, the
// redirects (CheckRedirect) and the dial (dial), the header limit and
// the answers of a refused or failed request are the same for both.
// timeout is the request's bound, for the message of a timeout; a
// context that ends with the cause context.DeadlineExceeded is one.
func (g *httpGate) send(ctx context.Context, s *callScope, req abi.HTTPRequest, timeout time.Duration) (*http.Response, string, *abi.HTTPError) {
	u, err := parseURL(req.URL)
	if err != nil {
		return nil, "", httpFailure(abi.HTTPFailed, err.Error())
	}
	port := u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	if !g.allows(u.Hostname(), port) {
		return nil, "", g.deniedResponse(s, &errDenied{host: u.Hostname()})
	}
	h := &hop{dest: net.JoinHostPort(u.Hostname(), port)}
	traced := httptrace.WithClientTrace(ctx, h.trace())
	var body io.Reader
	switch {
	case req.BodyBase64 != "":
		b, err := base64.StdEncoding.DecodeString(req.BodyBase64)
		if err != nil {
			return nil, "", httpFailure(abi.HTTPFailed, "body_base64: "+err.Error())
		}
		body = bytes.NewReader(b)
	case req.Body != "":
		body = strings.NewReader(req.Body)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hr, err := http.NewRequestWithContext(traced, method, u.String(), body)
	if err != nil {
		return nil, "", httpFailure(abi.HTTPFailed, err.Error())
	}
	for k, v := range req.Headers {
		hr.Header.Set(k, v)
	}
	span := traceRequest(hr)
	resp, err := g.client.Do(hr)
	dest, connected := h.state()
	var failure *abi.HTTPError
	if err != nil {
		failure = g.sendFailure(ctx, s, err, dest, connected, timeout)
	}
	endRequestSpan(span, resp, dest, failure)
	if failure != nil {
		return nil, dest, failure
	}
	return resp, dest, nil
}

// sendFailure answers a request whose response did not come (send),
// from err of the client and the state of its last hop, dest.
func (g *httpGate) sendFailure(ctx context.Context, s *callScope, err error, dest string, connected bool, timeout time.Duration) *abi.HTTPError {
	var denied *errDenied
	var redirects *errTooManyRedirects
	switch {
	case errors.As(err, &denied):
		return g.deniedResponse(s, denied)
	case errors.As(err, &redirects):
		return httpFailure(abi.HTTPFailed, redirects.Error())
	case !connected:
		return g.notConnected(s, dest, err)
	case isHeaderTooLarge(err):
		return httpFailure(abi.HTTPTooLarge, fmt.Sprintf("response headers from %s are over the limit of %d bytes", dest, g.maxHeaderBytes))
	case timedOut(ctx, err):
		return httpFailure(abi.HTTPTimeout, fmt.Sprintf("no response within %s", timeout))
	}
	return g.brokenResponse(s, dest, err)
}

// responseHeaders are a response's headers as the ABI gives them: one
// value a name, the first.
func responseHeaders(resp *http.Response) map[string]string {
	out := make(map[string]string, len(resp.Header))
	for k := range resp.Header {
		out[k] = resp.Header.Get(k)
	}
	return out
}

// bodyFailure answers a response body that broke off before its end,
// read under ctx: timeout, with timeoutMsg, when the time ran out
// (timedOut), else as brokenResponse.
func (g *httpGate) bodyFailure(ctx context.Context, s *callScope, dest string, err error, timeoutMsg string) *abi.HTTPError {
	if timedOut(ctx, err) {
		return httpFailure(abi.HTTPTimeout, timeoutMsg)
	}
	return g.brokenResponse(s, dest, err)
}

// bodyTooLarge answers a response body over the limit.
func (g *httpGate) bodyTooLarge() *abi.HTTPError {
	return httpFailure(abi.HTTPTooLarge, fmt.Sprintf("response body is over the limit of %d bytes", g.maxBytes))
}

// deniedResponse answers a request to a host or port off the list. The
// list is the operator's, so saying so tells the plugin nothing about the
// network; the call records the refusal, and a plugin that then fails is
// classified plugin_denied.
func (g *httpGate) deniedResponse(s *callScope, denied *errDenied) *abi.HTTPError {
	g.denied.Add(1)
	s.deny("agenthost_http: " + denied.Error())
	return httpFailure(abi.HTTPDenied, denied.Error())
}

// notConnected answers a request whose hop got no connection: its name did
// not resolve, resolved to a refused address, no address answered in time,
// or TLS failed. The plugin gets one message for all of them, which names
// neither an address nor the resolver, so that it cannot map the network
// behind an allowed name; the server's log keeps the reason.
func (g *httpGate) notConnected(s *callScope, dest string, err error) *abi.HTTPError {
	var df *dialFailure
	if errors.As(err, &df) && df.refused {
		g.log(s, slog.LevelWarn, "agenthost_http refused the address a host name resolved to", dest, err)
	} else {
		g.log(s, slog.LevelInfo, "agenthost_http could not connect", dest, err)
	}
	return httpFailure(abi.HTTPFailed, fmt.Sprintf("the request to %s was not allowed or could not be made (the server's log says why)", dest))
}

// brokenResponse answers a request that failed after it connected: the
// server closed the connection or sent something that is not HTTP. Those
// errors name local addresses, so the reason goes to the log.
func (g *httpGate) brokenResponse(s *callScope, dest string, err error) *abi.HTTPError {
	g.log(s, slog.LevelInfo, "agenthost_http response failed", dest, err)
	return httpFailure(abi.HTTPFailed, fmt.Sprintf("the response from %s broke off or was not HTTP (the server's log says why)", dest))
}

func (g *httpGate) log(s *callScope, level slog.Level, msg, dest string, err error) {
	// The client's error spells the request's whole URL, which may carry
	// the plugin's secrets (a key in its query, a token in its path):
	// the log names the destination instead.
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err
	}
	logger, attrs := slog.Default(), []any{"destination", dest, "error", err.Error()}
	if s != nil && s.plugin != nil {
		logger = s.plugin.h.log
		attrs = append(attrs, "plugin", s.plugin.name, "tenant", s.tenant, "run", s.runID, "effect", s.effectID)
	}
	logger.Log(context.Background(), level, msg, attrs...)
}

// isHeaderTooLarge reports the transport's refusal of headers over
// MaxResponseHeaderBytes, which net/http reports with no error value of
// its own.
func isHeaderTooLarge(err error) bool {
	return err != nil && strings.Contains(err.Error(), "server response headers exceeded")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// timedOut reports whether err, a request's failure under ctx, is its
// time running out: ctx's deadline, a cause of context.DeadlineExceeded
// (a stream's bounds, httpstream.go), or a network timeout.
func timedOut(ctx context.Context, err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) || isTimeout(err)
}

func (h *Host) httpCall(ctx context.Context, s *callScope, m guestMemory, stack []uint64) {
	req, failure := readHTTPRequest(s, m, stack[0])
	resp := abi.HTTPResponse{Error: failure}
	if failure == nil {
		resp = s.plugin.http.do(ctx, s, req)
	}
	stack[0] = writeJSON(m, resp)
}

// readHTTPRequest reads the request of agenthost_http or
// agenthost_http_open from the block at off, and frees it; the error
// answers a request that cannot be sent.
func readHTTPRequest(s *callScope, m guestMemory, off uint64) (abi.HTTPRequest, *abi.HTTPError) {
	b, ok := readArg(m, off)
	var req abi.HTTPRequest
	switch {
	case s == nil:
		return req, httpFailure(abi.HTTPFailed, "no call scope")
	case !ok:
		return req, httpFailure(abi.HTTPFailed, "request not readable from the plugin's memory")
	case json.Unmarshal(b, &req) != nil:
		return req, httpFailure(abi.HTTPFailed, "request is not the JSON of docs/ABI.md")
	}
	return req, nil
}

// writeJSON writes v's JSON to the guest's memory and returns its
// offset, or 0 when there is no room.
func writeJSON(m guestMemory, v any) uint64 {
	out, _ := json.Marshal(v)
	off, ok := writeResult(m, out)
	if !ok {
		return 0
	}
	return off
}

func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url %q: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("url %q: scheme must be http or https", raw)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("url %q: no host", raw)
	}
	return u, nil
}

package host

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	extism "github.com/extism/go-sdk"

	"github.com/agenthost/agenthost/plugins/abi"
)

// httpGate is one plugin's agenthost_http: an HTTP client that reaches only
// the plugin's allowed hosts. The list is checked on the request, on every
// redirect (CheckRedirect) and on the address dialled (DialContext), so
// neither a redirect nor a proxy setting can take a request elsewhere. It
// never uses the environment's proxies.
type httpGate struct {
	allowed      []hostRule
	timeout      time.Duration
	maxBytes     int64
	maxRedirects int
	client       *http.Client
	transport    *http.Transport
}

// hostRule is one allowed-hosts entry.
type hostRule struct {
	host     string // lower case; "*.suffix" matches subdomains of suffix
	port     string // "" for any port
	wildcard bool
}

// errDenied marks a destination outside the allowed hosts.
type errDenied struct{ host string }

func (e *errDenied) Error() string {
	return fmt.Sprintf("host %q is not in the plugin's allowed hosts", e.host)
}

func parseHostRules(entries []string) ([]hostRule, error) {
	rules := make([]hostRule, 0, len(entries))
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		r := hostRule{host: e}
		if h, p, err := net.SplitHostPort(e); err == nil {
			if _, perr := strconv.ParseUint(p, 10, 16); perr != nil {
				return nil, fmt.Errorf("allowed host %q: port %q is not a number", e, p)
			}
			r.host, r.port = h, p
		}
		if strings.HasPrefix(r.host, "*.") {
			r.wildcard = true
			r.host = r.host[1:] // ".example.com"
		}
		if r.host == "" || strings.ContainsAny(r.host, "/*@ ") {
			return nil, fmt.Errorf("allowed host %q is not a host name, a *.domain wildcard or an IP, each optionally with :port", e)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// allows reports whether host:port is an allowed destination.
func (g *httpGate) allows(host, port string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, r := range g.allowed {
		if r.port != "" && r.port != port {
			continue
		}
		if r.wildcard {
			if strings.HasSuffix(host, r.host) && len(host) > len(r.host) {
				return true
			}
			continue
		}
		if host == r.host {
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
	g := &httpGate{allowed: rules, timeout: s.HTTPTimeout, maxBytes: s.MaxHTTPResponseBytes, maxRedirects: s.MaxHTTPRedirects}
	dialer := &net.Dialer{Timeout: s.HTTPTimeout}
	g.transport = &http.Transport{
		Proxy: nil, // never through a proxy: the dialled address is the destination
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if !g.allows(host, port) {
				return nil, &errDenied{host: host}
			}
			return dialer.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout:   s.HTTPTimeout,
		ResponseHeaderTimeout: s.HTTPTimeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       30 * time.Second,
	}
	g.client = &http.Client{
		Transport: g.transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > g.maxRedirects {
				return fmt.Errorf("stopped after %d redirects", g.maxRedirects)
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

func (g *httpGate) close() { g.transport.CloseIdleConnections() }

// do performs one request; a refusal or failure comes back in the
// response's error, never as a trap.
func (g *httpGate) do(ctx context.Context, s *callScope, req abi.HTTPRequest) abi.HTTPResponse {
	fail := func(code, msg string) abi.HTTPResponse {
		if code == abi.HTTPDenied {
			s.deny("agenthost_http: " + msg)
		}
		return abi.HTTPResponse{Error: &abi.HTTPError{Code: code, Message: msg}}
	}
	u, err := parseURL(req.URL)
	if err != nil {
		return fail(abi.HTTPFailed, err.Error())
	}
	port := u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	if !g.allows(u.Hostname(), port) {
		return fail(abi.HTTPDenied, (&errDenied{host: u.Hostname()}).Error())
	}
	timeout := g.timeout
	if req.TimeoutMS > 0 && time.Duration(req.TimeoutMS)*time.Millisecond < timeout {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	switch {
	case req.BodyBase64 != "":
		b, err := base64.StdEncoding.DecodeString(req.BodyBase64)
		if err != nil {
			return fail(abi.HTTPFailed, "body_base64: "+err.Error())
		}
		body = bytes.NewReader(b)
	case req.Body != "":
		body = strings.NewReader(req.Body)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hr, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fail(abi.HTTPFailed, err.Error())
	}
	for k, v := range req.Headers {
		hr.Header.Set(k, v)
	}
	resp, err := g.client.Do(hr)
	if err != nil {
		var denied *errDenied
		switch {
		case errors.As(err, &denied):
			return fail(abi.HTTPDenied, denied.Error())
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			return fail(abi.HTTPTimeout, fmt.Sprintf("no response within %s", timeout))
		}
		return fail(abi.HTTPFailed, err.Error())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, g.maxBytes+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return fail(abi.HTTPTimeout, fmt.Sprintf("response body not read within %s", timeout))
		}
		return fail(abi.HTTPFailed, err.Error())
	}
	if int64(len(b)) > g.maxBytes {
		return fail(abi.HTTPTooLarge, fmt.Sprintf("response body is over the limit of %d bytes", g.maxBytes))
	}
	out := abi.HTTPResponse{Status: resp.StatusCode, Headers: map[string]string{}}
	for k := range resp.Header {
		out.Headers[k] = resp.Header.Get(k)
	}
	if utf8.Valid(b) {
		out.Body = string(b)
	} else {
		out.BodyBase64 = base64.StdEncoding.EncodeToString(b)
	}
	return out
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (h *Host) httpCall(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
	s := scopeFrom(ctx)
	b, ok := readArg(ctx, p, stack[0])
	var resp abi.HTTPResponse
	var req abi.HTTPRequest
	switch {
	case s == nil:
		resp = abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "no call scope"}}
	case !ok:
		resp = abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "request not readable from the plugin's memory"}}
	case json.Unmarshal(b, &req) != nil:
		resp = abi.HTTPResponse{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: "request is not the JSON of docs/ABI.md"}}
	default:
		resp = s.plugin.http.do(ctx, s, req)
	}
	out, _ := json.Marshal(resp)
	off, ok := writeResult(ctx, p, out)
	if !ok {
		off = 0
	}
	stack[0] = off
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

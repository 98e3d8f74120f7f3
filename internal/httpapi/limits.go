package httpapi

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/agenthost/agenthost/internal/connlimit"
)

// The error codes of the server's own limits (the quotas' are in
// quota.go).
const (
	// CodeOverloaded: the server holds as many connections as it serves
	// (overall, or from the client's address); the connection is closed.
	CodeOverloaded = "overloaded"
	// CodeRateLimited: a request rate is exceeded (the message names it).
	CodeRateLimited = "rate_limited"
	// CodeConcurrentReads: the tenant has as many reads in progress as
	// its quota allows.
	CodeConcurrentReads = "quota_concurrent_reads"
)

// The limits as OnLimit names them (and the metrics label them), besides
// connlimit's reasons.
const (
	LimitUnauthenticatedRate = "unauthenticated_rate"
	LimitRequestRate         = "request_rate"
	LimitSubmissionRate      = "submission_rate"
	LimitConcurrentReads     = "max_concurrent_reads"
)

// Rate is a token bucket: PerSecond requests a second, Burst at once.
// PerSecond 0 is no limit.
type Rate struct {
	PerSecond float64
	Burst     int
}

func (r Rate) limiter() *rate.Limiter {
	if r.PerSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(r.PerSecond), max(r.Burst, 1))
}

// TenantLimits bound one tenant's use of the API on this server.
type TenantLimits struct {
	// Requests bounds every /v1 request of the tenant; Submissions the
	// Runs it submits, on top.
	Requests    Rate
	Submissions Rate
	// MaxConcurrentReads bounds the reads of Runs and session pages in
	// progress at once; 0 is no limit.
	MaxConcurrentReads int
}

// tenantLimiter is one tenant's limits in force. Its fields are set once;
// rate.Limiter and the channel are safe for concurrent use.
type tenantLimiter struct {
	limits      TenantLimits
	requests    *rate.Limiter // nil: no limit
	submissions *rate.Limiter
	reads       chan struct{} // a slot a read in progress; nil: no limit
}

func newTenantLimiters(by map[string]TenantLimits) map[string]*tenantLimiter {
	out := make(map[string]*tenantLimiter, len(by))
	for tenant, l := range by {
		tl := &tenantLimiter{limits: l, requests: l.Requests.limiter(), submissions: l.Submissions.limiter()}
		if l.MaxConcurrentReads > 0 {
			tl.reads = make(chan struct{}, l.MaxConcurrentReads)
		}
		out[tenant] = tl
	}
	return out
}

// take spends a token of lim, or says how long until one is there.
func take(lim *rate.Limiter) (time.Duration, bool) {
	if lim == nil {
		return 0, true
	}
	res := lim.Reserve()
	if !res.OK() {
		return time.Second, false
	}
	if d := res.Delay(); d > 0 {
		res.Cancel()
		return d, false
	}
	return 0, true
}

// rateLimited is the 429 of a rate: which one, its value, and when to try
// again.
func rateLimited(what string, r Rate, wait time.Duration) *apiError {
	e := errorf(http.StatusTooManyRequests, CodeRateLimited,
		"%s: at most %g a second (bursts of %d) on this server; retry after the Retry-After delay, or ask the operator to raise it",
		what, r.PerSecond, max(r.Burst, 1))
	e.RetryAfter = max(wait, time.Second)
	return e
}

// limitRequest charges one request of tenant to its request rate.
func (s *Server) limitRequest(tenant string) *apiError {
	tl := s.tenants().limits[tenant]
	if tl == nil {
		return nil
	}
	if wait, ok := take(tl.requests); !ok {
		s.cfg.OnLimit(LimitRequestRate, tenant)
		return rateLimited("this tenant's requests exceed its rate (rate_limits.requests)", tl.limits.Requests, wait)
	}
	return nil
}

// limitSubmissions wraps a submission handler with the tenant's
// submission rate.
func (s *Server) limitSubmissions(h tenantHandler) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) error {
		if e := s.takeSubmission(tenant); e != nil {
			closeWithoutBody(w, r)
			return e
		}
		return h(w, r, tenant)
	}
}

// takeSubmission charges one submission of tenant to its submission
// rate.
func (s *Server) takeSubmission(tenant string) *apiError {
	if tl := s.tenants().limits[tenant]; tl != nil {
		if wait, ok := take(tl.submissions); !ok {
			s.cfg.OnLimit(LimitSubmissionRate, tenant)
			return rateLimited("this tenant's submissions exceed their rate (rate_limits.submissions)", tl.limits.Submissions, wait)
		}
	}
	return nil
}

// limitReads wraps a read handler with the tenant's bound on reads in
// progress: past it the read answers 429 at once rather than queue.
func (s *Server) limitReads(h tenantHandler) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) error {
		tl := s.tenants().limits[tenant]
		if tl == nil || tl.reads == nil {
			return h(w, r, tenant)
		}
		select {
		case tl.reads <- struct{}{}:
			defer func() { <-tl.reads }()
			return h(w, r, tenant)
		default:
			s.cfg.OnLimit(LimitConcurrentReads, tenant)
			e := errorf(http.StatusTooManyRequests, CodeConcurrentReads,
				"this tenant has %d reads in progress on this server, its quota (quotas.max_concurrent_reads); retry after the Retry-After delay, read fewer pages at once, or ask the operator to raise it",
				tl.limits.MaxConcurrentReads)
			e.RetryAfter = time.Second
			return e
		}
	}
}

// unauthenticated bounds, per client address, the requests that carry no
// valid token, so that nobody can probe tokens or flood the API without
// one. Its table of addresses is bounded: past maxClients entries the
// ones idle long enough to have refilled are swept, and if none has, the
// request is refused as if its bucket were empty.
type unauthenticated struct {
	rate Rate

	mu      sync.Mutex
	clients map[netip.Addr]*clientBucket
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// maxClients bounds the addresses the unauthenticated limiter tracks.
const maxClients = 16384

func newUnauthenticated(r Rate) *unauthenticated {
	if r.PerSecond <= 0 {
		return nil
	}
	return &unauthenticated{rate: r, clients: map[netip.Addr]*clientBucket{}}
}

// allow charges one unauthenticated request of the client at addr
// (host:port), or says how long until the client may send another.
func (u *unauthenticated) allow(remoteAddr string, now time.Time) (time.Duration, bool) {
	if u == nil {
		return 0, true
	}
	ip := clientIP(remoteAddr)
	u.mu.Lock()
	defer u.mu.Unlock()
	b := u.clients[ip]
	if b == nil {
		if len(u.clients) >= maxClients && !u.sweep(now) {
			return time.Second, false
		}
		b = &clientBucket{lim: u.rate.limiter()}
		u.clients[ip] = b
	}
	b.seen = now
	res := b.lim.ReserveN(now, 1)
	if !res.OK() {
		return time.Second, false
	}
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}

// sweep drops the clients idle for as long as their bucket takes to fill,
// which a new bucket would equal; it reports whether it freed a place.
func (u *unauthenticated) sweep(now time.Time) bool {
	refill := time.Duration(math.Ceil(float64(max(u.rate.Burst, 1)) / u.rate.PerSecond * float64(time.Second)))
	freed := false
	for ip, b := range u.clients {
		if now.Sub(b.seen) >= refill {
			delete(u.clients, ip)
			freed = true
		}
	}
	return freed
}

func clientIP(remoteAddr string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, _ := netip.ParseAddr(host)
	return ip.Unmap()
}

// closeWithoutBody makes the answer to r the last of its connection, and
// makes the server give up the part of r's body no one read instead of
// reading it: net/http reads up to 256 KiB of an unread body after the
// handler, to reuse the connection, and a client that sends it a byte at
// a time would hold the connection as long as it likes. For refusals
// that come before the body is read.
func closeWithoutBody(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
}

// refuseUnauthenticated answers a request without a valid token: 429
// past the client's unauthenticated rate, else 401. Either way the
// connection closes after the answer, without the server reading the
// rest of the body.
func (s *Server) refuseUnauthenticated(w http.ResponseWriter, r *http.Request) {
	closeWithoutBody(w, r)
	if wait, ok := s.unauth.allow(clientKey(r).String(), time.Now()); !ok {
		s.cfg.OnLimit(LimitUnauthenticatedRate, "")
		e := rateLimited("requests without a valid token from this address exceed their rate (http.unauthenticated_rate)", s.unauth.rate, wait)
		writeAPIError(w, e)
		return
	}
	writeAPIError(w, errorf(http.StatusUnauthorized, CodeUnauthorized,
		"missing or unknown bearer token; send the header \"Authorization: Bearer YOUR_TOKEN\" with a token configured for your tenant"))
}

// shedOverCap answers 503 to a request of a connection over the
// server's caps (connlimit), and closes the connection after the answer;
// /healthz is answered as usual (and closed too), so that a flood does
// not make the process look dead. It reports whether it answered.
func (s *Server) shedOverCap(w http.ResponseWriter, r *http.Request) bool {
	reason := connlimit.OverCap(r.Context())
	if reason == "" {
		return false
	}
	closeWithoutBody(w, r)
	if r.URL.Path == "/healthz" {
		return false
	}
	what := "the server holds as many connections as it serves (http.max_connections)"
	if reason == connlimit.ReasonPerClient {
		what = "your address holds as many connections as one client may (http.max_connections_per_client)"
	}
	e := errorf(http.StatusServiceUnavailable, CodeOverloaded,
		"%s; this connection is closed: reuse the connections you have open, or retry after the Retry-After delay", what)
	e.RetryAfter = s.cfg.RetryAfter
	writeAPIError(w, e)
	return true
}

// CodeFieldTooLarge is the code of a request one of whose strings is
// longer than the server takes for that field (FieldLimits): 413, the
// message naming the field, its size and the limit.
const CodeFieldTooLarge = "field_too_large"

// The field limits as OnLimit names them, after their config keys.
const (
	LimitInputBytes    = "max_input_bytes"
	LimitMetadataBytes = "max_metadata_bytes"
	LimitReasonBytes   = "max_reason_bytes"
)

// FieldLimits bound the strings a tenant sends that the store keeps with
// its Runs. The body cap alone does not do it: a string is stored several
// times over (StoredBytesBound), and each Run, answer and approval is a
// body of its own. Every field sent to the API is bounded: session and
// Run IDs by loop.ValidID (64 bytes), the Idempotency-Key at 255 bytes,
// these here, and an approval's tool_call_id by having to name a tool
// call the Run waits on (nothing is stored otherwise). A zero field is
// its default.
type FieldLimits struct {
	// MaxInputBytes bounds a submission's "input" and an answer's
	// "message" (POST /v1/runs/{id}/input), in bytes of UTF-8.
	MaxInputBytes int
	// MaxMetadataBytes bounds a submission's "metadata", as the JSON
	// sent.
	MaxMetadataBytes int
	// MaxReasonBytes bounds the "reason" of each approval or denial, and
	// of a cancellation.
	MaxReasonBytes int
}

// The defaults of FieldLimits. An answer is bounded like an input.
const (
	DefaultMaxInputBytes    = 512 << 10
	DefaultMaxMetadataBytes = 64 << 10
	DefaultMaxReasonBytes   = 4 << 10
)

func (f FieldLimits) withDefaults() FieldLimits {
	if f.MaxInputBytes <= 0 {
		f.MaxInputBytes = DefaultMaxInputBytes
	}
	if f.MaxMetadataBytes <= 0 {
		f.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	if f.MaxReasonBytes <= 0 {
		f.MaxReasonBytes = DefaultMaxReasonBytes
	}
	return f
}

// fieldTooLarge refuses a field of n bytes over its limit, and reports
// the refusal to OnLimit under limitName.
func (s *Server) fieldTooLarge(tenant, field string, n, limit int, limitName, fix string) *apiError {
	s.cfg.OnLimit(limitName, tenant)
	return errorf(http.StatusRequestEntityTooLarge, CodeFieldTooLarge,
		"%q is %d bytes, over the limit of %d bytes this server takes for it (http.%s); %s",
		field, n, limit, limitName, fix)
}

// checkSubmitFields refuses a submission whose input or metadata is over
// its limit.
func (s *Server) checkSubmitFields(tenant string, req SubmitRequest) error {
	f := s.cfg.Fields
	if n := len(req.Input); n > f.MaxInputBytes {
		return s.fieldTooLarge(tenant, "input", n, f.MaxInputBytes, LimitInputBytes,
			"send a shorter input (a tool can fetch large documents), or ask the operator to raise the limit")
	}
	if n := len(req.Metadata); n > f.MaxMetadataBytes {
		return s.fieldTooLarge(tenant, "metadata", n, f.MaxMetadataBytes, LimitMetadataBytes,
			"send less metadata (keep large data elsewhere and send its reference), or ask the operator to raise the limit")
	}
	return nil
}

// checkInputFields refuses an answer whose message, or an approval whose
// reason, is over its limit.
func (s *Server) checkInputFields(tenant string, req InputRequest) error {
	f := s.cfg.Fields
	if req.Message != nil {
		if n := len(*req.Message); n > f.MaxInputBytes {
			return s.fieldTooLarge(tenant, "message", n, f.MaxInputBytes, LimitInputBytes,
				"send a shorter message, or ask the operator to raise the limit")
		}
	}
	for i, a := range req.Approvals {
		if n := len(a.Reason); n > f.MaxReasonBytes {
			return s.fieldTooLarge(tenant, "approvals["+strconv.Itoa(i)+"].reason", n, f.MaxReasonBytes, LimitReasonBytes,
				"send a shorter reason, or ask the operator to raise the limit")
		}
	}
	return nil
}

// checkCancelFields refuses a cancellation whose reason is over its
// limit.
func (s *Server) checkCancelFields(tenant string, req CancelRequest) error {
	if n, limit := len(req.Reason), s.cfg.Fields.MaxReasonBytes; n > limit {
		return s.fieldTooLarge(tenant, "reason", n, limit, LimitReasonBytes,
			"send a shorter reason, or ask the operator to raise the limit")
	}
	return nil
}

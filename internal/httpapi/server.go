package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/internal/console"
	"github.com/agenthost/agenthost/internal/mcpserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Runtime is what the API needs of the runtime; *runtime.Runtime has it.
type Runtime interface {
	Submit(ctx context.Context, req runtime.Request) (loop.Run, bool, error)
	LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error)
	Approve(ctx context.Context, tenant, runID string, approvals []abi.ApprovalDecision, opts ...runtime.InputOption) (loop.Run, error)
	ProvideInput(ctx context.Context, tenant, runID, text string, opts ...runtime.InputOption) (loop.Run, error)
	Cancel(ctx context.Context, tenant, runID, reason string, opts ...runtime.InputOption) (loop.Run, error)
	NewFollower(tenant, runID string, fromSeq int64, opts runtime.FollowOptions) (*runtime.Follower, error)
	InFlight(tenant string) int
}

var _ Runtime = (*runtime.Runtime)(nil)

// Store is what the API reads from the store directly; runtime.Store has
// it. Every call is scoped to the caller's tenant.
type Store interface {
	RunLister
	StoredBytesReader
	SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error)
	// RunsByStatusDesc serves GET /v1/runs?order=newest.
	RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error)
}

var _ Store = (runtime.Store)(nil)

// Config configures a Server. Runtime, Store and Auth are required.
type Config struct {
	Runtime Runtime
	Store   Store
	Auth    Authenticator
	// Quotas by tenant ID; a tenant without an entry has no quota.
	Quotas map[string]Quota
	// Usage sums token usage for the token budgets. It must also be an
	// Observer of the runtime. Required when a quota sets a TokenBudget.
	// It also keeps the tenants' stored bytes and reservations for the
	// storage quotas; when nil, the server keeps a ledger of its own for
	// them.
	Usage *UsageLedger
	// MaxBodyBytes caps a request body (default 1 MiB); past it: 413.
	MaxBodyBytes int64
	// Fields bound the strings of a request that the store keeps: input,
	// metadata, answers, reasons (FieldLimits; zero fields take the
	// defaults). Past one: 413 field_too_large.
	Fields FieldLimits
	// MaxStreamsPerTenant bounds the event streams one tenant may have
	// open on this server at once (default DefaultMaxStreamsPerTenant);
	// past it a stream answers 429 too_many_streams. Negative: no limit.
	MaxStreamsPerTenant int
	// StreamWriteTimeout bounds each send of an event stream (default
	// DefaultStreamWriteTimeout); a client that takes nothing for that
	// long is dropped.
	StreamWriteTimeout time.Duration
	// MaxPageBytes bounds the JSON of one page of GET
	// /v1/sessions/{id}/runs (default DefaultMaxPageBytes, 1 MiB); a page
	// holds one Run at least. A page cut by it ends with next_after.
	MaxPageBytes int
	// RetryAfter is the Retry-After of a 429 or 503 (default 5s).
	RetryAfter time.Duration
	// Heartbeat is the interval of the comment lines that keep an idle
	// event stream open (default 15s).
	Heartbeat time.Duration
	// Ready reports whether the server is ready (recovery's first pass is
	// done); /readyz answers 503 until it is. Default: always ready.
	Ready func() bool
	// Metrics serves /metrics; nil leaves the route out.
	Metrics http.Handler
	// Logger receives one record per request (default: discard).
	Logger *slog.Logger

	// Limits by tenant ID: request and submission rates, reads at once
	// (limits.go). A tenant without an entry has none.
	Limits map[string]TenantLimits
	// UnauthenticatedRate bounds, per client address, the requests
	// without a valid token (past it: 429 instead of 401). Zero: no bound.
	UnauthenticatedRate Rate
	// Agents are each tenant's agents, by tenant ID, sorted by name, for
	// GET /v1/agents and the agent_not_found message; a tenant without an
	// entry lists none.
	Agents map[string][]AgentJSON
	// AgentsOf, when set, is used instead of Agents: a tenant's agents as
	// they are now (an agent with tools of an MCP server changes when the
	// server's tools do).
	AgentsOf func(tenant string) []AgentJSON
	// OnLimit is called with the limit (the Limit… constants, or a
	// quota's error code) and the tenant ("" when there is none) of every
	// request a limit refuses or cuts short, for the metrics. Default:
	// nothing.
	OnLimit func(limit, tenant string)
}

// DefaultMaxBodyBytes is the request body cap when Config sets none.
const DefaultMaxBodyBytes = 1 << 20

// Server serves the HTTP API over a runtime. It is safe for concurrent
// use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler

	submitMu sync.Mutex
	submits  map[string]*sync.Mutex // by tenant: quota check and submit are one step

	// inForce are the tokens, quotas and limits of the tenants now
	// (tenants.go): Config's at New, replaced whole by SetTenants.
	inForce atomic.Pointer[tenantsInForce]
	unauth  *unauthenticated // nil: no bound

	drain     context.Context // cancelled by Drain
	stopDrain context.CancelFunc

	mcp *mcpserver.Handler // serves /mcp (mcp.go)
}

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Runtime == nil || cfg.Store == nil || cfg.Auth == nil {
		return nil, errors.New("httpapi: Config needs Runtime, Store and Auth")
	}
	if err := (Tenants{Auth: cfg.Auth, Quotas: cfg.Quotas, Limits: cfg.Limits}).check(cfg.Usage != nil); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Fields.MaxInputBytes < 0 || cfg.Fields.MaxMetadataBytes < 0 || cfg.Fields.MaxReasonBytes < 0 {
		return nil, errors.New("httpapi: field limits must be 0 (the default) or positive")
	}
	cfg.Fields = cfg.Fields.withDefaults()
	if cfg.Usage == nil {
		cfg.Usage = NewUsageLedger()
	}
	if cfg.MaxPageBytes <= 0 {
		cfg.MaxPageBytes = DefaultMaxPageBytes
	}
	if cfg.MaxStreamsPerTenant == 0 {
		cfg.MaxStreamsPerTenant = DefaultMaxStreamsPerTenant
	}
	if cfg.StreamWriteTimeout <= 0 {
		cfg.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = retryAfterDefault
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return true }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnLimit == nil {
		cfg.OnLimit = func(string, string) {}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), submits: map[string]*sync.Mutex{},
		unauth: newUnauthenticated(cfg.UnauthenticatedRate)}
	s.inForce.Store(s.inForceFrom(Tenants{Auth: cfg.Auth, Quotas: cfg.Quotas, Limits: cfg.Limits}, nil))
	s.drain, s.stopDrain = context.WithCancel(context.Background())
	var err error
	if s.mcp, err = s.newMCP(); err != nil {
		return nil, err
	}
	s.routes()
	s.handler = s.logRequests(s.guardConnection(console.WithHeaders(http.HandlerFunc(s.dispatch))))
	return s, nil
}

// Handler returns the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Drain makes the server stop intake: every /v1 request that needs a
// token answers 503 from now on, and open event streams end (clients
// resume them from Last-Event-ID elsewhere or later). Call it before
// http.Server.Shutdown, which would otherwise wait for the streams. It is
// safe to call more than once.
func (s *Server) Drain() { s.stopDrain() }

// route is one operation of the API: a method, a path pattern in
// ServeMux's syntax ({id} is a path parameter, {$} ends the path, a
// trailing slash serves the path's subtree), and its handler.
type route struct {
	method, pattern string
	handler         http.Handler
}

// routeTable lists every route of the server: routes registers these and
// no others, and openapi_test.go checks that openapi.json describes each
// of them and nothing else, so that a route added here without its
// description fails the tests.
func (s *Server) routeTable() []route {
	rs := []route{
		{"POST", "/v1/sessions/{id}/runs", s.authed(s.limitSubmissions(s.submitRun))},
		{"GET", "/v1/sessions/{id}/runs", s.authed(s.limitReads(s.listSessionRuns))},
		{"GET", "/v1/whoami", s.authed(s.whoAmI)},
		{"GET", "/v1/agents", s.authed(s.listAgents)},
		{"GET", "/v1/agents/{name}", s.authed(s.getAgent)},
		{"GET", "/v1/runs", s.authed(s.limitReads(s.listTenantRuns))},
		{"GET", "/v1/runs/{id}", s.authed(s.limitReads(s.getRun))},
		{"GET", "/v1/runs/{id}/events", s.authed(s.streamEvents)},
		{"POST", "/v1/runs/{id}/input", s.authed(s.postInput)},
		{"POST", "/v1/runs/{id}/cancel", s.authed(s.cancelRun)},
		// MCP's streamable HTTP transport (mcp.go): JSON-RPC messages
		// posted, the session's stream got, the session deleted.
		{"POST", "/mcp", s.authed(s.serveMCP)},
		{"GET", "/mcp", s.authed(s.serveMCP)},
		{"DELETE", "/mcp", s.authed(s.serveMCP)},
		// The API's description needs no token: it documents no tenant's
		// data, and a client reads it before it has a token.
		{"GET", "/v1/openapi.json", http.HandlerFunc(serveOpenAPIDocument)},
		{"GET", "/healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})},
		{"GET", "/readyz", http.HandlerFunc(s.readyz)},
	}
	if s.cfg.Metrics != nil {
		rs = append(rs, route{"GET", "/metrics", s.cfg.Metrics})
	}
	// The web console: static files, no token needed to load them; in
	// the browser it calls the /v1 routes with the tenant's token.
	return append(rs,
		route{"GET", console.Prefix, console.Handler()},
		route{"GET", "/{$}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			console.SetHeaders(w.Header())
			http.Redirect(w, r, console.Prefix, http.StatusFound)
		})},
	)
}

func (s *Server) routes() {
	for _, rt := range s.routeTable() {
		s.mux.Handle(rt.method+" "+rt.pattern, rt.handler)
	}
}

// readyz answers 503 until recovery's first pass is done and once the
// server drains, 200 in between.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.drain.Err() != nil {
		// Every /v1 call answers 503 now: a load balancer routing
		// on readiness sends them to the other nodes instead.
		e := errorf(http.StatusServiceUnavailable, CodeUnavailable,
			"not ready: the server is stopping; send requests to another node")
		e.RetryAfter = s.cfg.RetryAfter
		writeAPIError(w, e)
		return
	}
	if !s.cfg.Ready() {
		e := errorf(http.StatusServiceUnavailable, CodeUnavailable,
			"not ready: recovery's first pass has not finished; retry after the Retry-After delay")
		e.RetryAfter = time.Second
		writeAPIError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// dispatch routes a request, answering unknown routes (404) and wrong
// methods (405) with the JSON error body instead of ServeMux's text.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	if s.shedOverCap(w, r) {
		return
	}
	if h, pattern := s.mux.Handler(r); pattern == "" {
		rec := &headerRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusMethodNotAllowed:
			e := errorf(http.StatusMethodNotAllowed, CodeMethod, "method %s is not allowed on %s; use %s", r.Method, r.URL.Path, rec.header.Get("Allow"))
			e.Allow = rec.header.Get("Allow")
			writeAPIError(w, e)
			return
		case http.StatusNotFound:
			writeAPIError(w, errorf(http.StatusNotFound, CodeNotFound,
				"no route %s %s; the API serves /v1/whoami, /v1/runs, /v1/sessions/{id}/runs, /v1/runs/{id}, /v1/runs/{id}/events, /v1/runs/{id}/input, /v1/runs/{id}/cancel, MCP at /mcp, /healthz, /readyz and /metrics, its description at /v1/openapi.json, and the web console at /console/", r.Method, r.URL.Path))
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// headerRecorder catches what ServeMux's own 404/405 handlers answer.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerRecorder) WriteHeader(status int)      { h.status = status }

// tenantHandler is a handler for an authenticated tenant.
type tenantHandler func(w http.ResponseWriter, r *http.Request, tenant string) error

// authed authenticates the bearer token, refuses requests while draining
// and past the tenant's request rate, caps the body, and writes the
// handler's error.
func (s *Server) authed(h tenantHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := s.authenticate(r)
		if !ok {
			s.refuseUnauthenticated(w, r)
			return
		}
		if info := infoOf(r.Context()); info != nil {
			info.tenant = tenant
		}
		if s.drain.Err() != nil {
			closeWithoutBody(w, r)
			e := errorf(http.StatusServiceUnavailable, CodeUnavailable, "the server is shutting down; retry after the Retry-After delay")
			e.RetryAfter = s.cfg.RetryAfter
			writeAPIError(w, e)
			return
		}
		if e := s.limitRequest(tenant); e != nil {
			closeWithoutBody(w, r)
			writeAPIError(w, e)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := h(w, r, tenant); err != nil {
			var ae *apiError
			if !errors.As(err, &ae) {
				ae = s.unavailableOrInternal(r, err)
			}
			writeAPIError(w, ae)
		}
	}
}

func (s *Server) authenticate(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return s.tenants().auth.Authenticate(strings.TrimSpace(token))
}

// tenantLock returns the lock that makes a tenant's quota check and
// submission one step.
func (s *Server) tenantLock(tenant string) *sync.Mutex {
	s.submitMu.Lock()
	defer s.submitMu.Unlock()
	m := s.submits[tenant]
	if m == nil {
		m = &sync.Mutex{}
		s.submits[tenant] = m
	}
	return m
}

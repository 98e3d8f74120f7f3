package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Backend is what the MCP server needs of the API; the API's server
// (package httpapi) gives it, with its checks, rates and quotas. Every
// call is scoped to the tenant: another tenant's Run answers as a missing
// one (runtime.ErrRunNotFound).
type Backend interface {
	// Agents are the tenant's agents, sorted by name.
	Agents(tenant string) []Agent
	// Submit starts a Run as POST /v1/sessions/{session}/runs does: the
	// field limits, the submission rate and the quotas apply. A refusal
	// is an *Error.
	Submit(ctx context.Context, tenant string, sub Submission) (loop.Run, error)
	// LoadRun reads the tenant's Run from the store.
	LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error)
	// Runs are the tenant's Runs, newest first, from the one after the
	// Run ID after ("" for the newest), at most limit of them, and the
	// after of the next page ("" at the end).
	Runs(ctx context.Context, tenant, after string, limit int) ([]loop.Run, string, error)
	// Cancel cancels the tenant's Run, as POST /v1/runs/{id}/cancel.
	Cancel(ctx context.Context, tenant, runID, reason string) (loop.Run, error)
	// Approve and ProvideInput answer what the Run waits for, as POST
	// /v1/runs/{id}/input.
	Approve(ctx context.Context, tenant, runID string, decisions []abi.ApprovalDecision) (loop.Run, error)
	ProvideInput(ctx context.Context, tenant, runID, text string) (loop.Run, error)
	// Follow follows the Run's events from fromSeq, as an event stream
	// does: it counts against the tenant's streams (a refusal is an
	// *Error).
	Follow(tenant, runID string, fromSeq int64) (*runtime.Follower, error)
}

// Agent is one of a tenant's agents, as its tool shows it.
type Agent struct {
	Name         string
	Description  string
	Instructions string
	// OutputSchema is the JSON Schema the agent's answers match; absent
	// when it has none.
	OutputSchema json.RawMessage
}

// Submission is a Run that a tool call starts.
type Submission struct {
	Agent   string
	Session string
	Input   string
}

// Error is a refusal of the Backend: the API's HTTP status, error code
// and message (which says what to do).
type Error struct {
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Defaults of Config.
const (
	// DefaultMaxSessionsPerTenant bounds the MCP sessions one tenant may
	// have open on a server.
	DefaultMaxSessionsPerTenant = 64
	// DefaultSessionTimeout closes a session that had no request for
	// that long.
	DefaultSessionTimeout = 10 * time.Minute
	// DefaultWriteTimeout bounds each send of an answer's stream.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultPollInterval is the pollInterval a task suggests.
	DefaultPollInterval = time.Second
)

// Config configures a Handler. Backend is required.
type Config struct {
	Backend Backend
	// Drain, when done, ends the sessions' streams (GET) and every wait
	// for a Run, which answers that the Run goes on: the server is
	// stopping (the API's Drain). Default: never.
	Drain context.Context
	// MaxSessionsPerTenant bounds each tenant's sessions on this server
	// (see SessionsFull); negative: no bound.
	MaxSessionsPerTenant int
	// SessionTimeout closes a session idle for that long.
	SessionTimeout time.Duration
	// WriteTimeout bounds each send to a client: one that takes nothing
	// for that long is dropped.
	WriteTimeout time.Duration
	// PollInterval is the pollInterval of the tasks.
	PollInterval time.Duration
	// Logger receives the SDK's and this package's records (default:
	// discard).
	Logger *slog.Logger
}

// Handler serves MCP for every tenant: one SDK server a tenant, whose
// tools are the tenant's agents, behind one streamable HTTP handler. It
// is safe for concurrent use.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	entry http.Handler

	mu      sync.Mutex
	tenants map[string]*tenantServer
}

// tenantServer is the SDK server of one tenant.
type tenantServer struct {
	h      *Handler
	tenant string
	agents map[string]Agent
	server *mcp.Server
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Backend == nil {
		return nil, errors.New("mcpserver: Config needs a Backend")
	}
	if cfg.Drain == nil {
		cfg.Drain = context.Background()
	}
	if cfg.MaxSessionsPerTenant == 0 {
		cfg.MaxSessionsPerTenant = DefaultMaxSessionsPerTenant
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, tenants: map[string]*tenantServer{}}
	streamable := mcp.NewStreamableHTTPHandler(h.serverOf, &mcp.StreamableHTTPOptions{
		SessionTimeout: cfg.SessionTimeout,
		Logger:         cfg.Logger,
		// The API has bounded the body already (Config.MaxBodyBytes).
		MaxRequestBodyBytes: -1,
	})
	// The API authenticated the request; the SDK's bearer middleware only
	// records its tenant as the session's user, so that a session is
	// served to the tenant that opened it and to no other (403).
	h.entry = auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		tenant, _ := ctx.Value(tenantKey{}).(string)
		if tenant == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: tenant, Expiration: time.Now().Add(24 * time.Hour)}, nil
	}, nil)(streamable)
	return h, nil
}

// tenantKey holds the authenticated tenant in a request's context.
type tenantKey struct{}

// SessionHeader is the header of the session a request belongs to; a
// POST without it opens a session.
const SessionHeader = "Mcp-Session-Id"

// ServeTenant serves an MCP request (POST, GET or DELETE) of the tenant,
// which the caller has authenticated. It returns an error only before it
// writes anything: the body could not be read (an *http.MaxBytesError
// past the caller's bound).
func (h *Handler) ServeTenant(w http.ResponseWriter, r *http.Request, tenant string) error {
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return fmt.Errorf("mcpserver: read the request body: %w", err)
		}
		body = mcptasks.LiftRequestTasks(body)
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	ctx := context.WithValue(r.Context(), tenantKey{}, tenant)
	if r.Method == http.MethodGet {
		// The session's own stream ends when the server drains; a POST's
		// ends with its answer, which a drain hastens (awaitEnd).
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(h.cfg.Drain, cancel)()
	}
	r = r.WithContext(ctx)
	// An answer's stream outlives the http.Server's read and write
	// timeouts; each send has a deadline of its own instead.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: h.cfg.WriteTimeout}
	_ = rc.SetWriteDeadline(time.Time{})
	defer dw.clear()
	h.entry.ServeHTTP(dw, r)
	return nil
}

// SessionsFull reports whether the tenant has its MaxSessionsPerTenant
// sessions open on this server: a request that would open another should
// be refused.
func (h *Handler) SessionsFull(tenant string) bool {
	if h.cfg.MaxSessionsPerTenant < 0 {
		return false
	}
	n := 0
	for range h.tenantServer(tenant).server.Sessions() {
		n++
	}
	return n >= h.cfg.MaxSessionsPerTenant
}

// MaxSessionsPerTenant is the bound SessionsFull checks.
func (h *Handler) MaxSessionsPerTenant() int { return h.cfg.MaxSessionsPerTenant }

// serverOf is the SDK server of a request's tenant: the streamable
// handler asks for it when a request opens a session.
func (h *Handler) serverOf(r *http.Request) *mcp.Server {
	tenant, _ := r.Context().Value(tenantKey{}).(string)
	if tenant == "" {
		return nil
	}
	return h.tenantServer(tenant).server
}

// protocolVersions are the revisions served: those the SDK speaks up to
// 2025-11-25, whose tasks this package implements. (2026-07-28 moved
// tasks to an extension of its own.)
var protocolVersions = slices.DeleteFunc(mcp.SupportedProtocolVersions(), func(v string) bool { return v > "2025-11-25" })

// tenantServer returns the tenant's SDK server, making it the first time.
func (h *Handler) tenantServer(tenant string) *tenantServer {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ts := h.tenants[tenant]; ts != nil {
		return ts
	}
	ts := &tenantServer{h: h, tenant: tenant, agents: map[string]Agent{}}
	ts.server = mcp.NewServer(&mcp.Implementation{Name: "agenthost", Title: "agenthost", Version: version()}, &mcp.ServerOptions{
		Instructions: "Each tool runs an agent of this tenant as a durable Run and answers its final answer. " +
			"Call a tool as a task to get the Run's ID at once: the task's ID is the Run's, and any node answers tasks/get for it.",
		Capabilities:              &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Logging: &mcp.LoggingCapabilities{}},
		SupportedProtocolVersions: protocolVersions,
		Logger:                    h.log,
	})
	agents := h.cfg.Backend.Agents(tenant)
	if len(agents) == 0 {
		agents = []Agent{{Name: runtime.DefaultAgent}}
	}
	for _, a := range agents {
		ts.agents[a.Name] = a
		ts.server.AddTool(toolOf(a), ts.callTool)
	}
	ts.server.AddReceivingMiddleware(ts.tasksMiddleware)
	ts.addTaskMethods()
	h.tenants[tenant] = ts
	return ts
}

// version is the module's version as built, for serverInfo.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// deadlineWriter gives each write (and flush) of an answer a deadline
// of its own: a client that takes nothing for the timeout is dropped,
// however long the answer's stream lasts.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.ResponseWriter.Write(b)
}

func (d *deadlineWriter) FlushError() error {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.rc.Flush()
}

// clear bounds what net/http writes after the handler, then lets the
// connection serve its next request without the deadline.
func (d *deadlineWriter) clear() { _ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout)) }

func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

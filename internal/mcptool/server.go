// Package mcptool carries out the tools of MCP servers (Model Context
// Protocol) as effects: the servers of the config's mcp_servers, reached
// over streamable HTTP or started by the host and spoken to over stdio,
// each kept connected in the background, its tools listed at connection
// and again on notifications/tools/list_changed, and each tool call an
// effect carried out by a runtime.Executor of the host's own (no Wasm).
// With a server that supports MCP's tasks (revision 2025-11-25,
// internal/mcptasks), a call is a task: its ID is the effect's pending
// handle, polled with tasks/get, found again after a crash with
// tasks/get, cancelled with tasks/cancel. Without, it is a plain call,
// and after a crash the missing-effect policy decides.
//
// A server's outbound HTTP goes through the plugins' network gate
// (host.NewGatedClient); its tool descriptions, schemas and results are
// untrusted input, bounded and checked before any reaches a model.
package mcptool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/mcptasks"
)

// Options configure Start.
type Options struct {
	Logger *slog.Logger
	// OnChange is called, from a goroutine of the server's, after the
	// tools of a server changed: listed for the first time, listed again
	// with a difference, or dropped. It must not block for long.
	OnChange func(server string)
	// Version is the host's, sent as the client's implementation version.
	Version string
	// LookupIP resolves the host names of HTTP servers; nil is the
	// system's resolver (the tests give names of their own).
	LookupIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// keepAlive is the interval of the pings that find a dead connection
// while the host has nothing to ask the server.
const keepAlive = 15 * time.Second

// Manager holds the MCP servers of a config, each connecting in the
// background.
type Manager struct {
	servers map[string]*Server
}

// Start starts connecting to every server of servers; it returns at once.
// A server that cannot be reached is retried with its backoff, and its
// tools are unavailable meanwhile.
func Start(servers map[string]config.MCPServer, opts Options) (*Manager, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{servers: map[string]*Server{}}
	for name, cfg := range servers {
		s, err := newServer(cfg, opts)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.servers[name] = s
	}
	for _, s := range m.servers {
		go s.run()
	}
	return m, nil
}

// WaitTried waits, up to d, until every server has been tried once:
// connected and its tools listed, or failed. A caller that creates Runs
// at once waits so that they are offered the tools of the servers that
// are up.
func (m *Manager) WaitTried(ctx context.Context, d time.Duration) {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for _, s := range m.servers {
		select {
		case <-s.tried:
		case <-ctx.Done():
			return
		}
	}
}

// Server returns the server of that name, or nil.
func (m *Manager) Server(name string) *Server {
	if m == nil {
		return nil
	}
	return m.servers[name]
}

// Close disconnects every server (a stdio server's process is stopped)
// and waits for their goroutines.
func (m *Manager) Close() {
	if m == nil {
		return
	}
	for _, s := range m.servers {
		s.stop()
	}
	for _, s := range m.servers {
		<-s.done
	}
}

// Server is one MCP server: its connection, kept up in the background, and
// its tools as last listed.
type Server struct {
	cfg    config.MCPServer
	log    *slog.Logger
	opts   Options
	client *mcp.Client
	// gated is the HTTP client behind the network gate (HTTP servers),
	// over which each connection's client adds the headers.
	gated *http.Client

	life   context.Context
	cancel context.CancelFunc
	done   chan struct{}
	relist chan struct{}
	// tried is closed once the first connection was made and its tools
	// listed, or failed.
	tried     chan struct{}
	triedOnce sync.Once

	mu      sync.Mutex
	session *mcp.ClientSession // nil while not connected
	// taskCalls: the server accepts task-augmented tools/call;
	// taskCancel: and tasks/cancel.
	taskCalls, taskCancel bool
	tools                 []Tool // as last listed; kept while disconnected
	listed                bool   // tools were listed once at least
	downSince             time.Time
	lastErr               error
}

func newServer(cfg config.MCPServer, opts Options) (*Server, error) {
	s := &Server{cfg: cfg, opts: opts, log: opts.Logger.With("mcp_server", cfg.Name),
		done: make(chan struct{}), relist: make(chan struct{}, 1), tried: make(chan struct{}), downSince: time.Now()}
	s.life, s.cancel = context.WithCancel(context.Background())
	s.client = mcp.NewClient(&mcp.Implementation{Name: "agenthost", Version: opts.Version}, &mcp.ClientOptions{
		Logger:       s.log,
		Capabilities: &mcp.ClientCapabilities{}, // no roots, sampling or elicitation
		KeepAlive:    keepAlive,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case s.relist <- struct{}{}:
			default:
			}
		},
	})
	if err := mcptasks.Register(s.client); err != nil {
		return nil, err
	}
	if !cfg.Stdio() {
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("mcp_servers.%s.url: %w", cfg.Name, err)
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		// The one destination is the URL's own host and port: a name
		// reaches only public addresses, and an address written in the
		// URL reaches itself, as plugins' allowed_hosts do.
		g, err := host.NewGatedClient(host.GatedClientOptions{
			AllowedHosts: []string{hostPort(u.Hostname(), port)}, DialTimeout: min(cfg.CallTimeout, 10*time.Second), LookupIP: opts.LookupIP,
		})
		if err != nil {
			return nil, fmt.Errorf("mcp_servers.%s.url: %w", cfg.Name, err)
		}
		g.Transport = mcptasks.RoundTripper(g.Transport)
		s.gated = g
	}
	return s, nil
}

// hostPort writes an allowed-hosts entry for host and port.
func hostPort(h, port string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + port
	}
	return h + ":" + port
}

// Name is the server's name in the config.
func (s *Server) Name() string { return s.cfg.Name }

// Tools returns the server's tools as last listed: none before it was
// first reached; while it is disconnected, those it had.
func (s *Server) Tools() []Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tools)
}

// Connected reports whether the server is connected now.
func (s *Server) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session != nil
}

// current returns the session (nil while not connected) and whether the
// server accepts task-augmented tool calls and tasks/cancel.
func (s *Server) current() (cs *mcp.ClientSession, taskCalls, taskCancel bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session, s.taskCalls, s.taskCancel
}

// unavailable says why the server cannot be called now.
func (s *Server) unavailable() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("MCP server %s is not connected (since %s; agenthost keeps trying to reach it)", s.cfg.Name, s.downSince.UTC().Format(time.RFC3339))
}

func (s *Server) stop() { s.cancel() }

// run keeps the server connected until stop: it connects, lists the
// tools, lists them again when the server says they changed, and
// reconnects with the backoff when the connection ends or cannot be made
// (a stdio server is started again).
func (s *Server) run() {
	defer close(s.done)
	backoff := s.cfg.Backoff
	for s.life.Err() == nil {
		began := time.Now()
		err := s.connectAndServe()
		s.triedOnce.Do(func() { close(s.tried) })
		if s.life.Err() != nil {
			return
		}
		if time.Since(began) > s.cfg.MaxBackoff {
			backoff = s.cfg.Backoff // it was up a while: start over
		}
		s.setDown(err, backoff)
		select {
		case <-time.After(backoff):
		case <-s.life.Done():
			return
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// connectAndServe makes one connection and serves it until it ends.
func (s *Server) connectAndServe() error {
	ctx, cancel := context.WithTimeout(s.life, s.cfg.CallTimeout)
	cs, err := s.client.Connect(ctx, s.transport(), &mcp.ClientSessionOptions{ProtocolVersion: mcptasks.ProtocolVersion})
	cancel()
	if err != nil {
		return s.connectError(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cs.Wait() }()
	taskCalls, taskCancel := mcptasks.ServerSupportsToolTasks(cs.InitializeResult())
	tools, err := s.list(cs)
	if err != nil {
		cs.Close()
		<-ended
		return fmt.Errorf("listing its tools: %w", err)
	}
	s.setUp(cs, taskCalls, taskCancel, tools)
	for {
		select {
		case <-s.relist:
			tools, err := s.list(cs)
			if err != nil {
				s.log.Warn("mcp: listing the server's tools again failed; its last list stays", "err", err)
				continue
			}
			s.setTools(tools)
		case err := <-ended:
			if err == nil {
				err = errors.New("the connection closed")
			}
			return fmt.Errorf("connection lost: %w", err)
		case <-s.life.Done():
			cs.Close()
			<-ended
			return nil
		}
	}
}

// connectError words a failure to connect, naming a refusal of the
// network gate plainly.
func (s *Server) connectError(err error) error {
	switch {
	case host.IsRefusedAddress(err):
		return fmt.Errorf("refused: the url's host name resolved to an address a name never reaches (loopback, private, link-local, …); to reach such an address, write the address itself in mcp_servers.%s.url: %w", s.cfg.Name, err)
	case host.IsDeniedHost(err):
		return fmt.Errorf("refused: the server redirected to another host, which is not allowed: %w", err)
	}
	return err
}

// setUp records a new connection and its tools.
func (s *Server) setUp(cs *mcp.ClientSession, taskCalls, taskCancel bool, tools []Tool) {
	s.mu.Lock()
	s.session, s.taskCalls, s.taskCancel, s.lastErr = cs, taskCalls, taskCancel, nil
	s.mu.Unlock()
	s.log.Info("mcp: connected", "protocol", cs.InitializeResult().ProtocolVersion, "tools", len(tools), "tasks", taskCalls)
	s.setTools(tools)
	s.triedOnce.Do(func() { close(s.tried) })
}

// setTools records the tools listed, and tells OnChange when they changed.
func (s *Server) setTools(tools []Tool) {
	s.mu.Lock()
	changed := !s.listed || !slices.EqualFunc(s.tools, tools, Tool.equal)
	s.tools, s.listed = tools, true
	s.mu.Unlock()
	if changed && s.opts.OnChange != nil {
		s.opts.OnChange(s.cfg.Name)
	}
}

// setDown records that the server is not connected, and logs why: a
// warning the first time, then at each doubling of the backoff.
func (s *Server) setDown(err error, backoff time.Duration) {
	s.mu.Lock()
	wasUp := s.session != nil
	first := s.lastErr == nil
	s.session, s.lastErr = nil, err
	if wasUp {
		s.downSince = time.Now()
	}
	s.mu.Unlock()
	if err == nil {
		err = errors.New("the connection closed")
	}
	if wasUp || first || backoff == s.cfg.MaxBackoff {
		s.log.Warn("mcp: the server is not connected; its tools are unavailable until it is, and agenthost retries", "err", err, "retry_in", backoff)
	} else {
		s.log.Debug("mcp: connecting failed again", "err", err, "retry_in", backoff)
	}
}

// transport returns the transport of a new connection: streamable HTTP
// through the gate, with the headers read now; or a new process of the
// stdio server's command.
func (s *Server) transport() mcp.Transport {
	if s.cfg.Stdio() {
		cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
		cmd.Env = s.childEnv()
		cmd.Dir = s.cfg.Dir
		cmd.Stderr = &stderrLog{log: s.log}
		setProcAttr(cmd)
		return mcptasks.WrapTransport(&mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second})
	}
	headers, err := s.headers()
	client := &http.Client{Transport: &headerTransport{next: s.gated.Transport, headers: headers, err: err}, CheckRedirect: s.gated.CheckRedirect}
	return &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: client, MaxRetries: 2, MaxEventSize: mcptasks.MaxMessageBytes}
}

// headers reads the headers of a connection: the literal ones, and the
// secret ones from their variables and files, now.
func (s *Server) headers() (http.Header, error) {
	h := http.Header{}
	for k, v := range s.cfg.Headers {
		h.Set(k, v)
	}
	for k, env := range s.cfg.HeadersFromEnv {
		v, ok := os.LookupEnv(env)
		if !ok {
			return nil, fmt.Errorf("mcp_servers.%s.headers_from_env.%s: environment variable %s is not set", s.cfg.Name, k, env)
		}
		h.Set(k, v)
	}
	for k, path := range s.cfg.HeadersFromFile {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("mcp_servers.%s.headers_from_file.%s: %w", s.cfg.Name, k, err)
		}
		h.Set(k, strings.TrimRight(string(b), " \t\r\n"))
	}
	return h, nil
}

// headerTransport adds a connection's headers to each of its requests,
// and the W3C traceparent of the span its context carries (a tool call's,
// docs/DESIGN.md §5.10), written by the global propagator, a no-op while
// tracing is off.
type headerTransport struct {
	next    http.RoundTripper
	headers http.Header
	err     error // reading a secret failed: no request is made
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, t.err
	}
	req = req.Clone(req.Context())
	for k, v := range t.headers {
		req.Header[k] = v
	}
	otel.GetTextMapPropagator().Inject(req.Context(), propagation.HeaderCarrier(req.Header))
	return t.next.RoundTrip(req)
}

// BaseEnv are the variables of the host's environment a stdio server
// gets, besides its env and env_from_env: what a program needs to run.
// Nothing else of the host's environment (where its own secrets are)
// reaches it.
var BaseEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SYSTEMROOT"}

func (s *Server) childEnv() []string {
	var env []string
	for _, k := range BaseEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, from := range s.cfg.EnvFromEnv {
		env = append(env, k+"="+os.Getenv(from))
	}
	for k, v := range s.cfg.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// stderrLog writes what a stdio server says on its stderr to the log,
// line by line, each cut to maxStderrLine.
type stderrLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	line []byte
}

const maxStderrLine = 4 << 10

func (w *stderrLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range p {
		if b == '\n' {
			w.flush()
			continue
		}
		if len(w.line) < maxStderrLine {
			w.line = append(w.line, b)
		}
	}
	return len(p), nil
}

func (w *stderrLog) flush() {
	if len(w.line) > 0 {
		w.log.Info("mcp: the stdio server wrote", "stderr", strings.ToValidUTF8(string(w.line), "\uFFFD"))
		w.line = w.line[:0]
	}
}

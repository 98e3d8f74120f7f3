// Package config reads agenthost's operator config: one YAML file, read
// by viper, every key of which an AGENTHOST_… environment variable can
// override.
//
// Tenants and plugins are maps keyed by ID, not lists, so that a variable
// can reach them: AGENTHOST_TENANTS_DEMO_LIMITS_MAX_STEPS overrides
// tenants.demo.limits.max_steps (dots and dashes become underscores).
// Viper lowercases every key, so tenant IDs, plugin IDs and plugin config
// keys are lowercase. Relative paths resolve against the directory of the
// config file.
//
// Load collects every problem (an unknown key, a wrong type, a missing
// required value, a reference to a plugin that is not declared) and
// returns them together, one line each, each naming the file and the key.
// It reads the file only: bad config never touches stored state.
package config

import (
	"encoding/json"
	"github.com/agenthost/agenthost/internal/budget"
	"slices"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/plugins/abi"
)

// EnvPrefix prefixes every environment variable that overrides a key.
const EnvPrefix = "AGENTHOST"

// Config is the whole operator config, with defaults filled in and paths
// made absolute.
type Config struct {
	// File is the config file as it was named; Dir is its absolute
	// directory, against which relative paths resolve.
	File string
	Dir  string

	// Store says which store holds the Runs: Badger in DataDir (the
	// default) or PostgreSQL.
	Store Store
	// DataDir is the Badger store's directory (unused with postgres).
	DataDir string
	// SyncWrites makes every acknowledged commit durable (default true).
	// Badger only: PostgreSQL's own synchronous_commit decides there.
	SyncWrites bool
	// CacheDir is the wazero compilation cache on disk; "" disables it.
	CacheDir string
	// Retention is how long the event logs of terminal Runs are kept; 0
	// keeps them forever.
	Retention time.Duration
	// RetentionInterval is the time between the retention passes of
	// `agenthost serve` (the first runs at start).
	RetentionInterval time.Duration
	// WatchdogInterval is the time between the watchdog's scans for stuck
	// Runs; a Run is reported when two scans in a row find it stuck. Its
	// default is shorter with postgres (DefaultPostgresWatchdogInterval),
	// where it is also the safety net for a lost cross-node notification.
	WatchdogInterval time.Duration
	// LeaseTTL is how long the process's node lease lasts between
	// renewals (every LeaseTTL/3). A process paused or starved for longer
	// loses it: `agenthost serve` then exits, for a restart to recover.
	LeaseTTL time.Duration
	// NodeName is node.name: the node's identity across restarts. With
	// store.driver postgres, a process that starts under the name of a
	// dead one takes its sessions back at once instead of after its lease
	// (lease_ttl); a second live process under a name is refused. Empty
	// (the default): each process is a fresh node, whose predecessor's
	// sessions pass on when its lease runs out. Badger needs none (its
	// directory lock makes every earlier process dead at once).
	NodeName string
	// Listen is the HTTP address of `agenthost serve`.
	Listen string
	// HTTP bounds what clients of the API listener may hold and send.
	HTTP HTTP
	// Metrics says where /metrics is served.
	Metrics Metrics
	// Tracing says whether and where OpenTelemetry traces are exported.
	Tracing Tracing
	Log     Log
	// MaxInstanceMemory caps the linear memory of every plugin instance of
	// the host together, in bytes.
	MaxInstanceMemory int64
	// PluginCallPath is how plugins are called: PluginCallNative (the host's
	// own Extism kernel) or PluginCallSDK (extism go-sdk, the reference).
	PluginCallPath string
	// PIDFile is where serve writes its process ID, and `agenthost reload`
	// finds it (default: DefaultPIDFile in DataDir). The reload's outcome
	// is written beside it (ReloadStatusFile).
	PIDFile string
	// PluginDrain bounds how long a plugin version a reload replaced stays
	// loaded for the attempts it holds (default DefaultPluginDrain).
	PluginDrain time.Duration

	Plugins map[string]Plugin
	// MCPServers are the MCP servers whose tools tenants and agents may
	// name (mcp_servers), by name.
	MCPServers map[string]MCPServer
	Tenants    map[string]Tenant
}

// The plugin call paths (host.CallPath).
const (
	PluginCallNative = "native"
	PluginCallSDK    = "extism-sdk"
)

// The store drivers.
const (
	DriverBadger   = "badger"
	DriverPostgres = "postgres"
)

// Store is the store.* section: which store, and how to reach it.
type Store struct {
	// Driver is DriverBadger (default: the embedded store in DataDir) or
	// DriverPostgres.
	Driver string
	// DSN is the PostgreSQL connection string (postgres only). It may hold
	// a password: show it only through pgstore.RedactDSN (Location does).
	DSN      string
	Postgres Postgres
}

// Postgres is store.postgres.*: the pool and session settings of the
// PostgreSQL store. Zero values take pgstore's defaults.
type Postgres struct {
	// MaxConns is the size of the connection pool (default 16). Every
	// node's MaxConns together must stay under the server's
	// max_connections.
	MaxConns int
	// WriteGroups bounds the transactions of commits and creations this
	// node has under way at once (default 4); the ones that arrive while
	// one is under way share the next, and another starts only for a
	// backlog (group commit).
	WriteGroups int
	// StatementTimeout bounds every statement (default 30s).
	StatementTimeout time.Duration
	// Schema is the schema holding the tables (default "agenthost").
	Schema string
}

// HTTP is the http.* section: the API listener's timeouts, connection
// caps and the rate of requests without a valid token. A zero duration
// or rate means no bound.
type HTTP struct {
	// ReadHeaderTimeout bounds the wait for a request's headers,
	// ReadTimeout for the whole request (its body too), WriteTimeout the
	// writing of the answer, IdleTimeout the wait for the next request of
	// a keep-alive connection. Event streams lift the read and write
	// timeouts for themselves.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// MaxHeaderBytes caps a request's headers.
	MaxHeaderBytes int
	// MaxConnections is how many connections are served at once (0:
	// three quarters of what the open-file limit leaves, at most 4096);
	// MaxConnectionsPerClient how many of them one client address may
	// hold (0: no cap). Past either, a request answers 503.
	MaxConnections          int
	MaxConnectionsPerClient int
	// UnauthenticatedRate bounds, per client address, the requests that
	// carry no valid token; past it they answer 429 instead of 401.
	UnauthenticatedRate Rate
	// MaxUnauthenticatedConnections is how many of MaxConnections may be
	// held by connections that have carried no valid token yet (0: half
	// of MaxConnections); the rest stays for the tenants.
	MaxUnauthenticatedConnections int
	// UnauthenticatedIdleTimeout bounds every wait of a connection that
	// has carried no valid token yet: idle, or reading a request (0: the
	// other timeouts only).
	UnauthenticatedIdleTimeout time.Duration
	// IPv6ClientPrefix is how many leading bits of an IPv6 address name
	// one client, for MaxConnectionsPerClient and UnauthenticatedRate.
	IPv6ClientPrefix int
	// MaxStreamsPerTenant bounds the event streams one tenant may have
	// open on a node (0: no limit); StreamWriteTimeout each send of one
	// (a client that takes nothing for that long is dropped).
	MaxStreamsPerTenant int
	StreamWriteTimeout  time.Duration
	// MaxPageBytes bounds the JSON of one page of a session's Runs.
	MaxPageBytes int
	// MaxInputBytes bounds a submission's input and an answer's message,
	// MaxMetadataBytes a submission's metadata, MaxReasonBytes the reason
	// of an approval, a denial or a cancellation; past one a request
	// answers 413 field_too_large. 0 is the server's default
	// (httpapi.DefaultMaxInputBytes and its kin: 512 KiB, 64 KiB, 4 KiB).
	MaxInputBytes    int
	MaxMetadataBytes int
	MaxReasonBytes   int
}

// Rate is a token bucket: PerSecond tokens a second, up to Burst at
// once. PerSecond 0 means no limit.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Metrics is the metrics.* section.
type Metrics struct {
	// Listen is where /metrics is served: an address of its own
	// (default 127.0.0.1:9464, loopback only), MetricsOnAPI to serve it
	// on the API listener without a token (the behaviour before
	// metrics.listen existed), or MetricsOff.
	Listen string
}

// The special values of metrics.listen.
const (
	MetricsOnAPI = "api"
	MetricsOff   = "off"
)

// Tracing configures OpenTelemetry traces (internal/tracing). They are
// off unless Enabled; the SDK's own variables (OTEL_EXPORTER_OTLP_*,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER,
// OTEL_BSP_*) apply as the SDK reads them, under these keys.
type Tracing struct {
	// Enabled turns the spans and their export on (default false).
	Enabled bool
	// Endpoint is the OTLP/HTTP receiver's base URL (such as
	// http://127.0.0.1:4318), traces going to its /v1/traces; "" leaves it
	// to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT or
	// the SDK's default, https://localhost:4318.
	Endpoint string
	// ServiceName is the service.name of the spans' resource when
	// OTEL_SERVICE_NAME does not set it (default agenthost).
	ServiceName string
}

// DefaultServiceName is the default of tracing.service_name.
const DefaultServiceName = "agenthost"

// Log configures the process's logs.
type Log struct {
	Format string // text or json
	Level  string // debug, info, warn or error
}

// Plugin is one Wasm plugin and its sandbox.
type Plugin struct {
	ID     string
	Path   string // absolute
	SHA256 string // hex pin; "" pins nothing
	Role   abi.Role
	// MemoryPages, CallTimeout, InitTimeout, MaxInputBytes,
	// MaxOutputBytes, PoolSize, MaxInstances and IdleTimeout are the
	// host's per-plugin limits; zero takes the host's default.
	MemoryPages    uint32
	CallTimeout    time.Duration
	InitTimeout    time.Duration
	MaxInputBytes  int
	MaxOutputBytes int
	PoolSize       int
	MaxInstances   int
	IdleTimeout    time.Duration
	// AllowedHosts are the hosts agenthost_http may reach.
	AllowedHosts []string
	HTTPTimeout  time.Duration
	// MaxHTTPResponseBytes and MaxHTTPResponseHeaderBytes cap one
	// agenthost_http response's body and headers; zero takes the host's
	// defaults (1 MiB, 64 KiB).
	MaxHTTPResponseBytes       int64
	MaxHTTPResponseHeaderBytes int64
	// Config is what the plugin reads with config_get (keys lowercase).
	Config map[string]string
	// Budget is the shared budget of a model executor
	// (plugins.ID.budget): it bounds the calls of every Run of every
	// tenant on this node that use the plugin as their model. Zero
	// fields limit nothing.
	Budget budget.Limits
}

// Tenant is one tenant: its tokens, quotas, limits and plugins.
type Tenant struct {
	ID string
	// TokenSHA256 are the hex sha256 hashes of the tenant's API tokens.
	TokenSHA256 []string
	Quotas      Quotas
	Limits      Limits
	// Builder and Model are plugin IDs; ToolExecutors lists the plugin IDs
	// whose tools the tenant's Runs may call.
	Builder       string
	Model         string
	ToolExecutors []string
	// MCPServers lists the MCP servers (mcp_servers) whose every tool the
	// tenant's top-level form (its agent "default") may call.
	MCPServers []string
	// Tools overrides, by tool name, what describe says of a tool.
	Tools       map[string]ToolOverride
	ModelPolicy loop.Policy
	HistoryRuns int
	// RateLimits bound the tenant's API requests on each node.
	RateLimits RateLimits
	// MaxAgentDepth bounds how deep child Runs nest (max_agent_depth): a
	// Run submitted from outside is at depth 0, the child Run of one of
	// its agent tools at 1.
	MaxAgentDepth int
	// Agents are the tenant's agents by name (tenants.ID.agents), always
	// with one at least. A tenant without an agents block is one agent,
	// DefaultAgent, made of its top-level builder, model, tool_executors
	// and tools (and so is that top-level form beside an agents block,
	// when it names a model).
	Agents map[string]Agent
}

// DefaultMaxAgentDepth is max_agent_depth when a tenant does not set it.
const DefaultMaxAgentDepth = 5

// MaxAgentDepthLimit is the largest max_agent_depth: every level is a Run
// and an effect that waits for it.
const MaxAgentDepthLimit = 32

// DefaultAgent is the name of the agent a submission that names none
// runs as, and of the agent the tenant's top-level form defines.
const DefaultAgent = "default"

// Agent is one agent of a tenant: its instructions, its builder, its
// model plugin and the settings that plugin is given, its tools and the
// rules of its Runs.
type Agent struct {
	Name string
	// Description says what the agent is for, for people (and, later,
	// for the agents that may call it).
	Description string
	// Instructions are the system prompt the builder is given ("" leaves
	// it to the builder's own config); InstructionsFile is the absolute
	// path they were read from ("" when written inline).
	Instructions     string
	InstructionsFile string
	// OutputSchema is output_schema: the JSON Schema (2020-12) the
	// agent's final answers must match, as compact JSON, which the Loop
	// compiles (nil when none); OutputSchemaFile is the absolute path it
	// was read from ("" when written inline).
	OutputSchema     json.RawMessage
	OutputSchemaFile string
	// Builder and Model are plugin IDs.
	Builder string
	Model   string
	// Settings are model.settings: a JSON object passed to the model as
	// params (model, temperature, max_output_tokens, ...); nil when none.
	Settings map[string]any
	// Tools are the agent's tools, in the order listed.
	Tools []AgentTool
	// TopLevel is set on the DefaultAgent the tenant's top-level form
	// (builder, model, tool_executors, tools) defines; Overrides are that
	// form's tools map, by tool name.
	TopLevel    bool
	Overrides   map[string]ToolOverride
	Limits      Limits
	ModelPolicy loop.Policy
	HistoryRuns int
}

// AgentTool is one entry of an agent's tools, with the operator's word on
// it: every tool of an executor plugin (Tool ""), or one of them; or
// (Agent set, Plugin "") another agent of the tenant, called as a tool
// named after it, each call a child Run of that agent; or (MCP set) every
// tool of an MCP server of mcp_servers, or (Tool set) one of them, by the
// server's own name for it. Each kind is told apart by its key.
type AgentTool struct {
	Plugin string
	Tool   string
	Agent  string
	MCP    string
	ToolOverride
}

// MCPServer is one MCP server (mcp_servers.NAME) whose tools are carried
// out by the host itself: reached over streamable HTTP at URL, or started
// by the host as Command, speaking over its stdin and stdout. It is the
// operator's: no tenant names a URL or a command. Its tools are offered
// as NAME__TOOL.
type MCPServer struct {
	Name string
	// URL is the streamable HTTP endpoint (http or https); "" for a
	// stdio server.
	URL string
	// Headers are sent with every request: literal values (no secret may
	// be written in the file), and values read at each connection from an
	// environment variable (HeadersFromEnv: header → variable) or a file
	// (HeadersFromFile: header → absolute path, trailing white space
	// trimmed). Header names are lowercase.
	Headers         map[string]string
	HeadersFromEnv  map[string]string
	HeadersFromFile map[string]string
	// Command is the stdio server's program and arguments; nil for an
	// HTTP server. Env is its whole environment besides PATH, HOME and
	// the like (mcptool.BaseEnv): literal values, and (EnvFromEnv: name →
	// variable of the host) values passed on from the host's. Names keep
	// their case. Dir is its working directory (absolute; "" is the
	// config file's directory).
	Command    []string
	Env        map[string]string
	EnvFromEnv map[string]string
	Dir        string
	// CallTimeout bounds one request to the server (listing tools, a
	// plain tool call, a poll of a task).
	CallTimeout time.Duration
	// TaskTTL is how long a task-augmented call asks the server to keep
	// its task.
	TaskTTL time.Duration
	// MaxResultBytes bounds the text a tool call's result gives the
	// model; past it the text is cut.
	MaxResultBytes int
	// Backoff is the wait before the first reconnection (or restart of a
	// stdio server), doubled at each failure up to MaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// Stdio reports whether the server is a stdio one (Command set).
func (s MCPServer) Stdio() bool { return len(s.Command) > 0 }

// The defaults of an MCP server's keys.
var (
	DefaultMCPCallTimeout    = 60 * time.Second
	DefaultMCPTaskTTL        = 24 * time.Hour
	DefaultMCPMaxResultBytes = 256 << 10
	DefaultMCPBackoff        = 500 * time.Millisecond
	DefaultMCPMaxBackoff     = 30 * time.Second
)

// MCPToolSeparator joins an MCP server's name and its tool's name in the
// name agents see: NAME__TOOL.
const MCPToolSeparator = "__"

// ToolPolicy returns the policy of tool, which entry brought in, given
// whether the tool declares itself idempotent: the entry's policy, else
// the override of its name, else the default.
func (a Agent) ToolPolicy(entry AgentTool, tool string, idempotent bool) loop.Policy {
	o := entry.ToolOverride
	if o.Policy == nil {
		o = a.Overrides[tool]
	}
	return Tenant{Tools: map[string]ToolOverride{tool: o}}.ToolPolicy(tool, idempotent)
}

// ToolApproval returns whether a call of tool, which entry brought in,
// waits for approval, given what the tool declares: the entry's approval,
// else the override of its name, else the tool's own.
func (a Agent) ToolApproval(entry AgentTool, tool string, declared abi.Approval) bool {
	o := entry.ToolOverride
	if o.Approval == "" {
		o = a.Overrides[tool]
	}
	return Tenant{Tools: map[string]ToolOverride{tool: o}}.ToolApproval(tool, declared)
}

// Plugins returns the IDs of the plugins the agent uses, without repeats:
// its builder, its model, then its tools' executors.
func (a Agent) Plugins() []string {
	ids := []string{a.Builder}
	for _, id := range append([]string{a.Model}, toolPlugins(a.Tools)...) {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// MCPServers returns the names of the MCP servers the agent's tools name,
// without repeats, in the order listed.
func (a Agent) MCPServers() []string {
	var names []string
	for _, t := range a.Tools {
		if t.MCP != "" && !slices.Contains(names, t.MCP) {
			names = append(names, t.MCP)
		}
	}
	return names
}

func toolPlugins(tools []AgentTool) []string {
	out := make([]string, 0, len(tools))
	for _, t := range tools {
		if t.Plugin != "" {
			out = append(out, t.Plugin)
		}
	}
	return out
}

// RateLimits are a tenant's request rates (rate_limits.*), per node.
type RateLimits struct {
	// Requests bounds every /v1 request, Submissions the Runs submitted
	// (which count as requests too).
	Requests    Rate
	Submissions Rate
}

// Quotas bound a tenant's use; `serve` enforces them. Zero means no bound.
type Quotas struct {
	MaxActiveRuns      int
	MaxInflightEffects int
	TokenBudget        int64
	// MaxStoredBytes bounds the bytes the tenant's Runs hold in the store
	// (snapshots, event logs, command IDs).
	MaxStoredBytes int64
	// MaxConcurrentReads bounds the tenant's reads of Runs and pages
	// served at once on a node; past it a read answers 429.
	MaxConcurrentReads int
}

// Limits bound each Run of a tenant.
type Limits struct {
	MaxSteps             int
	MaxToolCallsPerStep  int
	MaxParallelToolCalls int
	// RunTimeout bounds a Run's work time, which does not count its
	// waits for a person; 0 means none.
	RunTimeout time.Duration
	// WaitTimeout bounds each wait of a Run for a person (an approval,
	// an answer); DefaultWaitTimeout unless the file sets it, and 0
	// (`wait_timeout: 0`) means none.
	WaitTimeout   time.Duration
	EffectTimeout time.Duration
}

// LoopLimits returns the limits as the Loop takes them (the timeouts come
// from the durations, set by the runtime).
func (l Limits) LoopLimits() loop.Limits {
	return loop.Limits{MaxSteps: l.MaxSteps, MaxToolCallsPerStep: l.MaxToolCallsPerStep, MaxParallelToolCalls: l.MaxParallelToolCalls}
}

// ToolOverride is the operator's word on one tool.
type ToolOverride struct {
	// Approval is "never" or "always"; "" keeps the tool's own.
	Approval abi.Approval
	// Policy is the missing-effect policy; nil keeps the default (retry
	// for an idempotent tool, fail otherwise). Its Mode is "" when the
	// block set none: ToolPolicy then takes the tool's default mode.
	Policy *loop.Policy
}

// Defaults of the keys a file may leave out.
var (
	DefaultDataDir = "data"
	DefaultPIDFile = "agenthost.pid"
	// DefaultPluginDrain is plugin_drain's default.
	DefaultPluginDrain = time.Hour
	DefaultCacheDir    = ".cache/wazero"
	DefaultListen      = "127.0.0.1:8080"
	// DefaultRetentionInterval is the time between retention passes.
	DefaultRetentionInterval = time.Hour
	// DefaultWatchdogInterval is the time between watchdog scans.
	DefaultWatchdogInterval = 30 * time.Second
	// DefaultPostgresWatchdogInterval is the time between watchdog scans
	// when the store is postgres: shorter, since the watchdog also finds
	// the work whose cross-node notification was lost.
	DefaultPostgresWatchdogInterval = 10 * time.Second
	// DefaultLeaseTTL is the node lease's default length.
	DefaultLeaseTTL = 15 * time.Second
	// MinLeaseTTL is the shortest lease_ttl the config accepts.
	MinLeaseTTL = time.Second
	// The http.* defaults.
	DefaultReadHeaderTimeout       = 10 * time.Second
	DefaultReadTimeout             = 30 * time.Second
	DefaultWriteTimeout            = 60 * time.Second
	DefaultIdleTimeout             = 60 * time.Second
	DefaultMaxHeaderBytes          = 64 << 10
	DefaultMaxConnectionsPerClient = 128
	DefaultUnauthenticatedRate     = Rate{PerSecond: 10, Burst: 50}
	DefaultMaxStreamsPerTenant     = 256
	DefaultStreamWriteTimeout      = 10 * time.Second
	DefaultMaxPageBytes            = 1 << 20
	// MaxFieldBytes is the most http.max_input_bytes,
	// http.max_metadata_bytes and http.max_reason_bytes may be: the
	// request body cap.
	MaxFieldBytes = 1 << 20
	// DefaultUnauthenticatedIdleTimeout is http.unauthenticated_idle_timeout.
	DefaultUnauthenticatedIdleTimeout = 5 * time.Second
	// DefaultIPv6ClientPrefix is http.ipv6_client_prefix: a /64.
	DefaultIPv6ClientPrefix = 64
	// DefaultMetricsListen serves /metrics on loopback only.
	DefaultMetricsListen = "127.0.0.1:9464"
	// The tenants' defaults: requests and submissions a second, per node,
	// and reads at once.
	DefaultRequestRate        = Rate{PerSecond: 200, Burst: 400}
	DefaultSubmissionRate     = Rate{PerSecond: 50, Burst: 100}
	DefaultMaxConcurrentReads = 32
	DefaultLogFormat          = "text"
	DefaultLogLevel           = "info"
	DefaultHistoryRuns        = 20
	// DefaultWaitTimeout is limits.wait_timeout: a Run that waits a week
	// for a person's approval or answer fails; `wait_timeout: 0` lets it
	// wait for ever.
	DefaultWaitTimeout = 7 * 24 * time.Hour
)

// ToolPolicy returns the policy of tool under tenant t, given whether the
// tool declares itself idempotent.
func (t Tenant) ToolPolicy(tool string, idempotent bool) loop.Policy {
	if o, ok := t.Tools[tool]; ok && o.Policy != nil {
		p := *o.Policy
		if p.Mode == "" {
			// The block set no mode: the tool's default one.
			p.Mode = loop.DefaultToolPolicy(idempotent).Mode
		}
		return p
	}
	return loop.DefaultToolPolicy(idempotent)
}

// ToolApproval returns whether a call of tool waits for approval under
// tenant t, given what the tool declares.
func (t Tenant) ToolApproval(tool string, declared abi.Approval) bool {
	if o, ok := t.Tools[tool]; ok && o.Approval != "" {
		return o.Approval == abi.ApprovalAlways
	}
	return declared == abi.ApprovalAlways
}

// StoreLocation names the store for messages and logs: "data dir DIR" for
// Badger, "postgres DSN" for PostgreSQL with the DSN's password hidden
// (pgstore.RedactDSN). Never show Store.DSN any other way.
func (c *Config) StoreLocation() string {
	if c.Store.Driver == DriverPostgres {
		return "postgres " + pgstore.RedactDSN(c.Store.DSN)
	}
	return "data dir " + c.DataDir
}

// ReloadStatusFile is where serve writes the outcome of its last config
// reload, as JSON, for `agenthost reload` to read: beside the PID file.
func (c *Config) ReloadStatusFile() string { return c.PIDFile + ".reload" }

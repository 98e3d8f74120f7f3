package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agenthost/agenthost/internal/budget"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Error is a config that cannot be used: every problem found, one line
// each, each naming the file and the key.
type Error struct {
	File     string
	Problems []string
}

func (e *Error) Error() string {
	return "config: " + strings.Join(e.Problems, "\n")
}

// The keys of the file, as dotted paths. tenants and plugins are maps keyed
// by ID; tenants.ID.tools is a map keyed by tool name; plugins.ID.config is
// a free map of strings.
var (
	topKeys = []string{
		"data_dir", "sync_writes", "cache_dir", "retention", "retention_interval", "watchdog_interval", "lease_ttl", "listen",
		"log.format", "log.level", "max_instance_memory", "plugin_call_path",
		"store.driver", "store.dsn", "store.postgres.max_conns", "store.postgres.write_groups", "store.postgres.statement_timeout",
		"store.postgres.schema",
		"http.read_header_timeout", "http.read_timeout", "http.write_timeout", "http.idle_timeout", "http.max_header_bytes",
		"http.max_connections", "http.max_connections_per_client",
		"http.unauthenticated_rate.per_second", "http.unauthenticated_rate.burst",
		"http.max_unauthenticated_connections", "http.unauthenticated_idle_timeout", "http.ipv6_client_prefix",
		"http.max_streams_per_tenant", "http.stream_write_timeout", "http.max_page_bytes",
		"http.max_input_bytes", "http.max_metadata_bytes", "http.max_reason_bytes",
		"metrics.listen", "pid_file", "plugin_drain", "tracing.enabled", "tracing.endpoint", "tracing.service_name",
		"node.name",
	}
	pluginKeys = []string{
		"path", "sha256", "role", "memory_pages", "call_timeout", "init_timeout",
		"max_input_bytes", "max_output_bytes", "pool_size", "max_instances", "idle_timeout",
		"allowed_hosts", "http_timeout", "max_http_response_bytes", "max_http_response_header_bytes",
		"budget.max_concurrent_calls", "budget.requests_per_minute", "budget.tokens_per_minute", "budget.window",
	}
	policyKeys = []string{"mode", "max_attempts", "backoff", "max_backoff", "max_rate_limited_attempts", "max_retry_after"}
	tenantKeys = []string{
		"tokens_sha256", "builder", "model", "tool_executors", "mcp_servers", "history_runs", "max_agent_depth",
		"quotas.max_active_runs", "quotas.max_inflight_effects", "quotas.token_budget", "quotas.max_stored_bytes", "quotas.max_concurrent_reads",
		"rate_limits.requests.per_second", "rate_limits.requests.burst",
		"rate_limits.submissions.per_second", "rate_limits.submissions.burst",
		"limits.max_steps", "limits.max_tool_calls_per_step", "limits.max_parallel_tool_calls",
		"limits.run_timeout", "limits.wait_timeout", "limits.effect_timeout",
	}
	toolKeys = []string{"approval"}
	// agentKeys are the keys of tenants.ID.agents.NAME; its tools list,
	// its model.settings (a free JSON object) and its output_schema (a
	// JSON Schema, read from the file as written: outputschema.go) are
	// read apart.
	agentKeys = []string{
		"description", "instructions", "instructions_file", "output_schema_file", "builder", "model.plugin", "history_runs",
		"limits.max_steps", "limits.max_tool_calls_per_step", "limits.max_parallel_tool_calls",
		"limits.run_timeout", "limits.wait_timeout", "limits.effect_timeout",
	}
	// agentToolKeys are the keys of one entry of an agent's tools.
	agentToolKeys = []string{"plugin", "tool", "agent", "mcp", "approval"}
	// mcpKeys are the keys of mcp_servers.NAME; its header and env maps
	// are free (mcpFreeMaps), its command a list.
	mcpKeys     = []string{"url", "command", "dir", "call_timeout", "task_ttl", "max_result_bytes", "backoff", "max_backoff"}
	mcpFreeMaps = []string{"headers", "headers_from_env", "headers_from_file", "env", "env_from_env"}
)

func init() {
	for _, k := range policyKeys {
		tenantKeys = append(tenantKeys, "model_policy."+k)
		toolKeys = append(toolKeys, "policy."+k)
		agentKeys = append(agentKeys, "model_policy."+k)
		agentToolKeys = append(agentToolKeys, "policy."+k)
	}
}

// agentNamePattern is what an agent's name must match, after viper has
// lowercased it: it names the agent in URLs, in the Runs that ran as it
// and in environment variables.
var agentNamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,63}$`)

// MaxInstructionsBytes bounds an agent's instructions: every Run of the
// agent keeps a copy of them in its snapshot.
const MaxInstructionsBytes = 256 << 10

// idPattern is what a tenant or plugin ID must match, after viper has
// lowercased it.
var idPattern = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Load reads the config file at path, applies the AGENTHOST_… overrides
// from the environment, fills in the defaults and checks everything.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		what := "cannot be read"
		if errors.Is(err, os.ErrNotExist) {
			what = "does not exist"
		}
		return nil, fmt.Errorf("config: %s %s: pass an existing file with --config (config.example.yaml is a start): %w", path, what, err)
	}
	return Parse(path, data)
}

// Parse is Load on data already read; name is the file's name, for errors
// and to resolve relative paths.
func Parse(name string, data []byte) (*Config, error) {
	v := viper.New()
	v.SetConfigType("yaml")
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	v.AutomaticEnv()
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return nil, &Error{File: name, Problems: []string{fmt.Sprintf("%s: not valid YAML: %s", name, oneLine(err.Error()))}}
	}
	// Bind every key of the schema, so that a variable reaches a key the
	// file leaves out too (for the tenants and plugins the file declares).
	for _, k := range topKeys {
		_ = v.BindEnv(k)
	}
	for id := range mapAt(v.AllSettings(), "plugins") {
		for _, k := range pluginKeys {
			_ = v.BindEnv("plugins." + id + "." + k)
		}
	}
	for name := range mapAt(v.AllSettings(), "mcp_servers") {
		for _, k := range mcpKeys {
			_ = v.BindEnv("mcp_servers." + name + "." + k)
		}
	}
	for id, raw := range mapAt(v.AllSettings(), "tenants") {
		for _, k := range tenantKeys {
			_ = v.BindEnv("tenants." + id + "." + k)
		}
		if t, ok := raw.(map[string]any); ok {
			for tool := range mapAt(t, "tools") {
				for _, k := range toolKeys {
					_ = v.BindEnv("tenants." + id + ".tools." + tool + "." + k)
				}
			}
			for name := range mapAt(t, "agents") {
				for _, k := range agentKeys {
					_ = v.BindEnv("tenants." + id + ".agents." + name + "." + k)
				}
			}
		}
	}
	d := &decoder{file: name}
	// The document as written, keys in their case, for what viper's
	// lowercasing would change (an agent's output_schema). Viper read it
	// without error, so this does too.
	d.yaml = new(yaml.Node)
	_ = yaml.Unmarshal(data, d.yaml)
	cfg := d.decode(v.AllSettings())
	if len(d.problems) > 0 {
		return nil, &Error{File: name, Problems: d.problems}
	}
	return cfg, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func mapAt(m map[string]any, key string) map[string]any {
	sub, _ := m[key].(map[string]any)
	return sub
}

// decoder turns viper's merged settings into a Config, collecting every
// problem.
type decoder struct {
	file     string
	dir      string
	yaml     *yaml.Node // the file as written (Parse)
	problems []string
}

func (d *decoder) problem(key, format string, args ...any) {
	d.problems = append(d.problems, fmt.Sprintf("%s: %s: %s", d.file, key, fmt.Sprintf(format, args...)))
}

func (d *decoder) decode(all map[string]any) *Config {
	abs, err := filepath.Abs(d.file)
	if err != nil {
		abs = d.file
	}
	d.dir = filepath.Dir(abs)
	d.unknownKeys("", all, schemaTree())

	c := &Config{File: d.file, Dir: d.dir}
	c.DataDir = d.path("data_dir", d.str(all, "data_dir", DefaultDataDir))
	c.SyncWrites = d.boolean(all, "sync_writes", true)
	c.CacheDir = d.str(all, "cache_dir", DefaultCacheDir)
	if c.CacheDir != "" {
		c.CacheDir = d.path("cache_dir", c.CacheDir)
	}
	c.Retention = d.duration(all, "retention", 0)
	c.RetentionInterval = d.duration(all, "retention_interval", DefaultRetentionInterval)
	if c.RetentionInterval == 0 {
		c.RetentionInterval = DefaultRetentionInterval
	}
	c.Store = d.store(all)
	watchdogDefault := DefaultWatchdogInterval
	if c.Store.Driver == DriverPostgres {
		watchdogDefault = DefaultPostgresWatchdogInterval
	}
	c.WatchdogInterval = d.duration(all, "watchdog_interval", watchdogDefault)
	if c.WatchdogInterval == 0 {
		c.WatchdogInterval = watchdogDefault
	}
	c.LeaseTTL = d.duration(all, "lease_ttl", DefaultLeaseTTL)
	switch {
	case c.LeaseTTL == 0:
		c.LeaseTTL = DefaultLeaseTTL
	case c.LeaseTTL < MinLeaseTTL:
		d.problem("lease_ttl", "%s is too short: the lease is renewed every lease_ttl/3, and one shorter than %s expires under ordinary load; use %s or more (default %s)",
			c.LeaseTTL, MinLeaseTTL, MinLeaseTTL, DefaultLeaseTTL)
	}
	c.NodeName = strings.TrimSpace(d.str(all, "node.name", ""))
	if c.NodeName != "" && runtime.CheckNodeName(c.NodeName) != nil {
		d.problem("node.name", "%q is not a node name: use 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit, unique to this node (the host's name, say)", truncate(c.NodeName))
	}
	c.Listen = d.str(all, "listen", DefaultListen)
	c.HTTP = HTTP{
		ReadHeaderTimeout:       d.duration(all, "http.read_header_timeout", DefaultReadHeaderTimeout),
		ReadTimeout:             d.duration(all, "http.read_timeout", DefaultReadTimeout),
		WriteTimeout:            d.duration(all, "http.write_timeout", DefaultWriteTimeout),
		IdleTimeout:             d.duration(all, "http.idle_timeout", DefaultIdleTimeout),
		MaxHeaderBytes:          d.integer(all, "http.max_header_bytes", DefaultMaxHeaderBytes, 16<<20),
		MaxConnections:          d.integer(all, "http.max_connections", 0, 1<<20),
		MaxConnectionsPerClient: d.integer(all, "http.max_connections_per_client", DefaultMaxConnectionsPerClient, 1<<20),
		UnauthenticatedRate:     d.rate(all, "", "http.unauthenticated_rate", DefaultUnauthenticatedRate),
		MaxStreamsPerTenant:     d.integer(all, "http.max_streams_per_tenant", DefaultMaxStreamsPerTenant, 1<<20),
		StreamWriteTimeout:      d.duration(all, "http.stream_write_timeout", DefaultStreamWriteTimeout),
		MaxPageBytes:            d.integer(all, "http.max_page_bytes", DefaultMaxPageBytes, 1<<30),
	}
	if c.HTTP.StreamWriteTimeout == 0 {
		d.problem("http.stream_write_timeout", "is 0: every send of an event stream needs a bound, or a client that does not read holds its stream for ever; want a duration such as 10s (the default)")
	}
	if c.HTTP.MaxPageBytes < 4096 {
		d.problem("http.max_page_bytes", "%d is too small for a page of Run summaries: want 4096 or more (default %d)", c.HTTP.MaxPageBytes, DefaultMaxPageBytes)
	}
	// The bounds of the strings a tenant sends that the store keeps; 0
	// leaves the server's defaults. A request body is at most 1 MiB, so
	// a larger bound would never be reached.
	c.HTTP.MaxInputBytes = d.integer(all, "http.max_input_bytes", 0, MaxFieldBytes)
	c.HTTP.MaxMetadataBytes = d.integer(all, "http.max_metadata_bytes", 0, MaxFieldBytes)
	c.HTTP.MaxReasonBytes = d.integer(all, "http.max_reason_bytes", 0, MaxFieldBytes)
	c.HTTP.MaxUnauthenticatedConnections = d.integer(all, "http.max_unauthenticated_connections", 0, 1<<20)
	c.HTTP.UnauthenticatedIdleTimeout = d.duration(all, "http.unauthenticated_idle_timeout", DefaultUnauthenticatedIdleTimeout)
	c.HTTP.IPv6ClientPrefix = d.integer(all, "http.ipv6_client_prefix", DefaultIPv6ClientPrefix, 128)
	if c.HTTP.IPv6ClientPrefix < 16 {
		d.problem("http.ipv6_client_prefix", "%d is too short a prefix: it would count whole networks of IPv6 clients as one; want 16 to 128 bits (default %d: a /64, the block one host or home network is commonly given; 128: each address alone)", c.HTTP.IPv6ClientPrefix, DefaultIPv6ClientPrefix)
	}
	if c.HTTP.MaxHeaderBytes != 0 && c.HTTP.MaxHeaderBytes < 4096 {
		d.problem("http.max_header_bytes", "%d is too small for ordinary requests: want 4096 or more (default %d)", c.HTTP.MaxHeaderBytes, DefaultMaxHeaderBytes)
	}
	c.Metrics.Listen = strings.TrimSpace(d.str(all, "metrics.listen", DefaultMetricsListen))
	if c.Metrics.Listen == "" {
		d.problem("metrics.listen", "is empty: want an address such as %s (loopback only), %q to serve /metrics on the API listener without a token, or %q", DefaultMetricsListen, MetricsOnAPI, MetricsOff)
	}
	c.Tracing = d.tracing(all)
	c.Log.Format = d.oneOf(all, "log.format", DefaultLogFormat, "text", "json")
	c.Log.Level = d.oneOf(all, "log.level", DefaultLogLevel, "debug", "info", "warn", "error")
	c.MaxInstanceMemory = int64(d.integer(all, "max_instance_memory", 0, 0))
	c.PluginCallPath = d.oneOf(all, "plugin_call_path", PluginCallNative, PluginCallNative, PluginCallSDK)
	c.PluginDrain = d.duration(all, "plugin_drain", DefaultPluginDrain)
	if c.PluginDrain == 0 {
		c.PluginDrain = DefaultPluginDrain
	}
	c.PIDFile = d.str(all, "pid_file", "")
	if c.PIDFile == "" {
		c.PIDFile = filepath.Join(c.DataDir, DefaultPIDFile)
	} else {
		c.PIDFile = d.path("pid_file", c.PIDFile)
	}

	c.Plugins = map[string]Plugin{}
	for _, id := range d.ids(all, "plugins") {
		c.Plugins[id] = d.plugin(id, all["plugins"].(map[string]any)[id])
	}
	c.MCPServers = d.mcpServers(all)
	c.Tenants = map[string]Tenant{}
	for _, id := range d.ids(all, "tenants") {
		c.Tenants[id] = d.tenant(id, all["tenants"].(map[string]any)[id], c.Plugins, c.MCPServers)
	}
	if len(c.Tenants) == 0 {
		d.problem("tenants", "no tenant is declared: add at least one under tenants (see config.example.yaml)")
	}
	return c
}

// schemaPattern is what store.postgres.schema must match: an unquoted
// PostgreSQL identifier.
var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// store decodes the store.* section. The DSN may hold a password, so no
// problem ever quotes it.
func (d *decoder) store(all map[string]any) Store {
	s := Store{Driver: DriverBadger}
	if raw, ok := lookup(all, "store.driver"); ok {
		switch v, _ := raw.(string); v {
		case DriverBadger, DriverPostgres:
			s.Driver = v
		case "":
			if _, isString := raw.(string); !isString {
				d.problem("store.driver", "want a string, got %s", typeName(raw))
			} else {
				d.problem("store.driver", "is empty: want badger (the default: an embedded store in data_dir) or postgres (with store.dsn)")
			}
		default:
			d.problem("store.driver", "%q is not a store driver: want badger (the default: an embedded store in data_dir) or postgres (with store.dsn)", redactSuspect(v))
		}
	}
	if raw, ok := lookup(all, "store.dsn"); ok {
		if v, isString := raw.(string); isString {
			s.DSN = strings.TrimSpace(v)
		} else {
			d.problem("store.dsn", "want a connection string, got %s", kindOf(raw))
		}
	}
	switch {
	case s.Driver == DriverPostgres && s.DSN == "":
		d.problem("store.dsn", "is required with store.driver postgres: set a PostgreSQL connection string such as \"postgres://agenthost@db.internal:5432/agenthost\" (better in AGENTHOST_STORE_DSN, or with the password in PGPASSWORD or ~/.pgpass, than in this file)")
	case s.Driver == DriverBadger && s.DSN != "":
		d.problem("store.dsn", "is set, but store.driver is badger, which keeps everything in data_dir and reads no DSN: set store.driver: postgres (or AGENTHOST_STORE_DRIVER=postgres) to use PostgreSQL, or remove store.dsn")
	}
	if raw, ok := lookup(all, "store.postgres.max_conns"); ok {
		if n, isInt := signedInt(raw); isInt && n < 0 {
			d.problem("store.postgres.max_conns", "%d is negative: want the size of the connection pool, at least 1, or 0 for the default (16)", n)
		} else {
			s.Postgres.MaxConns = d.integer(all, "store.postgres.max_conns", 0, 1<<20)
		}
	}
	if raw, ok := lookup(all, "store.postgres.write_groups"); ok {
		if n, isInt := signedInt(raw); isInt && n < 0 {
			d.problem("store.postgres.write_groups", "%d is negative: want how many transactions of commits this node may have under way at once, at least 1, or 0 for the default (4)", n)
		} else {
			s.Postgres.WriteGroups = d.integer(all, "store.postgres.write_groups", 0, 1024)
		}
	}
	s.Postgres.StatementTimeout = d.duration(all, "store.postgres.statement_timeout", 0)
	s.Postgres.Schema = d.str(all, "store.postgres.schema", "")
	if s.Postgres.Schema != "" && !schemaPattern.MatchString(s.Postgres.Schema) {
		d.problem("store.postgres.schema", "%q is not a plain schema name: use 1 to 63 of a-z, 0-9 and _, not starting with a digit (default agenthost)", truncate(s.Postgres.Schema))
	}
	return s
}

// signedInt reads an integer of any sign from YAML or the environment.
func signedInt(raw any) (int64, bool) {
	switch v := raw.(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// kindOf names a value's type without quoting it, for keys whose values
// may be secret.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case bool:
		return "a boolean"
	case int, int64, uint64, float64:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("a %T", v)
}

// redactSuspect hides the password of a value that looks like a DSN put
// under the wrong key.
func redactSuspect(v string) string {
	if strings.Contains(v, "://") || strings.Contains(v, "=") {
		return pgstore.RedactDSN(v)
	}
	return truncate(v)
}

// ids returns the sorted IDs of the map at key, reporting bad ones.
func (d *decoder) ids(all map[string]any, key string) []string {
	raw, ok := all[key]
	if !ok || raw == nil {
		return nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		d.problem(key, "want a map keyed by ID, got %s", typeName(raw))
		return nil
	}
	var ids []string
	for id, v := range m {
		if !idPattern.MatchString(id) {
			d.problem(key+"."+id, "%q is not a valid ID: use 1 to 64 of a-z, 0-9, _ and - (keys are lowercased)", id)
			continue
		}
		if _, isMap := v.(map[string]any); !isMap {
			d.problem(key+"."+id, "want a map of settings, got %s", typeName(v))
			continue
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (d *decoder) plugin(id string, raw any) Plugin {
	m := raw.(map[string]any)
	k := "plugins." + id + "."
	p := Plugin{ID: id}
	if path := d.strAt(m, k, "path", ""); path == "" {
		d.problem(k+"path", "is required: the plugin's .wasm file")
	} else {
		p.Path = d.path(k+"path", path)
	}
	p.SHA256 = strings.ToLower(d.strAt(m, k, "sha256", ""))
	if p.SHA256 != "" && !hexSHA256.MatchString(p.SHA256) {
		d.problem(k+"sha256", "%q is not a hex sha256 (64 hex digits; `sha256sum FILE` prints it)", p.SHA256)
	}
	switch role := abi.Role(d.strAt(m, k, "role", "")); role {
	case abi.RoleBuilder, abi.RoleExecutor:
		p.Role = role
	case "":
		d.problem(k+"role", "is required: builder or executor")
	default:
		d.problem(k+"role", "%q is not a role: want builder or executor", role)
	}
	p.MemoryPages = uint32(d.integerAt(m, k, "memory_pages", 0, 65536))
	p.CallTimeout = d.durationAt(m, k, "call_timeout", 0)
	p.InitTimeout = d.durationAt(m, k, "init_timeout", 0)
	p.MaxInputBytes = d.integerAt(m, k, "max_input_bytes", 0, 0)
	p.MaxOutputBytes = d.integerAt(m, k, "max_output_bytes", 0, 0)
	p.PoolSize = d.integerAt(m, k, "pool_size", 0, 0)
	p.MaxInstances = d.integerAt(m, k, "max_instances", 0, 0)
	if p.MaxInstances > 0 && p.MaxInstances < p.PoolSize {
		d.problem(k+"max_instances", "%d is under pool_size %d: max_instances bounds every instance of a tenant, the %d kept warm included: raise max_instances or lower pool_size",
			p.MaxInstances, p.PoolSize, p.PoolSize)
	}
	p.IdleTimeout = d.durationAt(m, k, "idle_timeout", 0)
	p.AllowedHosts = d.stringsAt(m, k, "allowed_hosts")
	p.HTTPTimeout = d.durationAt(m, k, "http_timeout", 0)
	p.MaxHTTPResponseBytes = int64(d.integerAt(m, k, "max_http_response_bytes", 0, 1<<30))
	p.MaxHTTPResponseHeaderBytes = int64(d.integerAt(m, k, "max_http_response_header_bytes", 0, 16<<20))
	p.Budget = budget.Limits{
		MaxConcurrentCalls: d.integerAt(m, k, "budget.max_concurrent_calls", 0, 1<<20),
		RequestsPerMinute:  d.integerAt(m, k, "budget.requests_per_minute", 0, 1<<20),
		TokensPerMinute:    d.integerAt(m, k, "budget.tokens_per_minute", 0, 1<<40),
		Window:             d.durationAt(m, k, "budget.window", 0),
	}
	if w := p.Budget.Window; w != 0 {
		switch {
		case w < time.Second || w > time.Minute || time.Minute%w != 0:
			d.problem(k+"budget.window", "%s does not divide a minute into whole windows of at least 1s: use a window such as 1s, 5s, 10s, 15s, 30s or 1m", w)
		case p.Budget.RequestsPerMinute == 0 && p.Budget.TokensPerMinute == 0:
			d.problem(k+"budget.window", "is set, and neither requests_per_minute nor tokens_per_minute is: the window holds those limits to shorter periods; set one of them, or remove the window")
		}
	}
	if !p.Budget.IsZero() && p.Role == abi.RoleBuilder {
		d.problem(k+"budget", "a budget bounds the calls of a model executor, and this plugin is a builder: move the budget to the plugin the tenants name as their model")
	}
	p.Config = map[string]string{}
	if raw, ok := m["config"]; ok && raw != nil {
		cm, ok := raw.(map[string]any)
		if !ok {
			d.problem(k+"config", "want a map of string values, got %s", typeName(raw))
		}
		for ck, cv := range cm {
			switch cv := cv.(type) {
			case string:
				p.Config[ck] = cv
			case bool, int, int64, uint64, float64:
				p.Config[ck] = fmt.Sprint(cv)
			default:
				d.problem(k+"config."+ck, "want a string, number or boolean, got %s", typeName(cv))
			}
		}
	}
	return p
}

func (d *decoder) tenant(id string, raw any, plugins map[string]Plugin, servers map[string]MCPServer) Tenant {
	m := raw.(map[string]any)
	k := "tenants." + id + "."
	t := Tenant{ID: id}
	t.TokenSHA256 = d.stringsAt(m, k, "tokens_sha256")
	for i, h := range t.TokenSHA256 {
		t.TokenSHA256[i] = strings.ToLower(h)
		if !hexSHA256.MatchString(t.TokenSHA256[i]) {
			d.problem(k+"tokens_sha256", "entry %d is not a hex sha256: store the token's hash, never the token (`printf %%s TOKEN | sha256sum`)", i+1)
		}
	}
	t.Quotas = Quotas{
		MaxActiveRuns:      d.integerAt(m, k, "quotas.max_active_runs", 0, 0),
		MaxInflightEffects: d.integerAt(m, k, "quotas.max_inflight_effects", 0, 0),
		TokenBudget:        int64(d.integerAt(m, k, "quotas.token_budget", 0, 0)),
		MaxStoredBytes:     int64(d.integerAt(m, k, "quotas.max_stored_bytes", 0, 0)),
		MaxConcurrentReads: d.integerAt(m, k, "quotas.max_concurrent_reads", DefaultMaxConcurrentReads, 0),
	}
	t.RateLimits = RateLimits{
		Requests:    d.rate(m, k, "rate_limits.requests", DefaultRequestRate),
		Submissions: d.rate(m, k, "rate_limits.submissions", DefaultSubmissionRate),
	}
	t.Limits = Limits{
		MaxSteps:             d.integerAt(m, k, "limits.max_steps", loop.DefaultLimits.MaxSteps, 0),
		MaxToolCallsPerStep:  d.integerAt(m, k, "limits.max_tool_calls_per_step", loop.DefaultLimits.MaxToolCallsPerStep, 0),
		MaxParallelToolCalls: d.integerAt(m, k, "limits.max_parallel_tool_calls", loop.DefaultLimits.MaxParallelToolCalls, 0),
		RunTimeout:           d.durationAt(m, k, "limits.run_timeout", 0),
		WaitTimeout:          d.durationAt(m, k, "limits.wait_timeout", DefaultWaitTimeout),
		EffectTimeout:        d.durationAt(m, k, "limits.effect_timeout", 0),
	}
	for _, lim := range []struct {
		key string
		v   int
	}{{"max_steps", t.Limits.MaxSteps}, {"max_tool_calls_per_step", t.Limits.MaxToolCallsPerStep}, {"max_parallel_tool_calls", t.Limits.MaxParallelToolCalls}} {
		if lim.v < 1 {
			d.problem(k+"limits."+lim.key, "must be at least 1, got %d", lim.v)
		}
	}
	t.HistoryRuns = d.integerAt(m, k, "history_runs", DefaultHistoryRuns, 0)
	t.MaxAgentDepth = d.integerAt(m, k, "max_agent_depth", DefaultMaxAgentDepth, MaxAgentDepthLimit)
	if t.MaxAgentDepth < 1 {
		d.problem(k+"max_agent_depth", "must be at least 1, got %d (it bounds how deep agents calling agents nest)", t.MaxAgentDepth)
	}

	// With an agents block, the top-level builder is its agents' default
	// and the top-level model is optional: when set, the top-level form
	// is the default agent.
	_, hasAgents := lookup(m, "agents")
	t.Builder = d.strAt(m, k, "builder", "")
	d.reference(k+"builder", t.Builder, abi.RoleBuilder, plugins, !hasAgents)
	t.Model = d.strAt(m, k, "model", "")
	d.reference(k+"model", t.Model, abi.RoleExecutor, plugins, !hasAgents)
	t.ToolExecutors = d.stringsAt(m, k, "tool_executors")
	seen := map[string]bool{}
	for _, pid := range t.ToolExecutors {
		if seen[pid] {
			d.problem(k+"tool_executors", "plugin %q is listed twice", pid)
		}
		seen[pid] = true
		d.reference(k+"tool_executors", pid, abi.RoleExecutor, plugins, true)
	}
	t.MCPServers = d.stringsAt(m, k, "mcp_servers")
	seenServers := map[string]bool{}
	for _, name := range t.MCPServers {
		if seenServers[name] {
			d.problem(k+"mcp_servers", "server %q is listed twice", name)
		}
		seenServers[name] = true
		d.mcpReference(k+"mcp_servers", name, servers)
	}
	if mp := d.policy(m, k+"model_policy", "model_policy", loop.DefaultModelPolicy); mp != nil {
		t.ModelPolicy = *mp
	} else {
		t.ModelPolicy = loop.DefaultModelPolicy
	}
	t.Tools = map[string]ToolOverride{}
	if raw, ok := m["tools"]; ok && raw != nil {
		tm, ok := raw.(map[string]any)
		if !ok {
			d.problem(k+"tools", "want a map keyed by tool name, got %s", typeName(raw))
		}
		for name, traw := range tm {
			tk := k + "tools." + name
			if !abi.ValidToolName(name) {
				d.problem(tk, "%q is not a valid tool name", name)
				continue
			}
			om, ok := traw.(map[string]any)
			if !ok {
				d.problem(tk, "want a map (approval, policy), got %s", typeName(traw))
				continue
			}
			t.Tools[name] = d.toolOverride(om, tk)
		}
	}
	d.agents(m, k, &t, hasAgents, plugins, servers)
	d.agentCalls(k, &t)
	return t
}

// agentCalls checks the agent entries of each agent's tools: each names an
// agent of the tenant, and no agent reaches itself through them (a cycle
// would nest child Runs until max_agent_depth refused one).
func (d *decoder) agentCalls(k string, t *Tenant) {
	names := sortedKeys(t.Agents)
	for _, name := range names {
		for i, e := range t.Agents[name].Tools {
			if e.Agent != "" && !slices.Contains(names, e.Agent) {
				d.problem(fmt.Sprintf("%sagents.%s.tools[%d].agent", k, name, i), "the tenant has no agent %q (its agents: %s): fix the name",
					e.Agent, strings.Join(names, ", "))
			}
		}
	}
	// A depth-first search from each agent, in name order, reports each
	// cycle once, at the entry that closes it.
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(name string)
	visit = func(name string) {
		state[name] = onPath
		path = append(path, name)
		for i, e := range t.Agents[name].Tools {
			if _, ok := t.Agents[e.Agent]; !ok {
				continue
			}
			switch state[e.Agent] {
			case onPath:
				cycle := append(slices.Clone(path[slices.Index(path, e.Agent):]), e.Agent)
				d.problem(fmt.Sprintf("%sagents.%s.tools[%d].agent", k, name, i),
					"makes a cycle of agents calling agents (%s): a Run of any of them would start child Runs until max_agent_depth refused one; remove one of these tools",
					strings.Join(cycle, " → "))
			case unseen:
				visit(e.Agent)
			}
		}
		path = path[:len(path)-1]
		state[name] = done
	}
	for _, name := range names {
		if state[name] == unseen {
			visit(name)
		}
	}
}

// agents decodes tenants.ID.agents into t.Agents, and adds the default
// agent of the top-level form: always without an agents block, and beside
// one when the top-level model is set. (An empty agents block is no block:
// viper drops it, and the top-level model is then required.)
func (d *decoder) agents(m map[string]any, k string, t *Tenant, hasAgents bool, plugins map[string]Plugin, servers map[string]MCPServer) {
	t.Agents = map[string]Agent{}
	if hasAgents {
		am, ok := m["agents"].(map[string]any)
		if !ok {
			// unknownKeys reported it.
			return
		}
		for _, name := range sortedKeys(am) {
			ak := k + "agents." + name
			if !agentNamePattern.MatchString(name) {
				d.problem(ak, "%q is not a valid agent name: use a-z first, then up to 63 of a-z, 0-9 and - (keys are lowercased)", name)
				continue
			}
			raw, isMap := am[name].(map[string]any)
			if !isMap {
				d.problem(ak, "want a map (instructions, builder, model, tools...), got %s", typeName(am[name]))
				continue
			}
			t.Agents[name] = d.agent(ak+".", name, raw, t, plugins, servers)
		}
	}
	topLevel := !hasAgents || t.Model != ""
	switch {
	case topLevel:
		if _, dup := t.Agents[DefaultAgent]; dup {
			d.problem(k+"agents."+DefaultAgent, "is defined twice: by the tenant's top-level model (with its builder, tool_executors and tools) and here; "+
				"move the top-level model, tool_executors and tools into agents.%s, or name this agent otherwise", DefaultAgent)
			return
		}
		def := Agent{Name: DefaultAgent, TopLevel: true, Builder: t.Builder, Model: t.Model, Overrides: t.Tools,
			Limits: t.Limits, ModelPolicy: t.ModelPolicy, HistoryRuns: t.HistoryRuns}
		for _, pid := range t.ToolExecutors {
			def.Tools = append(def.Tools, AgentTool{Plugin: pid})
		}
		for _, name := range t.MCPServers {
			def.Tools = append(def.Tools, AgentTool{MCP: name})
		}
		t.Agents[DefaultAgent] = def
	case len(t.ToolExecutors) > 0 || len(t.Tools) > 0 || len(t.MCPServers) > 0:
		d.problem(k+"model", "is not set, but the tenant's top-level tool_executors or tools are (or mcp_servers): the top-level model, tool_executors, mcp_servers and tools define the agent %q. "+
			"Set model too, or move them into one of the agents under agents (mcp_servers as tools entries {mcp: NAME})", DefaultAgent)
	}
}

// agent decodes one agent at key k (ending in "."); the tenant's builder,
// limits, history_runs and model_policy are the defaults of its own.
func (d *decoder) agent(k, name string, m map[string]any, t *Tenant, plugins map[string]Plugin, servers map[string]MCPServer) Agent {
	a := Agent{Name: name}
	a.Description = d.strAt(m, k, "description", "")
	a.Instructions = d.strAt(m, k, "instructions", "")
	if file := d.strAt(m, k, "instructions_file", ""); file != "" {
		if _, inline := lookup(m, "instructions"); inline {
			d.problem(k+"instructions_file", "is set, and so is instructions: keep one of them")
		} else {
			a.InstructionsFile = d.path(k+"instructions_file", file)
			b, err := os.ReadFile(a.InstructionsFile)
			switch {
			case errors.Is(err, os.ErrNotExist):
				d.problem(k+"instructions_file", "%s does not exist: write the agent's instructions there, or inline them under instructions (a relative path is read from the config file's directory)", a.InstructionsFile)
			case err != nil:
				d.problem(k+"instructions_file", "%s cannot be read: %v", a.InstructionsFile, err)
			default:
				a.Instructions = string(b)
			}
		}
	}
	which := "instructions"
	if a.InstructionsFile != "" {
		which = "instructions_file"
	}
	if len(a.Instructions) > MaxInstructionsBytes {
		d.problem(k+which, "is %d bytes; the limit is %d (every Run of the agent keeps a copy): shorten them", len(a.Instructions), MaxInstructionsBytes)
	} else if !utf8.ValidString(a.Instructions) {
		d.problem(k+which, "is not UTF-8 text: save the instructions as UTF-8")
	}
	a.OutputSchema, a.OutputSchemaFile = d.outputSchema(k, t.ID, name, m)
	a.Builder = d.strAt(m, k, "builder", t.Builder)
	if a.Builder == "" {
		d.problem(k+"builder", "is required: the ID of a builder plugin declared under plugins (or set the tenant's builder, the default of its agents)")
	} else {
		d.reference(k+"builder", a.Builder, abi.RoleBuilder, plugins, true)
	}
	if _, isMap := m["model"].(map[string]any); isMap || m["model"] == nil {
		a.Model = d.strAt(m, k, "model.plugin", "")
		if a.Model == "" {
			d.problem(k+"model.plugin", "is required: the ID of the model executor plugin declared under plugins that serves this agent")
		} else {
			d.reference(k+"model.plugin", a.Model, abi.RoleExecutor, plugins, true)
		}
	}
	if raw, ok := lookup(m, "model.settings"); ok {
		sm, isMap := raw.(map[string]any)
		if _, err := json.Marshal(sm); !isMap || err != nil {
			d.problem(k+"model.settings", "want a map of model settings (model, temperature, max_output_tokens...), got %s", typeName(raw))
		} else {
			a.Settings = sm
		}
	}
	a.Tools = d.agentTools(k+"tools", m, plugins, servers)
	a.Limits = Limits{
		MaxSteps:             d.integerAt(m, k, "limits.max_steps", t.Limits.MaxSteps, 0),
		MaxToolCallsPerStep:  d.integerAt(m, k, "limits.max_tool_calls_per_step", t.Limits.MaxToolCallsPerStep, 0),
		MaxParallelToolCalls: d.integerAt(m, k, "limits.max_parallel_tool_calls", t.Limits.MaxParallelToolCalls, 0),
		RunTimeout:           d.durationAt(m, k, "limits.run_timeout", t.Limits.RunTimeout),
		WaitTimeout:          d.durationAt(m, k, "limits.wait_timeout", t.Limits.WaitTimeout),
		EffectTimeout:        d.durationAt(m, k, "limits.effect_timeout", t.Limits.EffectTimeout),
	}
	for _, lim := range []struct {
		key string
		v   int
	}{{"max_steps", a.Limits.MaxSteps}, {"max_tool_calls_per_step", a.Limits.MaxToolCallsPerStep}, {"max_parallel_tool_calls", a.Limits.MaxParallelToolCalls}} {
		if lim.v < 1 {
			d.problem(k+"limits."+lim.key, "must be at least 1, got %d", lim.v)
		}
	}
	a.HistoryRuns = d.integerAt(m, k, "history_runs", t.HistoryRuns, 0)
	a.ModelPolicy = t.ModelPolicy
	if mp := d.policy(m, k+"model_policy", "model_policy", t.ModelPolicy); mp != nil {
		a.ModelPolicy = *mp
	}
	return a
}

// agentTools decodes an agent's tools list at key: each entry names an
// executor plugin, and one of its tools or (without tool) all of them;
// another agent of the tenant; or an MCP server, and one of its tools or
// all of them.
func (d *decoder) agentTools(key string, m map[string]any, plugins map[string]Plugin, servers map[string]MCPServer) []AgentTool {
	raw, ok := lookup(m, "tools")
	if !ok {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		d.problem(key, "want a list of tools, each {plugin: ID} for every tool of an executor plugin, {plugin: ID, tool: NAME} for one, {agent: NAME} for another agent, or {mcp: SERVER} for every tool of an MCP server, got %s", typeName(raw))
		return nil
	}
	var out []AgentTool
	agents := map[string]bool{}
	whole := map[string]bool{}
	single := map[string]bool{}
	for i, e := range list {
		ek := fmt.Sprintf("%s[%d]", key, i)
		em, ok := e.(map[string]any)
		if !ok {
			d.problem(ek, "want a map such as {plugin: calculator}, {plugin: calculator, tool: calculate} or {mcp: SERVER}, got %s", typeName(e))
			continue
		}
		d.unknownKeys(ek+".", em, tree(agentToolKeys))
		at := AgentTool{Plugin: d.strAt(em, ek+".", "plugin", ""), Tool: d.strAt(em, ek+".", "tool", ""), Agent: d.strAt(em, ek+".", "agent", ""),
			MCP: d.strAt(em, ek+".", "mcp", "")}
		if at.Agent != "" {
			switch {
			case at.Plugin != "" || at.Tool != "" || at.MCP != "":
				d.problem(ek, "names agent %q and a plugin or tool (or an MCP server): an entry is either {agent: NAME} (another agent of the tenant, called as a tool), {plugin: ID[, tool: NAME]} or {mcp: SERVER[, tool: NAME]}", at.Agent)
			case agents[at.Agent]:
				d.problem(ek, "lists agent %q again", at.Agent)
			}
			agents[at.Agent] = true
			at.ToolOverride = d.toolOverride(em, ek)
			out = append(out, at)
			continue
		}
		// source keys the dedupe maps: the plugin's ID, or the MCP
		// server's name apart from them.
		source, what := at.Plugin, "plugin"
		switch {
		case at.MCP != "" && at.Plugin != "":
			d.problem(ek, "names plugin %q and MCP server %q: an entry is either {plugin: ID[, tool: NAME]} or {mcp: SERVER[, tool: NAME]}; split it in two", at.Plugin, at.MCP)
			continue
		case at.MCP != "":
			source, what = "mcp\x00"+at.MCP, "MCP server"
			if !d.mcpReference(ek+".mcp", at.MCP, servers) {
				continue
			}
		case at.Plugin == "":
			d.problem(ek+".plugin", "is required: the ID of the executor plugin whose tools the agent may call (or set agent: NAME to call another agent of the tenant, or mcp: SERVER for the tools of an MCP server)")
			continue
		default:
			d.reference(ek+".plugin", at.Plugin, abi.RoleExecutor, plugins, true)
		}
		name := at.Plugin + at.MCP
		switch {
		case at.Tool == "" && (whole[source] || single[source]):
			d.problem(ek, "lists %s %q again: list it once, without tool for all its tools or with tool for each one", what, name)
		case at.Tool != "" && at.MCP == "" && !abi.ValidToolName(at.Tool):
			d.problem(ek+".tool", "%q is not a valid tool name", at.Tool)
		case at.Tool != "" && at.MCP != "" && (strings.TrimSpace(at.Tool) == "" || len(at.Tool) > maxMCPToolNameBytes):
			d.problem(ek+".tool", "%q is not a tool name an MCP server can offer: the server's own name of the tool, 1 to %d bytes (without the %s%s prefix)", truncate(at.Tool), maxMCPToolNameBytes, at.MCP, MCPToolSeparator)
		case at.Tool != "" && whole[source]:
			d.problem(ek, "lists tool %q of %s %q, whose every tool is listed already (without tool): keep one of the two", at.Tool, what, name)
		case at.Tool != "" && single[source+"\x00"+at.Tool]:
			d.problem(ek, "lists tool %q of %s %q again", at.Tool, what, name)
		}
		if at.Tool == "" {
			whole[source] = true
		} else {
			single[source] = true
			single[source+"\x00"+at.Tool] = true
		}
		at.ToolOverride = d.toolOverride(em, ek)
		out = append(out, at)
	}
	return out
}

// toolPolicyDefaults are the defaults of the keys a tool's policy block
// leaves out: the retry parameters of an idempotent tool's default policy
// (3 attempts, backoff 1s doubling up to 30s), and no mode, which
// Tenant.ToolPolicy picks by the tool's idempotency as a tool without a
// policy block gets it (retry if idempotent, else fail).
var toolPolicyDefaults = func() loop.Policy {
	p := loop.DefaultToolPolicy(true)
	p.Mode = ""
	return p
}()

// toolOverride reads the approval and missing-effect policy a tool entry
// at key (a map) overrides.
func (d *decoder) toolOverride(m map[string]any, key string) ToolOverride {
	var o ToolOverride
	switch a := abi.Approval(d.strAt(m, key+".", "approval", "")); a {
	case "", abi.ApprovalNever, abi.ApprovalAlways:
		o.Approval = a
	default:
		d.problem(key+".approval", "%q is not an approval: want never or always", a)
	}
	o.Policy = d.policy(m, key+".policy", "policy", toolPolicyDefaults)
	return o
}

// policy decodes a missing-effect policy under key (nil when absent). Each
// key the block leaves out takes its value from def, field by field: a
// block that sets only max_attempts keeps the documented backoff and
// max_backoff, instead of dropping them to 0 (no backoff, no cap).
func (d *decoder) policy(m map[string]any, full, key string, def loop.Policy) *loop.Policy {
	raw, ok := m[key]
	if !ok || raw == nil {
		return nil
	}
	pm, ok := raw.(map[string]any)
	if !ok {
		d.problem(full, "want a map (mode, max_attempts, backoff, max_backoff, max_rate_limited_attempts, max_retry_after), got %s", typeName(raw))
		return nil
	}
	p := def
	if _, set := lookup(pm, "mode"); set {
		switch mode := loop.PolicyMode(d.strAt(pm, full+".", "mode", "")); mode {
		case loop.PolicyRetry, loop.PolicyFail, loop.PolicyFailRun:
			p.Mode = mode
		default:
			d.problem(full+".mode", "%q is not a policy: want retry, fail or fail_run (or leave mode out for the default)", mode)
		}
	}
	_, attemptsSet := lookup(pm, "max_attempts")
	p.MaxAttempts = d.integerAt(pm, full+".", "max_attempts", def.MaxAttempts, 0)
	switch {
	case p.Mode == loop.PolicyRetry && p.MaxAttempts < 1:
		d.problem(full+".max_attempts", "retry needs max_attempts of at least 1")
	case p.Mode == "" && attemptsSet && p.MaxAttempts < 1:
		// The mode is left to the tool: retry when it is idempotent.
		d.problem(full+".max_attempts", "must be at least 1: without a mode, an idempotent tool retries, and retry needs max_attempts of at least 1")
	}
	p.BackoffMS = d.durationAt(pm, full+".", "backoff", time.Duration(def.BackoffMS)*time.Millisecond).Milliseconds()
	_, capSet := lookup(pm, "max_backoff")
	p.MaxBackoffMS = d.durationAt(pm, full+".", "max_backoff", time.Duration(def.MaxBackoffMS)*time.Millisecond).Milliseconds()
	if p.MaxBackoffMS > 0 && p.BackoffMS > p.MaxBackoffMS {
		// The cap would cut the first backoff already: say so rather
		// than let a default max_backoff shorten the backoff silently.
		which := "max_backoff"
		if !capSet {
			which = "max_backoff (by default)"
		}
		d.problem(full+".max_backoff", "%s is %s, less than backoff %s, which it would cut: raise max_backoff, or set it to 0 for no cap",
			which, time.Duration(p.MaxBackoffMS)*time.Millisecond, time.Duration(p.BackoffMS)*time.Millisecond)
	}
	// The rate-limit keys: left out, they stay 0, which the Loop reads as
	// its defaults (loop.DefaultMaxRateLimitedAttempts,
	// loop.DefaultMaxRetryAfterMS).
	if _, set := lookup(pm, "max_rate_limited_attempts"); set {
		// integerAt reports a value that is not an integer in range, and
		// then answers -1.
		n := d.integerAt(pm, full+".", "max_rate_limited_attempts", -1, maxRateLimitedAttempts)
		if n == 0 {
			d.problem(full+".max_rate_limited_attempts", "must be at least 1: it is how many attempts of an effect the provider may answer rate_limited before the effect fails (leave it out for the default, %d)",
				loop.DefaultMaxRateLimitedAttempts)
		}
		p.MaxRateLimitedAttempts = max(n, 0)
	}
	if _, set := lookup(pm, "max_retry_after"); set {
		// durationAt reports a value that is not a duration, and then
		// answers -1.
		v := d.durationAt(pm, full+".", "max_retry_after", -1)
		if v >= 0 && v < time.Millisecond {
			d.problem(full+".max_retry_after", "must be more than 0: it is the longest wait a provider's retry-after sets before the next attempt (leave it out for the default, %s)",
				time.Duration(loop.DefaultMaxRetryAfterMS)*time.Millisecond)
		}
		p.MaxRetryAfterMS = max(v.Milliseconds(), 0)
	}
	return &p
}

// maxRateLimitedAttempts bounds a policy's max_rate_limited_attempts.
const maxRateLimitedAttempts = 10_000

// reference checks that id names a declared plugin of the wanted role.
func (d *decoder) reference(key, id string, role abi.Role, plugins map[string]Plugin, required bool) {
	if id == "" {
		if required {
			d.problem(key, "is required: the ID of a %s plugin declared under plugins", role)
		}
		return
	}
	p, ok := plugins[id]
	if !ok {
		d.problem(key, "names plugin %q, which is not declared under plugins (declared: %s)", id, strings.Join(sortedKeys(plugins), ", "))
		return
	}
	if p.Role != "" && p.Role != role {
		d.problem(key, "names plugin %q, which is a %s; a %s is needed here", id, p.Role, role)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// path resolves p against the config file's directory.
func (d *decoder) path(_ string, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(d.dir, p)
}

// lookup finds a dotted key in nested maps.
func lookup(m map[string]any, key string) (any, bool) {
	parts := strings.Split(key, ".")
	var cur any = m
	for _, p := range parts {
		cm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = cm[p]; !ok {
			return nil, false
		}
	}
	return cur, cur != nil
}

func (d *decoder) str(m map[string]any, key, def string) string { return d.strAt(m, "", key, def) }

func (d *decoder) strAt(m map[string]any, prefix, key, def string) string {
	raw, ok := lookup(m, key)
	if !ok {
		return def
	}
	s, ok := raw.(string)
	if !ok {
		d.problem(prefix+key, "want a string, got %s", typeName(raw))
		return def
	}
	return s
}

func (d *decoder) oneOf(m map[string]any, key, def string, allowed ...string) string {
	s := d.str(m, key, def)
	for _, a := range allowed {
		if s == a {
			return s
		}
	}
	d.problem(key, "%q is not one of %s", s, strings.Join(allowed, ", "))
	return def
}

func (d *decoder) boolean(m map[string]any, key string, def bool) bool {
	raw, ok := lookup(m, key)
	if !ok {
		return def
	}
	switch b := raw.(type) {
	case bool:
		return b
	case string: // from the environment
		if v, err := strconv.ParseBool(b); err == nil {
			return v
		}
	}
	d.problem(key, "want true or false, got %s", typeName(raw))
	return def
}

func (d *decoder) integer(m map[string]any, key string, def, max int) int {
	return d.integerAt(m, "", key, def, max)
}

// integerAt reads a non-negative integer (at most max, when max > 0).
func (d *decoder) integerAt(m map[string]any, prefix, key string, def, max int) int {
	raw, ok := lookup(m, key)
	if !ok {
		return def
	}
	var n int64
	bad := false
	switch v := raw.(type) {
	case int:
		n = int64(v)
	case int64:
		n = v
	case uint64:
		if v > 1<<62 {
			bad = true
		}
		n = int64(v)
	case float64:
		if v != float64(int64(v)) || v > 1<<62 || v < -(1<<62) {
			bad = true
		}
		n = int64(v)
	case string: // from the environment
		p, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		bad, n = err != nil, p
	default:
		bad = true
	}
	if bad {
		d.problem(prefix+key, "want an integer, got %s", typeName(raw))
		return def
	}
	if n < 0 || n > 1<<40 || (max > 0 && n > int64(max)) {
		limit := "1099511627776"
		if max > 0 {
			limit = strconv.Itoa(max)
		}
		d.problem(prefix+key, "%d is out of range: want 0 to %s", n, limit)
		return def
	}
	return int(n)
}

// rate reads a token bucket at key (key.per_second, key.burst). A rate
// with per_second 0 is no limit; a positive one needs a burst of at least
// 1 (default: the default's, or twice the rate).
func (d *decoder) rate(m map[string]any, prefix, key string, def Rate) Rate {
	r := Rate{PerSecond: def.PerSecond, Burst: def.Burst}
	if raw, ok := lookup(m, key+".per_second"); ok {
		v, good := number(raw)
		if !good || math.IsNaN(v) || v < 0 || v > 1e9 {
			d.problem(prefix+key+".per_second", "want a number of requests a second, 0 (no limit) or more, got %s", typeName(raw))
		} else {
			r.PerSecond = v
			if _, set := lookup(m, key+".burst"); !set && v > 0 {
				r.Burst = max(def.Burst, int(math.Ceil(2*v)))
			}
		}
	}
	if _, ok := lookup(m, key+".burst"); ok {
		r.Burst = d.integerAt(m, prefix, key+".burst", r.Burst, 1<<30)
	}
	if r.PerSecond > 0 && r.Burst < 1 {
		d.problem(prefix+key+".burst", "is %d: a rate of %g a second needs a burst of at least 1 (the requests allowed at once)", r.Burst, r.PerSecond)
	}
	return r
}

// number reads a non-integer or integer number from YAML or the
// environment.
func number(raw any) (float64, bool) {
	switch v := raw.(type) {
	case int:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint64:
		return float64(v), true
	case float64:
		return v, true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return f, err == nil
	}
	return 0, false
}

func (d *decoder) duration(m map[string]any, key string, def time.Duration) time.Duration {
	return d.durationAt(m, "", key, def)
}

func (d *decoder) durationAt(m map[string]any, prefix, key string, def time.Duration) time.Duration {
	raw, ok := lookup(m, key)
	if !ok {
		return def
	}
	if n, isInt := raw.(int); isInt && n == 0 {
		return 0
	}
	s, ok := raw.(string)
	if !ok {
		d.problem(prefix+key, "want a duration such as \"30s\" or \"5m\", got %s", typeName(raw))
		return def
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || v < 0 {
		hint := ""
		if strings.HasSuffix(strings.TrimSpace(s), "d") {
			hint = " (there is no unit of days: write 168h for 7 days)"
		}
		d.problem(prefix+key, "%q is not a duration: write it like \"30s\", \"5m\" or \"1h30m\"%s", s, hint)
		return def
	}
	return v
}

// stringsAt reads a list of strings; from the environment, a
// comma-separated string.
func (d *decoder) stringsAt(m map[string]any, prefix, key string) []string {
	raw, ok := lookup(m, key)
	if !ok {
		return nil
	}
	switch v := raw.(type) {
	case string:
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	case []any:
		out := make([]string, 0, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				d.problem(prefix+key, "entry %d: want a string, got %s", i+1, typeName(e))
				continue
			}
			out = append(out, s)
		}
		return out
	}
	d.problem(prefix+key, "want a list of strings, got %s", typeName(raw))
	return nil
}

func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing"
	case string:
		return fmt.Sprintf("the string %q", truncate(v))
	case bool:
		return fmt.Sprintf("the boolean %v", v)
	case int, int64, uint64:
		return fmt.Sprintf("the integer %v", v)
	case float64:
		return fmt.Sprintf("the number %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("a %T", v)
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// node is one level of the schema, for finding unknown keys.
type node struct {
	children map[string]*node
	each     *node // a map keyed by ID (or tool name)
	free     bool  // any keys (plugins.ID.config)
}

func tree(keys []string) *node {
	n := &node{children: map[string]*node{}}
	for _, k := range keys {
		cur := n
		for _, p := range strings.Split(k, ".") {
			next, ok := cur.children[p]
			if !ok {
				next = &node{children: map[string]*node{}}
				cur.children[p] = next
			}
			cur = next
		}
	}
	return n
}

func schemaTree() *node {
	root := tree(topKeys)
	plugin := tree(pluginKeys)
	plugin.children["config"] = &node{free: true}
	tenant := tree(tenantKeys)
	tenant.children["tools"] = &node{each: tree(toolKeys)}
	agent := tree(agentKeys)
	agent.children["model"].children["settings"] = &node{free: true}
	agent.children["output_schema"] = &node{free: true}
	agent.children["tools"] = &node{children: map[string]*node{}} // a list, read by agentTools
	tenant.children["agents"] = &node{each: agent}
	root.children["plugins"] = &node{each: plugin}
	root.children["tenants"] = &node{each: tenant}
	root.children["mcp_servers"] = &node{each: mcpSchema()}
	return root
}

// unknownKeys reports every key of m the schema does not know.
func (d *decoder) unknownKeys(prefix string, m map[string]any, n *node) {
	for _, k := range sortedKeys(m) {
		full := prefix + k
		if n.each != nil {
			if sub, ok := m[k].(map[string]any); ok {
				d.unknownKeys(full+".", sub, n.each)
			}
			continue
		}
		child, ok := n.children[k]
		if !ok {
			hint := "remove it, or check its spelling against config.example.yaml"
			if k == "tokens" && strings.HasPrefix(prefix, "tenants.") {
				hint = "plain-text tokens are not accepted: store their sha256 under tokens_sha256 (`printf %s TOKEN | sha256sum`)"
			}
			d.problem(full, "unknown key: %s", hint)
			continue
		}
		if child.free {
			continue
		}
		if len(child.children) == 0 && child.each == nil {
			continue // a leaf: its type is checked where it is read
		}
		if sub, ok := m[k].(map[string]any); ok {
			d.unknownKeys(full+".", sub, child)
		} else if m[k] != nil {
			d.problem(full, "want a map, got %s", typeName(m[k]))
		}
	}
}

// MissingFiles lists, one line each, the plugin files that do not exist.
func (c *Config) MissingFiles() []string {
	var out []string
	for _, id := range sortedKeys(c.Plugins) {
		p := c.Plugins[id]
		if _, err := os.Stat(p.Path); err != nil {
			shown := p.Path
			if rel, err := filepath.Rel(c.Dir, p.Path); err == nil && !strings.HasPrefix(rel, "..") {
				shown = rel
			}
			build := "`make plugins`"
			if strings.HasSuffix(p.Path, "-c.wasm") {
				build = "`make plugins-c` (the C builds; make deps-c installs clang)"
			}
			out = append(out, fmt.Sprintf("%s: plugins.%s.path: %s does not exist; run %s (or fix the path)", c.File, id, shown, build))
		}
	}
	return out
}

// tracing reads the tracing section.
func (d *decoder) tracing(all map[string]any) Tracing {
	t := Tracing{
		Enabled:     d.boolean(all, "tracing.enabled", false),
		Endpoint:    strings.TrimSpace(d.str(all, "tracing.endpoint", "")),
		ServiceName: strings.TrimSpace(d.str(all, "tracing.service_name", DefaultServiceName)),
	}
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		shown := t.Endpoint // without a password it may carry
		if err == nil && u.User != nil {
			shown = u.Redacted()
		}
		switch {
		case err != nil:
			// Neither the value nor the parser's error (which quotes it)
			// is shown: it may carry a password.
			d.problem("tracing.endpoint", "is not a URL: want the OTLP/HTTP receiver's base URL, such as http://127.0.0.1:4318")
		case u.Scheme != "http" && u.Scheme != "https":
			d.problem("tracing.endpoint", "%q has scheme %q: want an http or https URL of an OTLP/HTTP receiver, such as http://127.0.0.1:4318 (OTLP over gRPC is not supported)", shown, u.Scheme)
		case u.Host == "":
			d.problem("tracing.endpoint", "%q names no host: want the OTLP/HTTP receiver's base URL, such as http://127.0.0.1:4318", shown)
		}
	}
	if t.ServiceName == "" {
		d.problem("tracing.service_name", "is empty: leave it out for %q, or name the service the spans belong to", DefaultServiceName)
	}
	return t
}

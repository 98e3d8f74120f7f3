package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

const minimal = `
plugins:
  b: {path: b.wasm, role: builder}
  m: {path: m.wasm, role: executor}
tenants:
  acme:
    builder: b
    model: m
`

func parse(t *testing.T, yaml string) (*Config, error) {
	t.Helper()
	return Parse(filepath.Join(t.TempDir(), "agenthost.yaml"), []byte(yaml))
}

func problems(t *testing.T, err error) []string {
	t.Helper()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a *config.Error, got %v", err)
	}
	return ce.Problems
}

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := Load("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	demo, ok := cfg.Tenants["demo"]
	if !ok {
		t.Fatal("the example has no demo tenant")
	}
	if demo.Builder != "prompt-builder" || demo.Model != "scripted-model" {
		t.Errorf("demo wires builder %q, model %q", demo.Builder, demo.Model)
	}
	if strings.Join(demo.ToolExecutors, ",") != "calculator,slow-job" {
		t.Errorf("demo tool executors: %v", demo.ToolExecutors)
	}
	// printf %s demo-token | sha256sum
	if len(demo.TokenSHA256) != 1 || demo.TokenSHA256[0] != "7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c" {
		t.Errorf("demo token hashes: %v", demo.TokenSHA256)
	}
	root, _ := filepath.Abs("../..")
	if want := filepath.Join(root, "build/plugins/calculator-c.wasm"); cfg.Plugins["calculator"].Path != want {
		t.Errorf("calculator path %q, want %q (relative to the file)", cfg.Plugins["calculator"].Path, want)
	}
	if cfg.Plugins["prompt-builder"].Config["history_window"] != "6" {
		t.Errorf("a number in plugin config becomes a string: %v", cfg.Plugins["prompt-builder"].Config)
	}
	if p := demo.Tools["slow_job"].Policy; p == nil || p.Mode != loop.PolicyRetry || p.BackoffMS != 2000 {
		t.Errorf("slow_job policy override: %+v", p)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.SyncWrites || cfg.Log.Level != "info" || cfg.Log.Format != "text" || cfg.Listen != DefaultListen ||
		cfg.WatchdogInterval != 30*time.Second || cfg.LeaseTTL != 15*time.Second {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.DataDir != filepath.Join(cfg.Dir, "data") {
		t.Errorf("data dir %q does not default to data/ beside the file", cfg.DataDir)
	}
	acme := cfg.Tenants["acme"]
	if acme.Limits.MaxSteps != loop.DefaultLimits.MaxSteps || acme.ModelPolicy != loop.DefaultModelPolicy || acme.HistoryRuns != DefaultHistoryRuns {
		t.Errorf("tenant defaults: %+v", acme)
	}
	if p := acme.ToolPolicy("x", true); p.Mode != loop.PolicyRetry {
		t.Errorf("an idempotent tool retries by default, got %+v", p)
	}
	if acme.ToolApproval("x", abi.ApprovalAlways) != true || acme.ToolApproval("x", abi.ApprovalNever) {
		t.Error("with no override, approval follows describe")
	}
}

func TestEveryProblemIsReportedWithFileAndKey(t *testing.T) {
	_, err := parse(t, `
data_dir: 42
sync_writes: "perhaps"
retention: forever
retention_interval: often
watchdog_interval: -3s
lease_ttl: 200ms
node: {name: "edge/1"}
colour: blue
log: {level: loud}
plugins:
  b: {path: b.wasm, role: builder, memory_pages: 70000, sha256: abc, pool_size: 8, max_instances: 2}
  m: {role: model, allowed_hosts: 3}
tenants:
  acme:
    tokens: [demo-token]
    builder: m
    model: nope
    limits: {max_steps: "many", max_parallel_tool_calls: 0}
    tools:
      calc: {approval: sometimes, policy: {mode: retry, max_attempts: 0}}
`)
	ps := problems(t, err)
	text := strings.Join(ps, "\n")
	for _, want := range []string{
		"data_dir: want a string, got the integer 42",
		"sync_writes: want true or false",
		"retention: \"forever\" is not a duration",
		"retention_interval: \"often\" is not a duration",
		"watchdog_interval: \"-3s\" is not a duration",
		"lease_ttl: 200ms is too short",
		"node.name: \"edge/1\" is not a node name",
		"colour: unknown key",
		"log.level: \"loud\" is not one of debug, info, warn, error",
		"plugins.b.memory_pages: 70000 is out of range",
		"plugins.b.sha256: \"abc\" is not a hex sha256",
		"plugins.b.max_instances: 2 is under pool_size 8",
		"plugins.m.path: is required",
		"plugins.m.role: \"model\" is not a role",
		"plugins.m.allowed_hosts: want a list of strings",
		"tenants.acme.tokens: unknown key: plain-text tokens are not accepted",
		"tenants.acme.model: names plugin \"nope\", which is not declared",
		"tenants.acme.limits.max_steps: want an integer, got the string \"many\"",
		"tenants.acme.limits.max_parallel_tool_calls: must be at least 1",
		"tenants.acme.tools.calc.approval: \"sometimes\" is not an approval",
		"tenants.acme.tools.calc.policy.max_attempts: retry needs max_attempts",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
	for _, p := range ps {
		if !strings.Contains(p, "agenthost.yaml: ") {
			t.Errorf("problem %q does not name the file", p)
		}
		if strings.Contains(p, "\n") {
			t.Errorf("problem %q spans lines", p)
		}
	}
}

func TestEnvironmentOverridesNestedKeys(t *testing.T) {
	t.Setenv("AGENTHOST_DATA_DIR", "/var/lib/agenthost")
	t.Setenv("AGENTHOST_TENANTS_ACME_LIMITS_MAX_STEPS", "3")
	t.Setenv("AGENTHOST_TENANTS_ACME_LIMITS_RUN_TIMEOUT", "90s")
	t.Setenv("AGENTHOST_PLUGINS_M_ALLOWED_HOSTS", "a.example.com, b.example.com")
	t.Setenv("AGENTHOST_SYNC_WRITES", "false")
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/var/lib/agenthost" || cfg.SyncWrites {
		t.Errorf("top-level overrides: data_dir %q sync %v", cfg.DataDir, cfg.SyncWrites)
	}
	acme := cfg.Tenants["acme"]
	if acme.Limits.MaxSteps != 3 || acme.Limits.RunTimeout != 90*time.Second {
		t.Errorf("tenant overrides: %+v", acme.Limits)
	}
	if h := cfg.Plugins["m"].AllowedHosts; strings.Join(h, "|") != "a.example.com|b.example.com" {
		t.Errorf("list override: %v", h)
	}
}

func TestEnvironmentOverrideWithBadValueNamesTheKey(t *testing.T) {
	t.Setenv("AGENTHOST_TENANTS_ACME_LIMITS_MAX_STEPS", "lots")
	_, err := parse(t, minimal)
	text := strings.Join(problems(t, err), "\n")
	if !strings.Contains(text, "tenants.acme.limits.max_steps: want an integer, got the string \"lots\"") {
		t.Errorf("got %s", text)
	}
}

func TestDashedPluginIDsAreReachable(t *testing.T) {
	t.Setenv("AGENTHOST_PLUGINS_SLOW_JOB_CALL_TIMEOUT", "7s")
	cfg, err := parse(t, `
plugins:
  b: {path: b.wasm, role: builder}
  slow-job: {path: s.wasm, role: executor}
tenants:
  acme: {builder: b, model: slow-job, tool_executors: [slow-job]}
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Plugins["slow-job"].CallTimeout; got != 7*time.Second {
		t.Errorf("AGENTHOST_PLUGINS_SLOW_JOB_CALL_TIMEOUT gave %v", got)
	}
}

func TestKeysAreLowercased(t *testing.T) {
	cfg, err := parse(t, `
plugins:
  B: {path: b.wasm, role: builder, config: {SystemPrompt: hi}}
  m: {path: m.wasm, role: executor}
tenants:
  Acme: {builder: b, model: m}
`)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Tenants["acme"]; !ok {
		t.Errorf("tenant IDs are lowercased: %v", sortedKeys(cfg.Tenants))
	}
	if cfg.Plugins["b"].Config["systemprompt"] != "hi" {
		t.Errorf("plugin config keys are lowercased: %v", cfg.Plugins["b"].Config)
	}
}

func TestNoTenantIsAnError(t *testing.T) {
	_, err := parse(t, "data_dir: x\n")
	if !strings.Contains(err.Error(), "tenants: no tenant is declared") {
		t.Fatalf("got %v", err)
	}
}

func TestMissingFileSaysWhatToDo(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("got %v", err)
	}
}

func TestMissingPluginFilesAreListed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agenthost.yaml")
	if err := os.WriteFile(filepath.Join(dir, "b.wasm"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(file, []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	missing := cfg.MissingFiles()
	if len(missing) != 1 || !strings.Contains(missing[0], "plugins.m.path: m.wasm does not exist; run `make plugins` (or") {
		t.Fatalf("got %q", missing)
	}
	// A C build's file names the target that builds the C examples.
	if !strings.Contains(minimal, "path: m.wasm") {
		t.Fatal("the minimal config no longer loads m.wasm")
	}
	cfg, err = Parse(file, []byte(strings.Replace(minimal, "path: m.wasm", "path: m-c.wasm", 1)))
	if err != nil {
		t.Fatal(err)
	}
	missing = cfg.MissingFiles()
	if len(missing) != 1 || !strings.Contains(missing[0], "plugins.m.path: m-c.wasm does not exist; run `make plugins-c`") {
		t.Fatalf("got %q", missing)
	}
}

func TestStoreDefaultsToBadger(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Driver != DriverBadger || cfg.Store.DSN != "" || cfg.Store.Postgres != (Postgres{}) {
		t.Errorf("store defaults: %+v", cfg.Store)
	}
	if cfg.WatchdogInterval != DefaultWatchdogInterval {
		t.Errorf("watchdog_interval with badger: %s, want %s", cfg.WatchdogInterval, DefaultWatchdogInterval)
	}
	if got, want := cfg.StoreLocation(), "data dir "+filepath.Join(cfg.Dir, "data"); got != want {
		t.Errorf("StoreLocation %q, want %q", got, want)
	}
}

func TestStorePostgres(t *testing.T) {
	cfg, err := parse(t, minimal+`
store:
  driver: postgres
  dsn: postgres://agenthost:s3cret@db.internal:5432/agenthost
  postgres:
    max_conns: 8
    write_groups: 2
    statement_timeout: 5s
    schema: ah_prod
`)
	if err != nil {
		t.Fatal(err)
	}
	want := Store{Driver: DriverPostgres, DSN: "postgres://agenthost:s3cret@db.internal:5432/agenthost",
		Postgres: Postgres{MaxConns: 8, WriteGroups: 2, StatementTimeout: 5 * time.Second, Schema: "ah_prod"}}
	if cfg.Store != want {
		t.Errorf("store: %+v, want %+v", cfg.Store, want)
	}
	// The watchdog is the safety net for a lost cross-node notification.
	if cfg.WatchdogInterval != DefaultPostgresWatchdogInterval {
		t.Errorf("watchdog_interval with postgres: %s, want %s", cfg.WatchdogInterval, DefaultPostgresWatchdogInterval)
	}
	loc := cfg.StoreLocation()
	if strings.Contains(loc, "s3cret") || !strings.Contains(loc, "db.internal") {
		t.Errorf("StoreLocation %q must name the server and hide the password", loc)
	}
}

func TestStorePostgresKeepsAConfiguredWatchdogInterval(t *testing.T) {
	cfg, err := parse(t, minimal+"watchdog_interval: 45s\nstore: {driver: postgres, dsn: \"host=/tmp dbname=x\"}\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WatchdogInterval != 45*time.Second {
		t.Errorf("watchdog_interval %s, want the configured 45s", cfg.WatchdogInterval)
	}
}

func TestStoreEnvironmentOverrides(t *testing.T) {
	t.Setenv("AGENTHOST_STORE_DRIVER", "postgres")
	t.Setenv("AGENTHOST_STORE_DSN", "postgres://u:pw@h/db")
	t.Setenv("AGENTHOST_STORE_POSTGRES_MAX_CONNS", "4")
	t.Setenv("AGENTHOST_STORE_POSTGRES_STATEMENT_TIMEOUT", "2s")
	t.Setenv("AGENTHOST_STORE_POSTGRES_WRITE_GROUPS", "3")
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Driver != DriverPostgres || cfg.Store.DSN != "postgres://u:pw@h/db" ||
		cfg.Store.Postgres.MaxConns != 4 || cfg.Store.Postgres.StatementTimeout != 2*time.Second || cfg.Store.Postgres.WriteGroups != 3 {
		t.Errorf("store from the environment: %+v", cfg.Store)
	}
}

func TestStoreEnvironmentOverridesTheFile(t *testing.T) {
	t.Setenv("AGENTHOST_STORE_DSN", "host=/run/pg dbname=other password=envpw")
	cfg, err := parse(t, minimal+"store: {driver: postgres, dsn: \"postgres://u:pw@h/db\"}\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.DSN != "host=/run/pg dbname=other password=envpw" {
		t.Errorf("AGENTHOST_STORE_DSN did not override store.dsn: %q", cfg.StoreLocation())
	}
}

func TestStoreProblems(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string // each must be in one problem
	}{
		{"unknown driver", "store: {driver: mysql}\n",
			[]string{`store.driver: "mysql" is not a store driver: want badger`, "or postgres (with store.dsn)"}},
		{"empty driver", "store: {driver: \"\"}\n", []string{"store.driver: is empty: want badger"}},
		{"postgres without dsn", "store: {driver: postgres}\n",
			[]string{"store.dsn: is required with store.driver postgres", "AGENTHOST_STORE_DSN"}},
		{"dsn with badger", "store: {dsn: \"postgres://u:topsecret@h/db\"}\n",
			[]string{"store.dsn: is set, but store.driver is badger", "set store.driver: postgres"}},
		{"negative pool", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {max_conns: -2}}\n",
			[]string{"store.postgres.max_conns: -2 is negative: want the size of the connection pool, at least 1"}},
		{"negative write groups", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {write_groups: -1}}\n",
			[]string{"store.postgres.write_groups: -1 is negative: want how many transactions of commits this node may have under way at once"}},
		{"too many write groups", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {write_groups: 5000}}\n",
			[]string{"store.postgres.write_groups"}},
		{"pool not a number", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {max_conns: many}}\n",
			[]string{`store.postgres.max_conns: want an integer, got the string "many"`}},
		{"bad statement timeout", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {statement_timeout: -1s}}\n",
			[]string{`store.postgres.statement_timeout: "-1s" is not a duration`}},
		{"bad schema", "store: {driver: postgres, dsn: \"host=/tmp\", postgres: {schema: \"1; drop\"}}\n",
			[]string{`store.postgres.schema: "1; drop" is not a plain schema name`}},
		{"unknown store key", "store: {driver: badger, pool: 3}\n", []string{"store.pool: unknown key"}},
		{"store not a map", "store: postgres\n", []string{"store: want a map"}},
		{"dsn not a string", "store: {driver: postgres, dsn: {host: x}}\n", []string{"store.dsn: want a connection string, got a map"}},
		{"dsn under driver", "store: {driver: \"postgres://u:topsecret@h/db\"}\n",
			[]string{`store.driver: "postgres://u:xxxxx@h/db" is not a store driver`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, minimal+tc.yaml)
			ps := problems(t, err)
			text := strings.Join(ps, "\n")
			for _, want := range tc.want {
				if !strings.Contains(text, want) {
					t.Errorf("no problem says %q; got:\n%s", want, text)
				}
			}
			for _, p := range ps {
				if !strings.Contains(p, "agenthost.yaml: ") || strings.Contains(p, "\n") {
					t.Errorf("problem %q must be one line naming the file", p)
				}
			}
			if strings.Contains(text, "topsecret") {
				t.Errorf("a problem shows the DSN's password:\n%s", text)
			}
		})
	}
}

func TestStoreProblemsFromTheEnvironmentNameTheKey(t *testing.T) {
	t.Setenv("AGENTHOST_STORE_DRIVER", "sqlite")
	t.Setenv("AGENTHOST_STORE_POSTGRES_MAX_CONNS", "-1")
	_, err := parse(t, minimal)
	text := strings.Join(problems(t, err), "\n")
	for _, want := range []string{`store.driver: "sqlite" is not a store driver`, "store.postgres.max_conns: -1 is negative"} {
		if !strings.Contains(text, want) {
			t.Errorf("no problem says %q; got:\n%s", want, text)
		}
	}
}

func TestHTTPLimitsDefaults(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	want := HTTP{
		ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout, WriteTimeout: DefaultWriteTimeout,
		IdleTimeout: DefaultIdleTimeout, MaxHeaderBytes: DefaultMaxHeaderBytes, MaxConnections: 0,
		MaxConnectionsPerClient: DefaultMaxConnectionsPerClient, UnauthenticatedRate: DefaultUnauthenticatedRate,
		MaxStreamsPerTenant: DefaultMaxStreamsPerTenant, StreamWriteTimeout: DefaultStreamWriteTimeout, MaxPageBytes: DefaultMaxPageBytes,
		UnauthenticatedIdleTimeout: DefaultUnauthenticatedIdleTimeout, IPv6ClientPrefix: DefaultIPv6ClientPrefix,
	}
	if cfg.HTTP != want {
		t.Errorf("http defaults %+v, want %+v", cfg.HTTP, want)
	}
	if cfg.Metrics.Listen != DefaultMetricsListen || !strings.HasPrefix(DefaultMetricsListen, "127.0.0.1:") {
		t.Errorf("metrics.listen defaults to %q, want %q on loopback", cfg.Metrics.Listen, DefaultMetricsListen)
	}
	tn := cfg.Tenants["acme"]
	if tn.RateLimits.Requests != DefaultRequestRate || tn.RateLimits.Submissions != DefaultSubmissionRate ||
		tn.Quotas.MaxConcurrentReads != DefaultMaxConcurrentReads {
		t.Errorf("tenant limits %+v, reads %d", tn.RateLimits, tn.Quotas.MaxConcurrentReads)
	}
}

func TestHTTPLimitsSetAndTurnedOff(t *testing.T) {
	cfg, err := parse(t, minimal+`
    quotas: {max_concurrent_reads: 0}
    rate_limits: {requests: {per_second: 0.5}, submissions: {per_second: 0}}
http:
  read_timeout: 0
  idle_timeout: 5s
  max_connections: 300
  max_connections_per_client: 0
  unauthenticated_rate: {per_second: 2, burst: 3}
metrics: {listen: api}
`)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.ReadTimeout != 0 || cfg.HTTP.IdleTimeout != 5*time.Second || cfg.HTTP.MaxConnections != 300 ||
		cfg.HTTP.MaxConnectionsPerClient != 0 || cfg.HTTP.UnauthenticatedRate != (Rate{PerSecond: 2, Burst: 3}) {
		t.Errorf("http %+v", cfg.HTTP)
	}
	if cfg.Metrics.Listen != MetricsOnAPI {
		t.Errorf("metrics.listen %q", cfg.Metrics.Listen)
	}
	tn := cfg.Tenants["acme"]
	// A rate set without its burst keeps the default's burst, at least
	// twice the rate.
	if tn.RateLimits.Requests != (Rate{PerSecond: 0.5, Burst: DefaultRequestRate.Burst}) || tn.RateLimits.Submissions.PerSecond != 0 ||
		tn.Quotas.MaxConcurrentReads != 0 {
		t.Errorf("tenant limits %+v, reads %d", tn.RateLimits, tn.Quotas.MaxConcurrentReads)
	}
}

func TestHTTPLimitsProblemsNameTheKey(t *testing.T) {
	_, err := parse(t, minimal+`
    rate_limits: {requests: {per_second: -1}, submissions: {per_second: 5, burst: 0}}
http:
  read_timeout: soon
  max_header_bytes: 100
  max_connections: -3
  unauthenticated_rate: {per_second: lots}
  stream_write_timeout: 0
  max_page_bytes: 10
metrics: {listen: ""}
`)
	got := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		"tenants.acme.rate_limits.requests.per_second: want a number of requests a second",
		"tenants.acme.rate_limits.submissions.burst: is 0: a rate of 5 a second needs a burst of at least 1",
		"http.read_timeout: \"soon\" is not a duration",
		"http.max_header_bytes: 100 is too small",
		"http.max_connections: -3 is out of range",
		"http.unauthenticated_rate.per_second: want a number",
		"metrics.listen: is empty",
		"http.stream_write_timeout: is 0",
		"http.max_page_bytes: 10 is too small",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no problem %q in:\n%s", want, got)
		}
	}
}

func TestHTTPLimitsFromTheEnvironment(t *testing.T) {
	t.Setenv("AGENTHOST_HTTP_MAX_CONNECTIONS_PER_CLIENT", "7")
	t.Setenv("AGENTHOST_METRICS_LISTEN", "off")
	t.Setenv("AGENTHOST_TENANTS_ACME_RATE_LIMITS_SUBMISSIONS_PER_SECOND", "2.5")
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.MaxConnectionsPerClient != 7 || cfg.Metrics.Listen != MetricsOff ||
		cfg.Tenants["acme"].RateLimits.Submissions != (Rate{PerSecond: 2.5, Burst: DefaultSubmissionRate.Burst}) {
		t.Errorf("from the environment: http %+v, metrics %q, submissions %+v", cfg.HTTP, cfg.Metrics.Listen, cfg.Tenants["acme"].RateLimits.Submissions)
	}
}

func TestPluginPoolLimits(t *testing.T) {
	cfg, err := parse(t, `
plugins:
  b: {path: b.wasm, role: builder, pool_size: 2, max_instances: 16}
  m: {path: m.wasm, role: executor, max_instances: 3}
tenants:
  acme:
    builder: b
    model: m
`)
	if err != nil {
		t.Fatal(err)
	}
	if b, m := cfg.Plugins["b"], cfg.Plugins["m"]; b.PoolSize != 2 || b.MaxInstances != 16 || m.PoolSize != 0 || m.MaxInstances != 3 {
		t.Errorf("b: pool_size %d, max_instances %d; m: %d, %d; want 2, 16 and 0 (the host's default), 3", b.PoolSize, b.MaxInstances, m.PoolSize, m.MaxInstances)
	}
}

// TestTracingKeys: tracing is off by default; its keys are read from the
// file and the environment, and a bad endpoint or service name is refused
// with its key path and what to write instead.
func TestTracingKeys(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing != (Tracing{ServiceName: DefaultServiceName}) {
		t.Errorf("tracing defaults %+v, want off, no endpoint, service %q", cfg.Tracing, DefaultServiceName)
	}
	cfg, err = parse(t, minimal+`
tracing: {enabled: true, endpoint: "http://127.0.0.1:4318", service_name: agents-eu}
`)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tracing{Enabled: true, Endpoint: "http://127.0.0.1:4318", ServiceName: "agents-eu"}); cfg.Tracing != want {
		t.Errorf("tracing %+v, want %+v", cfg.Tracing, want)
	}
	_, err = parse(t, minimal+`
tracing: {enabled: maybe, endpoint: "grpc://127.0.0.1:4317", service_name: " "}
`)
	got := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		"tracing.enabled:",
		`tracing.endpoint: "grpc://127.0.0.1:4317" has scheme "grpc": want an http or https URL`,
		"tracing.service_name: is empty",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no problem %q in:\n%s", want, got)
		}
	}
	_, err = parse(t, minimal+"\ntracing: {endpoint: \"http://\"}\n")
	if got := strings.Join(problems(t, err), "\n"); !strings.Contains(got, `tracing.endpoint: "http://" names no host`) {
		t.Errorf("an endpoint with no host: %s", got)
	}
	// A password in a refused endpoint is never shown.
	for _, endpoint := range []string{"grpc://agent:hunter2@127.0.0.1:4317", "http://agent:hunter2@", "http://agent:hunter2@[::1"} {
		_, err = parse(t, minimal+"\ntracing: {endpoint: \""+endpoint+"\"}\n")
		if got := strings.Join(problems(t, err), "\n"); !strings.Contains(got, "tracing.endpoint:") || strings.Contains(got, "hunter2") {
			t.Errorf("the endpoint %s is refused as:\n%s\nwant a problem of tracing.endpoint without its password", endpoint, got)
		}
	}
	t.Setenv("AGENTHOST_TRACING_ENABLED", "true")
	t.Setenv("AGENTHOST_TRACING_ENDPOINT", "https://collector.example:4318")
	if cfg, err = parse(t, minimal); err != nil || !cfg.Tracing.Enabled || cfg.Tracing.Endpoint != "https://collector.example:4318" {
		t.Errorf("tracing from the environment: %+v, %v", cfg.Tracing, err)
	}
}

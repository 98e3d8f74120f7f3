package host

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Defaults of Config and Limits. Every sandbox limit is on unless the
// operator raises it; nothing is granted unless the operator grants it.
const (
	DefaultMemoryPages                = 1024 // 64 MiB of linear memory per instance
	DefaultCallTimeout                = 10 * time.Second
	DefaultInitTimeout                = 30 * time.Second
	DefaultMaxInputBytes              = 1 << 20
	DefaultMaxOutputBytes             = 1 << 20
	DefaultPoolSize                   = 4
	DefaultMaxInstances               = 64
	DefaultIdleTimeout                = 5 * time.Minute
	DefaultHTTPTimeout                = 10 * time.Second
	DefaultMaxHTTPResponseBytes       = 1 << 20
	DefaultMaxHTTPResponseHeaderBytes = 64 << 10
	DefaultMaxHTTPRedirects           = 5
	DefaultMaxInstanceMemory          = int64(2) << 30 // 2 GiB across every instance of the host
)

// Config configures a Host. The zero value of every field but KV is
// usable: no disk cache, the system clock, no event sink, the default
// host-wide memory cap.
type Config struct {
	// CacheDir, when set, is the wazero compilation cache on disk: a
	// restart (or a test process) reuses the machine code compiled before
	// instead of compiling every plugin again.
	CacheDir string
	// KV is the durable plugin KV behind agenthost_kv_*; usually the Store.
	// Without it, the KV host functions answer "store unavailable".
	KV runtime.PluginKV
	// Clock is the host clock behind agenthost_now_ms and the WASI clocks,
	// and it times idle eviction. Default runtime.SystemClock.
	Clock runtime.Clock
	// Events receives agenthost_emit events; without it they are dropped.
	Events runtime.EventSink
	// MaxInstanceMemory caps the linear memory of every live instance of
	// the host together, in bytes. A memory.grow that would pass it fails
	// (the plugin sees out-of-memory), and idle instances are evicted to
	// make room for new ones. Default DefaultMaxInstanceMemory.
	MaxInstanceMemory int64
	// Logger receives the host's own logs. Default slog.Default().
	Logger *slog.Logger
	// CallPath is how plugins are called: CallPathNative (the default,
	// also for "") or CallPathSDK.
	CallPath CallPath

	// wazeroChecks compiles native-path plugins with wazero's termination
	// checks instead of the interrupt rewrite (interrupt.go), as a module
	// the rewrite does not cover is: for the tests of that fallback.
	wazeroChecks bool
	// describing, when set, is called by Load with the plugin's name once
	// the module is compiled and its describe instance made, before
	// describe runs: for the tests that a load holds nothing the calls of
	// other plugins need.
	describing func(plugin string)
}

// CallPath names one of the host's two implementations of a plugin call.
type CallPath string

const (
	// CallPathNative is the host's own implementation of the Extism plugin
	// ABI on wazero: the kernel in Go, one Wasm entry a call.
	CallPathNative CallPath = "native"
	// CallPathSDK is extism go-sdk's, the reference the native path is
	// tested against (TestCallPathsAgree) and measured against (agenthost
	// bench plugin). It is several times slower a call; choose it only to
	// rule the native path out while you diagnose a plugin.
	CallPathSDK CallPath = "extism-sdk"
)

// Limits are a plugin's sandbox limits. Zero fields take the defaults.
type Limits struct {
	// MemoryPages caps each instance's linear memory, in 64 KiB pages. The
	// Extism kernel's memory, which holds input and output, has the same
	// cap.
	MemoryPages uint32
	// CallTimeout bounds one call. An instance whose call times out is
	// closed and replaced.
	CallTimeout time.Duration
	// InitTimeout bounds a new instance's guest runtime initialisation
	// (Haskell's hs_init, a WASI reactor's _initialize, a command's
	// __wasm_call_ctors), which runs once, when the instance is created,
	// and never inside a call's timeout: a Go guest's runtime start costs
	// far more than its calls, the more so on a loaded machine. An
	// instance whose initialisation fails or runs past the bound is never
	// used, and the call that needed it fails as plugin_trap or
	// plugin_timeout. The default is generous: it is there to stop a
	// start-up that never ends, not to time a slow one.
	InitTimeout time.Duration
	// MaxInputBytes and MaxOutputBytes bound one call's JSON input and
	// output, checked by the host (Extism would cut an input that does not
	// fit without saying so).
	MaxInputBytes  int
	MaxOutputBytes int
	// PoolSize is the number of instances of one (tenant, plugin) kept
	// warm: up to PoolSize stay idle after their call, until IdleTimeout.
	// Default DefaultPoolSize, or MaxInstances when that is lower.
	PoolSize int
	// MaxInstances bounds the instances of one (tenant, plugin) that exist
	// at once. A call that finds none idle makes one while there are fewer
	// (and the host-wide memory cap leaves room), so that calls waiting
	// on the network do not queue behind PoolSize; a caller beyond it
	// waits for one, within its context. At least PoolSize. Default
	// DefaultMaxInstances, or PoolSize when that is higher.
	MaxInstances int
	// IdleTimeout evicts an instance unused for that long, measured on the
	// host Clock.
	IdleTimeout time.Duration
}

// Sandbox grants a plugin what it may reach. The zero value grants
// nothing: no files, no environment, no network.
type Sandbox struct {
	// AllowedPaths maps a host directory to the guest path it is mounted
	// at. Prefix the host directory with "ro:" to mount it read-only.
	AllowedPaths map[string]string
	// Env lists the environment variables the guest sees.
	Env map[string]string
	// Config is the Extism config the guest reads with config_get.
	Config map[string]string
	// AllowedHosts lists the hosts agenthost_http may reach: a host name
	// ("api.example.com"), a wildcard ("*.example.com") or an IP address
	// ("10.0.0.5", "[::1]"). An entry without a port allows ports 80 and
	// 443; ":port" allows that port instead ("api.example.com:8443",
	// "127.0.0.1:11434", "[::1]:8080"). The list is checked on the first
	// request, on every redirect and at the dial. A name is dialled only
	// at public addresses: whatever it resolves to, it never reaches
	// loopback, link-local, private, CGNAT, multicast or other
	// special-purpose addresses, nor their IPv4-mapped forms. Only an
	// address listed literally reaches such an address, and only when
	// the URL names that address.
	AllowedHosts []string
	// HTTPTimeout bounds one agenthost_http request, redirects included
	// (a request's own timeout_ms may only lower it); for a body read as
	// it arrives (agenthost_http_open), the wait for the response's head
	// and each read's wait for more of the body.
	HTTPTimeout time.Duration
	// MaxHTTPResponseBytes bounds a response body, streamed or not, and
	// MaxHTTPResponseHeaderBytes its status line and headers (those of
	// any 1xx response before it included); a response over either fails
	// with too_large.
	MaxHTTPResponseBytes       int64
	MaxHTTPResponseHeaderBytes int64
	// MaxHTTPRedirects bounds the redirects one request follows.
	MaxHTTPRedirects int

	// lookupIP resolves a host name for agenthost_http; nil is the
	// system's resolver. The host's tests give names of their own.
	lookupIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// PluginSpec says what to load and how to sandbox it.
type PluginSpec struct {
	// Name identifies the plugin in errors, pools and the KV namespace.
	Name string
	// Path is the .wasm file.
	Path string
	// SHA256, when set, pins the file's hex sha256; a mismatch is refused.
	SHA256 string
	// Role is the role the caller expects; describe must report it.
	Role    abi.Role
	Limits  Limits
	Sandbox Sandbox
}

// WithDefaults is spec with the defaults of its limits and sandbox filled
// in, as Load loads it (Plugin.Spec).
func (s PluginSpec) WithDefaults() PluginSpec {
	s.Limits = s.Limits.withDefaults()
	s.Sandbox = s.Sandbox.withDefaults()
	return s
}

func (l Limits) withDefaults() Limits {
	if l.MemoryPages == 0 {
		l.MemoryPages = DefaultMemoryPages
	}
	if l.CallTimeout <= 0 {
		l.CallTimeout = DefaultCallTimeout
	}
	if l.InitTimeout <= 0 {
		l.InitTimeout = DefaultInitTimeout
	}
	if l.MaxInputBytes <= 0 {
		l.MaxInputBytes = DefaultMaxInputBytes
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	switch {
	case l.PoolSize <= 0 && l.MaxInstances <= 0:
		l.PoolSize, l.MaxInstances = DefaultPoolSize, DefaultMaxInstances
	case l.PoolSize <= 0:
		l.PoolSize = min(DefaultPoolSize, l.MaxInstances)
	case l.MaxInstances <= 0:
		l.MaxInstances = max(DefaultMaxInstances, l.PoolSize)
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

func (s Sandbox) withDefaults() Sandbox {
	if s.HTTPTimeout <= 0 {
		s.HTTPTimeout = DefaultHTTPTimeout
	}
	if s.MaxHTTPResponseBytes <= 0 {
		s.MaxHTTPResponseBytes = DefaultMaxHTTPResponseBytes
	}
	if s.MaxHTTPResponseHeaderBytes <= 0 {
		s.MaxHTTPResponseHeaderBytes = DefaultMaxHTTPResponseHeaderBytes
	}
	if s.MaxHTTPRedirects <= 0 {
		s.MaxHTTPRedirects = DefaultMaxHTTPRedirects
	}
	return s
}

// check refuses limits under which a call could not work: the input and
// the output both live in the Extism kernel's memory, under the same cap.
func (l Limits) check() error {
	const pageBytes = 64 << 10
	capBytes := int64(l.MemoryPages) * pageBytes
	if l.MemoryPages > 65536 {
		return fmt.Errorf("limits: memory_pages %d is over the wasm32 maximum of 65536", l.MemoryPages)
	}
	if l.MaxInstances < l.PoolSize {
		return fmt.Errorf("limits: max_instances %d is under pool_size %d: max_instances bounds every instance of a tenant, the warm ones included: raise max_instances or lower pool_size",
			l.MaxInstances, l.PoolSize)
	}
	if need := int64(l.MaxInputBytes) + int64(l.MaxOutputBytes) + 2*pageBytes; need > capBytes {
		return fmt.Errorf("limits: max input (%d B) plus max output (%d B) do not fit in memory_pages %d (%d B): raise memory_pages or lower the byte limits",
			l.MaxInputBytes, l.MaxOutputBytes, l.MemoryPages, capBytes)
	}
	return nil
}

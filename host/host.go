package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"

	"github.com/agenthost/agenthost/internal/wasmengine"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Host loads plugins and runs their calls. It owns one wazero compilation
// cache (on disk when Config.CacheDir is set), the host-wide memory budget
// and every plugin it loaded.
//
// Host is safe for concurrent use.
type Host struct {
	cfg    Config
	clock  runtime.Clock
	log    *slog.Logger
	cache  wazero.CompilationCache
	budget *memoryBudget
	// makers holds a token per instance being made, over every pool: at
	// most GOMAXPROCS at once, since making one (instantiating it and
	// starting its guest runtime) is CPU work that more at once would only
	// slow down, with everything else the process runs (pool.acquire).
	makers chan struct{}
	// onMakerWait, when set (by this package's tests), runs when a call
	// finds every turn to make an instance taken and starts to wait.
	onMakerWait func()

	mu sync.Mutex
	// loaded is every plugin loaded and not yet closed, in load order:
	// Close and the memory cap's eviction (evictIdleFor) reach each of
	// them, and a name's plugin (Plugin) is the last one loaded under it
	// that is still open. A version loaded beside another (LoadBeside)
	// takes the name; when it is closed (a refused reload), the name goes
	// back to the version still in force, and an old version that drains
	// after a reload stays in loaded until it is closed.
	loaded []*Plugin
	// codes are the native path's compiled modules in use, by the sha256
	// of the file each was compiled from: a file loaded again while a
	// plugin of it is loaded (under another name, or as a new version
	// beside the old one with another config) shares its compiled code
	// (nativeCode.refs) instead of compiling it again.
	codes  map[[sha256.Size]byte]*nativeCode
	closed bool
}

// New returns a Host. It creates Config.CacheDir if it is missing.
func New(cfg Config) (*Host, error) {
	switch cfg.CallPath {
	case "":
		cfg.CallPath = CallPathNative
	case CallPathNative, CallPathSDK:
	default:
		return nil, fmt.Errorf("host: call path %q is neither %q nor %q", cfg.CallPath, CallPathNative, CallPathSDK)
	}
	h := &Host{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, codes: map[[sha256.Size]byte]*nativeCode{}}
	if h.clock == nil {
		h.clock = runtime.SystemClock{}
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	limit := cfg.MaxInstanceMemory
	if limit <= 0 {
		limit = DefaultMaxInstanceMemory
	}
	h.budget = &memoryBudget{limit: limit}
	h.makers = make(chan struct{}, goruntime.GOMAXPROCS(0))
	if cfg.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("host: compilation cache %s: %w (set a writable cache dir, or none)", cfg.CacheDir, err)
		}
		h.cache = c
	} else {
		h.cache = wazero.NewCompilationCache()
	}
	return h, nil
}

// runtimeConfig is the one wazero RuntimeConfig of every plugin runtime
// and of the inspection at load, on both call paths, over the host's
// compilation cache (wasmengine.RuntimeConfig says why it is what it is).
func (h *Host) runtimeConfig() wazero.RuntimeConfig {
	return wasmengine.RuntimeConfig(h.cache)
}

// Load reads, checks and compiles a plugin, then calls describe on a
// throwaway instance and checks the reply against spec.Role. Every refusal
// of the file itself (hash, marker, imports, exports) happens before any
// instance exists. The plugin is registered under spec.Name; loading a
// second plugin of that name fails until the first is closed.
func (h *Host) Load(ctx context.Context, spec PluginSpec) (*Plugin, error) {
	return h.load(ctx, spec, false)
}

// LoadBeside loads spec as Load does, except that a plugin of the same
// name may be loaded already: the new one takes the name (Plugin,
// Plugins), and the old one serves whoever holds it until it is closed;
// closing the new one gives the name back. Both stay the host's until
// closed: its memory cap evicts their idle instances, and Close closes
// them. A config reload loads a changed plugin so, and closes the old
// version once nothing needs it, or the new one when the reload is
// refused (internal/node).
func (h *Host) LoadBeside(ctx context.Context, spec PluginSpec) (*Plugin, error) {
	return h.load(ctx, spec, true)
}

func (h *Host) load(ctx context.Context, spec PluginSpec, beside bool) (*Plugin, error) {
	fail := func(err error) (*Plugin, error) {
		return nil, refuse("host: plugin[%s] export[-]: load %s: %w", spec.Name, spec.Path, err)
	}
	if spec.Name == "" {
		return fail(errors.New("the plugin has no name: give it one in the config"))
	}
	if spec.Role != abi.RoleBuilder && spec.Role != abi.RoleExecutor {
		return fail(fmt.Errorf("expected role %q is neither %q nor %q", spec.Role, abi.RoleBuilder, abi.RoleExecutor))
	}
	spec = spec.WithDefaults()
	if err := spec.Limits.check(); err != nil {
		return fail(err)
	}
	gate, err := newHTTPGate(spec.Sandbox)
	if err != nil {
		return fail(err)
	}
	wasm, err := os.ReadFile(spec.Path)
	if err != nil {
		return fail(fmt.Errorf("reading the module: %w", err))
	}
	sum := sha256.Sum256(wasm)
	got := hex.EncodeToString(sum[:])
	if spec.SHA256 != "" && !strings.EqualFold(strings.TrimSpace(spec.SHA256), got) {
		return fail(fmt.Errorf("%w: the file's sha256 is %s but the config pins %s: check that this is the build you meant, then update the pin",
			ErrHashMismatch, got, strings.ToLower(spec.SHA256)))
	}

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return fail(ErrClosed)
	}
	if _, dup := h.named(spec.Name); dup && !beside {
		h.mu.Unlock()
		return fail(fmt.Errorf("a plugin named %q is loaded already: close it first, or load this one under another name", spec.Name))
	}
	h.mu.Unlock()

	code, info, err := h.compile(ctx, wasm, sum, spec)
	if err != nil {
		return fail(err)
	}
	p := &Plugin{
		h: h, name: spec.Name, spec: spec, sha256: got, info: info,
		code: code, http: gate, pools: map[string]*pool{},
	}
	d, err := p.describe(ctx)
	if err != nil {
		p.closeAll(context.WithoutCancel(ctx))
		return nil, err
	}
	p.desc = d

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		p.closeAll(context.WithoutCancel(ctx))
		return fail(ErrClosed)
	}
	if _, dup := h.named(spec.Name); dup && !beside {
		p.closeAll(context.WithoutCancel(ctx))
		return fail(fmt.Errorf("a plugin named %q was loaded meanwhile: load each name once", spec.Name))
	}
	h.loaded = append(h.loaded, p)
	return p, nil
}

// Plugin returns a loaded plugin by name: of versions loaded beside each
// other (LoadBeside), the last one loaded that is still open.
func (h *Host) Plugin(name string) (*Plugin, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.named(name)
}

// named is Plugin, under h.mu.
func (h *Host) named(name string) (*Plugin, bool) {
	for i := len(h.loaded) - 1; i >= 0; i-- {
		if h.loaded[i].name == name {
			return h.loaded[i], true
		}
	}
	return nil, false
}

// Plugins returns the names of the loaded plugins, sorted.
func (h *Host) Plugins() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := make([]string, 0, len(h.loaded))
	for _, p := range h.loaded {
		names = append(names, p.name)
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// MemoryInUse is the linear memory of every live instance, in bytes: what
// counts against Config.MaxInstanceMemory.
func (h *Host) MemoryInUse() int64 { return h.budget.used.Load() }

// Close closes every plugin, its pools and instances, and the compilation
// cache. Calls in flight fail. It is safe to call more than once.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	plugins := h.loaded
	h.loaded = nil
	h.mu.Unlock()
	var errs []error
	for _, p := range plugins {
		errs = append(errs, p.closeAll(ctx))
	}
	errs = append(errs, h.cache.Close(ctx))
	return errors.Join(errs...)
}

// forget drops a closed plugin from the host's loaded ones; another
// version of its name, loaded beside it, keeps its place.
func (h *Host) forget(p *Plugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i := slices.Index(h.loaded, p); i >= 0 {
		h.loaded = slices.Delete(h.loaded, i, i+1)
	}
}

// evictIdleFor closes idle instances of every plugin, least recently used
// first, until need more bytes fit under the host-wide memory cap.
func (h *Host) evictIdleFor(ctx context.Context, need int64) bool {
	if h.budget.used.Load()+need <= h.budget.limit {
		return true
	}
	h.mu.Lock()
	plugins := slices.Clone(h.loaded)
	h.mu.Unlock()
	type candidate struct {
		idleInstance
		owner *pool
	}
	var idle []candidate
	for _, p := range plugins {
		for _, pl := range p.poolList() {
			for _, in := range pl.idleSnapshot() {
				idle = append(idle, candidate{in, pl})
			}
		}
	}
	sort.Slice(idle, func(a, b int) bool { return idle[a].lastUsed.Before(idle[b].lastUsed) })
	for _, c := range idle {
		if h.budget.used.Load()+need <= h.budget.limit {
			break
		}
		c.owner.evict(ctx, c.in)
	}
	return h.budget.used.Load()+need <= h.budget.limit
}

// instanceReserve is the room a new instance needs under the host-wide
// memory cap: the declared minimums of the guest and of the kernel.
const instanceReserve = 4 << 20

// waitForRoom makes room for a new instance under the host-wide memory
// cap: it evicts idle instances and, when that is not enough while other
// instances serve calls, waits for one of them to come back, within ctx.
// It begins the call's wait (callWait.begin) when it has to wait, and
// counts itself in waiting while it waits. With no instance busy anywhere
// nothing would free memory, and it fails at once, as
// ErrExecutorUnavailable.
func (h *Host) waitForRoom(ctx context.Context, wait *callWait, waiting *atomic.Int64) error {
	for {
		busy, freed := h.budget.watch()
		if h.evictIdleFor(ctx, instanceReserve) {
			return nil
		}
		if busy == 0 {
			return fmt.Errorf("the host-wide instance memory cap (%d B) is reached, with %d B in use, nothing idle to evict and no instance busy to wait for: raise max_instance_memory, or lower memory_pages or max_instances: %w",
				h.budget.limit, h.budget.used.Load(), runtime.ErrExecutorUnavailable)
		}
		wait.begin(ctx)
		waiting.Add(1)
		select {
		case <-freed:
			waiting.Add(-1)
		case <-ctx.Done():
			waiting.Add(-1)
			return fmt.Errorf("waiting for room under the host-wide instance memory cap (%d B, %d B in use by %d busy instances): %w",
				h.budget.limit, h.budget.used.Load(), busy, ctx.Err())
		}
	}
}

// compile compiles the module on the host's call path and inspects it
// (inspectModule): nothing is instantiated.
func (h *Host) compile(ctx context.Context, wasm []byte, sum [sha256.Size]byte, spec PluginSpec) (pluginCode, moduleInfo, error) {
	if h.cfg.CallPath != CallPathSDK {
		c, err := h.compileNative(ctx, spec.Name, wasm, sum)
		if err != nil {
			return nil, moduleInfo{}, err
		}
		info, err := inspectModule(c.compiled, spec.Role)
		if err != nil {
			_ = c.close(context.WithoutCancel(ctx))
			return nil, moduleInfo{}, err
		}
		return c, info, nil
	}
	// Inspect under the same RuntimeConfig go-sdk will use, so the compile
	// here is the cache entry NewCompiledPlugin finds.
	rt := wazero.NewRuntimeWithConfig(ctx, h.runtimeConfig())
	defer rt.Close(context.WithoutCancel(ctx))
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, moduleInfo{}, &errInvalidModule{err}
	}
	info, err := inspectModule(cm, spec.Role)
	if err != nil {
		return nil, moduleInfo{}, err
	}
	timeoutMS := uint64(spec.Limits.CallTimeout.Milliseconds())
	if timeoutMS == 0 {
		timeoutMS = 1
	}
	compiled, err := h.compileExtism(ctx, wasm, spec.Sandbox, timeoutMS)
	if err != nil {
		return nil, moduleInfo{}, fmt.Errorf("compiling: %w", err)
	}
	return sdkCode{compiled: compiled}, info, nil
}

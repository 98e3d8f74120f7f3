package host

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Plugin is a loaded plugin: one compiled module, and a pool of instances
// for each tenant that called it. Use Executor or Builder to call it.
//
// Plugin is safe for concurrent use.
type Plugin struct {
	h      *Host
	name   string
	spec   PluginSpec
	sha256 string
	info   moduleInfo
	desc   abi.Describe
	code   pluginCode // the compiled module, on the host's call path
	http   *httpGate

	// waits and waitNanos count the calls, of every tenant, that waited
	// for an instance, and their waits (InstanceWaits).
	waits     atomic.Int64
	waitNanos atomic.Int64

	mu     sync.Mutex
	pools  map[string]*pool // by tenant
	closed bool
}

// Name is the plugin's name in the host.
func (p *Plugin) Name() string { return p.name }

// SHA256 is the hex sha256 of the loaded file.
func (p *Plugin) SHA256() string { return p.sha256 }

// ABIVersion is the ABI version the host picked at the handshake; every
// input carries it as "abi".
func (p *Plugin) ABIVersion() int { return p.info.abiVersion }

// Describe is the plugin's describe reply, as checked at load.
func (p *Plugin) Describe() abi.Describe { return p.desc }

// Spec is the spec the plugin was loaded with, defaults filled in.
func (p *Plugin) Spec() PluginSpec { return p.spec }

// Close closes the plugin's pools and instances and its compiled module,
// and removes it from the host. Calls in flight fail; when another loaded
// plugin of the same file shares the compiled module (Host.codes), which
// stays open, they run to their end instead, and their instances are
// closed as they return.
func (p *Plugin) Close(ctx context.Context) error {
	p.h.forget(p)
	return p.closeAll(ctx)
}

func (p *Plugin) closeAll(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	pools := p.pools
	p.pools = map[string]*pool{}
	p.mu.Unlock()
	for _, pl := range pools {
		pl.close(ctx)
	}
	p.http.close()
	return p.code.close(ctx)
}

// pool returns the tenant's pool, creating it on first use.
func (p *Plugin) pool(tenant string) (*pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	pl, ok := p.pools[tenant]
	if !ok {
		pl = newPool(p, tenant)
		p.pools[tenant] = pl
	}
	return pl, nil
}

func (p *Plugin) poolList() []*pool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*pool, 0, len(p.pools))
	for _, pl := range p.pools {
		out = append(out, pl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tenant < out[j].tenant })
	return out
}

// PoolStats counts a tenant's instances.
type PoolStats struct {
	Idle    int // instances waiting in the pool
	InUse   int // instances serving a call
	Created int // instances created since the pool was
	Evicted int // idle instances closed for idleness (IdleTimeout) or memory
	Failed  int // instances discarded after a trap, timeout or limit
	Trimmed int // idle instances beyond PoolSize closed once unused for burstLinger
	Waiting int // calls waiting for an instance (or for memory for one), now
	Waited  int // calls that waited for an instance since the pool was
}

// InstanceWaitStats counts a plugin's calls, of every tenant, that found
// no instance free (max_instances of the tenant's were busy, or the
// host-wide memory cap left no room for another) and waited for one.
type InstanceWaitStats struct {
	Waits  int64         // calls that waited, whether they got one or gave up
	Waited time.Duration // their waits, summed
}

// InstanceWaits returns the plugin's instance wait counters, over every
// tenant since it was loaded.
func (p *Plugin) InstanceWaits() InstanceWaitStats {
	return InstanceWaitStats{Waits: p.waits.Load(), Waited: time.Duration(p.waitNanos.Load())}
}

// Stats returns the pool counters of one tenant (zero when it has none).
func (p *Plugin) Stats(tenant string) PoolStats {
	p.mu.Lock()
	pl, ok := p.pools[tenant]
	p.mu.Unlock()
	if !ok {
		return PoolStats{}
	}
	return pl.stats()
}

// pluginCode is a compiled plugin on one of the host's call paths: the
// native one (native.go) or extism go-sdk's (sdkpath.go).
type pluginCode interface {
	// instantiate makes an instance for in; ctx carries in's memory
	// allocator and mc is the sandbox's module config.
	instantiate(ctx context.Context, p *Plugin, in *instance, mc wazero.ModuleConfig) (guest, error)
	close(ctx context.Context) error
}

// guest is one instance of the plugin's module on a call path.
type guest interface {
	// initialise runs the guest runtime's one-time initialisation, if the
	// module has one (moduleInfo.initExport), bounded by timeout: before
	// the first call, never inside a call's timeout.
	initialise(ctx context.Context, timeout time.Duration) guestResult
	// call runs an export as extism go-sdk's Plugin.CallWithContext does,
	// bounded by timeout: the status, output and error it returns.
	call(ctx context.Context, s *callScope, export string, input []byte, timeout time.Duration) guestResult
	// errorMessage is what the plugin set with error_set in its last call.
	errorMessage(ctx context.Context) string
	close(ctx context.Context)
}

// guestResult is a call's outcome as go-sdk reports it, and what the host
// needs to classify it.
type guestResult struct {
	rc       uint32
	out      []byte
	err      error
	timedOut bool // the call's own timeout stopped it (not its caller)
	spent    bool // the instance must not serve again, whatever the outcome
}

// sdkCode is a plugin compiled by extism go-sdk.
type sdkCode struct {
	compiled *extism.CompiledPlugin
}

func (c sdkCode) close(ctx context.Context) error { return c.compiled.Close(ctx) }

func (c sdkCode) instantiate(ctx context.Context, p *Plugin, _ *instance, mc wazero.ModuleConfig) (guest, error) {
	ext, err := c.compiled.Instance(ctx, extism.PluginInstanceConfig{ModuleConfig: mc})
	if err != nil {
		return nil, err
	}
	init, err := sdkInitOf(ext)
	if err != nil {
		_ = ext.Close(ctx)
		return nil, err
	}
	ext.SetLogger(func(level extism.LogLevel, msg string) {
		p.h.log.Debug("plugin log", "plugin", p.name, "level", level.String(), "message", msg)
	})
	return &sdkGuest{ext: ext, init: init}, nil
}

// instance is one plugin instance with its own capped memory. It serves
// one call at a time, for one tenant only.
type instance struct {
	g        guest
	mem      *instanceMemory
	stderr   *headBuffer
	scope    atomic.Pointer[callScope] // the call in progress, for the denying FS
	lastUsed time.Time
}

func (in *instance) close(ctx context.Context) { in.g.close(ctx) }

// newInstance instantiates the compiled plugin in its sandbox (capped
// memory, the host clock as the WASI clock, no environment and no files
// unless granted: an ungranted open is recorded as a denial) and
// initialises its guest runtime, for a call of export.
func (p *Plugin) newInstance(ctx context.Context, export string) (*instance, error) {
	limit := uint64(p.spec.Limits.MemoryPages) * 65536
	// Room for the declared minimums of the guest and of the kernel.
	if !p.h.evictIdleFor(ctx, instanceReserve) {
		return nil, fmt.Errorf("the host-wide instance memory cap (%d B) is reached, with %d B in use and nothing idle to evict: raise max_instance_memory or lower pool sizes: %w",
			p.h.budget.limit, p.h.budget.used.Load(), runtime.ErrExecutorUnavailable)
	}
	in := &instance{mem: &instanceMemory{budget: p.h.budget, limit: limit}, stderr: &headBuffer{max: 4096}}
	clock := p.h.clock
	mc := wazero.NewModuleConfig().
		WithStderr(in.stderr).
		WithWalltime(func() (int64, int32) {
			t := clock.Now()
			return t.Unix(), int32(t.Nanosecond())
		}, sys.ClockResolution(1)).
		WithNanotime((&monotonic{clock: clock}).nanotime, sys.ClockResolution(1))
	for k, v := range p.spec.Sandbox.Env {
		mc = mc.WithEnv(k, v)
	}
	if len(p.spec.Sandbox.AllowedPaths) == 0 {
		mc = mc.WithFSConfig(wazero.NewFSConfig().WithFSMount(deniedFS{in: in}, "/"))
	}
	g, err := p.code.instantiate(experimental.WithMemoryAllocator(ctx, in.mem), p, in, mc)
	if err != nil {
		return nil, fmt.Errorf("instantiating: %w: %w", err, runtime.ErrExecutorUnavailable)
	}
	in.g = g
	// Never run an instance whose memory escaped the cap: the kernel's
	// memory and every exported guest memory must come from our allocator.
	if want := 1 + p.info.memoryExports; in.mem.allocated() < want {
		in.close(ctx)
		return nil, fmt.Errorf("instance memory is not under the host's allocator (%d of %d memories): refusing to run it uncapped: %w",
			in.mem.allocated(), want, runtime.ErrExecutorUnavailable)
	}
	// The guest runtime starts here, under InitTimeout, so that no call's
	// timeout pays for it: whether a short call timeout covered a Go
	// guest's runtime start as well would be a matter of the machine's
	// speed.
	if res := in.g.initialise(ctx, p.spec.Limits.InitTimeout); res.err != nil {
		err := p.initErr(ctx, export, in, res)
		in.close(context.WithoutCancel(ctx))
		return nil, err
	}
	return in, nil
}

// initErr classifies the failed initialisation of a new instance, which
// is never used: a trap, running out of memory or the init bound are the
// plugin's (plugin_trap, plugin_oom, plugin_timeout, as in a call); the
// caller giving up is not.
func (p *Plugin) initErr(ctx context.Context, export string, in *instance, res guestResult) error {
	what := fmt.Sprintf("the guest runtime's initialisation (%s)", p.info.initExport)
	if ctx.Err() != nil && !res.timedOut {
		// The caller gave up while the instance was being made: whatever
		// failed then (the halt, or on the reference path go-sdk's input
		// set under a done context, "reset") is not the plugin's doing.
		// The instance is discarded either way; a start-up that truly
		// fails fails again for the next caller.
		return fmt.Errorf("the caller gave up while a new instance initialised: %w", ctx.Err())
	}
	var exit *sys.ExitError
	if errors.As(res.err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded, sys.ExitCodeContextCanceled:
			if res.timedOut || ctx.Err() == nil {
				return p.pluginErr(export, abi.ClassPluginTimeout, fmt.Errorf(
					"%s ran past its bound of %s and was stopped; the instance is discarded: fix the plugin's start-up, or raise init_timeout if it is legitimately that slow",
					what, p.spec.Limits.InitTimeout))
			}
			return fmt.Errorf("the caller gave up while a new instance initialised: %w", ctx.Err())
		}
	}
	if in.mem.refused.Load() {
		return p.pluginErr(export, abi.ClassPluginOOM, fmt.Errorf(
			"%s ran out of memory (a memory.grow past the cap of %d pages, or past the host-wide cap, was refused) and then failed: %s%s; the instance is discarded: raise memory_pages if the plugin needs more",
			what, p.spec.Limits.MemoryPages, firstLine(res.err.Error()), stderrNote(in)))
	}
	if exit != nil {
		return p.pluginErr(export, abi.ClassPluginTrap, fmt.Errorf("%s exited with code %d%s; the instance is discarded: fix the plugin's start-up",
			what, exit.ExitCode(), stderrNote(in)))
	}
	return p.pluginErr(export, abi.ClassPluginTrap, fmt.Errorf("%s failed: %s%s; the instance is discarded: fix the plugin's start-up",
		what, firstLine(res.err.Error()), stderrNote(in)))
}

// monotonic is an instance's WASI monotonic clock: the host clock, except
// that a reading never repeats. While the clock stands still (a fake clock
// in a test), each reading moves 1 ms ahead, as wazero's own fake clock
// does: a guest runtime that waits for time to pass (Go's scheduler and
// GC do) would otherwise spin until the call timeout.
type monotonic struct {
	clock runtime.Clock
	mu    sync.Mutex
	last  int64
	skew  int64
}

func (m *monotonic) nanotime() int64 {
	raw := m.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	if raw <= m.last {
		m.skew += int64(time.Millisecond)
	} else {
		m.last = raw
	}
	return raw + m.skew
}

// deniedFS is the root a plugin sees when no path is granted: every open
// fails with a permission error and is recorded as a denial of the call.
type deniedFS struct{ in *instance }

func (d deniedFS) Open(name string) (fs.File, error) {
	if name == "." {
		return emptyDir.Open(".") // the root itself exists, and is empty
	}
	if s := d.in.scope.Load(); s != nil {
		s.deny(fmt.Sprintf("file system: open %q refused: the plugin is granted no paths", "/"+name))
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
}

// emptyDir is an empty directory: the zero embed.FS.
var emptyDir embed.FS

// headBuffer keeps the first max bytes a guest writes to stderr, for the
// error of a trap (a Go plugin prints its panic there).
type headBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *headBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.max - len(t.buf); room > 0 {
		t.buf = append(t.buf, b[:min(room, len(b))]...)
	}
	return len(b), nil
}

func (t *headBuffer) take() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := string(t.buf)
	t.buf = t.buf[:0]
	return s
}

var errPoolClosed = errors.New("the plugin is closed")

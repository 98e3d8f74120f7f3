// Package pluginverify runs a plugin .wasm on the real plugin host, for
// `agenthost plugin inspect` and `agenthost plugin verify`: Subject
// implements abicheck.Plugin with host/, in a host of its own, over an
// in-memory plugin KV and a clock that stands still (so that a plugin that
// reads the clock answers a replayed effect the same way).
package pluginverify

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/plugins/abicheck"
	"github.com/agenthost/agenthost/runtime"
)

// Tenant is the tenant every verification call runs under.
const Tenant = "verify"

// PluginName is the name the plugin is loaded under.
const PluginName = "plugin"

// Options say how to load the plugin.
type Options struct {
	// Role is the role to load it as; "" takes the one its exports suggest.
	Role abi.Role
	// Limits are the sandbox limits; zero fields take the host's defaults.
	Limits host.Limits
	// Sandbox grants (config values, allowed hosts); zero grants nothing.
	Sandbox host.Sandbox
	// CacheDir is the wazero compilation cache; "" keeps it in memory.
	CacheDir string
	Logger   *slog.Logger
	// Events receives what the plugin emits (agenthost_emit); nil drops
	// it.
	Events runtime.EventSink
	// RealClock runs agenthost_now_ms and the WASI clocks on the system
	// clock instead of a clock that stands still (for plugin call).
	RealClock bool
	// OnCall, when set, is told of every call the suite makes, with its
	// input and full output (plugin verify -v).
	OnCall func(export string, input, output []byte, err error)
}

// Subject is a plugin file loaded for verification. It implements
// abicheck.Plugin.
type Subject struct {
	h       *host.Host
	p       *host.Plugin
	insp    host.Inspection
	loadErr error
	limits  host.Limits
	kv      *memKV
	onCall  func(export string, input, output []byte, err error)
}

var _ abicheck.Plugin = (*Subject)(nil)

// Open inspects the file and loads it. A refusal of the host (no marker, a
// refused import, a describe it cannot accept) is not an error of Open: it
// is the Module's LoadError, for the suite to report. Open fails only when
// the file cannot be read or is not WebAssembly.
func Open(ctx context.Context, path string, o Options) (*Subject, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var clock runtime.Clock = frozenClock{at: time.Now()}
	if o.RealClock {
		clock = runtime.SystemClock{}
	}
	kv := newMemKV()
	h, err := host.New(host.Config{CacheDir: o.CacheDir, KV: kv, Clock: clock, Logger: log, Events: o.Events})
	if err != nil {
		return nil, err
	}
	insp, err := h.Inspect(ctx, path)
	if err != nil {
		h.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	s := &Subject{h: h, insp: insp, kv: kv, onCall: o.OnCall}
	role := o.Role
	if role == "" {
		role = insp.Role
	}
	if role == "" {
		role = abi.RoleExecutor
	}
	spec := host.PluginSpec{Name: PluginName, Path: path, Role: role, Limits: o.Limits, Sandbox: o.Sandbox}
	if s.p, err = h.Load(ctx, spec); err != nil {
		s.loadErr = err
	} else {
		s.limits = s.p.Spec().Limits
	}
	return s, nil
}

// Inspection is what the module's exports and imports say.
func (s *Subject) Inspection() host.Inspection { return s.insp }

// Plugin is the loaded plugin, or nil when the host refused it.
func (s *Subject) Plugin() *host.Plugin { return s.p }

// LoadError is the host's refusal, or nil.
func (s *Subject) LoadError() error { return s.loadErr }

// SuiteLimits are the limits the plugin runs under, for abicheck.Options.
func (s *Subject) SuiteLimits() abicheck.Limits {
	return abicheck.Limits{CallTimeout: s.limits.CallTimeout, MemoryPages: s.limits.MemoryPages}
}

// Module implements abicheck.Plugin.
func (s *Subject) Module() abicheck.Module {
	return abicheck.Module{Markers: s.insp.Markers, LoadError: s.loadErr}
}

// Call implements abicheck.Plugin.
func (s *Subject) Call(ctx context.Context, export string, input []byte) ([]byte, error) {
	if s.p == nil {
		return nil, fmt.Errorf("pluginverify: the host refused the plugin: %w", s.loadErr)
	}
	out, err := s.p.CallRaw(ctx, Tenant, export, input)
	if s.onCall != nil {
		s.onCall(export, input, out, err)
	}
	return out, err
}

// KVEntry is one key of the plugin's KV.
type KVEntry struct {
	Key, Value []byte
}

// KV lists what the plugin holds in its KV, by key.
func (s *Subject) KV() []KVEntry {
	prefix := kvKey(Tenant, PluginName, nil)
	s.kv.mu.Lock()
	defer s.kv.mu.Unlock()
	var out []KVEntry
	for k, v := range s.kv.data {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			out = append(out, KVEntry{Key: []byte(rest), Value: bytes.Clone(v)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Key, out[j].Key) < 0 })
	return out
}

// MemoryBytes implements abicheck.Plugin: the host holds this plugin
// only.
func (s *Subject) MemoryBytes() int64 { return s.h.MemoryInUse() }

// Close closes the plugin and its host.
func (s *Subject) Close(ctx context.Context) error { return s.h.Close(ctx) }

// frozenClock stands still: agenthost_now_ms and the WASI wall clock
// answer the same instant during a verification. Timers (idle eviction)
// run on real time.
type frozenClock struct{ at time.Time }

func (c frozenClock) Now() time.Time { return c.at }

func (frozenClock) AfterFunc(d time.Duration, f func()) runtime.Timer { return time.AfterFunc(d, f) }

// memKV is the plugin KV of a verification: in memory, thrown away after.
type memKV struct {
	mu   sync.Mutex
	data map[string][]byte
}

func newMemKV() *memKV { return &memKV{data: map[string][]byte{}} }

func kvKey(tenant, plugin string, key []byte) string {
	return fmt.Sprintf("%d:%s/%d:%s/%s", len(tenant), tenant, len(plugin), plugin, key)
}

func (m *memKV) KVGet(_ context.Context, tenant, plugin string, key []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.data[kvKey(tenant, plugin, key)]), nil
}

func (m *memKV) KVSet(_ context.Context, tenant, plugin string, key, value []byte) error {
	if len(value) > 1<<20 {
		return runtime.ErrKVTooLarge
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(value) == 0 {
		delete(m.data, kvKey(tenant, plugin, key))
		return nil
	}
	m.data[kvKey(tenant, plugin, key)] = bytes.Clone(value)
	return nil
}

func (m *memKV) KVDelete(_ context.Context, tenant, plugin string, key []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.data, kvKey(tenant, plugin, key))
	return nil
}

var _ runtime.PluginKV = (*memKV)(nil)

package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// memKV is an in-memory runtime.PluginKV for the host's tests, with a
// switch that makes the store fail.
type memKV struct {
	mu      sync.Mutex
	data    map[string][]byte
	failing bool
	max     int
	// gate, when set, holds every KVGet until it is closed (or the
	// call's context ends); gated counts the KVGets it holds.
	gate  chan struct{}
	gated atomic.Int64
}

// hold makes every KVGet wait until the returned release is called.
func (m *memKV) hold() (release func()) {
	g := make(chan struct{})
	m.mu.Lock()
	m.gate = g
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		m.gate = nil
		m.mu.Unlock()
		close(g)
	}
}

func newMemKV() *memKV { return &memKV{data: map[string][]byte{}, max: 1 << 16} }

func kvKey(tenant, plugin string, key []byte) string {
	return fmt.Sprintf("%d:%s/%d:%s/%s", len(tenant), tenant, len(plugin), plugin, key)
}

func (m *memKV) setFailing(f bool) { m.mu.Lock(); m.failing = f; m.mu.Unlock() }

func (m *memKV) KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error) {
	m.mu.Lock()
	if g := m.gate; g != nil {
		m.mu.Unlock()
		m.gated.Add(1)
		select {
		case <-g:
		case <-ctx.Done():
		}
		m.gated.Add(-1)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		m.mu.Lock()
	}
	defer m.mu.Unlock()
	if m.failing {
		return nil, fmt.Errorf("memkv: disk on fire: %w", runtime.ErrStoreUnavailable)
	}
	return bytes.Clone(m.data[kvKey(tenant, plugin, key)]), nil
}

func (m *memKV) KVSet(_ context.Context, tenant, plugin string, key, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failing {
		return runtime.ErrStoreUnavailable
	}
	if len(value) > m.max {
		return runtime.ErrKVTooLarge
	}
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
	if m.failing {
		return runtime.ErrStoreUnavailable
	}
	delete(m.data, kvKey(tenant, plugin, key))
	return nil
}

func (m *memKV) keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ks []string
	for k := range m.data {
		ks = append(ks, k)
	}
	return ks
}

// recordSink records emitted events.
type recordSink struct {
	mu     sync.Mutex
	events []emitted
}

type emitted struct {
	scope runtime.EmitScope
	ev    abi.EmitEvent
}

func (s *recordSink) Emit(_ context.Context, scope runtime.EmitScope, ev abi.EmitEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, emitted{scope, ev})
	return nil
}

func (s *recordSink) all() []emitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]emitted(nil), s.events...)
}

// env is one test's host, with its fakes.
type env struct {
	h     *Host
	kv    *memKV
	clock *conformance.FakeClock
	sink  *recordSink
}

func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	e := &env{kv: newMemKV(), clock: conformance.NewFakeClock(time.Time{}), sink: &recordSink{}}
	if cfg.CacheDir == "" {
		cfg.CacheDir = conformance.WazeroCacheDir()
	}
	cfg.KV, cfg.Clock, cfg.Events = e.kv, e.clock, e.sink
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	t.Cleanup(func() { h.Close(context.Background()) })
	return e
}

func pluginPath(t testing.TB, name string) string {
	t.Helper()
	p, err := conformance.BuildPlugin(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) load(t testing.TB, name string, role abi.Role, mod func(*PluginSpec)) *Plugin {
	t.Helper()
	spec := PluginSpec{Name: name, Path: pluginPath(t, name), Role: role}
	if mod != nil {
		mod(&spec)
	}
	p, err := e.h.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) executor(t testing.TB, name string, mod func(*PluginSpec)) *Executor {
	t.Helper()
	x, err := e.load(t, name, abi.RoleExecutor, mod).Executor()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func toolCall(tenant, effect string, attempt int, tool string, args any) runtime.EffectCall {
	a, _ := json.Marshal(args)
	req, _ := json.Marshal(abi.ToolRequest{Arguments: a})
	return runtime.EffectCall{Tenant: tenant, Session: "s1", RunID: "run1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: effect, AssignmentKey: tenant + "/s1/" + effect + "#1", Attempt: attempt, Kind: abi.KindTool, Tool: tool, Request: req},
	}}
}

func toolContent(t testing.TB, r abi.EffectReply) string {
	t.Helper()
	var o abi.ToolOutcome
	if err := json.Unmarshal(r.Outcome, &o); err != nil {
		t.Fatalf("outcome %s: %v", r.Outcome, err)
	}
	return o.Content
}

// doneIn returns a check that asserts a done reply and returns its tool
// content: doneIn(t)(x.Start(ctx, c)).
func doneIn(t testing.TB) func(abi.EffectReply, error) string {
	return func(r abi.EffectReply, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("call failed: %v", err)
		}
		if r.State != abi.StateDone {
			t.Fatalf("state %q, want done (reply %+v)", r.State, r)
		}
		return toolContent(t, r)
	}
}

// classOf returns the class of a *runtime.PluginError, failing the test
// when err is not one.
func classOf(t testing.TB, err error) abi.ErrorClass {
	t.Helper()
	var pe *runtime.PluginError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *runtime.PluginError", err, err)
	}
	if !strings.HasPrefix(err.Error(), "host: plugin["+pe.Plugin+"] export["+pe.Export+"]: ") {
		t.Fatalf("error %q does not start with host: plugin[%s] export[%s]", err, pe.Plugin, pe.Export)
	}
	return pe.Class
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

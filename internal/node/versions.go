package node

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Plugin versions side by side.
//
// A reload that changes a plugin loads the new version beside the old one
// (reload.go). Every attempt records the version it was dispatched to
// (loop.Effect.Plugin, from its effect_dispatched event), and the runtime
// hands it with each call (runtime.EffectCall.Plugin). The executor the
// tenants are built with for a plugin is a versionedExecutor over the
// plugin's pluginVersions: a call goes to the version that holds its
// attempt while that version is loaded; when it is gone (closed after its
// drain, or never loaded here: a restart, another node), to the version in
// force if its describe lists the other in attaches_from
// (abi.Describe.TakesOver), or nowhere: runtime.ErrPluginVersionGone, and
// the missing-effect policy decides. A version a reload replaced stays
// loaded while attempts it holds are open or calls to it are under way,
// until plugin_drain at most, and no less than its call_timeout (a call
// whose version was named just before the swap); then it is closed. A
// reload that changes only a plugin's keys, not its file (the same
// sha256), hands the attempts open on the old version to the new one: the
// calls of those attempts go there from the swap on.

// pluginVersions are the loaded versions of one plugin ID.
type pluginVersions struct {
	id  string
	log *slog.Logger
	// mu guards current, draining and each version's open attempts,
	// calls under way and closed flag.
	mu       sync.Mutex
	current  *pluginVersion   // nil once the plugin left the config
	draining []*pluginVersion // versions a reload replaced, still loaded
}

// pluginVersion is one loaded version of a plugin.
type pluginVersion struct {
	plugin *host.Plugin
	ex     *host.Executor
	ref    loop.PluginRef
	// open are the attempts this version answered pending (or whose
	// Start or Attach failed: their outcome is unknown) and has not yet
	// answered anything else for, by assignment key.
	open map[string]bool
	// calls counts the calls routed to this version that have not
	// returned yet.
	calls int
	// callTimeout is the plugin's call_timeout; closePlugin closes it.
	callTimeout time.Duration
	closePlugin func(context.Context) error
	// callsDone is, once replaced, when a call of an attempt dispatched
	// to it just before the swap (its PluginRef read then) has surely
	// begun; closed, once it is closed.
	callsDone time.Time
	closed    bool
}

func newPluginVersion(p *host.Plugin) (*pluginVersion, error) {
	ex, err := p.Executor()
	if err != nil {
		return nil, err
	}
	ref, _ := ex.PluginRef()
	return &pluginVersion{plugin: p, ex: ex, ref: ref, open: map[string]bool{},
		callTimeout: p.Spec().Limits.CallTimeout, closePlugin: p.Close}, nil
}

// idle reports whether v holds no open attempt and no call is under way.
// vs.mu must be held.
func (v *pluginVersion) idle() bool { return len(v.open) == 0 && v.calls == 0 }

// setCurrent puts p in force (nil: the plugin left the config). The
// version it replaces drains: retire closes it after drain at most.
func (vs *pluginVersions) setCurrent(p *host.Plugin, drain time.Duration, retire func(time.Duration, func(context.Context) error)) error {
	var next *pluginVersion
	if p != nil {
		var err error
		if next, err = newPluginVersion(p); err != nil {
			return err
		}
	}
	vs.install(next, drain, retire)
	return nil
}

// install puts next in force (nil: the plugin left the config), as
// setCurrent does.
func (vs *pluginVersions) install(next *pluginVersion, drain time.Duration, retire func(time.Duration, func(context.Context) error)) {
	vs.mu.Lock()
	old := vs.current
	vs.current = next
	if old == nil {
		vs.mu.Unlock()
		return
	}
	if next != nil && next.ref.SHA256 == old.ref.SHA256 {
		// The same file: route sends the calls of old's attempts to next.
		maps.Copy(next.open, old.open)
		clear(old.open)
	}
	grace := old.callTimeout + retireMargin
	old.callsDone = time.Now().Add(grace)
	vs.draining = append(vs.draining, old)
	open := len(old.open)
	vs.mu.Unlock()
	vs.log.Info("plugin version replaced: it stays loaded for the attempts it holds, then is closed",
		"plugin", vs.id, "version", old.ref.Version, "sha256", old.ref.SHA256, "open_attempts", open, "plugin_drain", max(drain, grace))
	time.AfterFunc(grace, func() { vs.sweep(context.Background()) })
	retire(max(drain, grace), func(ctx context.Context) error { return vs.close(ctx, old, "its drain (plugin_drain) ran out") })
}

// sweep closes the draining versions that hold no open attempt and carry
// no call, once their grace (callsDone) is over.
func (vs *pluginVersions) sweep(ctx context.Context) {
	vs.mu.Lock()
	var done []*pluginVersion
	now := time.Now()
	for _, v := range vs.draining {
		if v.idle() && !now.Before(v.callsDone) {
			done = append(done, v)
		}
	}
	vs.mu.Unlock()
	for _, v := range done {
		_ = vs.close(ctx, v, "the attempts it held have ended")
	}
}

// close closes a draining version, once.
func (vs *pluginVersions) close(ctx context.Context, v *pluginVersion, why string) error {
	vs.mu.Lock()
	if v.closed {
		vs.mu.Unlock()
		return nil
	}
	v.closed = true
	vs.draining = slices.DeleteFunc(vs.draining, func(d *pluginVersion) bool { return d == v })
	open := len(v.open)
	vs.mu.Unlock()
	vs.log.Info("plugin version closed: "+why, "plugin", vs.id, "version", v.ref.Version, "sha256", v.ref.SHA256, "open_attempts", open)
	return v.closePlugin(ctx)
}

// begin routes a call of an attempt held by held (route) and counts it
// as under way on the version it goes to, until end.
func (vs *pluginVersions) begin(held *loop.PluginRef) (*pluginVersion, error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, err := vs.route(held)
	if err == nil {
		v.calls++
	}
	return v, err
}

// end records that a call begin routed to v returned state, or err:
// settles, when key is not empty, whether v holds the attempt open now
// (holdsOpen; starts: the call was a Start or an Attach). A draining
// version left idle is closed (sweep).
func (vs *pluginVersions) end(v *pluginVersion, key string, state abi.State, err error, starts bool) {
	vs.mu.Lock()
	v.calls--
	if key != "" {
		if holdsOpen(state, err, starts, v.open[key]) {
			v.open[key] = true
		} else {
			delete(v.open, key)
		}
	}
	drained := v.idle() && slices.Contains(vs.draining, v)
	vs.mu.Unlock()
	if drained {
		vs.sweep(context.Background())
	}
}

// route returns the version a call of an attempt held by held (nil:
// unknown, or not recorded) goes to. vs.mu must be held.
func (vs *pluginVersions) route(held *loop.PluginRef) (*pluginVersion, error) {
	cur := vs.current
	if held == nil || held.SHA256 == "" || (cur != nil && cur.ref.SHA256 == held.SHA256) {
		if cur == nil {
			return nil, fmt.Errorf("plugin %s is no longer in the config: %w", vs.id, runtime.ErrExecutorUnavailable)
		}
		return cur, nil
	}
	for _, v := range vs.draining {
		if v.ref.SHA256 == held.SHA256 && !v.closed {
			return v, nil
		}
	}
	if cur != nil && cur.plugin.Describe().TakesOver(held.Version) {
		return cur, nil
	}
	if cur == nil {
		return nil, fmt.Errorf("%w: plugin %s: version %q (sha256 %s) started the attempt and is no longer loaded, and the plugin is no longer in the config",
			runtime.ErrPluginVersionGone, vs.id, held.Version, short(held.SHA256))
	}
	return nil, fmt.Errorf("%w: plugin %s: version %q (sha256 %s) started the attempt and is no longer loaded; the version in force, %q (sha256 %s), does not list %q in its describe's attaches_from",
		runtime.ErrPluginVersionGone, vs.id, held.Version, short(held.SHA256), cur.ref.Version, short(cur.ref.SHA256), held.Version)
}

// holdsOpen reports whether a version holds an attempt open after
// answering reply, or err, to a call of it: pending keeps it open; an
// error of a Start or Attach (starts) does too, since the attempt may be
// running there; an error of a Poll changes nothing (was: whether it
// was open); any other reply ends it.
func holdsOpen(state abi.State, err error, starts, was bool) bool {
	switch {
	case err != nil:
		return starts || was
	default:
		return state == abi.StatePending
	}
}

// versionedExecutor is the executor of a plugin ID, over its versions.
type versionedExecutor struct{ vs *pluginVersions }

var (
	_ runtime.Executor       = versionedExecutor{}
	_ runtime.VersionRouter  = versionedExecutor{}
	_ runtime.PluginReporter = versionedExecutor{}
)

// call makes one call of an attempt on the version that holds it,
// counted as under way there while it runs; starts says it is a Start or
// an Attach.
func (x versionedExecutor) call(ctx context.Context, c runtime.EffectCall, starts bool, export func(*host.Executor, context.Context, runtime.EffectCall) (abi.EffectReply, error)) (abi.EffectReply, error) {
	v, err := x.vs.begin(c.Plugin)
	if err != nil {
		return abi.EffectReply{}, err
	}
	reply, err := export(v.ex, ctx, c)
	x.vs.end(v, c.Input.Effect.AssignmentKey, reply.State, err, starts)
	return reply, err
}

// Start implements runtime.Executor.
func (x versionedExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return x.call(ctx, c, true, (*host.Executor).Start)
}

// Poll implements runtime.Executor.
func (x versionedExecutor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return x.call(ctx, c, false, (*host.Executor).Poll)
}

// Attach implements runtime.Executor.
func (x versionedExecutor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return x.call(ctx, c, true, (*host.Executor).Attach)
}

// Cancel implements runtime.Executor. A reply other than pending settles
// the attempt: no Poll follows it.
func (x versionedExecutor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	v, err := x.vs.begin(c.Plugin)
	if err != nil {
		return abi.CancelReply{}, err
	}
	reply, err := v.ex.Cancel(ctx, c)
	x.vs.end(v, c.Input.Effect.AssignmentKey, reply.State, err, false)
	return reply, err
}

// RouteTo implements runtime.VersionRouter.
func (x versionedExecutor) RouteTo(held *loop.PluginRef) (loop.PluginRef, error) {
	x.vs.mu.Lock()
	defer x.vs.mu.Unlock()
	v, err := x.vs.route(held)
	if err != nil {
		return loop.PluginRef{}, err
	}
	return v.ref, nil
}

// PluginRef implements runtime.PluginReporter: the version in force, to
// which a new attempt is dispatched.
func (x versionedExecutor) PluginRef() (loop.PluginRef, bool) {
	x.vs.mu.Lock()
	defer x.vs.mu.Unlock()
	if x.vs.current == nil {
		return loop.PluginRef{}, false
	}
	return x.vs.current.ref, true
}

// Endpoint implements runtime.EndpointNamer: the plugin's ID.
func (x versionedExecutor) Endpoint() string { return x.vs.id }

// WaitsForCapacity implements runtime.CapacityWaiter, as host.Executor
// does.
func (x versionedExecutor) WaitsForCapacity() {}

package runtime

import (
	"context"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// EffectCall is one executor call: the effect input the plugin receives,
// and the scope the host needs for KV, emit and limits.
type EffectCall struct {
	Tenant  string
	Session string
	RunID   string
	Input   abi.EffectInput
	// DispatchedAt is when the attempt was dispatched, on the runtime's
	// clock (loop.Effect.DispatchedAt); a poll or attach carries the time
	// of the attempt's start, after a restart too. The metrics time a
	// model call from it to its settlement.
	DispatchedAt time.Time
	// Plugin is the plugin version that holds the attempt
	// (loop.Effect.Plugin), or nil: an executor that keeps several
	// versions of a plugin loaded sends the call to it (VersionRouter).
	Plugin *loop.PluginRef
}

// An EndpointNamer is an Executor that names the endpoint it calls: the
// executor plugin's ID in the config (host.Executor and the metrics
// decorator are). The runtime's logs of rate-limited attempts and failed
// Runs name it; an Executor that is not one is logged with endpoint "".
type EndpointNamer interface {
	Endpoint() string
}

// EndpointOf returns the endpoint ex names (EndpointNamer), or "".
func EndpointOf(ex Executor) string {
	if n, ok := ex.(EndpointNamer); ok {
		return n.Endpoint()
	}
	return ""
}

// A PluginReporter is an Executor that may carry its effects out with a
// plugin and names its version, ok false when it has none (host.Executor
// and the metrics decorator are). The runtime records it in each
// attempt's effect_dispatched event.
type PluginReporter interface {
	PluginRef() (ref loop.PluginRef, ok bool)
}

// A VersionRouter is an Executor that keeps several versions of a plugin
// loaded and sends each call to the version that holds its attempt
// (EffectCall.Plugin), or, when that one is gone, to the version in force
// if it declares it can take the attempt over (abi.Describe.AttachesFrom).
type VersionRouter interface {
	// RouteTo returns the version a call of an attempt held by held (nil:
	// unknown) goes to, or ErrPluginVersionGone.
	RouteTo(held *loop.PluginRef) (loop.PluginRef, error)
}

// routeTo is where a call of e goes (VersionRouter): taken is the
// version, when it is not the one that holds the attempt (a takeover);
// err is ErrPluginVersionGone when no loaded version may take it.
func routeTo(ex Executor, e loop.Effect) (taken *loop.PluginRef, err error) {
	r, ok := ex.(VersionRouter)
	if !ok || e.Plugin == nil {
		return nil, nil
	}
	to, err := r.RouteTo(e.Plugin)
	if err != nil || to.SHA256 == e.Plugin.SHA256 {
		return nil, err
	}
	return &to, nil
}

// PluginOf returns the plugin version ex reports (PluginReporter), or nil.
func PluginOf(ex Executor) *loop.PluginRef {
	if r, ok := ex.(PluginReporter); ok {
		if ref, ok := r.PluginRef(); ok {
			return &ref
		}
	}
	return nil
}

// Executor carries out effects (docs/DESIGN.md §1). host.Executor adapts a Wasm
// plugin to it; conformance has scripted fakes.
//
// A reply is returned only when it passed abi validation. Any failure to
// get one is an error; when the failure is the plugin's (a trap, a
// timeout, a bad reply …) it is a *PluginError with its class. Other
// errors (the context ended, the executor is closed) say the outcome is
// unknown to the caller.
//
// Implementations are safe for concurrent use.
type Executor interface {
	// Start begins an effect attempt: done, failed or pending.
	Start(ctx context.Context, c EffectCall) (abi.EffectReply, error)
	// Poll asks again about a pending attempt, with its handle.
	Poll(ctx context.Context, c EffectCall) (abi.EffectReply, error)
	// Attach asks, after a restart, what the executor knows of an attempt
	// (the handle may be empty): pending, done, failed or unknown.
	Attach(ctx context.Context, c EffectCall) (abi.EffectReply, error)
	// Cancel asks the executor to stop an attempt.
	Cancel(ctx context.Context, c EffectCall) (abi.CancelReply, error)
}

// A CapacityWaiter is an Executor or Builder that may wait for capacity (a
// free plugin instance) before it begins a call. The runtime hands it the
// call's timeout (Options.CallTimeout) with the context instead of a
// deadline already running, and it starts that timeout with BeginCall once
// it begins the call: the wait for capacity does not count against the
// timeout, which bounds the call alone. (A queue of attaches longer than
// the timeout would otherwise fail them as if the executor were
// unreachable, and defer them, after a restart.) The wait itself ends with
// the caller's context: the runtime's life. An Executor or Builder that is
// not a CapacityWaiter gets a context whose deadline runs from the start.
type CapacityWaiter interface {
	// WaitsForCapacity marks the implementation; it is never called.
	WaitsForCapacity()
}

type callTimeoutKey struct{}

// WithCallTimeout returns ctx carrying d as the timeout of the call made
// under it, for BeginCall: what the runtime hands a CapacityWaiter.
func WithCallTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, callTimeoutKey{}, d)
}

// BeginCall starts the call timeout ctx carries, from now: a
// CapacityWaiter calls it once it has the capacity to begin the call. A
// context that carries none comes back as it is (with a no-op cancel):
// its deadline, if any, runs already.
func BeginCall(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Value(callTimeoutKey{}).(time.Duration); ok && d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// Builder turns a Run view into a model request. It runs synchronously;
// its output is stored once, in the ModelStepPlanned event.
//
// Implementations are safe for concurrent use.
type Builder interface {
	Build(ctx context.Context, tenant string, in abi.BuildInput) (abi.BuildOutput, error)
}

// EmitScope says which Run and effect a plugin's emit belongs to.
type EmitScope struct {
	Tenant   string
	Session  string
	RunID    string
	EffectID string
	Plugin   string
	// Attempt is the effect's attempt, and DeltaSeq numbers the call's
	// model_delta emits from 1 (0 for other emits).
	Attempt  int
	DeltaSeq int64
}

// EventSink receives the progress events plugins emit with agenthost_emit,
// for the Run's event stream. Emit must not block for long: it is called
// from inside a plugin call.
type EventSink interface {
	Emit(ctx context.Context, scope EmitScope, ev abi.EmitEvent) error
}

// PluginError is a classified failure of a plugin call.
type PluginError struct {
	Class  abi.ErrorClass
	Plugin string
	Export string
	Err    error
}

func (e *PluginError) Error() string {
	return fmt.Sprintf("host: plugin[%s] export[%s]: %s: %v", e.Plugin, e.Export, e.Class, e.Err)
}

func (e *PluginError) Unwrap() error { return e.Err }

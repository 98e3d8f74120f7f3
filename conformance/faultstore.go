package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// ErrInjected is wrapped by every error a FaultStore makes up, so a test
// tells an injected fault from a real one with errors.Is.
var ErrInjected = errors.New("conformance: injected store fault")

// FaultKind is what a FaultStore does to a call it chose to fail.
type FaultKind uint8

const (
	// FaultError fails the call before it reaches the inner store: nothing
	// is written. The error wraps ErrInjected and
	// runtime.ErrStoreUnavailable, as a store that cannot serve would.
	FaultError FaultKind = iota + 1
	// FaultTimeout fails the call before it reaches the inner store, as a
	// call that ran out of time: the error wraps ErrInjected and
	// context.DeadlineExceeded. It does not sleep.
	FaultTimeout
	// FaultLostReply lets the call reach the inner store, then drops the
	// reply: whatever the call wrote stays written, and the caller gets an
	// error wrapping ErrInjected and runtime.ErrStoreUnavailable. It is
	// the fault that idempotent retries exist for. On a method that writes
	// nothing (a read, or Close) it is a FaultError.
	FaultLostReply
)

var faultKinds = []FaultKind{FaultError, FaultTimeout, FaultLostReply}

func (k FaultKind) String() string {
	switch k {
	case FaultError:
		return "error"
	case FaultTimeout:
		return "timeout"
	case FaultLostReply:
		return "lost-reply"
	}
	return fmt.Sprintf("FaultKind(%d)", uint8(k))
}

func (k FaultKind) valid() bool { return k >= FaultError && k <= FaultLostReply }

// faultMethods names every method of runtime.Store, and whether it writes
// (a FaultLostReply needs a write to lose the reply of).
var faultMethods = map[string]bool{
	"CreateRun": true, "Commit": true, "LoadRun": false, "Events": false,
	"SessionRuns": false, "CompletedRunsBefore": false, "ActiveRuns": false,
	"RunsByStatus": false, "RunsByStatusDesc": false, "TenantStoredBytes": false,
	"RegisterNode": true, "RenewNode": true, "ClaimSession": true, "ClaimSessions": true, "ReleaseSession": true,
	"OrphanedSessions": false, "ActiveSessions": false, "ExecutingEffects": false,
	"KVGet": false, "KVSet": true, "KVDelete": true,
	"Prune": true, "Close": false,
}

// FaultOptions configure the random faults of a FaultStore.
type FaultOptions struct {
	// Seed chooses the faults: the same Seed gives the same decision for
	// the n-th call.
	Seed uint64
	// Rate is the probability that a call of an eligible method gets a
	// fault, from 0 (never: the store only forwards, unless told by
	// FailNext or FailWhen) to 1 (every call).
	Rate float64
	// Methods are the names of the runtime.Store methods that may get a
	// random fault ("Commit", "KVGet", …); nil means every method except
	// Close.
	Methods []string
	// Kinds are the kinds a random fault is chosen from, evenly; nil
	// means all of them.
	Kinds []FaultKind
}

// InjectedFault is one fault a FaultStore injected.
type InjectedFault struct {
	Call   uint64 // the call's index among all calls of the FaultStore, from 1
	Method string // the runtime.Store method
	Kind   FaultKind
}

// FaultArgs is what a FailWhen predicate gets as the arguments of a call,
// for every method but CreateRun and Commit (which pass their
// runtime.CreateRun and runtime.Commit). Only the fields the method takes
// are set: Tenant, Session and Node for ClaimSession, Tenant and RunID for
// LoadRun, Node for RegisterNode, AtMS for OrphanedSessions (nowMS) and
// Prune (beforeMS), and so on; ActiveSessions sets Tenant and Session to
// its cursor.
type FaultArgs struct {
	Tenant  string
	Session string
	RunID   string
	Node    string
	Plugin  string
	Key     []byte
	AtMS    int64
}

// FaultStore wraps a runtime.Store and makes some of its calls fail, so a
// test can prove that the runtime survives a store that errs, times out,
// or writes and then loses the reply. Every method decides on a fault,
// then forwards to the inner store (or not, as the fault says).
//
// A call gets a fault, in this order of precedence:
//  1. FailNext said so for its method (targeted, counted);
//  2. the FailWhen predicate says so (targeted, by arguments);
//  3. random faults are enabled (SetEnabled), its method is in
//     FaultOptions.Methods, and the seeded draw falls under Rate.
//
// Random faults are deterministic: the calls are numbered from 1 in the
// order they reach the FaultStore, and every call takes the same two
// draws from a PCG generator seeded with Seed, whatever its method and
// whether or not it faults, so the decision for the n-th call depends on
// Seed and n only. Under concurrency, which call is the n-th is the
// caller's business. Injected lists what was injected, to replay or
// explain a failure.
//
// Typical use: wrap the store with a Rate, run a workload, call
// SetEnabled(false), let the system converge, then check its invariants
// against the inner store.
//
// Safe for concurrent use. It is for tests only.
type FaultStore struct {
	inner   runtime.Store
	rate    float64
	methods map[string]bool
	kinds   []FaultKind

	mu       sync.Mutex
	rng      *rand.Rand
	calls    uint64
	enabled  bool
	next     map[string]failNext
	when     func(method string, args any) (FaultKind, bool)
	injected []InjectedFault
}

type failNext struct {
	kind FaultKind
	n    int
}

var _ runtime.Store = (*FaultStore)(nil)

// NewFaultStore wraps inner. Random faults are enabled when opts.Rate > 0.
// It panics on a method name that runtime.Store does not have, or on a
// kind that is not a FaultKind: both are mistakes in the test.
func NewFaultStore(inner runtime.Store, opts FaultOptions) *FaultStore {
	f := &FaultStore{
		inner:   inner,
		rate:    opts.Rate,
		methods: map[string]bool{},
		kinds:   faultKinds,
		rng:     rand.New(rand.NewPCG(opts.Seed, 0x6661756c7473)),
		enabled: opts.Rate > 0,
		next:    map[string]failNext{},
	}
	if opts.Methods == nil {
		for m := range faultMethods {
			f.methods[m] = m != "Close"
		}
	}
	for _, m := range opts.Methods {
		mustBeMethod(m)
		f.methods[m] = true
	}
	if opts.Kinds != nil {
		for _, k := range opts.Kinds {
			mustBeKind(k)
		}
		f.kinds = slices.Clone(opts.Kinds)
	}
	return f
}

func mustBeMethod(m string) {
	if _, ok := faultMethods[m]; !ok {
		panic(fmt.Sprintf("conformance: FaultStore: runtime.Store has no method %q", m))
	}
}

func mustBeKind(k FaultKind) {
	if !k.valid() {
		panic(fmt.Sprintf("conformance: FaultStore: %v is not a fault kind", k))
	}
}

// SetEnabled switches random faults on or off; FailNext and FailWhen are
// obeyed either way. Calls made while off still count and still take
// their draws, so turning faults off and on does not shift the decisions
// of later calls.
func (f *FaultStore) SetEnabled(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enabled = on
}

// FailNext makes the next n calls of method fail with kind, whatever the
// Rate and SetEnabled say: for example FailNext("Commit", FaultLostReply,
// 1) loses the reply of the next Commit. It replaces what an earlier
// FailNext of that method had left; n <= 0 cancels it.
func (f *FaultStore) FailNext(method string, kind FaultKind, n int) {
	mustBeMethod(method)
	mustBeKind(kind)
	f.mu.Lock()
	defer f.mu.Unlock()
	if n <= 0 {
		delete(f.next, method)
		return
	}
	f.next[method] = failNext{kind: kind, n: n}
}

// FailWhen sets a predicate asked about every call that FailNext does not
// already fail: when it returns true, the call fails with the kind it
// returns. args is the call's runtime.Commit for Commit, its
// runtime.CreateRun for CreateRun, and a FaultArgs for the other methods.
// For example, to lose the reply of every settlement:
//
//	fs.FailWhen(func(method string, args any) (FaultKind, bool) {
//		c, ok := args.(runtime.Commit)
//		return FaultLostReply, ok && strings.HasPrefix(c.CommandID, "settle/")
//	})
//
// The predicate runs outside the FaultStore's lock, so it may call
// FailNext or SetEnabled (but should not call the store). nil removes it.
func (f *FaultStore) FailWhen(pred func(method string, args any) (FaultKind, bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.when = pred
}

// Injected returns the faults injected so far, in call order.
func (f *FaultStore) Injected() []InjectedFault {
	f.mu.Lock()
	out := slices.Clone(f.injected)
	f.mu.Unlock()
	slices.SortFunc(out, func(a, b InjectedFault) int {
		switch {
		case a.Call < b.Call:
			return -1
		case a.Call > b.Call:
			return 1
		}
		return 0
	})
	return out
}

// Counts returns how many faults of each kind were injected so far.
func (f *FaultStore) Counts() map[FaultKind]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[FaultKind]int{}
	for _, in := range f.injected {
		out[in.Kind]++
	}
	return out
}

// decide numbers a call and decides its fault: 0 for none.
func (f *FaultStore) decide(method string, args any) (uint64, FaultKind) {
	f.mu.Lock()
	f.calls++
	n := f.calls
	draw, pick := f.rng.Float64(), f.rng.Uint64() // always both: see FaultStore
	var kind FaultKind
	if fn, ok := f.next[method]; ok {
		kind = fn.kind
		if fn.n--; fn.n == 0 {
			delete(f.next, method)
		} else {
			f.next[method] = fn
		}
	}
	random := f.enabled && f.methods[method] && draw < f.rate
	when := f.when
	f.mu.Unlock()

	if kind == 0 && when != nil {
		if k, ok := when(method, args); ok {
			mustBeKind(k)
			kind = k
		}
	}
	if kind == 0 && random {
		kind = f.kinds[pick%uint64(len(f.kinds))]
	}
	if kind == FaultLostReply && !faultMethods[method] {
		kind = FaultError
	}
	if kind != 0 {
		f.mu.Lock()
		f.injected = append(f.injected, InjectedFault{Call: n, Method: method, Kind: kind})
		f.mu.Unlock()
	}
	return n, kind
}

func faultErr(n uint64, method string, kind FaultKind) error {
	switch kind {
	case FaultTimeout:
		return fmt.Errorf("faultstore: %s (call %d): %w: %w", method, n, ErrInjected, context.DeadlineExceeded)
	case FaultLostReply:
		return fmt.Errorf("faultstore: %s (call %d) reached the store but its reply was lost: %w: %w", method, n, ErrInjected, runtime.ErrStoreUnavailable)
	}
	return fmt.Errorf("faultstore: %s (call %d): %w: %w", method, n, ErrInjected, runtime.ErrStoreUnavailable)
}

// call runs one call of method through the fault decision; do forwards it
// to the inner store.
func call[T any](f *FaultStore, method string, args any, do func() (T, error)) (T, error) {
	n, kind := f.decide(method, args)
	switch kind {
	case 0:
		return do()
	case FaultLostReply:
		_, _ = do()
	}
	var zero T
	return zero, faultErr(n, method, kind)
}

// call0 is call for a method that returns only an error.
func call0(f *FaultStore, method string, args any, do func() error) error {
	_, err := call(f, method, args, func() (struct{}, error) { return struct{}{}, do() })
	return err
}

// StepsFirstRuns implements runtime.FirstStepper: as the inner store
// does.
func (f *FaultStore) StepsFirstRuns() bool {
	fs, ok := f.inner.(runtime.FirstStepper)
	return ok && fs.StepsFirstRuns()
}

// CreateRun implements runtime.Store.
func (f *FaultStore) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	return call(f, "CreateRun", c, func() (runtime.CreateResult, error) { return f.inner.CreateRun(ctx, c) })
}

// LoadRun implements runtime.Store.
func (f *FaultStore) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	return call(f, "LoadRun", FaultArgs{Tenant: tenant, RunID: runID}, func() (loop.Run, error) {
		return f.inner.LoadRun(ctx, tenant, runID)
	})
}

// Commit implements runtime.Store.
func (f *FaultStore) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	return call(f, "Commit", c, func() (runtime.CommitResult, error) { return f.inner.Commit(ctx, c) })
}

// Events implements runtime.Store.
func (f *FaultStore) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	return call(f, "Events", FaultArgs{Tenant: tenant, RunID: runID}, func() ([]loop.Event, error) {
		return f.inner.Events(ctx, tenant, runID, fromSeq, limit)
	})
}

// SessionRuns implements runtime.Store.
func (f *FaultStore) SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error) {
	return call(f, "SessionRuns", FaultArgs{Tenant: tenant, Session: session}, func() ([]runtime.SessionRun, error) {
		return f.inner.SessionRuns(ctx, tenant, session, after, limit)
	})
}

// CompletedRunsBefore implements runtime.Store.
func (f *FaultStore) CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error) {
	return call(f, "CompletedRunsBefore", FaultArgs{Tenant: tenant, Session: session, RunID: runID}, func() ([]loop.Run, error) {
		return f.inner.CompletedRunsBefore(ctx, tenant, session, runID, limit)
	})
}

// ActiveRuns implements runtime.Store.
func (f *FaultStore) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	return call(f, "ActiveRuns", FaultArgs{Tenant: tenant, Session: session}, func() ([]loop.Run, error) {
		return f.inner.ActiveRuns(ctx, tenant, session)
	})
}

// RunsByStatus implements runtime.Store.
func (f *FaultStore) RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error) {
	return call(f, "RunsByStatus", FaultArgs{Tenant: tenant}, func() ([]string, error) {
		return f.inner.RunsByStatus(ctx, tenant, status, after, limit)
	})
}

// RunsByStatusDesc implements runtime.Store.
func (f *FaultStore) RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error) {
	return call(f, "RunsByStatusDesc", FaultArgs{Tenant: tenant}, func() ([]string, error) {
		return f.inner.RunsByStatusDesc(ctx, tenant, status, before, limit)
	})
}

// TenantStoredBytes implements runtime.Store.
func (f *FaultStore) TenantStoredBytes(ctx context.Context, tenant string) (int64, error) {
	return call(f, "TenantStoredBytes", FaultArgs{Tenant: tenant}, func() (int64, error) {
		return f.inner.TenantStoredBytes(ctx, tenant)
	})
}

// RegisterNode implements runtime.Ownership.
func (f *FaultStore) RegisterNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return call0(f, "RegisterNode", FaultArgs{Node: nodeID, AtMS: expiresMS}, func() error {
		return f.inner.RegisterNode(ctx, nodeID, expiresMS)
	})
}

// RenewNode implements runtime.Ownership.
func (f *FaultStore) RenewNode(ctx context.Context, nodeID string, expiresMS int64) error {
	return call0(f, "RenewNode", FaultArgs{Node: nodeID, AtMS: expiresMS}, func() error {
		return f.inner.RenewNode(ctx, nodeID, expiresMS)
	})
}

// ClaimSession implements runtime.Ownership.
func (f *FaultStore) ClaimSession(ctx context.Context, tenant, session, nodeID string, nowMS int64) (uint64, error) {
	return call(f, "ClaimSession", FaultArgs{Tenant: tenant, Session: session, Node: nodeID, AtMS: nowMS}, func() (uint64, error) {
		return f.inner.ClaimSession(ctx, tenant, session, nodeID, nowMS)
	})
}

// ClaimSessions implements runtime.Ownership. A lost reply claims the
// whole batch and answers with an error.
func (f *FaultStore) ClaimSessions(ctx context.Context, nodeID string, nowMS int64, sessions []runtime.SessionRef) ([]runtime.SessionClaim, error) {
	return call(f, "ClaimSessions", FaultArgs{Node: nodeID, AtMS: nowMS}, func() ([]runtime.SessionClaim, error) {
		return f.inner.ClaimSessions(ctx, nodeID, nowMS, sessions)
	})
}

// ReleaseSession implements runtime.Ownership.
func (f *FaultStore) ReleaseSession(ctx context.Context, tenant, session, nodeID string) error {
	return call0(f, "ReleaseSession", FaultArgs{Tenant: tenant, Session: session, Node: nodeID}, func() error {
		return f.inner.ReleaseSession(ctx, tenant, session, nodeID)
	})
}

// OrphanedSessions implements runtime.Ownership.
func (f *FaultStore) OrphanedSessions(ctx context.Context, nowMS int64) ([]runtime.SessionOwner, error) {
	return call(f, "OrphanedSessions", FaultArgs{AtMS: nowMS}, func() ([]runtime.SessionOwner, error) {
		return f.inner.OrphanedSessions(ctx, nowMS)
	})
}

// ActiveSessions implements runtime.Ownership.
func (f *FaultStore) ActiveSessions(ctx context.Context, afterTenant, afterSession string, limit int) ([]runtime.SessionOwner, error) {
	return call(f, "ActiveSessions", FaultArgs{Tenant: afterTenant, Session: afterSession}, func() ([]runtime.SessionOwner, error) {
		return f.inner.ActiveSessions(ctx, afterTenant, afterSession, limit)
	})
}

// ExecutingEffects implements runtime.Ownership.
func (f *FaultStore) ExecutingEffects(ctx context.Context, tenant, session string) ([]runtime.EffectRecord, error) {
	return call(f, "ExecutingEffects", FaultArgs{Tenant: tenant, Session: session}, func() ([]runtime.EffectRecord, error) {
		return f.inner.ExecutingEffects(ctx, tenant, session)
	})
}

// KVGet implements runtime.PluginKV.
func (f *FaultStore) KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error) {
	return call(f, "KVGet", FaultArgs{Tenant: tenant, Plugin: plugin, Key: key}, func() ([]byte, error) {
		return f.inner.KVGet(ctx, tenant, plugin, key)
	})
}

// KVSet implements runtime.PluginKV.
func (f *FaultStore) KVSet(ctx context.Context, tenant, plugin string, key, value []byte) error {
	return call0(f, "KVSet", FaultArgs{Tenant: tenant, Plugin: plugin, Key: key}, func() error {
		return f.inner.KVSet(ctx, tenant, plugin, key, value)
	})
}

// KVDelete implements runtime.PluginKV.
func (f *FaultStore) KVDelete(ctx context.Context, tenant, plugin string, key []byte) error {
	return call0(f, "KVDelete", FaultArgs{Tenant: tenant, Plugin: plugin, Key: key}, func() error {
		return f.inner.KVDelete(ctx, tenant, plugin, key)
	})
}

// Prune implements runtime.Store.
func (f *FaultStore) Prune(ctx context.Context, beforeMS int64) (runtime.PruneStats, error) {
	return call(f, "Prune", FaultArgs{AtMS: beforeMS}, func() (runtime.PruneStats, error) {
		return f.inner.Prune(ctx, beforeMS)
	})
}

// Close implements runtime.Store. It gets a random fault only when
// FaultOptions.Methods names it; a faulted Close leaves the inner store
// open.
func (f *FaultStore) Close() error {
	return call0(f, "Close", FaultArgs{}, f.inner.Close)
}

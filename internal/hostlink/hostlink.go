// Package hostlink reaches what package host keeps out of its public API
// for the module's own benchmarks: the baselines a plugin call through the
// host is measured against (docs/BENCHMARKS.md). Package host fills the
// functions in when it is initialised; nothing outside this module can
// import them, and no Run goes through them.
package hostlink

import (
	"context"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero/api"
)

// ExtismBaseline compiles wasm with the extism go-sdk directly, exactly
// as host.(*Host).Load does, under the given *host.Host's wazero config,
// compilation cache and real ABI host functions, with a call timeout of
// timeoutMS (> 0). Calls on its instances have no call scope. The caller
// closes the plugin.
var ExtismBaseline func(ctx context.Context, h any, wasm []byte, timeoutMS uint64) (*extism.CompiledPlugin, error)

// WazeroBaseline instantiates wasm in a bare wazero runtime under the
// given *host.Host's wazero config and compilation cache, with WASI and
// every other import stubbed to panic: the floor a call of an export that
// calls no host function can cost. The returned func closes the runtime.
var WazeroBaseline func(ctx context.Context, h any, wasm []byte) (api.Module, func(context.Context) error, error)

// Package host loads WebAssembly plugins through ABI v1 and keeps the host
// safe from them: the marker handshake, import checks, sandbox limits,
// per-tenant instance pools, the agenthost host functions, and adapters
// that make a plugin a runtime.Builder or runtime.Executor.
//
// # Use
//
//	h, err := host.New(host.Config{
//		CacheDir: "/var/cache/agenthost/wazero", // compiled code survives restarts
//		KV:       store,                         // runtime.PluginKV, usually the Store
//		Clock:    runtime.SystemClock{},
//		Events:   sink,                          // runtime.EventSink for agenthost_emit
//	})
//	defer h.Close(ctx)
//	p, err := h.Load(ctx, host.PluginSpec{
//		Name: "calculator", Path: "calc.wasm", SHA256: "…", Role: abi.RoleExecutor,
//		Sandbox: host.Sandbox{AllowedHosts: []string{"api.example.com"}},
//	})
//	exec, err := p.Executor() // a runtime.Executor
//	reply, err := exec.Start(ctx, runtime.EffectCall{Tenant: "acme", …})
//
// Load does all its checks before any instance exists: the file's sha256
// against the pin, the ABI marker (agenthost_abi_vN; the host picks the
// highest version it supports, and refuses a module with none, or with
// only unsupported ones, saying which), the imports (every
// extism:host/env and WASI import is allowed; extism:host/user imports
// must be agenthost functions with their exact wasm types) and the exports
// the role needs. Only then does it call describe, on a throwaway
// instance, and check the reply against the expected role. The exports
// and imports are read with wazero's CompileModule under the same
// RuntimeConfig go-sdk uses, so that compile is the cache entry go-sdk
// then finds.
//
// # Sandbox defaults
//
// Nothing is granted unless the operator grants it, and every limit is on:
//
//   - memory: 1024 pages (64 MiB) per linear memory of an instance, the
//     guest's and the Extism kernel's, enforced by a wazero memory
//     allocator that also charges a host-wide cap (2 GiB by default,
//     Config.MaxInstanceMemory). A refused grow makes a failed call
//     plugin_oom.
//   - time: a 10 s call timeout that stops even a busy loop (the runtime
//     closes the module when the context ends); the instance is then
//     discarded.
//   - input and output: 1 MiB each, checked by the host (Extism would cut
//     an input that does not fit without saying so).
//   - files: none. The guest's root is a directory where every open fails
//     and is recorded, so a failed reply after it is plugin_denied.
//     Sandbox.AllowedPaths mounts host directories ("ro:" for read-only).
//   - environment: none; Sandbox.Env lists what the guest sees.
//   - clock: the WASI wall clock is Config.Clock; the monotonic clock is
//     Config.Clock too, but never repeats a reading (while a fake clock
//     stands still it moves 1 ms a reading, so guest runtimes never hang).
//   - network: only agenthost_http (and agenthost_http_open, _read and
//     _close, its body read as it arrives), to Sandbox.AllowedHosts (none
//     by default), checked on the request, on every redirect and on the
//     dialled address, with a 10 s timeout, 1 MiB responses and at most 5
//     redirects; never through a proxy; at most 4 streams a call, closed
//     when the call ends. Extism's own http_request is linked
//     but the manifest's AllowedHosts is never set, so it refuses every
//     host. Extism vars are capped at 64 KiB.
//   - instances: never shared across tenants; up to 64 at once per
//     (tenant, plugin), made on demand (a call waits for one beyond that,
//     or while the host-wide memory cap leaves no room), of which 4 are
//     kept idle after their call and evicted after 5 minutes idle on the
//     host clock, the others closed once unused for a second (a burst's,
//     kept for the next wave of calls). An instance
//     that trapped, timed out, ran out of memory, produced too much output
//     or was aborted by a host function is closed, never reused.
//
// # Errors
//
// A plugin's fault is a *runtime.PluginError with a class from
// plugins/abi (plugin_trap, plugin_timeout, plugin_oom,
// plugin_output_too_large, plugin_protocol, plugin_denied,
// executor_unavailable when the store failed under agenthost_kv_get,
// limit_exceeded for an input over the limit); its message starts with
// "host: plugin[NAME] export[EXPORT]: ". A failed reply is not an error:
// it is the plugin's verdict, returned as the reply. Errors that are not
// the plugin's (the caller's context ended while waiting or calling, the
// plugin is closed, the host-wide memory is full) are plain errors that
// wrap their cause.
//
// Host, Plugin, Executor and Builder are safe for concurrent use.
// See RATIONALE.md for why the host is built this way.
package host

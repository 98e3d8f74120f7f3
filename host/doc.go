// Package host loads WebAssembly plugins through ABI v1 and keeps the host
// safe from them: the marker handshake, import checks, sandbox limits,
// per-tenant instance pools, the agenthost host functions, and adapters
// that make a plugin a runtime.Builder or runtime.Executor.
package host

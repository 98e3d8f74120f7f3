// Command agenthost is the agenthost CLI: it wires config, store, plugin
// host and runtime together. It is the only package that imports all of
// them.
//
// Usage:
//
//	agenthost run [--tenant ID] [--session ID] "question"
//	agenthost serve [--listen ADDR]
//	agenthost runs list|show|events|cancel|approve|input [--server URL] [--token T] [--json]
//	agenthost plugin inspect FILE.wasm
//	agenthost plugin verify FILE.wasm [--tool NAME --args JSON] [--role R] [--timeout D] [--memory-pages N]
//	agenthost version
//
// Global flags: --config FILE, --data-dir DIR. The config is read by
// internal/config (docs/OPERATIONS.md); system.go wires it into a
// badgerstore, a plugin host and a runtime, for run and for serve
// (serve.go adds metrics, the usage ledger, the HTTP API of
// internal/httpapi, the signal-driven stop and scheduled retention).
// runs.go is the HTTP client of a server.
package main

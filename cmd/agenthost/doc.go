// Command agenthost is the agenthost CLI: it wires config, store, plugin
// host and runtime together. It, internal/node and the benches are the
// only code that imports all of them.
//
// Usage:
//
//	agenthost run [--tenant ID] [--session ID] "question"
//	agenthost serve [--listen ADDR]
//	agenthost reload [--timeout D]
//	agenthost runs list|show|events|cancel|approve|input [--server URL] [--token T] [--json]
//	agenthost plugin inspect FILE.wasm
//	agenthost plugin verify FILE.wasm [--tool NAME --args JSON] [--role R] [--timeout D] [--memory-pages N]
//	agenthost bench runs|http|recovery|plugin|chaos
//	agenthost version
//
// Global flags: --config FILE, --data-dir DIR. The config is read by
// internal/config (docs/OPERATIONS.md).
//
// Package main only defines and wires the commands: root.go builds the
// command tree and the global flags, run.go is `run`, serve.go is
// `serve`'s command (the signal-driven stop, the reload on SIGHUP, and
// the exit when the node lease expires), reload.go is `reload` (the PID
// file and the reload status file it reads), runs.go is `runs`, the HTTP client of a server,
// stream.go prints a Run's events for `run` and `runs events`, store.go
// is `store`, and plugin.go is `plugin`. The work is in packages outside
// cmd/, under internal/ (docs/DESIGN.md §2 lists them all):
//
//   - internal/node wires a config into a store, a plugin host and a
//     runtime (System, for run and serve), and serves the HTTP API of
//     internal/httpapi over them with metrics (internal/metrics), the
//     usage ledger and scheduled retention (Server, for serve);
//   - internal/config reads and checks the YAML config;
//   - internal/bench is `agenthost bench` (NewCommand): the benches, and
//     `bench chaos`, the command of internal/chaos (the chaos harness,
//     whose invariant checks the crash tests share);
//   - internal/storecopy is `store copy`;
//   - internal/serveproc runs `agenthost serve` as a child process and
//     speaks to it over HTTP, for the benches and the end-to-end tests;
//   - internal/pluginverify runs a plugin for `plugin inspect` and
//     `plugin verify`, and internal/plugininit is `plugin init`.
package main

// Package runtime drives Runs: it defines the ports the rest of agenthost
// plugs into (Store, Executor, Builder, EventSink, Clock), and composes
// them with the pure loop into an execution service.
//
// The package that uses a port defines it (STYLE.md, habit 2):
// badgerstore implements Store, host implements Executor and Builder, and
// conformance holds the in-memory twins for tests. runtime never imports
// badgerstore or host.
package runtime

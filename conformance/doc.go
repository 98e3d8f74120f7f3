// Package conformance holds the exported test suites every implementation
// of agenthost's ports must pass (StoreSuite, and more as the ports grow),
// and the fakes they use: MemStore, FakeClock, scripted executors, and
// fake Wasm plugins under conformance/plugins.
//
// Everything here is for tests; it is not a stable API and not for
// production use.
package conformance

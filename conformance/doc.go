// Package conformance holds the exported test suites every implementation
// of agenthost's ports must pass (StoreSuite, RuntimeSuite, PluginSuite),
// the fakes they use (MemStore, FakeClock, scripted executors, and fake
// Wasm plugins under conformance/plugins), FakeAnthropic and FakeOpenAI
// (fakes of Anthropic's Messages API and of OpenAI's chat completions,
// whole and streamed, for the example model executors), and
// FaultStore, a seeded wrapper of any Store that injects errors, timeouts
// and lost replies.
//
// Everything here is for tests; it is not a stable API and not for
// production use.
package conformance

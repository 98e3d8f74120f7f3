// Command agenthost is the agenthost CLI: it wires config, store, plugin
// host and runtime together. It is the only package that imports all of
// them.
//
// Usage:
//
//	agenthost version
//	agenthost --help
package main

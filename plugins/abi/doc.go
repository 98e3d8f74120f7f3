// Package abi is agenthost's plugin ABI, version 1: the version constants,
// the marker export, the JSON wire types of every message the host and a
// plugin exchange, the single list of error classes, and Validate helpers
// that plugin authors and the host use to check replies.
//
// It is a leaf package, like wazero's api/: it imports nothing else of
// agenthost, so a plugin written in Go can depend on it without pulling
// in the host. docs/ABI.md is the contract for plugin authors and is kept
// current with this package.
//
// Compatibility rule: fields may be added to these types; nothing is
// renamed or removed within a major version. Anything that would break a
// plugin written against ABI v1 is ABI v2.
package abi

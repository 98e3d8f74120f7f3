// Package schema holds the JSON Schema (2020-12) documents of ABI v1: one
// per message a plugin and the host exchange (the describe reply, the
// build input and reply, the effect input, the replies of start, poll,
// attach and cancel, the model and tool outcomes, the host functions'
// arguments and results, the KV status), plus common.json for the shapes
// they share. Each document's $id is BaseURL + its file name, and they
// refer to each other by those names, so a validator that is given all
// of them resolves every $ref without a network.
//
// The documents are the machine-readable form of docs/ABI.md; the Go
// validators of package abi are the host's own checks. A test holds the
// two to agreement on every example of docs/ABI.md and on a corpus of
// invalid messages. Where a rule cannot be said in JSON Schema (tool names
// unique within a list, tool call ids unique within a message), the
// document's description says so, and only the Go check holds it.
//
// The package is separate from abi so that a plugin that imports abi does
// not carry the documents in its binary.
package schema

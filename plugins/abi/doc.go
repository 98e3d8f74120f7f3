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
// # Checking replies
//
// The host decodes every plugin reply with DecodeDescribe,
// DecodeBuildOutput, DecodeEffectReply or DecodeCancelReply: one JSON
// object, unknown fields ignored, missing fields zero, then the matching
// Validate function. A refusal is a *FieldError that names the reply and
// the JSON path of the field ("abi: start reply: outcome.message.role:
// …") and wraps ErrInvalidReply, which the host classifies as
// plugin_protocol. A plugin author can run the same checks in the
// plugin's own tests.
//
// # Helpers for Go plugins
//
// Done, DoneTool, DoneModel, Failed, RateLimited, Pending, Unknown,
// Cancelled and CancelDone build replies; Effect.ToolArguments and
// Effect.ModelRequest decode an effect's request.
//
// Compatibility rule: fields may be added to these types; nothing is
// renamed or removed within a major version. Anything that would break a
// plugin written against ABI v1 is ABI v2.
package abi

// Package examples holds the example plugins, one directory each, built
// for wasip1 (docs/ABI.md, "Writing a plugin"); their tests are in this
// directory. It also embeds the sources that `agenthost plugin init`
// writes into a new project as they are, so that the examples and the
// projects share one copy: the C headers (c/) and the AssemblyScript
// JSON reader (calculator-as/json.ts).
package examples

import "embed"

// Shared holds c/extism.h, c/agenthost.h, c/json.h and
// calculator-as/json.ts.
//
//go:embed c/extism.h c/agenthost.h c/json.h calculator-as/json.ts
var Shared embed.FS

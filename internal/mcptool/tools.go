package mcptool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Bounds on what a server lists: its tools are shown to models, and their
// schemas compiled, so none may be large.
const (
	// MaxTools is how many tools of one server are taken; the rest are
	// left out, with a warning.
	MaxTools = 256
	// MaxDescriptionBytes bounds a tool's description; a longer one is
	// cut.
	MaxDescriptionBytes = 4 << 10
)

// Tool is one tool of an MCP server, as agents are offered it.
type Tool struct {
	// Name is the name agents see: the server's name, "__", and the
	// server's own name of the tool (Original), each character outside
	// [A-Za-z0-9_-] made "_".
	Name     string
	Original string
	// Descriptor is what the model is shown (its Name is Name): the
	// description, cut to MaxDescriptionBytes, and the input schema, which
	// the Loop checks each call's arguments against. It is never
	// idempotent and never asks for approval: the config decides both.
	Descriptor abi.Tool
	// TaskSupport is the tool's execution.taskSupport
	// (mcptasks.TaskForbidden, TaskOptional or TaskRequired).
	TaskSupport string
}

func (t Tool) equal(o Tool) bool {
	return t.Name == o.Name && t.Original == o.Original && t.TaskSupport == o.TaskSupport &&
		t.Descriptor.Description == o.Descriptor.Description && bytes.Equal(t.Descriptor.InputSchema, o.Descriptor.InputSchema)
}

// list lists the server's tools (every page, up to MaxTools), leaving out
// with a warning each one that cannot be offered.
func (s *Server) list(cs *mcp.ClientSession) ([]Tool, error) {
	ctx, cancel := context.WithTimeout(s.life, s.cfg.CallTimeout)
	defer cancel()
	var out []Tool
	seen := map[string]string{}
	n := 0
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		if n++; n > MaxTools {
			s.log.Warn("mcp: the server lists more tools than agenthost takes; the rest are left out", "max", MaxTools)
			break
		}
		tool, why := toolFrom(s.cfg.Name, t)
		if why == "" && seen[tool.Name] != "" {
			why = fmt.Sprintf("its name %s is taken by tool %q already", tool.Name, seen[tool.Name])
		}
		if why != "" {
			s.log.Warn("mcp: a tool of the server is left out", "tool", clip(t.Name, 128), "why", why)
			continue
		}
		seen[tool.Name] = t.Name
		out = append(out, tool)
	}
	return out, nil
}

// toolFrom makes the Tool of server's t, or says why it cannot be offered.
func toolFrom(server string, t *mcp.Tool) (Tool, string) {
	if t == nil || t.Name == "" {
		return Tool{}, "it has no name"
	}
	name := server + config.MCPToolSeparator + safeName(t.Name)
	if !abi.ValidToolName(name) {
		return Tool{}, fmt.Sprintf("%s is longer than the %d characters a tool's name may have", clip(name, 80), abi.MaxToolNameLen)
	}
	schema, err := json.Marshal(t.InputSchema)
	if err != nil {
		return Tool{}, "its input schema is not JSON"
	}
	if len(schema) > loop.MaxSchemaBytes {
		return Tool{}, fmt.Sprintf("its input schema is %d bytes, over the %d a tool's schema may have", len(schema), loop.MaxSchemaBytes)
	}
	var head struct {
		Type any `json:"type"`
	}
	if !bytes.HasPrefix(bytes.TrimSpace(schema), []byte("{")) || json.Unmarshal(schema, &head) != nil || head.Type != "object" {
		return Tool{}, `its input schema is not {"type": "object", …}`
	}
	if _, err := loop.CompileToolSchema(schema); err != nil {
		return Tool{}, fmt.Sprintf("its input schema cannot check arguments: %v", err)
	}
	desc := t.Description
	if desc == "" && t.Annotations != nil {
		desc = t.Annotations.Title
	}
	desc = clip(strings.ToValidUTF8(desc, "\uFFFD"), MaxDescriptionBytes)
	return Tool{
		Name: name, Original: t.Name, TaskSupport: mcptasks.ToolTaskSupport(t),
		Descriptor: abi.Tool{Name: name, Description: desc, InputSchema: schema, Approval: abi.ApprovalNever},
	}, ""
}

// safeName makes every character of an MCP tool's name that a tool name
// may not hold ([A-Za-z0-9_-]) an underscore.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}

// clip cuts s to at most n bytes, on a character boundary, ending in "…"
// when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

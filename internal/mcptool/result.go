package mcptool

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Outcome is the tool outcome of an MCP tool's result, as the model reads
// it: the text of its text content, joined by new lines, with every other
// kind of content described in a line of its own (an image's type and
// size, a resource's URI and, for a text resource, its text); its
// structured content as JSON when it has no text at all; is_error as the
// server said. The text is valid UTF-8 and at most max bytes, cut with a
// note past that.
func Outcome(res *mcp.CallToolResult, max int) abi.ToolOutcome {
	var parts []string
	text := false
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts, text = append(parts, c.Text), true
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image: %s, %d bytes, not shown]", orUnknown(c.MIMEType), len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio: %s, %d bytes, not shown]", orUnknown(c.MIMEType), len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link: %s %s]", c.Name, c.URI))
		case *mcp.EmbeddedResource:
			r := c.Resource
			switch {
			case r == nil:
				parts = append(parts, "[resource: empty]")
			case r.Text != "":
				parts, text = append(parts, fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text)), true
			default:
				parts = append(parts, fmt.Sprintf("[resource %s: %s, %d bytes, not shown]", r.URI, orUnknown(r.MIMEType), len(r.Blob)))
			}
		default:
			parts = append(parts, fmt.Sprintf("[content of type %T, not shown]", c))
		}
	}
	if !text && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append([]string{string(b)}, parts...)
		}
	}
	content := strings.ToValidUTF8(strings.Join(parts, "\n"), "\uFFFD")
	if len(content) > max {
		note := fmt.Sprintf("\n[cut: the result was %d bytes, over the %d this server's max_result_bytes allows]", len(content), max)
		content = clip(content, max-len(note)) + note
	}
	return abi.ToolOutcome{Content: content, IsError: res.IsError}
}

func orUnknown(mime string) string {
	if mime == "" {
		return "of unknown type"
	}
	return mime
}

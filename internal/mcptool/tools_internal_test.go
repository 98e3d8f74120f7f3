package mcptool

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestAToolListIsCheckedAndBounded: a server's tool is offered under
// SERVER__TOOL with the characters a tool name may not hold made "_", its
// description cut to MaxDescriptionBytes; a tool whose schema is not an
// object's, or cannot check arguments, or whose name would be too long,
// is left out, saying why.
func TestAToolListIsCheckedAndBounded(t *testing.T) {
	obj := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)
	tl, why := toolFrom("files", &mcp.Tool{Name: "read.file/v2", Description: strings.Repeat("d", MaxDescriptionBytes+100), InputSchema: obj})
	if why != "" || tl.Name != "files__read_file_v2" || tl.Original != "read.file/v2" || len(tl.Descriptor.Description) > MaxDescriptionBytes ||
		!strings.HasSuffix(tl.Descriptor.Description, "…") || tl.TaskSupport != "forbidden" {
		t.Fatalf("tool: %+v (%s)", tl, why)
	}
	for _, c := range []struct {
		tool *mcp.Tool
		why  string
	}{
		{&mcp.Tool{Name: "arr", InputSchema: json.RawMessage(`{"type":"array"}`)}, `is not {"type": "object"`},
		{&mcp.Tool{Name: "ref", InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}}`)}, "cannot check arguments"},
		{&mcp.Tool{Name: strings.Repeat("n", 80), InputSchema: obj}, "longer than the 64 characters"},
		{&mcp.Tool{Name: "", InputSchema: obj}, "no name"},
	} {
		if _, why := toolFrom("files", c.tool); !strings.Contains(why, c.why) {
			t.Errorf("tool %q: left out because %q, want %q", c.tool.Name, why, c.why)
		}
	}
}

// TestAResultIsTheModelsText: text content joined; other content
// described, never passed raw; a text resource's text kept; structured
// content as JSON when there is no text; is_error as the server said; and
// the whole cut to the limit, saying so.
func TestAResultIsTheModelsText(t *testing.T) {
	o := Outcome(&mcp.CallToolResult{Content: []mcp.Content{
		&mcp.TextContent{Text: "first"},
		&mcp.ImageContent{Data: []byte("PNGDATA"), MIMEType: "image/png"},
		&mcp.ResourceLink{URI: "file:///a.txt", Name: "a.txt"},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///b.txt", Text: "bee"}},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///c.bin", MIMEType: "application/octet-stream", Blob: []byte{1, 2, 3}}},
	}, IsError: true}, 4096)
	want := "first\n[image: image/png, 7 bytes, not shown]\n[resource link: a.txt file:///a.txt]\n[resource file:///b.txt]\nbee\n[resource file:///c.bin: application/octet-stream, 3 bytes, not shown]"
	if o.Content != want || !o.IsError {
		t.Fatalf("outcome %+v\nwant %q, is_error", o, want)
	}
	if o := Outcome(&mcp.CallToolResult{StructuredContent: map[string]any{"temp": 21}}, 4096); o.Content != `{"temp":21}` || o.IsError {
		t.Fatalf("structured only: %+v", o)
	}
	o = Outcome(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("é", 3000)}}}, 1024)
	if len(o.Content) > 1024 || !strings.Contains(o.Content, "[cut: the result was 6000 bytes") || !strings.HasPrefix(o.Content, "éé") {
		t.Fatalf("a long result: %d bytes, %q", len(o.Content), o.Content[len(o.Content)-120:])
	}
}

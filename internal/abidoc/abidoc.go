// Package abidoc reads the JSON examples of docs/ABI.md that carry a check
// marker: a line `<!-- check: WHAT … -->` right before a ```json fence.
// The tests that hold the Go validators (plugins/abi), the JSON Schemas
// (plugins/abi/schema) and the host's describe checks (host) to the
// documented contract read them through it, so a change of the doc is
// checked by all three.
package abidoc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Example is one checked example.
type Example struct {
	Line int      // the line of its check marker, from 1
	What []string // the marker's words: the message, and its qualifiers
	JSON []byte   // the fenced JSON, with its line ends
}

// Read returns the checked examples of the Markdown file at path, in
// order. A marker that no ```json fence follows is an error.
func Read(path string) ([]Example, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Example
	sc := bufio.NewScanner(bytes.NewReader(raw))
	n := 0
	for sc.Scan() {
		n++
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "<!-- check:")
		if !ok {
			continue
		}
		ex := Example{Line: n, What: strings.Fields(strings.TrimSuffix(rest, "-->"))}
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "```json" {
			return nil, fmt.Errorf("%s:%d: a check marker must be followed by a ```json fence", path, n)
		}
		n++
		var body bytes.Buffer
		for sc.Scan() {
			n++
			if strings.TrimSpace(sc.Text()) == "```" {
				break
			}
			body.WriteString(sc.Text() + "\n")
		}
		ex.JSON = body.Bytes()
		out = append(out, ex)
	}
	return out, sc.Err()
}

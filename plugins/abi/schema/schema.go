package schema

import (
	"embed"
	"io/fs"
	"slices"
	"strings"
)

// BaseURL is the prefix of every document's $id.
const BaseURL = "https://github.com/agenthost/agenthost/plugins/abi/schema/"

//go:embed *.json
var files embed.FS

// FS holds the documents, named by file (describe-reply.json, …).
var FS fs.FS = files

// Names lists the documents' file names, sorted.
func Names() []string {
	ents, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// Document returns the bytes of one document by file name.
func Document(name string) ([]byte, error) { return fs.ReadFile(files, name) }

// Package plugininit writes a new plugin project, for `agenthost plugin
// init`: a standalone tool executor in Go, C or AssemblyScript that builds
// outside this repository, with one example tool (word_count) that
// validates its input, a README, a build script and a verify script that
// runs `agenthost plugin verify` and `agenthost plugin call` on it.
//
// The projects are templates embedded in the binary (templates/): common/
// goes into every project, and the language's directory after it. In a
// template, __NAME__ stands for the plugin's name; a file whose name ends
// in .tmpl loses the suffix (so that go.mod and the .go files are not part
// of this module), and gitignore.tmpl becomes .gitignore. The C headers
// and the AssemblyScript JSON reader are the examples' own files
// (examples.Shared), written as they are.
package plugininit

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins"
)

//go:embed all:templates
var templates embed.FS

// Languages are the languages init writes, as --lang takes them.
var Languages = []string{"go", "c", "assemblyscript"}

// DisplayNames are the languages' names, as people write them.
var DisplayNames = map[string]string{"go": "Go", "c": "C", "assemblyscript": "AssemblyScript"}

// aliases are other spellings --lang accepts.
var aliases = map[string]string{"golang": "go", "as": "assemblyscript", "ts": "assemblyscript"}

// Placeholder stands for the plugin's name in the templates.
const Placeholder = "__NAME__"

// MaxNameLen is the longest plugin name init accepts.
const MaxNameLen = 64

// Lang returns the language --lang names, or an error that lists the
// ones there are.
func Lang(s string) (string, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	if a, ok := aliases[l]; ok {
		l = a
	}
	for _, x := range Languages {
		if l == x {
			return l, nil
		}
	}
	return "", fmt.Errorf("plugininit: --lang %q is not a language init writes: want one of %s", s, strings.Join(Languages, ", "))
}

// CheckName reports whether name can name a plugin project: it is the
// describe name, the Go module path, the npm package name and the .wasm
// file's name, so it is lower case letters, digits and '-', starting with
// a letter.
func CheckName(name string) error {
	if name == "" {
		return errors.New("plugininit: the plugin name is empty: name it, e.g. word-tools")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("plugininit: the plugin name %q is %d bytes long: at most %d", name, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '-') {
			continue
		}
		return fmt.Errorf("plugininit: the plugin name %q has %q at byte %d: use lower case letters, digits and '-', starting with a letter (e.g. word-tools); it names the Go module, the npm package and the .wasm file", name, c, i+1)
	}
	if strings.HasSuffix(name, "-") {
		return fmt.Errorf("plugininit: the plugin name %q ends with '-': end it with a letter or a digit", name)
	}
	return nil
}

// Write writes the project of lang for the plugin name into dir, which
// must not exist or be empty, and returns the paths it wrote, relative to
// dir, sorted. It writes nothing when it refuses.
func Write(lang, name, dir string) ([]string, error) {
	lang, err := Lang(lang)
	if err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("plugininit: %s already exists and is not empty: name a new directory, or empty this one (init overwrites nothing)", dir)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("plugininit: %w", err)
	}
	files, err := Files(lang, name)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, rel := range sortedKeys(files) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return written, fmt.Errorf("plugininit: %w", err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(rel, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, files[rel], mode); err != nil {
			return written, fmt.Errorf("plugininit: %w", err)
		}
		written = append(written, rel)
	}
	return written, nil
}

// Files returns the project of lang for the plugin name, by path (with
// '/'), without writing it.
func Files(lang, name string) (map[string][]byte, error) {
	lang, err := Lang(lang)
	if err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, root := range []string{"templates/common", "templates/" + lang} {
		err := fs.WalkDir(templates, root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := templates.ReadFile(p)
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(p, root+"/")
			rel = strings.TrimSuffix(rel, ".tmpl")
			if path.Base(rel) == "gitignore" {
				rel = path.Join(path.Dir(rel), ".gitignore")
			}
			rel = strings.ReplaceAll(rel, Placeholder, name)
			out[path.Clean(rel)] = []byte(strings.ReplaceAll(string(b), Placeholder, name))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("plugininit: the embedded templates: %w", err)
		}
	}
	// The sources the project shares with the examples, as they are.
	for file, src := range sharedSources[lang] {
		b, err := examples.Shared.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("plugininit: the examples' %s: %w", src, err)
		}
		out[file] = b
	}
	return out, nil
}

// sharedSources names, by language, the files of a project that are the
// examples' own (examples.Shared), by their path in the project.
var sharedSources = map[string]map[string]string{
	"c":              {"extism.h": "c/extism.h", "agenthost.h": "c/agenthost.h", "json.h": "c/json.h"},
	"assemblyscript": {"json.ts": "calculator-as/json.ts"},
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

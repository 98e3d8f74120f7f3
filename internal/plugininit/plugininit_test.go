package plugininit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"word-tools", "w", "a1-b2", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"":                                "is empty",
		"Word":                            `has 'W' at byte 1`,
		"1word":                           `has '1' at byte 1`,
		"word_tools":                      `has '_' at byte 5`,
		"word tools":                      `has ' ' at byte 5`,
		"../x":                            `has '.' at byte 1`,
		"word-":                           "ends with '-'",
		strings.Repeat("a", MaxNameLen+1): "at most 64",
	} {
		err := CheckName(name)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckName(%q) = %v, want an error with %q", name, err, want)
		}
	}
}

func TestLang(t *testing.T) {
	for in, want := range map[string]string{"go": "go", "Go": "go", "golang": "go", "c": "c", "assemblyscript": "assemblyscript", "as": "assemblyscript"} {
		if got, err := Lang(in); err != nil || got != want {
			t.Errorf("Lang(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Lang("rust"); err == nil || !strings.Contains(err.Error(), "want one of go, c, assemblyscript") {
		t.Errorf("Lang(rust) = %v", err)
	}
}

// Every project has a README, build.sh, verify.sh and a .gitignore, names
// the plugin everywhere the placeholder was, and the Go one refers to
// nothing of this module.
func TestFiles(t *testing.T) {
	for _, lang := range Languages {
		files, err := Files(lang, "word-tools")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"README.md", "build.sh", "verify.sh", ".gitignore"} {
			if _, ok := files[f]; !ok {
				t.Errorf("%s: no %s", lang, f)
			}
		}
		for p, b := range files {
			if strings.HasSuffix(p, ".tmpl") || strings.Contains(p, "gitignore") && p != ".gitignore" {
				t.Errorf("%s: file %s keeps its template name", lang, p)
			}
			if bytes.Contains(b, []byte(Placeholder)) {
				t.Errorf("%s: %s still holds %s", lang, p, Placeholder)
			}
			if bytes.Contains(b, []byte("github.com/agenthost/agenthost/")) {
				t.Errorf("%s: %s refers to the agenthost module: the project must build on its own", lang, p)
			}
		}
	}
	g, _ := Files("go", "word-tools")
	if !bytes.HasPrefix(g["go.mod"], []byte("module word-tools\n")) || !bytes.Contains(g["go.mod"], []byte("require github.com/extism/go-pdk v1.1.3\n")) {
		t.Errorf("go.mod:\n%s", g["go.mod"])
	}
	if !bytes.Contains(g["main.go"], []byte("//go:build wasip1")) || !bytes.Contains(g["main.go"], []byte("//go:wasmexport start")) {
		t.Error("main.go is not a wasip1 reactor with //go:wasmexport")
	}
}

// The C headers and the AssemblyScript JSON reader of a project are the
// examples' own files; the AssemblyScript project pins what the example
// pins.
func TestTemplatesMatchTheExamples(t *testing.T) {
	examples := filepath.Join("..", "..", "examples", "plugins")
	for lang, files := range map[string][]string{"c": {"extism.h", "agenthost.h", "json.h"}, "assemblyscript": {"json.ts"}} {
		project, err := Files(lang, "word-tools")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			want, err := os.ReadFile(filepath.Join(examples, sharedSources[lang][f]))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(project[f], want) {
				t.Errorf("the %s project's %s is not examples/plugins/%s", lang, f, sharedSources[lang][f])
			}
		}
	}

	deps := func(b []byte) map[string]string {
		var p struct {
			DevDependencies map[string]string `json:"devDependencies"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		return p.DevDependencies
	}
	tp, _ := templates.ReadFile("templates/assemblyscript/package.json")
	ep, err := os.ReadFile(filepath.Join(examples, "calculator-as", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := deps(tp), deps(ep); len(a) != 2 || a["assemblyscript"] != b["assemblyscript"] || a["@extism/as-pdk"] != b["@extism/as-pdk"] {
		t.Errorf("the template pins %v, calculator-as %v", a, b)
	}
	tl, _ := templates.ReadFile("templates/assemblyscript/package-lock.json")
	el, err := os.ReadFile(filepath.Join(examples, "calculator-as", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	var a, b struct {
		Packages map[string]json.RawMessage `json:"packages"`
	}
	if json.Unmarshal(tl, &a) != nil || json.Unmarshal(el, &b) != nil {
		t.Fatal("a package-lock.json is not JSON")
	}
	for k, v := range b.Packages {
		if k != "" && !bytes.Equal(v, a.Packages[k]) {
			t.Errorf("package-lock.json: %s differs from calculator-as's", k)
		}
	}
}

func TestWriteRefusesANonEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Write("go", "word-tools", dir); err == nil || !strings.Contains(err.Error(), "already exists and is not empty") {
		t.Fatalf("Write into a non-empty dir: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "main.go")); string(b) != "package main\n" {
		t.Error("Write changed a file it refused to overwrite")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("Write added files to a directory it refused: %v", entries)
	}

	empty := filepath.Join(t.TempDir(), "new", "word-tools")
	files, err := Write("c", "word-tools", empty)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(empty, "build.sh")); err != nil || fi.Mode()&0o100 == 0 {
		t.Errorf("build.sh is not executable: %v %v", fi, err)
	}
	if len(files) == 0 || files[0] != ".gitignore" {
		t.Errorf("files %v", files)
	}
}

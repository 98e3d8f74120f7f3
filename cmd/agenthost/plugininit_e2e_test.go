package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// runScript runs a generated project's script with the real toolchains,
// and the agenthost binary as AGENTHOST.
func runScript(t *testing.T, dir, bin string, env []string, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "AGENTHOST="+bin, "AGENTHOST_CACHE_DIR="+conformance.WazeroCacheDir()), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", script, dir, err, out)
	}
	return string(out)
}

// TestPluginInitBuildsAndVerifiesEveryLanguage is a plugin author's first
// hour for each language: plugin init writes a project outside this
// repository, its verify.sh builds it with its own toolchain (go with the
// module proxy; clang and wasi-libc; npm and AssemblyScript) and runs
// plugin verify and plugin call on it; the tool's bad input is a tool
// error; and the Go one's tool is called in a real Run through the
// scripted model's `use word_count {…}`.
func TestPluginInitBuildsAndVerifiesEveryLanguage(t *testing.T) {
	bin := buildBinary(t)
	root := t.TempDir() // outside the repository: no go.mod above it
	wasm := map[string]string{}
	for _, lang := range []string{"go", "c", "assemblyscript"} {
		name := "word-tools-" + map[string]string{"go": "go", "c": "c", "assemblyscript": "as"}[lang]
		dir := filepath.Join(root, name)
		t.Run(lang, func(t *testing.T) {
			if lang != "go" {
				conformance.SkipInShort(t, "building a "+lang+" plugin, whose toolchain make check does not install")
			}
			r := runCLI(t, bin, nil, "plugin", "init", "--lang", lang, name, dir)
			if r.code != 0 {
				t.Fatalf("plugin init exit %d", r.code)
			}
			mustContain(t, "plugin init", r.stdout, "wrote the tool plugin "+name+" (", "verify.sh")
			var env []string
			if lang == "go" {
				// Its own module, and nothing of ours: GOWORK off, GOFLAGS
				// without -mod, go-pdk from the module proxy (or its cache).
				env = []string{"GOWORK=off", "GOFLAGS=-buildvcs=false"}
				for _, c := range [][]string{{"go", "test", "./..."}, {"gofmt", "-l", "."}, {"go", "vet", "./..."}} {
					cmd := exec.Command(c[0], c[1:]...)
					cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
					if c[1] == "vet" {
						cmd.Env = append(cmd.Env, "GOOS=wasip1", "GOARCH=wasm")
					}
					out, err := cmd.CombinedOutput()
					if err != nil || c[0] == "gofmt" && len(out) > 0 {
						t.Fatalf("%s in the generated project: %v\n%s", strings.Join(c, " "), err, out)
					}
				}
			}
			out := runScript(t, dir, bin, env, "verify.sh")
			if n := strings.Count(out, "12 passed, 0 failed, 0 warnings"); n != 2 {
				t.Errorf("verify.sh ran plugin verify with %d clean results, want 2:\n%s", n, out)
			}
			mustContain(t, "verify.sh", out, `"content": "3"`, `"is_error": true`, `must be a string, not a number`, "a valid start reply")
			p := filepath.Join(dir, name+".wasm")
			wasm[lang] = p

			// Bad arguments of every kind: a tool error, never a trap.
			for args, want := range map[string]string{
				`{}`:                   `the argument \"text\" is missing`,
				`{"text":null}`:        `must be a string, not null`,
				`{"text":["a"]}`:       `must be a string, not an array`,
				`{"text":"héllo ☃ x"}`: `"content": "3"`,
			} {
				r := runCLI(t, bin, nil, "plugin", "call", "--cache-dir", conformance.WazeroCacheDir(), p, "start", "--tool", "word_count", "--input", args)
				if r.code != 0 {
					t.Errorf("plugin call with %s: exit %d", args, r.code)
				}
				mustContain(t, "plugin call "+args, r.stdout, want, "a valid start reply")
			}
			// An effect for another tool is a failed effect, with a reason.
			r = runCLI(t, bin, nil, "plugin", "call", "--cache-dir", conformance.WazeroCacheDir(), p, "start", "--tool", "nope", "--input", `{}`)
			mustContain(t, "plugin call --tool nope", r.stdout, `"state": "failed"`, `this plugin offers the tool \"word_count\"`)
			// A reply with non-ASCII text comes out whole: its length is
			// counted in UTF-8 bytes (AssemblyScript's Host.outputString
			// would cut it short, and the reply would not be JSON).
			r = runCLI(t, bin, nil, "plugin", "call", "--cache-dir", conformance.WazeroCacheDir(), p, "start", "--input",
				`{"abi":1,"effect":{"id":"r.t1.0","assignment_key":"a/b/r.t1.0#1","attempt":1,"kind":"tool","tool":"wörd_cöunt☃","request":{"arguments":{}}}}`)
			if r.code != 0 {
				t.Errorf("a non-ASCII reply: exit %d", r.code)
			}
			mustContain(t, "a non-ASCII reply", r.stdout, `no tool \"wörd_cöunt☃\"`, "a valid start reply")
		})
	}
	// init refuses to write over a project, or a name that cannot name
	// one, with one prefix.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lang", "c", "word-tools-c", filepath.Join(root, "word-tools-go")}, "plugin init: " + filepath.Join(root, "word-tools-go") + " already exists and is not empty"},
		{[]string{"--lang", "go", "Word", filepath.Join(root, "w")}, `plugin init: the plugin name "Word" has 'W' at byte 1`},
		{[]string{"--lang", "rust", "w", filepath.Join(root, "w")}, `plugin init: --lang "rust" is not a language init writes: want one of go, c, assemblyscript`},
		{[]string{"w"}, "plugin init: --lang is required"},
	} {
		r := runCLI(t, bin, nil, append([]string{"plugin", "init"}, c.args...)...)
		if r.code == 0 {
			t.Errorf("plugin init %v: exit 0", c.args)
		}
		mustContain(t, "plugin init refusal", r.stderr, c.want)
	}
	if t.Failed() || wasm["go"] == "" {
		return
	}

	// The Go plugin's tool in a real Run: the scripted model calls it when
	// told `use word_count {…}`, and answers with its result.
	cfg := toolRunConfig(t, conformance.WazeroCacheDir(), "word-tools", wasm["go"])
	r := runCLI(t, bin, nil, "run", "--config", cfg, `use word_count {"text": "one two three"}`)
	if r.code != 0 {
		t.Fatalf("run: exit %d", r.code)
	}
	mustContain(t, "run", r.stdout, "· word-tools: counted: 3 words", `model calls word_count {"text":"one two three"}`, "tool word_count returned: 3", "answer: The word_count tool answered: 3.", "run completed")
}

// toolRunConfig writes the config of a tenant whose Runs use the example
// builder and the demo model (scripted-model, which calls any tool when
// told `use TOOL {…}`) with one tool plugin, name at path.
func toolRunConfig(t *testing.T, cache, name, path string) string {
	t.Helper()
	paths := map[string]string{}
	for _, example := range []string{"prompt-builder", "scripted-model"} {
		p := conformance.ExampleWasm(t, example)
		paths[example] = p
	}
	return writeConfig(t, t.TempDir(), `
data_dir: data
cache_dir: `+cache+`
log: {level: warn}
plugins:
  prompt-builder: {path: `+paths["prompt-builder"]+`, role: builder}
  scripted-model: {path: `+paths["scripted-model"]+`, role: executor}
  `+name+`: {path: `+path+`, role: executor}
tenants:
  demo:
    builder: prompt-builder
    model: scripted-model
    tool_executors: [`+name+`]
`)
}

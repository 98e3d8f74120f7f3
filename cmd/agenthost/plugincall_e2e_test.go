package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// runCLIStdin is runCLI with stdin.
func runCLIStdin(t *testing.T, bin, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %v: %v", args, err)
	}
	t.Logf("agenthost %s < %q → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdin, r.code, r.stdout, r.stderr)
	return r
}

// TestPluginCallAndUseWithTheAssemblyScriptExample tries the
// AssemblyScript calculator (built with npm) the way an author tries a
// tool: plugin call with inline, file and stdin input, and its refusals;
// plugin verify with --args from a file too large for a command line, and
// -v; then a real Run in which the scripted model calls it because the
// question says `use calculate {…}`.
func TestPluginCallAndUseWithTheAssemblyScriptExample(t *testing.T) {
	bin := buildBinary(t)
	calc := conformance.ExampleWasm(t, "calculator-as")
	cache := conformance.WazeroCacheDir()
	dir := t.TempDir()
	call := func(args ...string) result {
		t.Helper()
		return runCLI(t, bin, nil, append([]string{"plugin", "call", "--cache-dir", cache}, args...)...)
	}

	t.Run("plugin call prints the full reply, pretty, with time and memory", func(t *testing.T) {
		r := call(calc, "describe")
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		// The whole describe reply, pretty-printed: the description is
		// longer than verify's one-line summaries keep.
		mustContain(t, "describe", r.stdout, "reply:   {\n", `"name": "calculator-as"`,
			`"description": "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus and decimals. Example: (2+3)*4"`,
			"abi:     a valid describe reply", "emitted: 0", "logged:  0", "time:    ", "memory:  ", "KiB of linear memory in use")

		r = call(calc, "start", "--tool", "calculate", "--input", `{"expression":"2^3^2"}`)
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		mustContain(t, "start", r.stdout, `"state": "done"`, `"content": "512"`, `"is_error": false`, "a valid start reply")

		args := filepath.Join(dir, "args.json")
		if err := os.WriteFile(args, []byte(`{"expression": "1/0"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		r = call(calc, "start", "--tool", "calculate", "--input", "@"+args)
		mustContain(t, "start @file", r.stdout, `"content": "error: division by zero at position 2"`, `"is_error": true`)

		r = runCLIStdin(t, bin, `{"expression":"(2+3)*4"}`, "plugin", "call", "--cache-dir", cache, calc, "start", "--tool", "calculate", "-")
		mustContain(t, "start from stdin", r.stdout, `"content": "20"`)

		// A whole effect input, raw, as start takes it.
		r = call(calc, "start", "--input", `{"abi":1,"effect":{"id":"r.t1.0","assignment_key":"a/b/r.t1.0#1","attempt":1,"kind":"tool","tool":"calculate","request":{"arguments":{"expression":"7%4"}}}}`)
		mustContain(t, "raw start", r.stdout, `"content": "3"`, "a valid start reply")
	})

	t.Run("plugin call refuses clearly", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want []string
		}{
			{[]string{filepath.Join(dir, "missing.wasm"), "describe"}, []string{"there is no file", "missing.wasm", "path of a plugin .wasm"}},
			{[]string{calc, "describe", "--input", `{"abi":1`}, []string{"--input: the flag's value is not JSON", "unexpected end of JSON input", "at byte 8 of 8"}},
			{[]string{calc, "start", "--tool", "calculate", "--input", `{"expression":2+3}`}, []string{"is not JSON", "invalid character '+'", "at byte 16", `{\"expression\":2»+3}`}},
			{[]string{calc, "start", "--input", "@" + filepath.Join(dir, "nope.json")}, []string{"there is no file", "nope.json"}},
			{[]string{calc, "describ"}, []string{`has no export "describ"`, "it exports", "describe", "start", "cancel"}},
			{[]string{calc, "start"}, []string{"start needs an input", "--tool NAME --input ARGUMENTS"}},
			{[]string{calc, "start", "--tool", "calculate", "--input", `[1]`}, []string{"not a JSON object"}},
			{[]string{calc, "agenthost_abi_v1"}, []string{"not called with an input"}},
		} {
			r := call(c.args...)
			if r.code == 0 {
				t.Errorf("%v: exit 0, want a refusal", c.args)
			}
			mustContain(t, strings.Join(c.args, " "), r.stderr, c.want...)
		}
	})

	t.Run("plugin call reports a failed call, a broken reply, the KV and the HTTP allow-list", func(t *testing.T) {
		hostile := conformancePlugin(t, conformance.PluginHostile)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello from the test server") }))
		defer srv.Close()
		addr := strings.TrimPrefix(srv.URL, "http://")
		for _, c := range []struct {
			what   string
			args   []string
			code   int
			stdout []string
			stderr []string
		}{
			{"a trap", []string{"--tool", "trap"}, 1, []string{"error:   "}, []string{"plugin call: ", "trap"}},
			{"a reply that is not JSON", []string{"--tool", "not_json"}, 1, []string{"reply:   (16 bytes, not JSON)", "this is not JSON"}, []string{"the reply of start is not JSON"}},
			{"a reply that breaks the ABI", []string{"--tool", "bad_schema"}, 1, []string{`"state": "exploded"`, "abi:     the reply breaks ABI v1"}, []string{"the reply breaks the ABI"}},
			{"a non-zero status", []string{"--tool", "nonzero"}, 1, nil, []string{"hostile: refusing on purpose"}},
			{"the KV after the call", []string{"--tool", "kv_put", "--input", `{"key":"k1","value":"v1"}`}, 0, []string{`"content": "stored"`, "kv:      1 keys", `"k1" = "v1"`}, nil},
			{"a host not on the allow-list", []string{"--tool", "http", "--input", `{"url":"` + srv.URL + `"}`}, 0, []string{`"state": "failed"`, "http: denied"}, nil},
			{"a host on the allow-list", []string{"--tool", "http", "--allow-host", addr, "--input", `{"url":"` + srv.URL + `"}`}, 0, []string{`"content": "200 hello from the test server"`}, nil},
		} {
			r := call(append([]string{hostile, "start"}, c.args...)...)
			if r.code != c.code {
				t.Errorf("%s: exit %d, want %d", c.what, r.code, c.code)
			}
			mustContain(t, c.what+": stdout", r.stdout, append(c.stdout, "time:    ", "memory:  ")...)
			mustContain(t, c.what+": stderr", r.stderr, c.stderr...)
		}
	})

	t.Run("plugin verify takes --args from a file and prints full replies with -v", func(t *testing.T) {
		// ~360 KB: over what one command-line argument may hold (128 KiB
		// on Linux).
		big := filepath.Join(dir, "big.json")
		expr := strings.Repeat("1+", 180000) + "1"
		if err := os.WriteFile(big, []byte(`{"expression":"`+expr+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		r := runCLI(t, bin, nil, "plugin", "verify", "--cache-dir", cache, calc, "--tool", "calculate", "--args", "@"+big)
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		mustContain(t, "verify --args @big.json", r.stdout, "start reply (tool calculate", "0 failed")

		r = runCLI(t, bin, nil, "plugin", "verify", "--cache-dir", cache, "-v", calc, "--tool", "calculate", "--args", `{"expression":"2^10"}`)
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		mustContain(t, "verify -v", r.stdout, "  call describe, input", "  call start, input", `"content": "1024"`,
			`"description": "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus and decimals. Example: (2+3)*4"`, "0 failed")

		r = runCLI(t, bin, nil, "plugin", "verify", calc, "--tool", "calculate", "--args", "@"+filepath.Join(dir, "nope.json"))
		if r.code == 0 {
			t.Error("verify --args @missing: exit 0")
		}
		mustContain(t, "verify --args @missing", r.stderr, "there is no file")
	})

	t.Run("the scripted model calls it in a Run when told use calculate", func(t *testing.T) {
		cfg := toolRunConfig(t, cache, "calculator-as", calc)
		r := runCLI(t, bin, nil, "run", "--config", cfg, `use calculate {"expression": "2^3^2"}`)
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		mustContain(t, "run", r.stdout, `model calls calculate {"expression":"2^3^2"}`, "tool calculate returned: 512", "answer: 2^3^2 = 512.", "run completed")

		r = runCLI(t, bin, nil, "run", "--config", cfg, `use weather {"city": "Paris"}`)
		if r.code != 0 {
			t.Fatalf("exit %d", r.code)
		}
		mustContain(t, "run use weather", r.stdout, "answer: I would call the tool weather, but this Run does not offer it. It offers: calculate.", "run completed")
		if strings.Contains(r.stdout, "model calls") {
			t.Error("the model called a tool the Run does not offer")
		}

		r = runCLI(t, bin, nil, "run", "--config", cfg, `use calculate {"expression": 2^3}`)
		mustContain(t, "run use with bad JSON", r.stdout, "answer: I could not read the arguments for calculate", "run completed")
	})
}

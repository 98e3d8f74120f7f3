package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// buildBinary compiles agenthost into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agenthost")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running %v: %v", args, err)
	}
	t.Logf("agenthost %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

func writeConfig(t *testing.T, dir, yaml string) string {
	t.Helper()
	p := filepath.Join(dir, "agenthost.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustContain(t *testing.T, what, text string, fragments ...string) {
	t.Helper()
	for _, f := range fragments {
		if !strings.Contains(text, f) {
			t.Errorf("%s lacks %q", what, f)
		}
	}
}

func conformancePlugin(t *testing.T, name string) string {
	t.Helper()
	p, err := conformance.BuildPlugin(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunEndToEnd runs the real binary over a real Badger dir and real
// Wasm plugins (the conformance ones), through a completed Run, a Run that
// waits for an approval, and configs it must refuse.
func TestRunEndToEnd(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	builder, executor := conformancePlugin(t, conformance.PluginBuilder), conformancePlugin(t, conformance.PluginExecutor)
	base := `
data_dir: data
cache_dir: ` + conformance.WazeroCacheDir() + `
log: {level: warn}
plugins:
  builder: {path: ` + builder + `, role: builder}
  executor: {path: ` + executor + `, role: executor}
tenants:
  demo:
    builder: builder
    model: executor
    tool_executors: [executor]
`
	cfg := writeConfig(t, dir, base)

	t.Run("a completed run streams its events and exits 0", func(t *testing.T) {
		r := runCLI(t, bin, nil, "run", "--config", cfg, "please add 2 3")
		if r.code != 0 {
			t.Fatalf("exit %d, want 0", r.code)
		}
		mustContain(t, "stdout", r.stdout,
			"(tenant demo, session cli-", "question: please add 2 3",
			"step 1: the builder planned a model request",
			"model calls add {\"a\":2,\"b\":3}",
			"tool add returned: 5",
			"step 2:",
			"answer: result: 5",
			"run completed")
		if strings.Index(r.stdout, "tool add returned") > strings.Index(r.stdout, "answer:") {
			t.Error("the events are out of order")
		}
	})

	t.Run("a streamed answer prints as it comes", func(t *testing.T) {
		// The conformance executor streams an answer to a question
		// with "stream" in it, a word a model_delta.
		r := runCLI(t, bin, nil, "run", "--config", cfg, "please stream this answer")
		if r.code != 0 {
			t.Fatalf("exit %d, want 0", r.code)
		}
		mustContain(t, "stdout", r.stdout, "  model › please stream this answer\n", "answer: please stream this answer\nrun completed")
	})

	t.Run("a run waiting for an approval says so and exits 2", func(t *testing.T) {
		gated := writeConfig(t, t.TempDir(), strings.Replace(base, "data_dir: data", "data_dir: "+filepath.Join(dir, "data"), 1)+`
    tools:
      add: {approval: always}
`)
		r := runCLI(t, bin, nil, "run", "--config", gated, "--session", "s1", "please add 2 3")
		if r.code != exitWaiting {
			t.Fatalf("exit %d, want %d", r.code, exitWaiting)
		}
		mustContain(t, "stdout", r.stdout, "model calls add", "waiting: tool add {\"a\":2,\"b\":3} needs a person's approval")
		mustContain(t, "stderr", r.stderr, "waits for a person")
		if strings.Contains(r.stdout, "answer:") {
			t.Error("a gated call must not run")
		}
	})

	t.Run("an environment variable overrides a nested key", func(t *testing.T) {
		r := runCLI(t, bin, []string{"AGENTHOST_TENANTS_DEMO_LIMITS_MAX_STEPS=1"}, "run", "--config", cfg, "please add 2 3")
		if r.code != exitFailed {
			t.Fatalf("exit %d, want %d (one step is not enough)", r.code, exitFailed)
		}
		mustContain(t, "stdout", r.stdout, "run failed: limit_exceeded")
		mustContain(t, "stderr", r.stderr, "failed: limit_exceeded")
	})

	t.Run("bad config is refused before the store is touched", func(t *testing.T) {
		fresh := t.TempDir()
		bad := writeConfig(t, fresh, strings.Replace(base, "log: {level: warn}", "log: {level: loud}\nsurprise: 1", 1))
		r := runCLI(t, bin, nil, "run", "--config", bad, "q")
		if r.code != 1 {
			t.Fatalf("exit %d, want 1", r.code)
		}
		mustContain(t, "stderr", r.stderr, bad+": log.level: \"loud\" is not one of", bad+": surprise: unknown key")
		if _, err := os.Stat(filepath.Join(fresh, "data")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the data dir was created for a bad config: %v", err)
		}
	})

	t.Run("a missing plugin file says to run make plugins", func(t *testing.T) {
		missing := writeConfig(t, t.TempDir(), strings.Replace(base, executor, "build/plugins/nope.wasm", 1))
		r := runCLI(t, bin, nil, "run", "--config", missing, "q")
		if r.code != 1 {
			t.Fatalf("exit %d, want 1", r.code)
		}
		mustContain(t, "stderr", r.stderr, "plugins.executor.path: build/plugins/nope.wasm does not exist; run `make plugins`")
	})

	t.Run("plugin verify rejects the broken plugin and passes a good one", func(t *testing.T) {
		r := runCLI(t, bin, nil, "plugin", "verify", "--cache-dir", conformance.WazeroCacheDir(), conformancePlugin(t, conformance.PluginBroken))
		if r.code != 1 {
			t.Fatalf("exit %d, want 1", r.code)
		}
		mustContain(t, "stdout", r.stdout, "FAIL  attach on an unknown effect", "PASS  marker")
		r = runCLI(t, bin, nil, "plugin", "verify", "--cache-dir", conformance.WazeroCacheDir(), executor)
		if r.code != 0 {
			t.Fatalf("exit %d, want 0", r.code)
		}
		r = runCLI(t, bin, nil, "plugin", "inspect", executor)
		mustContain(t, "stdout", r.stdout, "marker:  agenthost_abi_v1", "\"name\": \"conformance-executor\"", "extism:host/user.agenthost_kv_get (i64) -> i64")
	})
}

// TestRunExamplesEndToEnd is `make run` as a test: the example plugins
// answer "What is (2+3)*4?" with 20. It skips only while the examples are
// absent from the tree.
func TestRunExamplesEndToEnd(t *testing.T) {
	root, _ := filepath.Abs("../..")
	for _, name := range []string{"prompt-builder", "scripted-model", "calculator"} {
		if _, err := os.Stat(filepath.Join(root, "examples", "plugins", name)); errors.Is(err, os.ErrNotExist) {
			t.Skipf("examples/plugins/%s is absent", name)
		}
	}
	bin := buildBinary(t)
	paths := map[string]string{}
	for _, name := range []string{"prompt-builder", "scripted-model", "calculator"} {
		p := conformance.ExampleWasm(t, name)
		paths[name] = p
	}
	base := `
data_dir: data
cache_dir: ` + conformance.WazeroCacheDir() + `
log: {level: warn}
plugins:
  prompt-builder: {path: ` + paths["prompt-builder"] + `, role: builder}
  scripted-model: {path: ` + paths["scripted-model"] + `, role: executor}
  calculator: {path: ` + paths["calculator"] + `, role: executor}
tenants:
  demo:
    builder: prompt-builder
    model: scripted-model
    tool_executors: [calculator]
`
	dir := t.TempDir()
	r := runCLI(t, bin, nil, "run", "--config", writeConfig(t, dir, base), "What is (2+3)*4?")
	if r.code != 0 {
		t.Fatalf("exit %d, want 0", r.code)
	}
	mustContain(t, "stdout", r.stdout, "model calls calculate", "tool calculate returned: 20", "answer: ", "run completed")
	answer := r.stdout[strings.Index(r.stdout, "answer: "):]
	if !strings.Contains(strings.SplitN(answer, "\n", 2)[0], "20") {
		t.Errorf("the answer line does not say 20: %q", answer)
	}

	gated := writeConfig(t, t.TempDir(), base+`
    tools:
      calculate: {approval: always}
`)
	r = runCLI(t, bin, nil, "run", "--config", gated, "What is (2+3)*4?")
	if r.code != exitWaiting {
		t.Fatalf("exit %d, want %d", r.code, exitWaiting)
	}
	mustContain(t, "stdout", r.stdout, "waiting: tool calculate")
}

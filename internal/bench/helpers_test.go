package bench

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/plugincatalog"
)

// benchPluginsDir builds the plugins `agenthost bench` loads (through the
// shared test cache) and links them into a directory laid out as `make
// plugins` lays out build/plugins, for --plugins.
func benchPluginsDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "conformance"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, rel := range plugincatalog.Bench {
		build := conformance.BuildExampleWasm
		name, isConformance := strings.CutPrefix(rel, plugincatalog.ConformanceDir)
		if isConformance {
			build = conformance.BuildPlugin
		}
		p, err := build(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, plugincatalog.Path(dir, rel)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// agenthostPackage is the agenthost command, which the benches that start
// child processes run: in a test, os.Executable() is the test binary.
const agenthostPackage = "github.com/agenthost/agenthost/cmd/agenthost"

// buildBinary compiles agenthost into a temporary directory, for
// --agenthost-bin.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agenthost")
	out, err := exec.Command("go", "build", "-o", bin, agenthostPackage).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBench runs `agenthost bench ARGS` in-process with the test's plugins,
// the shared wazero cache and a temporary work dir, and returns its stdout.
func runBench(t testing.TB, plugins string, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand("test")
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(append([]string{"--plugins", plugins, "--cache-dir", conformance.WazeroCacheDir(), "--work-dir", t.TempDir()}, args...))
	err := cmd.Execute()
	if testing.Verbose() || err != nil {
		t.Logf("bench %v stderr:\n%s", args, stderr.String())
	}
	return stdout.String(), err
}

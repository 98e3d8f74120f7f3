package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
)

// TestCacheEnv names the environment variable that holds the directory of
// the on-disk test cache: compiled conformance plugins and the wazero
// compilation cache, shared by every test process (DESIGN §9).
const TestCacheEnv = "AGENTHOST_TEST_CACHE"

// Plugin names of the conformance plugins under conformance/plugins.
const (
	PluginBuilder  = "builder"
	PluginExecutor = "executor"
	PluginSlowJob  = "slowjob"
	PluginHostile  = "hostile"
	// PluginBroken loads, but breaks the ABI in the ways the plugin suite
	// must catch (see conformance/plugins/broken).
	PluginBroken = "broken"
)

// Plugins lists every conformance plugin.
var Plugins = []string{PluginBuilder, PluginExecutor, PluginSlowJob, PluginHostile, PluginBroken}

// TestCacheDir returns the test cache directory: $AGENTHOST_TEST_CACHE, or
// a fixed directory under the system temp dir, so that a plain `go test`
// shares it between runs too.
func TestCacheDir() string {
	if d := os.Getenv(TestCacheEnv); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "agenthost-test-cache")
}

// WazeroCacheDir is the wazero compilation cache inside the test cache.
func WazeroCacheDir() string { return filepath.Join(TestCacheDir(), "wazero") }

var (
	buildMu   sync.Mutex
	buildDone = map[string]string{}
)

// BuildPlugin compiles the conformance plugin conformance/plugins/NAME to
// Wasm (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared) and returns the path
// of the .wasm file. It builds once per source hash: the file is named
// after a hash of the plugin's sources, the shared plugin kit, plugins/abi,
// go.mod, go.sum and the Go version, and lives in TestCacheDir()/plugins.
// A build writes a temporary file and renames it into place, so parallel
// test processes that race to build the same plugin both end with a
// complete file. It needs the project's source tree and a Go toolchain;
// it is for tests, not a stable API.
func BuildPlugin(name string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildDone[name]; ok {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "conformance", "plugins", name)
	if st, err := os.Stat(src); err != nil || !st.IsDir() {
		return "", fmt.Errorf("conformance: plugin %q: no source directory %s: pick one of %v", name, src, Plugins)
	}
	sum, err := sourceHash(root, name)
	if err != nil {
		return "", fmt.Errorf("conformance: plugin %q: hashing sources: %w", name, err)
	}
	dir := filepath.Join(TestCacheDir(), "plugins")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("conformance: plugin %q: cache dir: %w (set %s to a writable directory)", name, err, TestCacheEnv)
	}
	out := filepath.Join(dir, name+"-"+sum[:16]+".wasm")
	if _, err := os.Stat(out); err == nil {
		buildDone[name] = out
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*.wasm.tmp")
	if err != nil {
		return "", fmt.Errorf("conformance: plugin %q: %w", name, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(goTool(), "build", "-buildmode=c-shared", "-o", tmp.Name(), "./conformance/plugins/"+name)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("conformance: plugin %q: go build failed: %w\n%s", name, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("conformance: plugin %q: %w", name, err)
	}
	buildDone[name] = out
	return out, nil
}

func goTool() string {
	p := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}

// moduleRoot finds the project's source tree from this file's location.
func moduleRoot() (string, error) {
	_, file, _, ok := goruntime.Caller(0)
	if !ok {
		return "", errors.New("conformance: cannot locate the source tree (runtime.Caller failed)")
	}
	root := filepath.Dir(filepath.Dir(file))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("conformance: no go.mod at %s: BuildPlugin needs the project's source tree", root)
	}
	return root, nil
}

// sourceHash hashes everything a plugin build depends on in this module.
func sourceHash(root, name string) (string, error) {
	var files []string
	for _, d := range []string{
		filepath.Join("conformance", "plugins", name),
		filepath.Join("conformance", "plugins", "internal"),
		filepath.Join("plugins", "abi"),
	} {
		err := filepath.WalkDir(filepath.Join(root, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !e.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	sort.Strings(files)
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", goruntime.Version())
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

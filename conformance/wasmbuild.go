package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/agenthost/agenthost/internal/plugincatalog"
)

// TestCacheEnv names the environment variable that holds the directory of
// the on-disk test cache: compiled conformance plugins and the wazero
// compilation cache, shared by every test process (docs/DESIGN.md §9).
const TestCacheEnv = "AGENTHOST_TEST_CACHE"

// Plugin names of the conformance plugins under conformance/plugins; the
// list is internal/plugincatalog's, which agenthost bench shares.
const (
	PluginBuilder  = plugincatalog.Builder
	PluginExecutor = plugincatalog.Executor
	PluginSlowJob  = plugincatalog.SlowJob
	PluginHostile  = plugincatalog.Hostile
	// PluginScripted is the Wasm twin of ScriptedModel and ScriptedTools.
	PluginScripted = plugincatalog.Scripted
	// PluginBroken loads, but breaks the ABI in the ways the plugin ABI
	// check must catch (see conformance/plugins/broken).
	PluginBroken = plugincatalog.Broken
	// PluginKernelProbe is an executor that also exports probe, which runs
	// a program of raw Extism kernel calls (see conformance/plugins/kernelprobe).
	PluginKernelProbe = plugincatalog.KernelProbe
)

// Plugins lists every conformance plugin.
var Plugins = plugincatalog.Conformance

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
	return hashFileList(root, files)
}

var packageBuildDone = map[string]string{}

// BuildPackage compiles the Go plugin package at relDir (a directory
// relative to the module root, such as "examples/plugins/calculator") to
// Wasm, like BuildPlugin, and returns the path of the .wasm file. It builds
// once per source hash: the hash covers the package's own sources and,
// transitively, every package of this module it imports (found by parsing
// the import clauses, whatever the build tags), go.mod, go.sum and the Go
// version. The file lives in TestCacheDir()/plugins, named after relDir and
// the hash. It is for tests, not a stable API.
func BuildPackage(relDir string) (string, error) {
	relDir = filepath.ToSlash(filepath.Clean(relDir))
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := packageBuildDone[relDir]; ok {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(filepath.Join(root, relDir)); err != nil || !st.IsDir() {
		return "", fmt.Errorf("conformance: package %q: no source directory under %s", relDir, root)
	}
	dirs, err := localImportClosure(root, relDir)
	if err != nil {
		return "", fmt.Errorf("conformance: package %q: %w", relDir, err)
	}
	sum, err := hashDirs(root, dirs)
	if err != nil {
		return "", fmt.Errorf("conformance: package %q: hashing sources: %w", relDir, err)
	}
	name := strings.ReplaceAll(relDir, "/", "_")
	out, err := buildCached(root, name, sum, "./"+relDir)
	if err != nil {
		return "", fmt.Errorf("conformance: package %q: %w", relDir, err)
	}
	packageBuildDone[relDir] = out
	return out, nil
}

// buildCached runs go build for pkg into the cache as NAME-HASH.wasm,
// unless that file is already there.
func buildCached(root, name, sum, pkg string) (string, error) {
	dir := filepath.Join(TestCacheDir(), "plugins")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cache dir: %w (set %s to a writable directory)", err, TestCacheEnv)
	}
	out := filepath.Join(dir, name+"-"+sum[:16]+".wasm")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*.wasm.tmp")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(goTool(), "build", "-buildmode=c-shared", "-o", tmp.Name(), pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build failed: %w\n%s", err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

// localImportClosure returns relDir and every directory of this module that
// it imports, directly or not, sorted. It reads only import clauses, of
// every .go file that is not a test, so build tags cannot hide a
// dependency.
func localImportClosure(root, relDir string) ([]string, error) {
	modPath, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	queue := []string{relDir}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if seen[d] {
			continue
		}
		seen[d] = true
		entries, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, d, e.Name()), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return nil, err
				}
				if rest, ok := strings.CutPrefix(p, modPath+"/"); ok {
					queue = append(queue, rest)
				}
			}
		}
	}
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	return dirs, nil
}

// modulePath reads the module path from go.mod.
func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", errors.New("go.mod has no module line")
}

// hashDirs hashes the Go sources (tests aside) directly in each directory,
// go.mod, go.sum and the Go version.
func hashDirs(root string, dirs []string) (string, error) {
	var files []string
	for _, d := range dirs {
		entries, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
				files = append(files, filepath.Join(root, d, e.Name()))
			}
		}
	}
	return hashFileList(root, files)
}

// hashFileList hashes files (sorted), then go.mod and go.sum, with the Go
// version: the build-cache key of a plugin.
func hashFileList(root string, files []string) (string, error) {
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
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// HashFiles hashes every regular file under each of dirs (relative to
// base), names and contents, in a fixed order. A test that builds a
// plugin with another toolchain (the C example's build.sh) names its cache
// file after it. It is for tests, not a stable API.
func HashFiles(base string, dirs ...string) (string, error) {
	var files []string
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(base, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.Type().IsRegular() {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(base, f)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

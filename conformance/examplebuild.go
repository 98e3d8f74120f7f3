package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// ListExamplePlugins returns the names of the example plugins, sorted: the
// directories under examples/plugins with Go sources or a build.sh (a
// directory of shared headers or helpers is not a plugin). Tests discover the examples
// this way, so that every example is covered, whoever adds it.
func ListExamplePlugins() ([]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(root, "examples", "plugins"))
	if err != nil {
		return nil, fmt.Errorf("conformance: listing examples/plugins: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "internal" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(root, "examples", "plugins", e.Name())
		gofiles, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if _, err := os.Stat(filepath.Join(dir, "build.sh")); err == nil || len(gofiles) > 0 {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// SkipInShort skips tb under -short, the tier of make check (the
// everyday loop: no installs, no PostgreSQL, no browser, no chaos, a few
// minutes), saying what it leaves out; make test runs everything.
func SkipInShort(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("-short (make check) leaves out %s: make test runs it", what)
	}
}

// ExampleWasm is BuildExampleWasm for a test: a build error fails tb.
// Under -short (make check, which installs nothing) it skips tb for a C or
// AssemblyScript example, whose toolchain make check does not install;
// make test builds and checks them all.
func ExampleWasm(tb testing.TB, name string) string {
	tb.Helper()
	if testing.Short() && !IsGoExample(name) {
		tb.Skipf("-short (make check) builds no C or AssemblyScript plugin such as %s: make test builds and checks it", name)
	}
	p, err := BuildExampleWasm(name)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// IsGoExample reports whether examples/plugins/NAME is built from Go
// sources, with nothing but the Go toolchain.
func IsGoExample(name string) bool {
	root, err := moduleRoot()
	if err != nil {
		return false
	}
	gofiles, _ := filepath.Glob(filepath.Join(root, "examples", "plugins", name, "*.go"))
	return len(gofiles) > 0
}

// BuildExampleWasm builds the example plugin examples/plugins/NAME and
// returns the path of its .wasm in the test cache, building once per hash
// of what the build reads. A Go example (it has .go files) builds through
// BuildPackage. Any other has a build.sh that takes the output path:
//
//   - an AssemblyScript example (it has a package.json) is hashed by its
//     *.ts sources, package.json, package-lock.json and build.sh, with the
//     node version; it needs node and npm, and its build.sh installs the
//     compiler and the PDK with npm ci (from the npm registry, or npm's
//     cache) when node_modules is missing or stale;
//   - any other is a C example, hashed with its sources, the shared C
//     headers (examples/plugins/c) and the compiler's version; it needs
//     clang, lld, wasi-libc and libclang-rt-14-dev-wasm32.
//
// scripts/deps.sh (make deps) installs both toolchains; without one the
// error says what to install. For tests; not a stable API.
func BuildExampleWasm(name string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "examples", "plugins", name)
	if gofiles, _ := filepath.Glob(filepath.Join(src, "*.go")); len(gofiles) > 0 {
		return BuildPackage("examples/plugins/" + name)
	}
	if _, err := os.Stat(filepath.Join(src, "build.sh")); err != nil {
		return "", fmt.Errorf("conformance: example %q has neither .go files nor a build.sh: add one", name)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	key := "example/" + name
	if p, ok := buildDone[key]; ok {
		return p, nil
	}
	var files, toolchain string
	var version []byte
	if _, err := os.Stat(filepath.Join(src, "package.json")); err == nil {
		toolchain = "the AssemblyScript toolchain: apt-get install -y nodejs npm; build.sh runs npm ci, which needs the npm registry (or npm's cache) the first time"
		for _, tool := range []string{"node", "npm"} {
			if _, err := exec.LookPath(tool); err != nil {
				return "", fmt.Errorf("conformance: example %q is AssemblyScript and needs node and npm (%s not found): apt-get install -y nodejs npm", name, tool)
			}
		}
		if files, err = hashASSources(src); err != nil {
			return "", fmt.Errorf("conformance: example %q: hashing sources: %w", name, err)
		}
		version, _ = exec.Command("node", "--version").Output()
	} else {
		toolchain = "the C toolchain: apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32"
		if _, err := exec.LookPath("clang"); err != nil {
			return "", fmt.Errorf("conformance: example %q needs clang: apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32", name)
		}
		if files, err = HashFiles(filepath.Join(root, "examples", "plugins"), name, "c"); err != nil {
			return "", fmt.Errorf("conformance: example %q: hashing sources: %w", name, err)
		}
		version, _ = exec.Command("clang", "--version").Output()
	}
	h := sha256.Sum256([]byte(files + "\n" + string(version)))
	sum := hex.EncodeToString(h[:])
	dir := filepath.Join(TestCacheDir(), "plugins")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("conformance: example %q: cache dir: %w (set %s to a writable directory)", name, err, TestCacheEnv)
	}
	out := filepath.Join(dir, name+"-"+sum[:16]+".wasm")
	if _, err := os.Stat(out); err == nil {
		buildDone[key] = out
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*.wasm.tmp")
	if err != nil {
		return "", fmt.Errorf("conformance: example %q: %w", name, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("sh", filepath.Join(src, "build.sh"), tmp.Name())
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("conformance: example %q: %s failed: %w\n%s\n(%s)",
			name, strings.Join(cmd.Args, " "), err, b, toolchain)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("conformance: example %q: %w", name, err)
	}
	buildDone[key] = out
	return out, nil
}

// hashASSources hashes what an AssemblyScript example's build reads from
// its directory: the *.ts sources, package.json, package-lock.json (which
// pins the compiler and the PDK) and build.sh. node_modules is left out:
// the lock file stands for it.
func hashASSources(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.ts"))
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no .ts sources in %s", dir)
	}
	for _, f := range []string{"package.json", "package-lock.json", "build.sh"} {
		files = append(files, filepath.Join(dir, f))
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err // a missing package-lock.json too: npm ci needs it
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

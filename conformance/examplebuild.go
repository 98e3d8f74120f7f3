package conformance

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
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

// BuildExampleWasm builds the example plugin examples/plugins/NAME and
// returns the path of its .wasm, in TestCacheDir()/examples, named after a
// hash of what the build reads (so it builds once per source). A Go example
// (it has .go files) builds with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared;
// any other has a build.sh that takes the output path (the C example needs
// clang, lld and wasi-libc; .ci/run installs them). For tests; not a stable
// API.
func BuildExampleWasm(name string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	key := "example/" + name
	if p, ok := buildDone[key]; ok {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "examples", "plugins", name)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", goruntime.Version())
	for _, d := range []string{filepath.Join(root, "examples", "plugins"), filepath.Join(root, "plugins", "abi")} {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			fmt.Fprintf(h, "%s %d\n", rel, len(b))
			h.Write(b)
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("conformance: example %q: hashing sources: %w", name, err)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	dir := filepath.Join(TestCacheDir(), "examples")
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
	var cmd *exec.Cmd
	if gofiles, _ := filepath.Glob(filepath.Join(src, "*.go")); len(gofiles) > 0 {
		cmd = exec.Command(goTool(), "build", "-buildmode=c-shared", "-o", tmp.Name(), "./examples/plugins/"+name)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	} else if _, err := os.Stat(filepath.Join(src, "build.sh")); err == nil {
		cmd = exec.Command("sh", filepath.Join(src, "build.sh"), tmp.Name())
		cmd.Dir = src
	} else {
		return "", fmt.Errorf("conformance: example %q has neither .go files nor a build.sh: add one", name)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("conformance: example %q: build failed (%s): %w\n%s", name, strings.Join(cmd.Args, " "), err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("conformance: example %q: %w", name, err)
	}
	buildDone[key] = out
	return out, nil
}

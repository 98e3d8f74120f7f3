package abidoc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The layout tables of docs/DESIGN.md (§2.1) and README.md ("Layout") are
// the newcomer's map of the packages, so they are checked like the ABI
// doc's examples: TestLayoutTablesMatchThePackages fails, naming the
// package and the table to add it to, when a package of the module is in
// no row, and fails for a row that names a path that no longer exists.
//
// What counts as a package: every directory of the module that holds a
// .go file, test files included, found by walking the tree the way the
// go command matches ./... (directories whose names begin with . or _,
// testdata directories and nested modules are skipped, and so are the
// npm packages of node_modules, which are not ours). Walking rather
// than running `go list ./...` is deliberate: `go list` answers for the
// host's GOOS, and would leave out the plugins built only for wasip1
// (conformance/plugins/..., examples/plugins/...), which a newcomer meets
// all the same; and the walk needs no go command, module download or
// build cache. A directory of test files only (a package `go test`
// runs) is a package too.
//
// How a row covers packages: the first cell of a row holds one or more
// paths in backquotes. A path ending in /... covers the package there
// and every package below it, as in a go command pattern
// (`examples/plugins/...`). Any other path covers that one package only
// (`runtime/` does not cover runtime/internal/watcher). A path that
// exists but holds no package (`docs/`, `RATIONALE.md`) covers nothing
// and is allowed; a path that does not exist is a stale row.

// layoutTables are the tables the test holds to the packages: the file,
// the heading the table follows, and what to call it in a message.
var layoutTables = []struct {
	file, heading, name string
}{
	{"docs/DESIGN.md", "### 2.1 Layout", "docs/DESIGN.md §2.1 (Layout)"},
	{"README.md", "## Layout", "README.md's Layout table"},
}

func TestLayoutTablesMatchThePackages(t *testing.T) {
	root := moduleRoot(t)
	pkgs, err := modulePackages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatalf("found no Go packages under %s", root)
	}
	for _, tab := range layoutTables {
		t.Run(tab.file, func(t *testing.T) {
			rows, err := readLayoutTable(filepath.Join(root, tab.file), tab.heading)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range layoutProblems(root, pkgs, rows, tab.name) {
				t.Error(p)
			}
		})
	}
}

// TestLayoutCheckCatchesDrift holds layoutProblems to the rules above on a
// tree of its own, so that a check that passes is known to be able to
// fail.
func TestLayoutCheckCatchesDrift(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{
		"go.mod",
		"loop/loop.go",
		"runtime/runtime.go",
		"runtime/internal/watcher/watcher.go",
		"examples/plugins/calc/main.go",
		"examples/plugins/calc/expr/expr.go",
		"conformance/plugins/echo/main.go",
		"testonly/x_test.go",
		"loop/testdata/scenario/x.go",
		"_scratch/x.go",
		"examples/plugins/as/node_modules/pkg/x.go",
		".cache/x.go",
		"nested/go.mod",
		"nested/inner/x.go",
		"docs/DESIGN.md",
	} {
		p := filepath.Join(root, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("package x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pkgs, err := modulePackages(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"conformance/plugins/echo", "examples/plugins/calc", "examples/plugins/calc/expr", "loop", "runtime", "runtime/internal/watcher", "testonly"}
	if strings.Join(pkgs, " ") != strings.Join(want, " ") {
		t.Fatalf("packages = %q, want %q", pkgs, want)
	}
	rows := []layoutRow{
		{line: 3, paths: []string{"loop/"}},
		{line: 4, paths: []string{"runtime/"}},
		{line: 5, paths: []string{"examples/plugins/..."}},
		{line: 6, paths: []string{"conformance/plugins/"}},
		{line: 7, paths: []string{"docs/", "gone/"}},
	}
	got := strings.Join(layoutProblems(root, pkgs, rows, "the table"), "\n")
	for _, w := range []string{
		"package runtime/internal/watcher is in no row of the table",
		"package testonly is in no row of the table",
		"package conformance/plugins/echo is in no row of the table",
		"conformance/plugins/..." + "` to cover the packages below it",
		"line 7 names gone/, which does not exist",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("the problems do not say %q; they are:\n%s", w, got)
		}
	}
	for _, covered := range []string{"package loop ", "package runtime ", "examples/plugins/calc "} {
		if strings.Contains(got, covered) {
			t.Errorf("a covered package is reported (%q):\n%s", covered, got)
		}
	}
}

// moduleRoot is the directory of the module's go.mod, found from the
// test's working directory up.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// modulePackages returns the module's package directories, relative to
// root with forward slashes, sorted: every directory holding a .go file,
// skipped as `./...` skips them (names beginning with . or _, testdata,
// nested modules), and node_modules.
func modulePackages(root string) ([]string, error) {
	var pkgs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root {
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
				rel, err := filepath.Rel(root, path)
				if err != nil {
					return err
				}
				if rel != "." {
					pkgs = append(pkgs, filepath.ToSlash(rel))
				}
				break
			}
		}
		return nil
	})
	sort.Strings(pkgs)
	return pkgs, err
}

// layoutRow is one row of a layout table: its line in the file, and the
// paths its first cell names.
type layoutRow struct {
	line  int
	paths []string
}

var backquoted = regexp.MustCompile("`([^`]+)`")

// readLayoutTable reads the first Markdown table after the line heading
// in the file at path: the paths in backquotes in the first cell of each
// row below the header.
func readLayoutTable(path, heading string) ([]layoutRow, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	n, found, inTable := 0, false, false
	var rows []layoutRow
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case !found:
			found = line == heading
		case !inTable && strings.HasPrefix(line, "#"):
			return nil, fmt.Errorf("%s:%d: the section %q has no table before the next heading", path, n, heading)
		case !inTable && strings.HasPrefix(line, "|"):
			inTable = true // the header row
		case !inTable:
		case !strings.HasPrefix(line, "|"):
			return rows, nil
		case strings.Trim(line, "|-: ") == "":
			// the row under the header
		default:
			first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
			var paths []string
			for _, m := range backquoted.FindAllStringSubmatch(first, -1) {
				paths = append(paths, strings.TrimSpace(m[1]))
			}
			if len(paths) == 0 {
				return nil, fmt.Errorf("%s:%d: a row of the table under %q names no `path` in its first cell", path, n, heading)
			}
			rows = append(rows, layoutRow{line: n, paths: paths})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: no line %q: the layout table is found under that heading (internal/abidoc/layout_test.go)", path, heading)
	}
	if !inTable {
		return nil, fmt.Errorf("%s: no table under %q", path, heading)
	}
	return rows, nil
}

// layoutProblems says what is wrong between the packages and the rows of
// one table: each package no row covers, and each path that does not
// exist.
func layoutProblems(root string, pkgs []string, rows []layoutRow, table string) []string {
	var problems []string
	covered := map[string]bool{}
	single := map[string]bool{} // directories named without /..., which cover no package below them
	for _, r := range rows {
		for _, p := range r.paths {
			clean, tree := strings.CutSuffix(p, "/...")
			clean = strings.TrimSuffix(strings.TrimPrefix(clean, "./"), "/")
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(clean))); errors.Is(err, fs.ErrNotExist) {
				problems = append(problems, fmt.Sprintf("%s: line %d names %s, which does not exist: fix the path, or remove the row if the package is gone", table, r.line, p))
				continue
			}
			n := 0
			for _, pkg := range pkgs {
				if pkg == clean || tree && strings.HasPrefix(pkg, clean+"/") {
					covered[pkg] = true
					n++
				}
			}
			if tree && n == 0 {
				problems = append(problems, fmt.Sprintf("%s: line %d names %s, which holds no Go package: fix the path, or remove the row", table, r.line, p))
			}
			if !tree {
				single[clean] = true
			}
		}
	}
	for _, pkg := range pkgs {
		if covered[pkg] {
			continue
		}
		msg := fmt.Sprintf("package %s is in no row of %s: add a row | `%s/` | what it is |", pkg, table, pkg)
		for dir := pkg; strings.Contains(dir, "/"); {
			dir = dir[:strings.LastIndex(dir, "/")]
			if single[dir] {
				msg += fmt.Sprintf(" (or write `%s/...` to cover the packages below it)", dir)
				break
			}
		}
		problems = append(problems, msg)
	}
	return problems
}

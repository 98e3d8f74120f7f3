package console

import (
	"io/fs"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// scriptTag matches a script element: its attributes, its content.
var scriptTag = regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`)

// The console puts what it shows on the page as text only, and the CSP
// allows no inline script or style: no file of it may parse strings as
// HTML or code, or carry inline script or style.
func TestTheAssetsRenderTextOnly(t *testing.T) {
	forbidden := map[string]*regexp.Regexp{
		".js":   regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setAttribute\(\s*['"](style|on\w+)['"]|\.srcdoc`),
		".html": regexp.MustCompile(`(?i)\sstyle=|<style|\son\w+=|javascript:`),
	}
	n := 0
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		for ext, re := range forbidden {
			if !strings.HasSuffix(path, ext) {
				continue
			}
			b, err := fs.ReadFile(assets, path)
			if err != nil {
				return err
			}
			n++
			if ext == ".html" {
				for _, tag := range scriptTag.FindAllSubmatch(b, -1) {
					if !strings.Contains(string(tag[1]), " src=") || len(tag[2]) > 0 {
						t.Errorf("%s has an inline script (%q): the CSP allows scripts from files of the console only", path, tag[0])
					}
				}
			}
			if m := re.Find(b); m != nil {
				t.Errorf("%s has %q: the console renders untrusted content as text (textContent) and the CSP forbids inline script and style", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 {
		t.Fatalf("checked %d files; the console has index.html and six modules at least", n)
	}
}

// The modules that need no browser (the SSE parser, the stream's dedupe,
// the fold of a Run's events) under node's test runner.
func TestTheModulesUnderNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("the console's module tests need node: apt-get install -y nodejs npm (make deps does it)")
	}
	cmd := exec.Command(node, "--test", "unit.test.mjs")
	cmd.Dir = "testdata/e2e"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test unit.test.mjs: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "# fail 0") {
		t.Fatalf("node --test ran no test:\n%s", out)
	}
}

package conformance

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// NPMCI installs the npm packages of a test's directory (dir holds a
// package.json and the package-lock.json that pins them; what names them
// for the failure message) with npm ci, unless node_modules was installed
// from this very package-lock.json: a stamp in node_modules holds the lock
// it was installed from. node_modules is not committed, so a fresh clone
// installs on its first run; that needs npm and the npm registry (or npm's
// cache).
func NPMCI(tb testing.TB, dir, what string) {
	tb.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		tb.Fatal(err)
	}
	stamp := filepath.Join(dir, "node_modules", ".installed-package-lock.json")
	if have, err := os.ReadFile(stamp); err == nil && bytes.Equal(have, lock) {
		return
	}
	if _, err := exec.LookPath("npm"); err != nil {
		tb.Fatalf("installing %s in %s needs npm: apt-get install -y nodejs npm (make deps does it)", what, dir)
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("npm ci in %s (it fetches %s from the npm registry the first time): %v\n%s", dir, what, err, b)
	}
	if err := os.WriteFile(stamp, lock, 0o644); err != nil {
		tb.Fatal(err)
	}
}

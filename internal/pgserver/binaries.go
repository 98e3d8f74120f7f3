package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNotInstalled is wrapped by the error FindBinaries (and so Start,
// Shared and Require) returns when PostgreSQL's server binaries are not
// on this machine.
var ErrNotInstalled = errors.New("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")

// serverBinaries are the programs a directory must hold to be the bindir.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// FindBinaries returns the directory of PostgreSQL's server binaries
// (initdb, pg_ctl, postgres; psql is looked up there first too): the
// highest version under /usr/lib/postgresql/*/bin (Debian and Ubuntu),
// else the directory of initdb on PATH (symbolic links resolved), else
// what `pg_config --bindir` says. The error wraps ErrNotInstalled and says
// how to install them.
func FindBinaries() (bindir string, err error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(versionOf(b), versionOf(a)) }) // highest first
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if d := filepath.Dir(p); hasServerBinaries(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(p, "--bindir").Output(); err == nil {
			if d := strings.TrimSpace(string(out)); d != "" && hasServerBinaries(d) {
				return d, nil
			}
		}
	}
	sudo := "sudo "
	if os.Geteuid() == 0 {
		sudo = ""
	}
	return "", fmt.Errorf("pgserver: %w; install them with: %sapt-get update && %sapt-get install -y postgresql", ErrNotInstalled, sudo, sudo)
}

func hasServerBinaries(dir string) bool {
	for _, name := range serverBinaries {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionOf is the version numbers of /usr/lib/postgresql/VERSION/bin:
// "15" → [15], "9.6" → [9 6]; nil when it is not a version.
func versionOf(bindir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(bindir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

func compareVersions(a, b []int) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] - b[i]
		}
	}
	return len(a) - len(b)
}

// findPsql is psql in bindir, else on PATH: the client CreateDatabase and
// the readiness check run. bindir may be "" (an external server on a
// machine without the server binaries).
func findPsql(bindir string) (string, error) {
	if bindir != "" {
		p := filepath.Join(bindir, "psql")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	sudo := "sudo "
	if os.Geteuid() == 0 {
		sudo = ""
	}
	return "", fmt.Errorf("pgserver: psql (PostgreSQL's client) is not installed; install it with: %sapt-get update && %sapt-get install -y postgresql-client", sudo, sudo)
}

// serverUser is who runs initdb and pg_ctl: nil for the current user,
// or the postgres account when this process is root, since initdb and
// pg_ctl refuse to run as root.
type serverUser struct {
	name     string
	uid, gid int
}

func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, so initdb and pg_ctl must run as the postgres user, but it does not exist (%v); install the postgresql package, which creates it, or run as a user other than root", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgserver: the postgres user has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		return nil, fmt.Errorf("pgserver: running as root, so initdb and pg_ctl must run as the postgres user through runuser, which is not installed; install util-linux, or run as a user other than root")
	}
	return &serverUser{name: u.Username, uid: uid, gid: gid}, nil
}

// chown gives path to the server user; nothing when it is the current user.
func (u *serverUser) chown(path string) error {
	if u == nil {
		return nil
	}
	if err := os.Chown(path, u.uid, u.gid); err != nil {
		return fmt.Errorf("pgserver: giving %s to the postgres user: %w", path, err)
	}
	return nil
}

// cleanEnv is this process's environment without the PG* variables
// (PGHOST, PGDATA, PGDATABASE, PGSERVICE …), which would change what
// initdb, pg_ctl and psql do, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

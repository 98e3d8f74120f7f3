package pgserver

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(RunTests(m)) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// query runs sql on dsn with psql and returns its output.
func query(t *testing.T, srv *Server, dsn, sql string) string {
	t.Helper()
	out, err := runPsql(testContext(t), srv.psql, dsn, sql)
	if err != nil {
		t.Fatalf("%s on %s: %v", sql, dsn, err)
	}
	return out
}

func postmasterPID(t *testing.T, srv *Server) int {
	t.Helper()
	pid, running := postmasterOf(srv.Dir())
	if !running {
		t.Fatalf("no postmaster runs in %s", srv.Dir())
	}
	return pid
}

func TestFindBinaries(t *testing.T) {
	bindir, err := FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bindir, name)); err != nil {
			t.Errorf("FindBinaries returned %s, without %s: %v", bindir, name, err)
		}
	}
}

func TestAServerServesDatabasesSurvivesACrashRestartAndIsGoneAfterStop(t *testing.T) {
	skipInShort(t)
	t.Parallel()
	ctx := testContext(t)
	srv, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if srv.External() {
		t.Fatal("a started server is not External")
	}
	if !strings.HasPrefix(filepath.Base(srv.Dir()), dirPrefix) {
		t.Fatalf("Dir() = %s, want a fresh %s… directory", srv.Dir(), dirPrefix)
	}

	for _, name := range []string{"alpha", "beta_2"} {
		if err := srv.CreateDatabase(ctx, name); err != nil {
			t.Fatal(err)
		}
		if got := query(t, srv, srv.DSN(name), "select current_database()"); got != name {
			t.Fatalf("connected to %q with DSN(%q) = %s", got, name, srv.DSN(name))
		}
		if got := query(t, srv, srv.DSN(name), "select 1"); got != "1" {
			t.Fatalf("select 1 = %q", got)
		}
	}
	if err := srv.CreateDatabase(ctx, "alpha"); err == nil {
		t.Fatal("creating an existing database succeeded")
	}

	// A committed row survives a crash-like restart (WAL replay).
	query(t, srv, srv.DSN("alpha"), "create table t (x int); insert into t values (1)")
	before := postmasterPID(t, srv)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if after := postmasterPID(t, srv); after == before {
		t.Fatalf("the postmaster is still %d after Restart", before)
	}
	if got := query(t, srv, srv.DSN("alpha"), "select count(*) from t"); got != "1" {
		t.Fatalf("after Restart, count(*) = %s, want 1", got)
	}
	if got := query(t, srv, srv.DSN("beta_2"), "select 1"); got != "1" {
		t.Fatalf("select 1 after Restart = %q", got)
	}

	pid := postmasterPID(t, srv)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(srv.Dir()); !os.IsNotExist(err) {
		t.Fatalf("%s is still there after Stop (%v)", srv.Dir(), err)
	}
	if processAlive(pid, "") {
		t.Fatalf("the postmaster %d still runs after Stop", pid)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
	if err := srv.Restart(ctx); err == nil {
		t.Fatal("Restart of a stopped server succeeded")
	}
}

func TestCreateDatabaseRefusesNamesThatNeedQuoting(t *testing.T) {
	srv := &Server{dir: "/nonexistent"}
	for _, name := range []string{"", "Upper", "has space", `q"uote`, "semi;colon", strings.Repeat("a", 64)} {
		if err := srv.CreateDatabase(context.Background(), name); err == nil || !strings.Contains(err.Error(), "database name") {
			t.Errorf("CreateDatabase(%q) = %v, want a refusal of the name", name, err)
		}
	}
}

func TestNewDatabaseIsFreshAndDroppedByCleanup(t *testing.T) {
	skipInShort(t)
	t.Parallel()
	var dsns []string
	t.Run("uses", func(t *testing.T) {
		for range 2 {
			dsn := NewDatabase(t)
			if got := query(t, Require(t), dsn, "select 1"); got != "1" {
				t.Fatalf("select 1 = %q", got)
			}
			dsns = append(dsns, dsn)
		}
	})
	if dsns[0] == dsns[1] {
		t.Fatalf("two NewDatabase calls gave the same DSN %s", dsns[0])
	}
	srv := Require(t)
	for _, dsn := range dsns {
		pairs, err := parseConninfo(dsn)
		if err != nil {
			t.Fatal(err)
		}
		var name string
		for _, p := range pairs {
			if p.key == "dbname" {
				name = p.value
			}
		}
		if !strings.HasPrefix(name, "agenthost_test_") {
			t.Fatalf("database name %q", name)
		}
		if n := query(t, srv, srv.adminDSN(), fmt.Sprintf("select count(*) from pg_database where datname = '%s'", name)); n != "0" {
			t.Errorf("database %s is still there after its test's cleanup", name)
		}
	}
}

// skipInShort skips a test that starts a server under -short (make
// check), as Require does.
func skipInShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip(ShortSkipMessage)
	}
}

// fakeTB records what the helpers do with a TB.
type fakeTB struct {
	fatals, logs, skips []string
	cleanups            []func()
}

func (f *fakeTB) Skip(a ...any) { f.skips = append(f.skips, fmt.Sprint(a...)) }

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, a ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, a...))
}
func (f *fakeTB) Logf(format string, a ...any) { f.logs = append(f.logs, fmt.Sprintf(format, a...)) }
func (f *fakeTB) Cleanup(fn func())            { f.cleanups = append(f.cleanups, fn) }

const bogusDSN = "host=/nonexistent/agpg-bogus port=5432 user=postgres dbname=postgres sslmode=disable"

func TestRequireFailsWithWhatToDoWhenAGENTHOST_TEST_PGDoesNotAnswer(t *testing.T) {
	t.Setenv(EnvDSN, bogusDSN)
	if testing.Short() {
		var tb fakeTB
		if srv := Require(&tb); srv != nil || len(tb.fatals) != 0 || len(tb.skips) != 1 || tb.skips[0] != ShortSkipMessage {
			t.Fatalf("under -short Require returned %v, Fatalf %q, Skip %q; want a skip with %q", srv, tb.fatals, tb.skips, ShortSkipMessage)
		}
		return
	}
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		var tb fakeTB
		if srv := Require(&tb); srv != nil {
			t.Fatalf("Require returned a server for %s", bogusDSN)
		}
		if len(tb.fatals) != 1 {
			t.Fatalf("Fatalf calls: %q", tb.fatals)
		}
		msg := tb.fatals[0]
		if got := strings.HasPrefix(msg, "CI needs PostgreSQL: "); got != (ci == "true") {
			t.Errorf("CI=%q: message %q", ci, msg)
		}
		if !strings.Contains(msg, EnvDSN) || !strings.Contains(msg, "unset") {
			t.Errorf("the message does not say what to do: %q", msg)
		}
		if dsn := NewDatabase(&tb); dsn != "" || len(tb.cleanups) != 0 {
			t.Errorf("NewDatabase without a server = %q, %d cleanups", dsn, len(tb.cleanups))
		}
	}
}

func TestAnExternalServerIsNeitherRestartedNorStopped(t *testing.T) {
	srv, err := newExternal(bogusDSN)
	if err != nil {
		t.Fatal(err)
	}
	if !srv.External() || srv.Dir() != "" {
		t.Fatalf("External() = %v, Dir() = %q", srv.External(), srv.Dir())
	}
	if got, want := srv.DSN("other"), "host=/nonexistent/agpg-bogus port=5432 user=postgres dbname=other sslmode=disable"; got != want {
		t.Errorf("DSN(other) = %q, want %q", got, want)
	}
	if err := srv.Restart(context.Background()); err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Errorf("Restart = %v, want a refusal", err)
	}
	if err := srv.Stop(); err != nil {
		t.Errorf("Stop = %v, want nothing done", err)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, c := range []struct{ dsn, db, want string }{
		{"host=/tmp/x port=5432", "d", "host=/tmp/x port=5432 dbname=d"},
		{"host=/tmp/x dbname=old user=u", "d", "host=/tmp/x dbname=d user=u"},
		{"host = '/tmp/a b'  dbname = old\tuser=u", "d", `host='/tmp/a b' dbname=d user=u`},
		{`host='/tmp/a b' password='it\'s'`, "d", `host='/tmp/a b' password='it\'s' dbname=d`},
		{"postgres://u:p@localhost:5433/old?sslmode=disable", "d", "postgres://u:p@localhost:5433/d?sslmode=disable"},
		{"postgresql://localhost", "d", "postgresql://localhost/d"},
	} {
		got, err := withDatabase(c.dsn, c.db)
		if err != nil && c.want != "" {
			t.Errorf("withDatabase(%q): %v", c.dsn, err)
			continue
		}
		if got != c.want {
			t.Errorf("withDatabase(%q, %q) = %q, want %q", c.dsn, c.db, got, c.want)
		}
	}
	for _, bad := range []string{"host", "host=/x dbname", "password='open"} {
		if _, err := withDatabase(bad, "d"); err == nil {
			t.Errorf("withDatabase(%q) accepted a broken connection string", bad)
		}
	}
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestStartRemovesTheServerOfADeadOwnerAndNothingElse(t *testing.T) {
	skipInShort(t)
	t.Parallel()
	ctx := testContext(t)
	orphanDir, err := os.MkdirTemp(tempBase(), dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(orphanDir) })
	srv, err := Start(ctx, Options{Dir: orphanDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	postmaster := postmasterPID(t, srv)
	// Its owner dies without stopping it.
	if err := os.WriteFile(filepath.Join(orphanDir, ownerFileName), []byte(strconv.Itoa(deadPID(t))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	liveOwned, err := os.MkdirTemp(tempBase(), dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(liveOwned) })
	if err := writeOwner(liveOwned); err != nil {
		t.Fatal(err)
	}
	beingMade, err := os.MkdirTemp(tempBase(), dirPrefix) // no owner.pid yet
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(beingMade) })

	reapOrphans(ctx, srv.user, srv.bindir, slog.New(slog.DiscardHandler))

	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Errorf("the orphan %s is still there (%v)", orphanDir, err)
	}
	if processAlive(postmaster, "") {
		t.Errorf("the orphan's postmaster %d still runs", postmaster)
	}
	for _, dir := range []string{liveOwned, beingMade} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s was removed: %v", dir, err)
		}
	}
}

func TestProcessAliveTellsAReusedPID(t *testing.T) {
	self := os.Getpid()
	if !processAlive(self, processStartTime(self)) {
		t.Fatal("this process is not alive")
	}
	if processStartTime(self) != "" && processAlive(self, "1") {
		t.Fatal("a pid with another start time counts as the same process")
	}
	if processAlive(deadPID(t), "") {
		t.Fatal("an exited process is alive")
	}
}

// The agenthost binary links this package for `agenthost bench` and must
// not link testing (docs/DESIGN.md §2).
func TestDoesNotImportTesting(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", ".")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "testing" {
			t.Fatal("internal/pgserver links package testing")
		}
	}
}

package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// EnvDSN names the environment variable that points the tests at a
// PostgreSQL server the user runs instead of one they start.
const EnvDSN = "AGENTHOST_TEST_PG"

// TB is the part of testing.TB the helpers use; *testing.T, *testing.B
// and *testing.F have it. This package does not import testing, because
// `agenthost bench` links it and the binary must not (docs/DESIGN.md §2).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Logf(format string, args ...any)
	Skip(args ...any)
}

// ShortSkipMessage is what a test that needs PostgreSQL says when it is
// skipped under -short, the tier of make check that starts no server.
const ShortSkipMessage = "-short (make check) starts no PostgreSQL: make test runs this test"

// Short reports whether this process is a test binary run with -short. It
// reads the flag rather than calling testing.Short, because this package
// is linked into the agenthost binary too, which must not link package
// testing.
func Short() bool {
	f := flag.Lookup("test.short")
	return f != nil && f.Value.String() == "true"
}

var shared struct {
	mu       sync.Mutex
	srv      *Server // started by this process
	err      error   // why starting it failed, remembered
	external *Server // wraps AGENTHOST_TEST_PG
}

// Shared returns the process's one test server, started (fsync off) on
// first use; when AGENTHOST_TEST_PG holds a DSN, it returns a Server
// wrapping the server that DSN names instead (External), once it answers.
// A failure to start is remembered, so that every later caller fails at
// once with the same error. The error says what to do.
func Shared(ctx context.Context) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return sharedExternal(ctx, dsn)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil || shared.err != nil {
		return shared.srv, shared.err
	}
	srv, err := Start(ctx, Options{})
	if err != nil {
		if ctx.Err() == nil { // not this caller's deadline: the next would fail the same way
			shared.err = err
		}
		return nil, err
	}
	shared.srv = srv
	return srv, nil
}

func sharedExternal(ctx context.Context, dsn string) (*Server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.external != nil && shared.external.external == dsn {
		return shared.external, nil
	}
	srv, err := newExternal(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %s: %w", EnvDSN, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := srv.ping(ctx); err != nil {
		return nil, fmt.Errorf("pgserver: %s names a PostgreSQL server that does not answer: %w\nstart that server or correct %s, or unset %s and the tests start their own", EnvDSN, err, EnvDSN, EnvDSN)
	}
	shared.external = srv
	return srv, nil
}

// StopShared stops the shared server if this process started it (never
// an external one); the next Shared starts a new one. A package's
// TestMain calls it after m.Run, through RunTests. A server left running
// by a process that did not call it is removed by a later Start (see the
// package doc).
func StopShared() {
	shared.mu.Lock()
	srv := shared.srv
	shared.srv, shared.err = nil, nil
	shared.mu.Unlock()
	if srv != nil {
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// RunTests runs a package's tests and then stops the shared server:
//
//	func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }
func RunTests(m interface{ Run() int }) int {
	code := m.Run()
	StopShared()
	return code
}

// Require is Shared for a test: on error it fails the test with tb.Fatalf
// and the error, which says what to do (under CI=true the message starts
// "CI needs PostgreSQL: "). A test never skips for want of a server; it
// is skipped only under -short (Short), which starts none. It returns nil
// only when tb.Fatalf or tb.Skip returns, which testing's do not.
func Require(tb TB) *Server {
	tb.Helper()
	if Short() {
		tb.Skip(ShortSkipMessage)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := Shared(ctx)
	if err != nil {
		msg := err.Error()
		if os.Getenv("CI") == "true" {
			msg = "CI needs PostgreSQL: " + msg
		}
		tb.Fatalf("%s", msg)
		return nil
	}
	return srv
}

var databaseCounter atomic.Int64

// NewDatabase creates a fresh database on the shared server (Require) and
// returns its DSN; tb.Cleanup drops it. Its name is
// agenthost_test_<counter>_<random>, unique on a server many processes
// share.
func NewDatabase(tb TB) string {
	tb.Helper()
	srv := Require(tb)
	if srv == nil {
		return ""
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	name := fmt.Sprintf("agenthost_test_%d_%s", databaseCounter.Add(1), hex.EncodeToString(suffix[:]))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.CreateDatabase(ctx, name); err != nil {
		tb.Fatalf("%v", err)
		return ""
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.DropDatabase(ctx, name); err != nil {
			tb.Logf("%v", err)
		}
	})
	return srv.DSN(name)
}

// Package pgserver starts and controls throwaway PostgreSQL servers: the
// one each test binary that needs PostgreSQL shares, and the one
// `agenthost bench` starts for itself. It runs the machine's own
// PostgreSQL (initdb, pg_ctl, psql; FindBinaries says where it looks and
// how to install it) and imports no driver and no testing.
//
// # Use
//
// In tests, a package's TestMain stops the shared server when its tests
// are done, and each test takes a database of its own:
//
//	func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }
//
//	func TestSomething(t *testing.T) {
//		dsn := pgserver.NewDatabase(t) // dropped by t.Cleanup
//		pool, err := pgxpool.New(ctx, dsn)
//		…
//	}
//
// Require(t) returns the shared server itself (Shared, started on first
// use with fsync off); a test that restarts or stops a server starts its
// own with Start. A test never skips for want of PostgreSQL: it fails,
// with a message that says how to install it ("CI needs PostgreSQL: …"
// under CI=true). `make test` installs it first (scripts/deps.sh).
//
// The bench starts and stops its own server, with fsync on:
//
//	srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true, Logger: log})
//	if err != nil { … } // the message says what to do
//	defer srv.Stop()
//	dsn := srv.DSN("postgres")
//
// # The servers
//
// Start makes a fresh cluster in its own directory (/tmp/agpg…, short, so
// that its socket path fits): superuser postgres, trust authentication,
// UTF8 and locale C. The server listens on no TCP port, only on the Unix
// socket in Dir()/sock, so the servers of test binaries running in
// parallel never collide although all use port 5432. DSN gives a libpq
// keyword/value string ("host=/tmp/agpg…/sock port=5432 user=postgres
// dbname=… sslmode=disable") that pgx and psql accept. Restart is a
// crash (pg_ctl's immediate mode) and a start; Stop shuts the server down
// and removes its directory. When Start or Restart fails, the error ends
// with the end of the server's log.
//
// initdb and pg_ctl refuse to run as root. As root, this package runs
// them as the postgres user (with runuser) and gives that user the
// cluster's directories; otherwise they run as the current user.
//
// A process killed before it stops its server leaves the server running.
// Every directory records its owner (owner.pid), and Start first stops
// and removes the servers of owners that are dead; it never touches a
// directory whose owner lives.
//
// # A server of your own
//
// With AGENTHOST_TEST_PG set to a DSN (keyword/value or postgres:// URL),
// Shared, Require and NewDatabase use the server it names instead of
// starting one: DSN(database) is that DSN with its database replaced.
// Such a server is External: Stop leaves it alone and Restart refuses.
// Only psql is needed on the machine then.
//
// Everything here is safe for concurrent use.
package pgserver

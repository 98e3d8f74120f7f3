package pgserver

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
)

// databaseName is what CreateDatabase and DropDatabase accept: no quoting
// questions, and within PostgreSQL's 63-byte limit.
var databaseName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// CreateDatabase creates database name ([a-z0-9_]+, at most 63 bytes) on
// the server, with psql.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	if !databaseName.MatchString(name) {
		return fmt.Errorf("pgserver: database name %q: use 1 to 63 of a-z, 0-9 and _", name)
	}
	if _, err := runPsql(ctx, s.psql, s.adminDSN(), `CREATE DATABASE "`+name+`"`); err != nil {
		return fmt.Errorf("pgserver: creating database %s: %w", name, err)
	}
	return nil
}

// DropDatabase drops database name if it exists, disconnecting its
// clients first (DROP DATABASE … WITH (FORCE)).
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	if !databaseName.MatchString(name) {
		return fmt.Errorf("pgserver: database name %q: use 1 to 63 of a-z, 0-9 and _", name)
	}
	if _, err := runPsql(ctx, s.psql, s.adminDSN(), `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
		return fmt.Errorf("pgserver: dropping database %s: %w", name, err)
	}
	return nil
}

// adminDSN is where CreateDatabase and DropDatabase connect: database
// postgres of a server Start made, AGENTHOST_TEST_PG as it is otherwise.
func (s *Server) adminDSN() string {
	if s.external != "" {
		return s.external
	}
	return s.DSN("postgres")
}

// newExternal wraps the server the DSN dsn names, which someone else runs.
func newExternal(dsn string) (*Server, error) {
	if _, err := withDatabase(dsn, "postgres"); err != nil {
		return nil, err
	}
	bindir, _ := FindBinaries() // only psql is needed, which may be on PATH alone
	psql, err := findPsql(bindir)
	if err != nil {
		return nil, err
	}
	return &Server{external: dsn, bindir: bindir, psql: psql, log: slog.New(slog.DiscardHandler)}, nil
}

// ping checks that the server answers a query.
func (s *Server) ping(ctx context.Context) error {
	_, err := runPsql(ctx, s.psql, s.adminDSN(), "select 1")
	return err
}

package chaos

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/runtime"
)

// chaosStore is where the chaos nodes keep their Runs: Badger in the one
// node's data dir, or one PostgreSQL database that every node shares,
// on a throwaway server the run starts (and may restart: the pgrestart
// fault) or on the server --dsn names.
type chaosStore struct {
	driver string           // config.DriverBadger or config.DriverPostgres
	pg     *pgserver.Server // the run's own server; nil with --dsn, or Badger
	dsn    string
	schema string // "" for pgstore's default (the run's own server has a fresh database)
	pgDir  string // where the run's own server lives ("" until started)
}

// chaosDatabase is the database the run creates on its own server.
const chaosDatabase = "agenthost_chaos"

// openChaosStore gets the store ready: nothing for Badger; for postgres,
// its own PostgreSQL server (fsync on) in dir when the socket path fits
// and the server's user can reach it, with a fresh database, or a fresh
// schema on the server of --dsn.
func openChaosStore(ctx context.Context, o *Options, dir string) (*chaosStore, error) {
	if o.Store != config.DriverPostgres {
		return &chaosStore{driver: config.DriverBadger}, nil
	}
	s := &chaosStore{driver: config.DriverPostgres}
	if o.DSN != "" {
		s.dsn = o.DSN
		s.schema = fmt.Sprintf("chaos_%d_%d", o.Seed%1_000_000, time.Now().Unix())
		return s, nil
	}
	pgDir := chaosPGDir(dir)
	srv, err := pgserver.Start(ctx, pgserver.Options{Fsync: true, Dir: pgDir})
	if err != nil {
		return nil, fmt.Errorf("bench chaos: starting PostgreSQL (or pass --dsn to use a server of yours): %w", err)
	}
	s.pg, s.pgDir = srv, srv.Dir()
	if err := srv.CreateDatabase(ctx, chaosDatabase); err != nil {
		_ = srv.Stop()
		return nil, fmt.Errorf("bench chaos: %w", err)
	}
	s.dsn = srv.DSN(chaosDatabase)
	return s, nil
}

// chaosPGDir is where the run's own PostgreSQL server goes: dir/pg, so
// that a work dir kept after a violation keeps the database, when its
// socket path fits and (as root, when the server runs as the postgres
// user) every directory above it can be entered by others; else "", a
// directory of pgserver's own under /tmp, which Stop removes.
func chaosPGDir(dir string) string {
	pgDir := filepath.Join(dir, "pg")
	if len(filepath.Join(pgDir, "sock", ".s.PGSQL.5432")) > 100 {
		return ""
	}
	if os.Geteuid() != 0 {
		return pgDir
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the work dir is the run's own
		return ""
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&fs.FileMode(0o001) == 0 {
			return ""
		}
		if d == filepath.Dir(d) {
			return pgDir
		}
	}
}

// configYAML is the store's part of a node's config; dsn, when not
// empty, is the DSN the node reaches PostgreSQL with (through its proxy,
// for the partition fault) in place of the store's.
func (s *chaosStore) configYAML(dsn string) string {
	if s.driver != config.DriverPostgres {
		return "data_dir: data\nsync_writes: true\n"
	}
	if dsn == "" {
		dsn = s.dsn
	}
	var b strings.Builder
	fmt.Fprintf(&b, "store:\n  driver: postgres\n  dsn: %q\n", dsn)
	if s.schema != "" {
		fmt.Fprintf(&b, "  postgres: {schema: %s}\n", s.schema)
	}
	return b.String()
}

// where names the store for the progress lines, a DSN's password hidden.
func (s *chaosStore) where(nodeDir string) string {
	switch {
	case s.driver != config.DriverPostgres:
		return "Badger in " + filepath.Join(nodeDir, "data")
	case s.pg != nil:
		return fmt.Sprintf("PostgreSQL (fsync on) in %s, database %s", s.pgDir, chaosDatabase)
	}
	return fmt.Sprintf("PostgreSQL at %s, schema %s", pgstore.RedactDSN(s.dsn), s.schema)
}

// open opens the store for the checks, once every node has stopped.
func (s *chaosStore) open(ctx context.Context, dataDir string) (runtime.Store, func(), error) {
	if s.driver != config.DriverPostgres {
		st, err := badgerstore.Open(dataDir, badgerstore.Options{})
		if err != nil {
			return nil, nil, fmt.Errorf("the data dir did not reopen after the clean stop: %w", err)
		}
		return st, func() { _ = st.Close() }, nil
	}
	st, err := pgstore.Open(ctx, pgstore.Options{DSN: s.dsn, Schema: s.schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, nil, fmt.Errorf("the PostgreSQL store did not open for the checks: %w", err)
	}
	return st, func() { _ = st.Close() }, nil
}

// restart is the pgrestart fault: pg_ctl restart -m immediate, a crash
// of the server and a start that recovers from its WAL.
func (s *chaosStore) restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return s.pg.Restart(ctx)
}

// close stops the run's own server (its directory stays when it is in
// the work dir).
func (s *chaosStore) close() error {
	if s.pg == nil {
		return nil
	}
	return s.pg.Stop()
}

// dropSchema drops the schema of a run on the --dsn server, once its
// checks found nothing to look into.
func (s *chaosStore) dropSchema(ctx context.Context) error {
	if s.schema == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("connecting to %s: %s", pgstore.RedactDSN(s.dsn), pgstore.RedactError(err, s.dsn))
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+s.schema+" CASCADE")
	return err
}

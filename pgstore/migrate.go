package pgstore

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The schema's migrations, applied in order. A file is named
// NNNN_what.sql, NNNN its version; a change to the layout is a new file,
// never an edit of an applied one.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded migrations by version; the versions run
// 1, 2, … without a gap.
func migrations() ([]migration, error) {
	entries, err := migrationFS.ReadDir("migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("pgstore: migration file %s is not named NNNN_what.sql", e.Name())
		}
		b, err := migrationFS.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("pgstore: migrations skip from version %d to %s", i, m.name)
		}
	}
	return out, nil
}

// SchemaVersion is the schema version this binary knows: its last
// migration.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// migrateLockKey is the advisory lock that serializes the migrations of
// one schema across processes.
func migrateLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("agenthost migrate " + schema))
	return int64(h.Sum64())
}

// migrate brings the schema up to the newest embedded version, in one
// transaction under a transaction-scoped advisory lock, so that two nodes
// starting on a fresh database together apply each migration once (the
// second waits for the first, then finds nothing to do). A database at a
// newer version than this binary knows is refused, and nothing is
// changed.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	known := ms[len(ms)-1].version
	schema := s.opts.Schema
	err = s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		steps := []string{
			"BEGIN",
			fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", migrateLockKey(schema)),
		}
		for _, q := range steps {
			if _, err := conn.Exec(ctx, q); err != nil {
				return err
			}
		}
		// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
		// database even when the schema exists: ask first, so that a
		// schema an administrator made for agenthost is enough.
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s", schema)); err != nil {
				return err
			}
		}
		steps = []string{
			fmt.Sprintf("SET LOCAL search_path TO %s", schema),
			`CREATE TABLE IF NOT EXISTS agenthost_schema (
				version    integer PRIMARY KEY,
				applied_at timestamptz NOT NULL DEFAULT now()
			)`,
		}
		for _, q := range steps {
			if _, err := conn.Exec(ctx, q); err != nil {
				return err
			}
		}
		var current int
		if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM agenthost_schema").Scan(&current); err != nil {
			return err
		}
		if current > known {
			return fmt.Errorf("pgstore: the database schema is version %d, this agenthost knows up to %d; upgrade agenthost (or point store.dsn at another database)", current, known)
		}
		for _, m := range ms[current:] {
			if _, err := conn.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgstore: apply migration %s to schema %s of %s: %w", m.name, schema, s.where, err)
			}
			if _, err := conn.Exec(ctx, "INSERT INTO agenthost_schema (version) VALUES ($1)", m.version); err != nil {
				return err
			}
			s.log.Info("pgstore: applied a schema migration", "schema", schema, "migration", m.name)
		}
		_, err := conn.Exec(ctx, "COMMIT")
		return err
	})
	if err != nil {
		return fail("bring schema "+schema+" of "+s.where+" up to date", err)
	}
	return nil
}

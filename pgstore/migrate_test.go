package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func TestMigrationsAreNumberedWithoutAGap(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || SchemaVersion() != len(ms) {
		t.Fatalf("%d migrations, SchemaVersion %d", len(ms), SchemaVersion())
	}
	for i, m := range ms {
		if m.version != i+1 || !strings.HasPrefix(m.name, fmt.Sprintf("%04d_", i+1)) {
			t.Fatalf("migration %d is %s (version %d)", i+1, m.name, m.version)
		}
	}
}

// schemaState describes a schema: its versions as recorded, and its
// tables and indexes, so that a test can tell whether Open changed it.
func schemaState(t *testing.T, dsn, schema string) string {
	t.Helper()
	var versions, objects string
	query(t, dsn, fmt.Sprintf(`SELECT coalesce(string_agg(version::text || '@' || applied_at::text, ',' ORDER BY version), '')
		FROM %s.agenthost_schema`, schema), &versions)
	query(t, dsn, fmt.Sprintf(`SELECT coalesce(string_agg(c.relname || ':' || c.relkind::text, ',' ORDER BY c.relname), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '%s'`, schema), &objects)
	return versions + " | " + objects
}

func TestOpenAppliesTheSchemaAndReopeningChangesNothing(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	var n, maxV int
	query(t, dsn, "SELECT count(*), max(version) FROM "+schema+".agenthost_schema", &n, &maxV)
	if n != SchemaVersion() || maxV != SchemaVersion() {
		t.Fatalf("a fresh schema records %d versions up to %d; want 1..%d", n, maxV, SchemaVersion())
	}
	var unlogged int
	query(t, dsn, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = '`+schema+`' AND c.relkind = 'r' AND c.relpersistence <> 'p'`, &unlogged)
	if unlogged != 0 {
		t.Fatalf("%d tables are not logged", unlogged)
	}
	before := schemaState(t, dsn, schema)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, dsn, schema, nil)
	if after := schemaState(t, dsn, schema); after != before {
		t.Fatalf("reopening changed the schema:\nbefore %s\nafter  %s", before, after)
	}
}

// TestOpensRacingOnAFreshDatabase starts several nodes at once on a
// database that has no schema yet (the default one): all of them open,
// and each migration is applied once (agenthost_schema's primary key
// would refuse a second).
func TestOpensRacingOnAFreshDatabase(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	const nodes = 4
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, nodes)
		got   = make([]*Store, nodes)
	)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = Open(context.Background(), Options{DSN: dsn, Logger: quietLogger()})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		defer got[i].Close()
	}
	var n, distinct int
	query(t, dsn, "SELECT count(*), count(DISTINCT version) FROM agenthost.agenthost_schema", &n, &distinct)
	if n != SchemaVersion() || distinct != SchemaVersion() {
		t.Fatalf("agenthost_schema holds %d rows (%d versions) after %d racing opens; want each of the %d versions once", n, distinct, nodes, SchemaVersion())
	}
}

func TestANewerSchemaIsRefusedAndLeftAlone(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	_ = s.Close()
	newer := SchemaVersion() + 1
	var one int
	query(t, dsn, fmt.Sprintf("INSERT INTO %s.agenthost_schema (version) VALUES (%d) RETURNING 1", schema, newer), &one)
	before := schemaState(t, dsn, schema)
	_, err := Open(context.Background(), Options{DSN: dsn, Schema: schema, Logger: quietLogger()})
	want := fmt.Sprintf("pgstore: the database schema is version %d, this agenthost knows up to %d; upgrade agenthost (or point store.dsn at another database)", newer, SchemaVersion())
	if err == nil || err.Error() != want {
		t.Fatalf("Open of a newer schema: %v\nwant: %s", err, want)
	}
	if after := schemaState(t, dsn, schema); after != before {
		t.Fatalf("the refused Open changed the schema:\nbefore %s\nafter  %s", before, after)
	}
}

// TestMigrationTwoCountsTheRunsAlreadyStored drops the stored_bytes column
// and schema version 2 from a schema holding Runs (one with a creation
// command, one with commands, one pruned), then opens it again: the
// migration counts each Run's stored bytes from what it holds, as the
// writes had kept them.
func TestMigrationTwoCountsTheRunsAlreadyStored(t *testing.T) {
	ctx := context.Background()
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	a := newRun(t, s, "t", "s", "a", 1)
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "b", Input: "hello", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, 1)
	b, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	ev.Seq = 1
	if _, err := s.CreateRun(ctx, runtime.CreateRun{Run: b, Event: ev, CommandID: "create-b"}); err != nil {
		t.Fatal(err)
	}
	toExecuting(t, s, b, 0)
	c := step(t, a, 0, "cancel-a", loop.Event{Type: loop.EventCancelRequested, Reason: "test", At: 2}, loop.Event{Type: loop.EventRunCancelled, At: 2})
	if _, err := s.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, 3); err != nil {
		t.Fatal(err)
	}
	p := newRun(t, s, "t", "s", "c", 4)
	if _, err := s.Commit(ctx, step(t, p, 0, "start-c", loop.Event{Type: loop.EventRunStarted, At: 4})); err != nil {
		t.Fatal(err)
	}
	newRun(t, s, "u", "s", "d", 4)
	want := map[string]int64{}
	for _, tenant := range []string{"t", "u"} {
		if want[tenant], err = s.TenantStoredBytes(ctx, tenant); err != nil || want[tenant] == 0 {
			t.Fatalf("TenantStoredBytes(%s) = %d, %v", tenant, want[tenant], err)
		}
	}
	_ = s.Close()

	// Back to version 1: version 2 and every later one go (they run
	// again, in order, at the next open).
	var gone int
	query(t, dsn, fmt.Sprintf(`WITH d AS (DELETE FROM %[1]s.agenthost_schema WHERE version >= 2 RETURNING 1) SELECT count(*)::int FROM d`, schema), &gone)
	if gone != SchemaVersion()-1 {
		t.Fatalf("deleted %d rows of versions 2 and later, want %d", gone, SchemaVersion()-1)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.runs DROP COLUMN stored_bytes", schema)); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)

	s = open(t, dsn, schema, nil)
	for tenant, w := range want {
		if got, err := s.TenantStoredBytes(ctx, tenant); err != nil || got != w {
			t.Fatalf("after migration 2 on stored Runs: TenantStoredBytes(%s) = %d, %v; the writes had kept %d", tenant, got, err, w)
		}
	}
}

package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan, as far as the
// tests read it.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	IndexName string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Filter    string     `json:"Filter"`
	Plans     []planNode `json:"Plans"`
}

// scansOf returns the scans of relation in the plan under n.
func scansOf(n planNode, relation string) []planNode {
	var out []planNode
	if n.Relation == relation && strings.HasSuffix(n.NodeType, "Scan") {
		out = append(out, n)
	}
	for _, c := range n.Plans {
		out = append(out, scansOf(c, relation)...)
	}
	return out
}

// wantKeyLookups fails the test for each scan of relation in scans that
// is not an index scan without a filter, saying why that costs: why.
func wantKeyLookups(t *testing.T, name, relation string, scans []planNode, why string) {
	t.Helper()
	for _, n := range scans {
		if n.Filter != "" || !strings.Contains(n.NodeType, "Index") {
			t.Errorf("%s: a %s of %s with index condition %q and filter %q: %s", name, n.NodeType, relation, n.IndexCond, n.Filter, why)
		}
	}
}

// genericPlansConn opens a connection to s's schema on which every
// prepared statement runs its generic plan.
func genericPlansConn(t *testing.T, s *Store) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, set := range []string{
		"SET search_path = " + pgx.Identifier{s.opts.Schema}.Sanitize(),
		"SET plan_cache_mode = force_generic_plan",
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// genericPlan prepares sql on conn and returns the generic plan
// PostgreSQL would keep for it once for all: the one a pooled connection
// runs after its first five executions when it costs no more than the
// custom ones.
func genericPlan(t *testing.T, conn *pgx.Conn, name, sql, args string) planNode {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	var out string
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+name+"("+args+")").Scan(&out); err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain %s: %v: %s", name, err, out)
	}
	return plans[0].Plan
}

// The KV statements that look keys up look them up by the whole key in
// their generic plans, planned on a fresh schema's empty tables, where
// key = ANY($3) became a filter over an index scan of every key of the
// plugin: each batch of KV writes then read all of them (3,600 buffers
// and 16 ms a batch for 20,000 keys, under the plugin's lock). A scan of
// kv in these plans has no filter: it reads the keys it looks for,
// however many the plugin has.
func TestKVKeyLookupsStayKeyLookupsInGenericPlans(t *testing.T) {
	s := openKVStore(t, 1<<20)
	conn := genericPlansConn(t, s)
	for _, c := range []struct {
		name, sql, args, relation string
	}{
		{"kv_sizes", sqlKVSizes, `'t', 'p', '{"\\x6b31", "\\x6b32"}'`, "kv"},
		{"kv_delete", sqlKVDelete, `'t', 'p', '\x6b31'`, "kv"},
	} {
		plan := genericPlan(t, conn, c.name, c.sql, c.args)
		scans := scansOf(plan, c.relation)
		if len(scans) == 0 {
			t.Fatalf("%s: no scan of %s in its plan", c.name, c.relation)
		}
		wantKeyLookups(t, c.name, c.relation, scans, "a lookup by key reads every row of the range")
	}
}

// A commit looks its command IDs up by the whole key in its generic
// plans, whatever further command IDs it carries: c.command_id = ANY($17)
// became a filter over an index scan of all the Run's commands, so that
// every commit of a long Run read every command it had applied
// (BenchmarkCommit: 880 µs a commit at 20,000 commands a Run, 125 µs now).
func TestCommitCommandLookupsStayKeyLookupsInGenericPlans(t *testing.T) {
	s := openKVStore(t, 1<<20)
	conn := genericPlansConn(t, s)
	for _, ending := range []bool{false, true} {
		for _, also := range []int{0, 1, 3, len(commitStatements[0]) + 2} {
			name := fmt.Sprintf("commit_%v_%d", ending, also)
			args := []string{"'t'", "'r'", "'s'", "1", "1", "'cmd'", "'{2}'", `'{"\\x7b7d"}'`, "2", "'running'", "true", "false", "0", "NULL", `'\x7b7d'`, "10"}
			for i := range also {
				args = append(args, fmt.Sprintf("'also%d'", i))
			}
			plan := genericPlan(t, conn, name, commitStatement(ending, also), strings.Join(args, ", "))
			scans := scansOf(plan, "commands")
			if len(scans) != 1+also {
				t.Errorf("%s: %d scans of commands in its plan, want %d: one a command ID", name, len(scans), 1+also)
			}
			wantKeyLookups(t, name, "commands", scans, "a lookup by command ID reads every command of the Run")
		}
	}
}

// Every lookup of a Run by its key, (tenant, run_id), goes through
// runs_pkey in the generic plans made on a fresh schema's tables, which
// PostgreSQL has not analyzed: there, an index that led with the tenant
// cost the same as the primary key, and the planner took runs_by_status
// bounded by the tenant alone. A pooled connection kept that plan, and
// each commit, load and creation read all the tenant's Runs (26 buffers
// a lookup at 1,000 Runs, against 3) until autovacuum's first ANALYZE.
// A lookup by key that another index bounds and a filter on run_id
// finishes (CompletedRunsBefore's, through runs_by_session) fails too.
// The reads by session and by status go through their own indexes.
func TestRunLookupsByKeyUseThePrimaryKeyInGenericPlans(t *testing.T) {
	s := openKVStore(t, 1<<20)
	conn := genericPlansConn(t, s)
	commitArgs := `'t', 'r', 's', 1, 1, 'cmd', '{2}', '{"\\x7b7d"}', 2, 'running', true, false, 0, NULL, '\x7b7d', 10`
	createArgs := `'t', 's', 'r', 1, 1, 'running', false, 0, NULL, NULL, '\x00', '\x7b7d', 10, '', NULL, ` +
		`0, 1, 'running', false, 0, NULL, '\x00', '{}', '{}', 10`
	for _, c := range []struct {
		name, sql, args string
		// other is the index a scan of runs that is not a lookup by key
		// goes through ("": the statement makes none).
		other string
	}{
		{"lock_run", sqlLockRun, `'t', 'r', NULL`, ""},
		{"commit", commitStatement(false, 0), commitArgs, ""},
		{"commit_ending", commitStatement(true, 1), commitArgs + `, 'also0'`, ""},
		{"create_run", sqlCreate, createArgs, ""},
		{"load_run", sqlLoadRun, `'t', 'r'`, ""},
		{"events", sqlEvents, `'t', 'r', 1, 10`, ""},
		{"completed_runs_before", sqlCompletedRunsBefore, `'t', 'r', 's', 'completed', 10`, "runs_by_session"},
		{"session_runs", sqlSessionRuns, `'t', 's', 0, 10`, "runs_by_session"},
		{"active_runs", sqlActiveRuns, `'t', 's'`, "runs_active"},
		{"runs_by_status", sqlRunsByStatus, `'t', 'completed', '', 10`, "runs_by_status"},
		{"runs_by_status_desc", sqlRunsByStatusDesc, `'t', 'completed', 10`, "runs_by_status"},
		{"runs_by_status_desc_before", sqlRunsByStatusDescBefore, `'t', 'completed', 10, 'r'`, "runs_by_status"},
		{"prune", sqlPrune, `10, 500`, ""},
	} {
		scans := scansOf(genericPlan(t, conn, c.name, c.sql, c.args), "runs")
		if len(scans) == 0 {
			t.Fatalf("%s: no scan of runs in its plan", c.name)
		}
		for _, n := range scans {
			byKey := strings.Contains(n.IndexCond, "run_id = ") || strings.Contains(n.Filter, "run_id = ")
			switch {
			case byKey && (n.IndexName != "runs_pkey" || n.Filter != ""):
				t.Errorf("%s: a lookup by key goes through %q (%s, index condition %q, filter %q), want runs_pkey: "+
					"it reads every Run its index condition matches", c.name, n.IndexName, n.NodeType, n.IndexCond, n.Filter)
			case !byKey && n.IndexName != c.other:
				t.Errorf("%s: a scan of runs goes through %q (%s, index condition %q), want %q", c.name, n.IndexName, n.NodeType, n.IndexCond, c.other)
			}
		}
	}
}

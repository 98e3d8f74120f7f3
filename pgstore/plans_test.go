package pgstore

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan, as far as the
// tests read it.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
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
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, set := range []string{
		"SET search_path = " + pgx.Identifier{s.opts.Schema}.Sanitize(),
		"SET plan_cache_mode = force_generic_plan",
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
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
		for _, n := range scans {
			if n.Filter != "" || !strings.Contains(n.NodeType, "Index") {
				t.Errorf("%s: a %s of %s with index condition %q and filter %q: a lookup by key reads every row of the range",
					c.name, n.NodeType, c.relation, n.IndexCond, n.Filter)
			}
		}
	}
}

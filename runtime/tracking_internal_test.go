package runtime

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
)

// TestTrackingTableMatchesPrefixScan runs seeded sequences of puts,
// deletes and Run drops on a trackingTable and on a plain map that drops a
// Run by scanning for its prefix (what forgetRun did before the index),
// and checks after every step that both hold the same entries and that the
// index holds no key twice nor a key the table lost. The Run IDs are
// chosen so that one is a prefix of another ("r1", "r10").
func TestTrackingTableMatchesPrefixScan(t *testing.T) {
	tenants := []string{"acme", "acme-2"}
	sessions := []string{"s1", "s10"}
	runs := []string{"r1", "r10", "run_x"}
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed))
		table := newTrackingTable()
		model := map[string]*tracking{}
		pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
		for step := 0; step < 300; step++ {
			tenant, session, run := pick(tenants), pick(sessions), pick(runs)
			effect := loop.ModelEffectID(run, rng.IntN(3))
			if rng.IntN(2) == 0 {
				effect = loop.ToolEffectID(run, rng.IntN(3), rng.IntN(3))
			}
			key := loop.AssignmentKey{Tenant: tenant, Session: session, EffectID: effect, Attempt: 1 + rng.IntN(2)}.String()
			var op string
			switch r := rng.IntN(10); {
			case r < 6:
				op = "put " + key
				tr := &tracking{done: rng.IntN(2) == 0}
				table.put(key, tr)
				model[key] = tr
			case r < 8:
				op = "delete " + key
				table.delete(key)
				delete(model, key)
			default:
				prefix := tenant + "/" + session + "/" + run + "."
				op = "deleteRun " + prefix
				table.deleteRun(prefix)
				for k := range model {
					if strings.HasPrefix(k, prefix) {
						delete(model, k)
					}
				}
			}
			if err := sameTracking(table, model); err != nil {
				t.Fatalf("seed %d step %d (%s): %v", seed, step, op, err)
			}
		}
	}
}

func sameTracking(table trackingTable, model map[string]*tracking) error {
	if table.len() != len(model) {
		return fmt.Errorf("table holds %d entries, the prefix-scan model %d", table.len(), len(model))
	}
	for k, tr := range model {
		if table.get(k) != tr {
			return fmt.Errorf("key %s: table %v, model %v", k, table.get(k), tr)
		}
	}
	var indexed []string
	for p, keys := range table.byRun {
		if len(keys) == 0 {
			return fmt.Errorf("run %s has an empty index entry", p)
		}
		for k := range keys {
			if runPrefix(k) != p {
				return fmt.Errorf("key %s indexed under %s", k, p)
			}
			indexed = append(indexed, k)
		}
	}
	slices.Sort(indexed)
	if len(slices.Compact(indexed)) != len(model) {
		return fmt.Errorf("the index holds %d keys, the table %d", len(indexed), len(model))
	}
	for _, k := range indexed {
		if _, ok := model[k]; !ok {
			return fmt.Errorf("the index holds %s, which the table does not", k)
		}
	}
	return nil
}

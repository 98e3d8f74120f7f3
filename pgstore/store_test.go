package pgstore

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/runtime"
)

// TestStoreConformance holds pgstore to the Store port's contract. Each
// case gets a schema of its own on one database.
func TestStoreConformance(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	conformance.StoreSuite(t, func(t *testing.T, cfg conformance.StoreConfig) runtime.Store {
		s, err := Open(context.Background(), Options{
			DSN:             dsn,
			Schema:          freshSchema(t, dsn),
			Clock:           cfg.Clock,
			KVMaxKeyBytes:   cfg.KV.MaxKeyBytes,
			KVMaxValueBytes: cfg.KV.MaxValueBytes,
			KVQuotaBytes:    cfg.KV.QuotaBytes,
			Logger:          quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// oneProcess hides the Store's ChangeFeed: the runtime then takes the
// store for one process's, as RuntimeSuite (which runs its second node on
// the same handle) expects. ClusterSuite runs the shared mode.
type oneProcess struct{ runtime.Store }

// TestRuntimeSuiteOnPostgres holds the runtime, over PostgreSQL, to the
// same contract as over MemStore and Badger.
func TestRuntimeSuiteOnPostgres(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	conformance.RuntimeSuite(t, conformance.RuntimeHarness{
		NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s, err := Open(context.Background(), Options{DSN: dsn, Schema: freshSchema(t, dsn), Clock: clock, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return oneProcess{s}
		},
	})
}

// TestClusterSuiteOnPostgres holds several runtimes on one database, each
// through a Store of its own as each node's process would have, to the
// contract of several nodes.
func TestClusterSuiteOnPostgres(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	conformance.ClusterSuite(t, conformance.ClusterHarness{
		NewStores: func(t *testing.T, clock runtime.Clock, n int) []runtime.Store {
			schema := freshSchema(t, dsn)
			var out []runtime.Store
			for range n {
				out = append(out, open(t, dsn, schema, clock))
			}
			return out
		},
	})
}

package conformance

import (
	"testing"

	"github.com/agenthost/agenthost/runtime"
)

// TestClusterSuiteOnMemHandles runs the several-node contract over
// handles on one MemStore.
func TestClusterSuiteOnMemHandles(t *testing.T) {
	ClusterSuite(t, ClusterHarness{NewStores: func(t *testing.T, clock runtime.Clock, n int) []runtime.Store {
		m := NewMemStore(clock, KVLimits{})
		out := make([]runtime.Store, n)
		for i := range out {
			h := m.Handle()
			t.Cleanup(func() { _ = h.Close() })
			out[i] = h
		}
		return out
	}})
}

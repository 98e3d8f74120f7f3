package badgerstore

import (
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime"
)

// TestRuntimeSuiteOnBadger holds the runtime, over a real Badger directory
// with SyncWrites on, to the same contract as over MemStore.
func TestRuntimeSuiteOnBadger(t *testing.T) {
	conformance.RuntimeSuite(t, conformance.RuntimeHarness{
		NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s, err := Open(t.TempDir(), Options{Clock: clock, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	})
}

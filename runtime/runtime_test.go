package runtime_test

import (
	"log/slog"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime"
)

func TestRuntimeSuiteOnMemStore(t *testing.T) {
	conformance.RuntimeSuite(t, conformance.RuntimeHarness{
		NewStore: func(t *testing.T, clock runtime.Clock) runtime.Store {
			s := conformance.NewMemStore(clock, conformance.KVLimits{})
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	})
}

var quiet = slog.New(slog.DiscardHandler)

package badgerstore

import (
	"io"
	"log/slog"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/runtime"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestStoreConformance(t *testing.T) {
	storeSuite(t, Options{})
}

// storeSuite runs the store suite on stores opened with opts, the suite's
// clock and KV limits, and a quiet logger.
func storeSuite(t *testing.T, opts Options) {
	conformance.StoreSuite(t, func(t *testing.T, cfg conformance.StoreConfig) runtime.Store {
		o := opts
		o.Clock, o.Logger = cfg.Clock, quietLogger()
		o.KVMaxKeyBytes, o.KVMaxValueBytes, o.KVQuotaBytes = cfg.KV.MaxKeyBytes, cfg.KV.MaxValueBytes, cfg.KV.QuotaBytes
		s, err := Open(t.TempDir(), o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

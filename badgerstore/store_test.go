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
	conformance.StoreSuite(t, func(t *testing.T, cfg conformance.StoreConfig) runtime.Store {
		s, err := Open(t.TempDir(), Options{
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

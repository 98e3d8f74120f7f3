package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/runtime"
)

// TestAnEndpointClosedThroughOneStoreIsClosedForAll: a closure written
// through one Store is read through another on the schema, for as long
// as it was asked, in the store's clock; a shorter closure does not
// shorten it, a longer one extends it; an endpoint never closed is open.
func TestAnEndpointClosedThroughOneStoreIsClosedForAll(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, b := open(t, dsn, schema, clock), open(t, dsn, schema, clock)
	ctx := context.Background()
	closedFor := func(s *Store, endpoint string) time.Duration {
		t.Helper()
		d, err := s.EndpointClosedFor(ctx, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := closedFor(b, "openai"); d != 0 {
		t.Fatalf("an endpoint never closed is closed for %s", d)
	}
	if err := a.CloseEndpoint(ctx, "openai", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := closedFor(b, "openai"); d != 20*time.Second {
		t.Fatalf("closed for %s through the other store, want 20s", d)
	}
	if d := closedFor(b, "anthropic"); d != 0 {
		t.Fatalf("another endpoint is closed for %s", d)
	}
	clock.Advance(5 * time.Second)
	if err := b.CloseEndpoint(ctx, "openai", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := closedFor(a, "openai"); d != 15*time.Second {
		t.Fatalf("closed for %s after a shorter closure, want the 15s left of the first", d)
	}
	if err := b.CloseEndpoint(ctx, "openai", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := closedFor(a, "openai"); d != 30*time.Second {
		t.Fatalf("closed for %s after a longer closure, want 30s", d)
	}
	clock.Advance(31 * time.Second)
	if d := closedFor(a, "openai"); d != 0 {
		t.Fatalf("closed for %s once the closure passed, want open", d)
	}
	if err := a.CloseEndpoint(ctx, "", time.Second); err == nil || !strings.Contains(err.Error(), "endpoint") {
		t.Fatalf("an empty endpoint name: %v", err)
	}
	var _ runtime.EndpointGate = a
}

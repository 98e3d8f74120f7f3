package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/runtime"
)

// sqlCloseEndpoint closes an endpoint for a wait from now, keeping a
// closure that ends later: $1 endpoint, $2 the wait in ms, $3 now.
var sqlCloseEndpoint = `INSERT INTO endpoint_closures AS c (endpoint, closed_until_ms)
VALUES ($1, ` + dbNow(3) + ` + $2)
ON CONFLICT (endpoint) DO UPDATE SET closed_until_ms = GREATEST(c.closed_until_ms, EXCLUDED.closed_until_ms)`

// sqlEndpointClosedFor reads how long an endpoint stays closed from now,
// in ms (0 or less: open): $1 endpoint, $2 now.
var sqlEndpointClosedFor = `SELECT closed_until_ms - ` + dbNow(2) + ` FROM endpoint_closures WHERE endpoint = $1`

// CloseEndpoint implements runtime.EndpointGate: one upsert, in the
// database's clock, so that every node sharing the database reads the
// same closure whatever its own clock says.
func (s *Store) CloseEndpoint(ctx context.Context, endpoint string, wait time.Duration) error {
	if err := runtime.CheckName("endpoint", endpoint); err != nil {
		return fmt.Errorf("pgstore: close endpoint: %w", err)
	}
	if wait <= 0 {
		return nil
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	if _, err := s.pool.Exec(ctx, sqlCloseEndpoint, endpoint, wait.Milliseconds(), s.nowParam()); err != nil {
		return fail("close endpoint "+endpoint, err)
	}
	return nil
}

// EndpointClosedFor implements runtime.EndpointGate: one read through the
// primary key.
func (s *Store) EndpointClosedFor(ctx context.Context, endpoint string) (time.Duration, error) {
	if err := runtime.CheckName("endpoint", endpoint); err != nil {
		return 0, fmt.Errorf("pgstore: endpoint closure: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	var ms int64
	err := s.pool.QueryRow(ctx, sqlEndpointClosedFor, endpoint, s.nowParam()).Scan(&ms)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fail("read the closure of endpoint "+endpoint, err)
	}
	return time.Duration(max(ms, 0)) * time.Millisecond, nil
}

var _ runtime.EndpointGate = (*Store)(nil)

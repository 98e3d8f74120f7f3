package bench

import (
	"os"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestMain stops the shared PostgreSQL server the postgres variants of
// the bench tests use (pgserver.NewDatabase) once they are done.
func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

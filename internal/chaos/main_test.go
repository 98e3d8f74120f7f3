package chaos

import (
	"os"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestMain stops the shared PostgreSQL server the partition proxy's test
// uses (pgserver.NewDatabase) once the tests are done.
func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

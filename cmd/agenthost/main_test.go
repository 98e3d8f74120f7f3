package main

import (
	"log/slog"
	"os"
	"testing"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// TestMain stops the shared PostgreSQL server the tests of this package
// start (pgserver.NewDatabase) once they are done.
func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// quietLog discards what the stores and runtimes of the tests log.
var quietLog = slog.New(slog.DiscardHandler)

//go:build !unix

package examples_test

import "testing"

// processCPU is 0 where getrusage is missing: cpu-ns/op is then 0.
func processCPU(*testing.B) int64 { return 0 }

//go:build unix

package examples_test

import (
	"syscall"
	"testing"
)

// processCPU is the CPU time the process has used, user and system, in
// ns: on a machine shared with other work, a call's CPU time is steadier
// than its wall time.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

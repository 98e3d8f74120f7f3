package pgserver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// userHZ is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture Go supports.
const userHZ = 100

// CPUTime is the CPU time, user and system, the server's processes have
// used since it started: the postmaster's own and its live children's
// (backends, WAL writer, checkpointer, …), and that of the children that
// have exited, which the postmaster has reaped. The difference of two
// readings is the server's CPU between them, the figure the peer bench
// (benchpeers) divides by the Runs. Linux only (/proc); an error for an
// external server or where /proc cannot be read.
func (s *Server) CPUTime() (time.Duration, error) {
	if s.external != "" {
		return 0, errors.New("pgserver: CPUTime of a server this process did not start (AGENTHOST_TEST_PG)")
	}
	pid, running := postmasterOf(s.dir)
	if !running {
		return 0, fmt.Errorf("pgserver: CPUTime: no postmaster runs in %s", s.dir)
	}
	// A child's time moves into the postmaster's reaped total when the
	// postmaster reaps it; until then /proc shows it as the child's (a
	// zombie's too). A child reaped while the children are read would be
	// counted in neither reading, or in both: the postmaster is read
	// before and after them, and the children read again when its total
	// moved in between.
	_, reaped, ok := procCPUTicks(pid)
	if !ok {
		return 0, fmt.Errorf("pgserver: CPUTime: reading /proc/%d/stat", pid)
	}
	var ticks int64
	for range cpuReadAttempts {
		children, err := childrenCPUTicks(pid)
		if err != nil {
			return 0, err
		}
		own, reapedAfter, ok := procCPUTicks(pid)
		if !ok {
			return 0, fmt.Errorf("pgserver: CPUTime: reading /proc/%d/stat", pid)
		}
		ticks = own + reapedAfter + children
		if reapedAfter == reaped {
			break
		}
		reaped = reapedAfter // the next try starts from this reading
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// cpuReadAttempts bounds CPUTime's readings while children keep exiting:
// past it, the last reading stands (a child reaped in between may be
// counted twice).
const cpuReadAttempts = 100

// childrenCPUTicks is the user and system time of the processes whose
// parent is pid, exited ones not yet reaped included.
func childrenCPUTicks(pid int) (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("pgserver: CPUTime: %w", err)
	}
	var ticks int64
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := procStatFields(child); ok && f[1] == strconv.Itoa(pid) {
			own, _, _ := procCPUTicks(child)
			ticks += own
		}
	}
	return ticks, nil
}

// procCPUTicks is a process's user and system time in ticks (fields 14
// and 15 of /proc/PID/stat), and that of the children it has reaped
// (fields 16 and 17).
func procCPUTicks(pid int) (own, reaped int64, ok bool) {
	f, ok := procStatFields(pid)
	if !ok {
		return 0, 0, false
	}
	var n [4]int64
	for i := range n {
		var err error
		if n[i], err = strconv.ParseInt(f[11+i], 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return n[0] + n[1], n[2] + n[3], true
}

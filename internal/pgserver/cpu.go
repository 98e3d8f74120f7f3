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
	ticks, ok := procCPUTicks(pid, true)
	if !ok {
		return 0, fmt.Errorf("pgserver: CPUTime: reading /proc/%d/stat", pid)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("pgserver: CPUTime: %w", err)
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := procStatFields(child); ok && f[1] == strconv.Itoa(pid) {
			// A child that exits between the two reads is lost from the
			// sum until the postmaster reaps it: a few ticks at most.
			t, _ := procCPUTicks(child, false)
			ticks += t
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// procCPUTicks is a process's user and system time in ticks (fields 14
// and 15 of /proc/PID/stat), and with reaped, its reaped children's too
// (fields 16 and 17).
func procCPUTicks(pid int, reaped bool) (int64, bool) {
	f, ok := procStatFields(pid)
	if !ok {
		return 0, false
	}
	last := 12
	if reaped {
		last = 14
	}
	var sum int64
	for i := 11; i <= last; i++ {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

package pgserver

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A backend's CPU time stays in the server's after the backend exits:
// the postmaster reaps it, and CPUTime counts what it reaped.
func TestCPUTimeCountsTheBackendsThatExited(t *testing.T) {
	skipInShort(t)
	srv := Require(t)
	if srv.External() {
		t.Skip("CPUTime reads the processes of a server this process started; AGENTHOST_TEST_PG names another")
	}
	before, err := srv.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	// The backend works, then reads its own CPU time; psql then exits,
	// and the backend with it.
	stat := query(t, srv, srv.DSN("postgres"),
		"select pg_read_file('/proc/self/stat') from (select count(*) from generate_series(1, 3000000)) s")
	i := strings.LastIndexByte(stat, ')')
	fields := strings.Fields(stat[i+1:])
	pid, _ := strconv.Atoi(strings.Fields(stat)[0])
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("the backend's /proc/self/stat: %q: %v", stat, err)
		}
		ticks += n
	}
	backend := time.Duration(ticks) * time.Second / userHZ
	if backend == 0 {
		t.Fatalf("the backend used no CPU time: %q", stat)
	}
	deadline := time.Now().Add(time.Minute)
	for processAlive(pid, "") {
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still runs a minute after its client left", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, err := srv.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < backend {
		t.Fatalf("CPUTime went from %v to %v while a backend that has exited used %v", before, after, backend)
	}
}

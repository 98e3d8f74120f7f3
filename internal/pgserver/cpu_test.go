package pgserver

import (
	"os"
	"os/exec"
	"path/filepath"
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

// CPUTime never goes back while children exit: a child's time moves from
// its own /proc entry into its parent's reaped total when the parent
// reaps it, and a reading that fell between the two counted it in
// neither (the backend of the test above, now and then). The parent here
// is a shell in a data directory's place, whose subshells each spin
// for a few clock ticks and exit, one after another, each reaped as
// the next starts.
func TestCPUTimeNeverLosesAReapedChild(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, dataDirName)
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	parent := exec.Command("sh", "-c", `while :; do ( i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done ); done`)
	parent.Dir = data
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = parent.Process.Kill()
		_ = parent.Wait()
	})
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(strconv.Itoa(parent.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &Server{dir: dir}
	// reaped is the CPU time of the children the shell has reaped.
	reaped := func() int64 {
		_, n, ok := procCPUTicks(parent.Process.Pid)
		if !ok {
			t.Fatalf("reading the shell's /proc/%d/stat", parent.Process.Pid)
		}
		return n
	}
	// Until the parent has reaped a second's worth of its children's time.
	const want = userHZ
	start := reaped()
	deadline := time.Now().Add(time.Minute)
	var last time.Duration
	readings := 0
	for reaped()-start < want {
		if time.Now().After(deadline) {
			t.Fatalf("the shell reaped %d ticks of its children in a minute; want %d", reaped()-start, want)
		}
		got, err := srv.CPUTime()
		if err != nil {
			t.Fatal(err)
		}
		if got < last {
			t.Fatalf("after %d readings, CPUTime went from %v back to %v", readings, last, got)
		}
		last = got
		readings++
	}
	t.Logf("%d readings, none back", readings)
}

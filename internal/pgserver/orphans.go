package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A process that dies without calling Stop (killed, or a test binary that
// timed out) leaves its server running: pg_ctl detaches the postmaster
// from it. Start removes such orphans first, so they do not pile up.
//
// Every directory Start makes holds owner.pid: the pid of the process
// that called Start and that process's start time (from /proc, so that a
// reused pid does not look alive). A directory /tmp/agpg* is an orphan
// when its owner is dead; one without owner.pid (its maker died before
// writing it) when it is over a minute old, holds only what Start puts
// there, and no live postmaster. A directory whose owner lives is never
// touched.

// noOwnerGrace is how old a directory without owner.pid must be before it
// counts as an orphan: Start writes the file just after making the
// directory.
const noOwnerGrace = time.Minute

// writeOwner records this process as the owner of dir.
func writeOwner(dir string) error {
	pid := os.Getpid()
	content := fmt.Sprintf("%d %s\n", pid, processStartTime(pid))
	if err := os.WriteFile(filepath.Join(dir, ownerFileName), []byte(content), 0o644); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// reapOrphans stops and removes, best effort, the orphaned servers in the
// directories Start makes.
func reapOrphans(ctx context.Context, su *serverUser, bindir string, log *slog.Logger) {
	bases := []string{tempBase()}
	if bases[0] != "/tmp" {
		bases = append(bases, "/tmp")
	}
	for _, base := range bases {
		dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
		for _, dir := range dirs {
			if ctx.Err() != nil {
				return
			}
			if isOrphan(dir) {
				reapOrphan(ctx, su, bindir, dir, log)
			}
		}
	}
}

func isOrphan(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	owner, err := os.ReadFile(filepath.Join(dir, ownerFileName))
	if err == nil {
		fields := strings.Fields(string(owner))
		if len(fields) >= 1 {
			if pid, err := strconv.Atoi(fields[0]); err == nil && pid > 0 {
				start := ""
				if len(fields) >= 2 {
					start = fields[1]
				}
				return !processAlive(pid, start)
			}
		}
		// An unreadable owner.pid: judge the directory as if it had none.
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if time.Since(fi.ModTime()) < noOwnerGrace {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		switch e.Name() {
		case ownerFileName, dataDirName, sockDirName, logFileName:
		default:
			return false // not one of ours
		}
	}
	_, running := postmasterOf(dir)
	return !running
}

// reapOrphan stops the server in dir, if one runs, and removes dir.
func reapOrphan(ctx context.Context, su *serverUser, bindir, dir string, log *slog.Logger) {
	data := filepath.Join(dir, dataDirName)
	if pid, running := postmasterOf(dir); running {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, _ = runAsServerUser(ctx, su, bindir, dir, "pg_ctl", "stop", "-D", data, "-s", "-m", "immediate", "-w", "-t", "20")
		cancel()
		if _, running := postmasterOf(dir); running {
			_ = syscall.Kill(pid, syscall.SIGKILL) // its backends exit when they see it gone
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		log.Warn("pgserver: could not remove an orphaned test server's directory", "dir", dir, "err", err)
		return
	}
	log.Info("pgserver: removed an orphaned test server", "dir", dir)
}

// postmasterOf reads the postmaster's pid from dir/data/postmaster.pid and
// reports whether that process runs and is that directory's server: its
// working directory is the data directory, which tells a live postmaster
// from an unrelated process that got the dead one's pid. Where that
// cannot be read (no /proc, another user's process), a live process
// counts as running, so that nothing is removed under a live server.
func postmasterOf(dir string) (pid int, running bool) {
	data := filepath.Join(dir, dataDirName)
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 || !processAlive(pid, "") {
		return pid, false
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return pid, true
	}
	if real, err := filepath.EvalSymlinks(data); err == nil {
		data = real
	}
	return pid, cwd == data
}

// processAlive reports whether process pid exists and is not a zombie;
// with start (its start time in clock ticks, from /proc/PID/stat), also
// that it is the process that started then and not a later one that got
// its pid.
func processAlive(pid int, start string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	state, started, ok := procStat(pid)
	if !ok {
		_, err := os.Stat("/proc/self/stat")
		return err != nil // no /proc here: trust kill; with /proc, the process is gone
	}
	if state == "Z" || state == "X" {
		return false
	}
	return start == "" || started == start
}

// processStartTime is pid's start time from /proc, or "" where there is none.
func processStartTime(pid int) string {
	_, started, _ := procStat(pid)
	return started
}

// procStat reads a process's state and start time (fields 3 and 22 of
// /proc/PID/stat).
func procStat(pid int) (state, started string, ok bool) {
	fields, ok := procStatFields(pid)
	if !ok {
		return "", "", false
	}
	return fields[0], fields[19], true
}

// procStatFields reads /proc/PID/stat's fields from the third on (the
// state): fields[i] is field i+3 of proc(5).
func procStatFields(pid int) ([]string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return nil, false
	}
	return fields, true
}

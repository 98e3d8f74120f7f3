package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options say how Start makes a server.
type Options struct {
	// Fsync keeps fsync and full_page_writes on, so that a commit
	// survives a crash of the machine: for crash tests and the chaos
	// bench. Off (the default, for fast suites) turns both off; a commit
	// still survives a crash of the server, since synchronous_commit
	// stays on either way.
	Fsync bool
	// Dir is where the cluster goes; it must be absent or empty, and at
	// most 80 bytes long, so that the socket's path fits. "" makes a fresh
	// temporary directory /tmp/agpg…, which Stop removes; Stop leaves a
	// given Dir (and the cluster in it) in place.
	Dir string
	// MaxConnections is the server's max_connections; 0 means 200.
	MaxConnections int
	// Logger hears about starts, stops and orphaned servers removed; nil
	// discards.
	Logger *slog.Logger
	// TrackStatements preloads pg_stat_statements, utility statements
	// tracked too, so that a database where CREATE EXTENSION
	// pg_stat_statements is run counts the statements it executes: for
	// the bench's statements per Run.
	TrackStatements bool
}

const (
	// Port is the port in the socket's name (.s.PGSQL.5432). There is no
	// TCP listener, so servers in different directories never collide.
	Port = 5432

	defaultMaxConnections = 200
	pgctlTimeoutSeconds   = "60"
	dirPrefix             = "agpg"
	ownerFileName         = "owner.pid"
	logFileName           = "server.log"
	dataDirName           = "data"
	sockDirName           = "sock"
	// maxSocketPath leaves room in sun_path (108 bytes with its NUL).
	maxSocketPath = 100
)

// A Server is a PostgreSQL server: one Start made (a throwaway cluster in
// its own directory, reached over a Unix socket only), or one the user
// runs and named in AGENTHOST_TEST_PG (External). Its methods are safe
// for concurrent use; Restart and Stop wait for each other.
type Server struct {
	dir      string // "" for an external server
	created  bool   // Start made dir, so Stop removes it
	bindir   string
	psql     string
	user     *serverUser // nil: initdb and pg_ctl run as this process's user
	log      *slog.Logger
	external string // the DSN of a server this process did not start, or ""

	mu      sync.Mutex
	stopped bool
}

// Start makes a new cluster (initdb, superuser postgres, trust
// authentication, UTF8, locale C), configures it (no TCP, its socket in
// Dir()/sock, Options' fsync and max_connections, a small
// shared_buffers, its log in Dir()/server.log) and starts it with pg_ctl,
// returning once it accepts connections. Before that it stops and removes,
// best effort, the orphaned servers of processes that died without
// stopping theirs. As root, initdb and pg_ctl run as the postgres user
// (through runuser), who then owns the cluster. The caller calls Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bindir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	psql, err := findPsql(bindir)
	if err != nil {
		return nil, err
	}
	su, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	maxConnections := opts.MaxConnections
	if maxConnections <= 0 {
		maxConnections = defaultMaxConnections
	}
	reapOrphans(ctx, su, bindir, log)

	s := &Server{bindir: bindir, psql: psql, user: su, log: log}
	if err := s.makeDir(opts.Dir); err != nil {
		return nil, err
	}
	if err := s.initCluster(ctx, opts.Fsync, maxConnections, opts.TrackStatements); err != nil {
		s.abandon()
		return nil, err
	}
	if out, err := s.pgctl(ctx, "start", "-l", s.logFile(), "-w", "-t", pgctlTimeoutSeconds); err != nil {
		err = fmt.Errorf("pgserver: pg_ctl start: %w%s%s", err, outputText(out), s.logTail())
		s.abandon()
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.abandon()
		return nil, err
	}
	log.Info("pgserver: started a PostgreSQL server", "dir", s.dir, "fsync", opts.Fsync, "bindir", bindir)
	return s, nil
}

// makeDir makes (or checks) the server's directory and its layout:
// owner.pid (this process, for reapOrphans), data/, sock/ and server.log,
// the last three the server user's.
func (s *Server) makeDir(dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp(tempBase(), dirPrefix)
		if err != nil {
			return fmt.Errorf("pgserver: making the server's directory: %w", err)
		}
		s.dir, s.created = d, true
	} else {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("pgserver: Dir %s: %w", dir, err)
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return fmt.Errorf("pgserver: making Dir: %w", err)
		}
		if entries, err := os.ReadDir(abs); err != nil {
			return fmt.Errorf("pgserver: Dir: %w", err)
		} else if len(entries) > 0 {
			return fmt.Errorf("pgserver: Dir %s is not empty; Start makes a new cluster and needs an absent or empty directory", abs)
		}
		s.dir = abs
	}
	err := s.layOut()
	if err != nil {
		s.abandon()
	}
	return err
}

func (s *Server) layOut() error {
	if err := writeOwner(s.dir); err != nil {
		return err
	}
	if n := len(s.socketPath()); n > maxSocketPath {
		return fmt.Errorf("pgserver: the socket path %s is %d bytes, longer than a Unix socket path can be; choose a shorter Dir", s.socketPath(), n)
	}
	if s.user != nil { // the postgres user must reach data/ and sock/
		if err := os.Chmod(s.dir, 0o755); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{s.dataDir(), 0o700}, {s.sockDir(), 0o755}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if err := s.user.chown(d.path); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(s.logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	f.Close()
	return s.user.chown(s.logFile())
}

// initCluster runs initdb and appends this package's settings to
// postgresql.conf (a later line wins over initdb's).
func (s *Server) initCluster(ctx context.Context, fsync bool, maxConnections int, trackStatements bool) error {
	args := []string{"-D", s.dataDir(), "--username=postgres", "--auth=trust", "-E", "UTF8", "--locale=C"}
	if !fsync {
		args = append(args, "--no-sync")
	}
	if out, err := runAsServerUser(ctx, s.user, s.bindir, s.dir, "initdb", args...); err != nil {
		return fmt.Errorf("pgserver: initdb: %w%s", err, outputText(out))
	}
	onOff := map[bool]string{true: "on", false: "off"}[fsync]
	conf := fmt.Sprintf(`
# Added by agenthost's internal/pgserver.
listen_addresses = ''
unix_socket_directories = '%s'
port = %d
max_connections = %d
shared_buffers = 64MB
fsync = %s
full_page_writes = %s
synchronous_commit = on
jit = off
logging_collector = off
log_line_prefix = '%%m [%%p] '
`, strings.ReplaceAll(s.sockDir(), "'", "''"), Port, maxConnections, onOff, onOff)
	if trackStatements {
		conf += "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track_utility = on\n"
	}
	f, err := os.OpenFile(filepath.Join(s.dataDir(), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgserver: configuring the cluster: %w", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgserver: configuring the cluster: %w", err)
	}
	return nil
}

// waitReady returns once the server answers a query. pg_ctl -w has
// already waited for it to be ready; this also proves a client gets in.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := runPsql(ctx, s.psql, s.DSN("postgres"), "select 1")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: the server in %s does not accept connections: %w%s", s.dir, err, s.logTail())
		case <-tick.C:
		}
	}
}

// DSN is a libpq keyword/value connection string for database, which pgx
// and psql accept: "host=DIR/sock port=5432 user=postgres dbname=DATABASE
// sslmode=disable". For an external server it is AGENTHOST_TEST_PG with
// its dbname replaced or added (the path, for a URL).
func (s *Server) DSN(database string) string {
	if s.external != "" {
		dsn, err := withDatabase(s.external, database)
		if err != nil { // newExternal parsed it already
			return s.external
		}
		return dsn
	}
	return formatConninfo([]keyValue{
		{"host", s.sockDir()}, {"port", fmt.Sprint(Port)}, {"user", "postgres"},
		{"dbname", database}, {"sslmode", "disable"},
	})
}

// Restart stops the server with pg_ctl's immediate mode, the way a crash
// does (clients are cut off, nothing is flushed), and starts it again;
// it returns once the server, having recovered from its WAL, accepts
// connections. An external server cannot be restarted.
func (s *Server) Restart(ctx context.Context) error {
	if s.external != "" {
		return errors.New("pgserver: cannot restart a server it did not start (AGENTHOST_TEST_PG names it); unset AGENTHOST_TEST_PG for tests that restart the server")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("pgserver: Restart of a stopped server")
	}
	if out, err := s.pgctl(ctx, "restart", "-m", "immediate", "-l", s.logFile(), "-w", "-t", pgctlTimeoutSeconds); err != nil {
		return fmt.Errorf("pgserver: pg_ctl restart: %w%s%s", err, outputText(out), s.logTail())
	}
	if err := s.waitReady(ctx); err != nil {
		return err
	}
	s.log.Info("pgserver: restarted the PostgreSQL server (immediate)", "dir", s.dir)
	return nil
}

// Stop stops the server (pg_ctl's fast mode: clients are disconnected,
// then a clean shutdown; immediate if that fails) and removes its
// directory if Start made it. A second Stop, and Stop of an external
// server, do nothing.
func (s *Server) Stop() error {
	if s.external != "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := s.stopPostmaster(ctx, "fast")
	if err != nil {
		if err2 := s.stopPostmaster(ctx, "immediate"); err2 == nil {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	if s.created {
		if err := os.RemoveAll(s.dir); err != nil {
			return fmt.Errorf("pgserver: removing the server's directory: %w", err)
		}
	}
	s.log.Info("pgserver: stopped the PostgreSQL server", "dir", s.dir, "removed", s.created)
	return nil
}

// stopPostmaster runs pg_ctl stop in mode; nothing when no postmaster.pid
// says a server runs.
func (s *Server) stopPostmaster(ctx context.Context, mode string) error {
	if !s.pidFileExists() {
		return nil
	}
	out, err := s.pgctl(ctx, "stop", "-m", mode, "-w", "-t", pgctlTimeoutSeconds)
	if err != nil && s.pidFileExists() {
		return fmt.Errorf("pgserver: pg_ctl stop -m %s: %w%s%s", mode, err, outputText(out), s.logTail())
	}
	return nil
}

func (s *Server) pidFileExists() bool {
	_, err := os.Stat(filepath.Join(s.dataDir(), "postmaster.pid"))
	return err == nil
}

// abandon undoes a Start that failed: it stops whatever server runs, at
// once, and removes the directory Start made.
func (s *Server) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.stopPostmaster(ctx, "immediate")
	if s.created {
		_ = os.RemoveAll(s.dir)
	}
}

// Dir is the server's directory: data/ (the cluster), sock/ (its
// socket), server.log and owner.pid. "" for an external server.
func (s *Server) Dir() string { return s.dir }

// External reports whether the server is one the user runs, named by
// AGENTHOST_TEST_PG, rather than one this process started.
func (s *Server) External() bool { return s.external != "" }

func (s *Server) dataDir() string { return filepath.Join(s.dir, dataDirName) }
func (s *Server) sockDir() string { return filepath.Join(s.dir, sockDirName) }
func (s *Server) logFile() string { return filepath.Join(s.dir, logFileName) }
func (s *Server) socketPath() string {
	return filepath.Join(s.sockDir(), fmt.Sprintf(".s.PGSQL.%d", Port))
}

func (s *Server) pgctl(ctx context.Context, action string, args ...string) ([]byte, error) {
	return runAsServerUser(ctx, s.user, s.bindir, s.dir, "pg_ctl", append([]string{action, "-D", s.dataDir(), "-s"}, args...)...)
}

// logTail is the end of the server's log, for an error message.
func (s *Server) logTail() string {
	f, err := os.Open(s.logFile())
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 4096
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 1 && len(b) == max {
		lines = lines[1:] // a partial first line
	}
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	text := strings.Join(lines, "\n")
	if strings.TrimSpace(text) == "" {
		return ""
	}
	return "\nthe end of the server's log:\n" + text
}

// outputText is a program's output for an error message.
func outputText(out []byte) string {
	text := strings.TrimSpace(string(out))
	if text == "" {
		return ""
	}
	if len(text) > 4096 {
		text = "…" + text[len(text)-4096:]
	}
	return "\n" + text
}

// runAsServerUser runs bindir/name with args in workdir, as su (through
// runuser) or, when su is nil, as this process's user, and returns its
// output (stdout and stderr).
func runAsServerUser(ctx context.Context, su *serverUser, bindir, workdir, name string, args ...string) ([]byte, error) {
	path := filepath.Join(bindir, name)
	var cmd *exec.Cmd
	if su != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", su.name, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = workdir
	cmd.Env = cleanEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// runuser passes SIGTERM on to its child; SIGKILL would orphan it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	// Should a daemon started by pg_ctl hold the output pipe, do not wait
	// for it (pg_ctl -l sends the server's output to its log instead).
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// runPsql runs one SQL command with psql on dsn and returns its output
// (unaligned, tuples only).
func runPsql(ctx context.Context, psql, dsn, sql string) (string, error) {
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql)
	cmd.Env = cleanEnv("PGCONNECT_TIMEOUT=10")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("psql: %w%s", err, outputText(stderr.Bytes()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// tempBase is where Start makes its directories: the temporary directory,
// or /tmp when that is too long for a socket path or, as root, might not
// be reachable by the postgres user.
func tempBase() string {
	base := os.TempDir()
	if os.Geteuid() == 0 || len(base) > 60 {
		return "/tmp"
	}
	return base
}

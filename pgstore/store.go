package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agenthost/agenthost/runtime"
)

// Defaults of Options.
const (
	DefaultSchema           = "agenthost"
	DefaultMaxConns         = 16
	DefaultWriteGroups      = 4
	DefaultStatementTimeout = 30 * time.Second
	DefaultConnectTimeout   = 10 * time.Second
	DefaultKVMaxKeyBytes    = 1 << 10
	DefaultKVMaxValueBytes  = 256 << 10
	DefaultKVQuotaBytes     = 64 << 20

	// MaxKVKeyBytes bounds Options.KVMaxKeyBytes: a KV key is part of a
	// B-tree index entry, and PostgreSQL refuses entries past about 2.7 kB.
	MaxKVKeyBytes = 2000

	// maxTxAttempts bounds the runs of a transaction that lost to a
	// serialization failure or a deadlock (SQLSTATE 40001, 40P01).
	maxTxAttempts = 10
)

// Options configure a Store. Only DSN is required.
type Options struct {
	// DSN is the PostgreSQL connection string (store.dsn), as a URL
	// (postgres://user:password@host:5432/db?sslmode=require) or as
	// key=value pairs (host=… user=… dbname=…).
	DSN string

	// MaxConns bounds the connection pool; zero takes pool_max_conns from
	// the DSN, or else DefaultMaxConns. The change feed holds two more
	// connections of its own.
	MaxConns int32

	// WriteGroups bounds the transactions of commits and creations under
	// way at once. The ones that arrive while one is under way share the
	// next; another starts only for a backlog (groups.go). Zero takes
	// DefaultWriteGroups.
	WriteGroups int

	// StatementTimeout is set as statement_timeout on every connection,
	// and as idle_in_transaction_session_timeout, so that no statement and
	// no abandoned transaction holds locks for long; zero takes
	// DefaultStatementTimeout, a negative value turns both off.
	StatementTimeout time.Duration

	// ConnectTimeout bounds one connection attempt when the DSN does not
	// set connect_timeout; zero takes DefaultConnectTimeout.
	ConnectTimeout time.Duration

	// Logger receives the store's own messages (the change feed's
	// reconnections). nil means slog.Default().
	Logger *slog.Logger

	// Clock, when set, is the time leases and claims are judged by: its
	// Now() is passed to the database as the current time. Tests set it to
	// a conformance.FakeClock. nil means the database's clock
	// (clock_timestamp()), the one clock every node shares; only durations
	// cross machines (see RegisterNode).
	Clock runtime.Clock

	// Schema is the PostgreSQL schema the tables live in, created when
	// missing; zero takes DefaultSchema. It must match [a-z_][a-z0-9_]{0,62}.
	Schema string

	// KVMaxKeyBytes and KVMaxValueBytes bound one plugin KV entry
	// (runtime.ErrKVTooLarge past them); KVQuotaBytes bounds the sum of
	// key and value sizes held by one (tenant, plugin)
	// (runtime.ErrKVQuota). Zero takes the Default… value. KVMaxKeyBytes
	// may not pass MaxKVKeyBytes.
	KVMaxKeyBytes   int
	KVMaxValueBytes int
	KVQuotaBytes    int64
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.WriteGroups <= 0 {
		o.WriteGroups = DefaultWriteGroups
	}
	if o.StatementTimeout == 0 {
		o.StatementTimeout = DefaultStatementTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.KVMaxKeyBytes <= 0 {
		o.KVMaxKeyBytes = DefaultKVMaxKeyBytes
	}
	if o.KVMaxValueBytes <= 0 {
		o.KVMaxValueBytes = DefaultKVMaxValueBytes
	}
	if o.KVQuotaBytes <= 0 {
		o.KVQuotaBytes = DefaultKVQuotaBytes
	}
	return o
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Store is runtime.Store on PostgreSQL. Any number of processes may open
// the same database and schema at once; each Open is one Store instance of
// the change feed.
//
// Safe for concurrent use. Close waits for the calls in progress.
type Store struct {
	pool   *pgxpool.Pool
	connCf *pgx.ConnConfig // for the change feed's own connections
	opts   Options
	log    *slog.Logger
	where  string // the redacted DSN, for messages
	feed   *feed

	mu     sync.RWMutex // read-held by every call, write-held by Close
	closed bool
	// closing is cancelled by Close: the groups of writes still under
	// way, whose callers gave up waiting, stop.
	closing     context.Context
	stopClosing context.CancelFunc

	writes writeQueue // the commits and creations queued; groups.go
	// writeGroupHook, when set (tests), is called before a group of
	// writes is written, with its size.
	writeGroupHook func(n int)

	kvMu     sync.Mutex
	kvQueues map[kvScope]*kvQueue // the KV writes of each (tenant, plugin); kvwrites.go
	// kvCommits counts the transactions that wrote KV (tests).
	kvCommits atomic.Int64
	// kvBatchHook, when set (tests), is called before a batch of KV writes
	// is written, with its size.
	kvBatchHook func(tenant, plugin string, n int)
}

var (
	_ runtime.Store      = (*Store)(nil)
	_ runtime.ChangeFeed = (*Store)(nil)
)

// Open connects to PostgreSQL, brings the schema up to the version this
// binary knows (under a transaction-scoped advisory lock, so that nodes
// starting together do not race) and starts the change feed. It refuses,
// with a one-line message that says what to do and never holds the
// password:
//   - an empty or malformed DSN;
//   - a server it cannot reach, or that refuses the login;
//   - a database whose schema is newer than this binary knows.
func Open(ctx context.Context, opts Options) (*Store, error) {
	maxConns := opts.MaxConns
	opts = opts.withDefaults()
	if !schemaName.MatchString(opts.Schema) {
		return nil, fmt.Errorf("pgstore: schema %q is not a valid schema name: use lower-case letters, digits and _, starting with a letter or _, at most 63 characters", opts.Schema)
	}
	if opts.KVMaxKeyBytes > MaxKVKeyBytes {
		return nil, fmt.Errorf("pgstore: a KV key limit of %d bytes is over the %d PostgreSQL can index; lower it", opts.KVMaxKeyBytes, MaxKVKeyBytes)
	}
	if strings.TrimSpace(opts.DSN) == "" {
		return nil, errors.New("pgstore: store.dsn is empty; set it to a PostgreSQL connection string (postgres://user:password@host:5432/database); see docs/OPERATIONS.md")
	}
	where := RedactDSN(opts.DSN)
	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgstore: store.dsn is not a valid PostgreSQL connection string: %s; see docs/OPERATIONS.md", scrub(opts.DSN, parseCause(err)))
	}
	if maxConns > 0 || !strings.Contains(opts.DSN, "pool_max_conns") {
		cfg.MaxConns = opts.MaxConns
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout <= 0 {
		cc.ConnectTimeout = opts.ConnectTimeout
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["search_path"] = opts.Schema
	if opts.StatementTimeout > 0 {
		ms := strconv.FormatInt(max(opts.StatementTimeout.Milliseconds(), 1), 10)
		cc.RuntimeParams["statement_timeout"] = ms
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = ms
	}
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = "agenthost"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: store.dsn is not a valid PostgreSQL connection string: %s; see docs/OPERATIONS.md", scrub(opts.DSN, oneLine(err)))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connectError(opts.DSN, where, err)
	}
	s := &Store{pool: pool, connCf: cc.Copy(), opts: opts, log: opts.Logger, where: where}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	f, err := startFeed(ctx, s)
	if err != nil {
		pool.Close()
		return nil, connectError(opts.DSN, where, err)
	}
	s.feed = f
	s.closing, s.stopClosing = context.WithCancel(context.Background())
	return s, nil
}

// connectError is the one-line message of a failed connection.
func connectError(dsn, where string, err error) error {
	cause := scrub(dsn, oneLine(err))
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "28P01" || pe.Code == "28000":
			return fmt.Errorf("pgstore: PostgreSQL at %s refused the login: %s; check the user and password in store.dsn", where, cause)
		case pe.Code == "3D000":
			return fmt.Errorf("pgstore: PostgreSQL at %s has no such database: %s; create it (createdb) or name another one in store.dsn", where, cause)
		}
	}
	return fmt.Errorf("pgstore: cannot reach PostgreSQL at %s: %s; check store.dsn and that the server is running", where, cause)
}

// parseCause is the reason pgx gives for a DSN it cannot parse, without
// the DSN it quotes.
func parseCause(err error) string {
	msg := oneLine(err)
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if i := strings.Index(msg, "`: "); i >= 0 && strings.HasPrefix(msg, "cannot parse `") {
			msg = msg[i+3:]
		}
	}
	return msg
}

// oneLine flattens a multi-line error message (pgx lists each address it
// tried on its own line).
func oneLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n\t", "; ")
	return strings.ReplaceAll(msg, "\n", "; ")
}

// Close stops the change feed and closes the pool, after the calls in
// progress return. It is safe to call more than once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.feed != nil {
		s.feed.close()
	}
	s.stopClosing()
	s.pool.Close()
	return nil
}

// enter read-locks the store for one call; the caller must call s.leave.
func (s *Store) enter() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return fmt.Errorf("pgstore: %w", runtime.ErrClosed)
	}
	return nil
}

func (s *Store) leave() { s.mu.RUnlock() }

// nowParam is the $now of a statement: the Clock's time in Unix ms, or
// NULL, which makes the statement read the database's clock.
func (s *Store) nowParam() *int64 {
	if s.opts.Clock == nil {
		return nil
	}
	ms := s.opts.Clock.Now().UnixMilli()
	return &ms
}

// dbNow is the SQL for the current time in Unix ms, given $now in
// parameter n.
func dbNow(n int) string {
	return fmt.Sprintf("coalesce($%d::bigint, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)", n)
}

// fail gives an error its context: the store's own errors (they start with
// "pgstore:") pass as they are, anything else is a failure of the database
// or the connection and wraps runtime.ErrStoreUnavailable.
func fail(what string, err error) error {
	if strings.HasPrefix(err.Error(), "pgstore:") {
		return err
	}
	return fmt.Errorf("pgstore: %s: %w: %w", what, runtime.ErrStoreUnavailable, err)
}

// txFunc is one attempt of a transaction on conn. It sends BEGIN in its
// first batch and COMMIT in its last; returning without a COMMIT rolls the
// transaction back. It must set its results afresh on every attempt.
type txFunc func(ctx context.Context, conn *pgx.Conn) error

// inTx runs fn on one connection of the pool, again (after a short,
// jittered pause) when PostgreSQL aborted it with a serialization failure
// or a deadlock, and, when retryUnique is set, a unique violation (two
// creations of one ID racing: the second attempt reads the first one's
// row). Any other error is returned at once: after a lost connection
// the transaction may have committed, and only the caller can decide.
func (s *Store) inTx(ctx context.Context, retryUnique bool, fn txFunc) error {
	for attempt := 1; ; attempt++ {
		err := s.txOnce(ctx, fn)
		if err == nil || !retryable(err, retryUnique) || attempt == maxTxAttempts {
			return err
		}
		pause := time.Duration(attempt)*time.Millisecond + rand.N(2*time.Millisecond)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (s *Store) txOnce(ctx context.Context, fn txFunc) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release() // destroys the connection if it is still in a transaction
	conn := pc.Conn()
	err = fn(ctx, conn)
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, _ = conn.Exec(rctx, "ROLLBACK")
		cancel()
	}
	return err
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func retryable(err error, unique bool) bool {
	switch sqlState(err) {
	case "40001", "40P01":
		return true
	case "23505":
		return unique
	}
	return false
}

// queryOne reads the next result of a batch as one row; found is false
// when it has none.
func queryOne(br pgx.BatchResults, dest ...any) (found bool, err error) {
	err = br.QueryRow().Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// execAll reads n results of a batch that return no rows.
func execAll(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// sendWrites sends b, whose last query is COMMIT, and reads every result.
func sendWrites(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) error {
	br := conn.SendBatch(ctx, b)
	err := execAll(br, b.Len())
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

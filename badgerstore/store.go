package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/agenthost/agenthost/runtime"
)

// formatVersion is the key layout this package writes. Open refuses a
// format it does not know, so a future layout is migrated, never misread.
// Format 2 is format 1's key layout with run records in the binary form
// (encodeRecord); it reads format 1's JSON records as well, so Open moves
// a format-1 store to 2 (after which an older agenthost refuses it
// instead of misreading a binary record), and each Run's next commit
// rewrites its record. Format 3 is format 2 with each tool of a Run's
// spec carrying the descriptor the builder shows the model (runcodec
// version 0x02); it reads format 2's records, which have none, so Open
// moves a format-1 or -2 store to 3, after which an agenthost that knows
// only 0x01 snapshots refuses the directory instead of failing on each
// Run written since.
const formatVersion = 3

// oldestFormat is the oldest format Open takes, and moves to formatVersion.
const oldestFormat = 1

// Defaults of Options.
const (
	DefaultKVMaxKeyBytes   = 1 << 10
	DefaultKVMaxValueBytes = 256 << 10
	DefaultKVQuotaBytes    = 64 << 20
	DefaultGCInterval      = 5 * time.Minute
	DefaultGCDiscardRatio  = 0.5
	// maxTxnRetries bounds the internal retries of a transaction that lost
	// a Badger conflict to a concurrent one.
	maxTxnRetries = 64
)

// Options configure a Store. The zero value is the production default.
type Options struct {
	// NoSyncWrites turns Badger's SyncWrites off. The default (false) makes
	// every acknowledged commit survive kill -9 and power loss. Turning it
	// off raises the commit rate many times over (docs/DESIGN.md §10), at a price:
	// a commit that was acknowledged may be lost on power loss or kill -9,
	// and with it an EffectDispatched that an executor already acted on.
	// Only for data you can afford to lose.
	NoSyncWrites bool

	// KVMaxKeyBytes and KVMaxValueBytes bound one plugin KV entry
	// (runtime.ErrKVTooLarge past them); KVQuotaBytes bounds the sum of
	// key and value sizes held by one (tenant, plugin)
	// (runtime.ErrKVQuota). Zero takes the Default… value.
	KVMaxKeyBytes   int
	KVMaxValueBytes int
	KVQuotaBytes    int64

	// GCInterval is how often the background value-log GC runs; zero takes
	// DefaultGCInterval, a negative value disables it. GCDiscardRatio is
	// passed to Badger's RunValueLogGC; zero takes DefaultGCDiscardRatio.
	GCInterval     time.Duration
	GCDiscardRatio float64

	// Logger receives the store's own messages, and Badger's warnings and
	// errors (Badger's info and debug lines go to Debug). nil means
	// slog.Default().
	Logger *slog.Logger

	// Clock is what RenewNode reads to tell an expired lease. nil means the
	// system clock.
	Clock runtime.Clock

	// SnapshotCacheBytes bounds the snapshots LoadRun answers from memory
	// without a Badger read (snapcache.go); zero takes
	// DefaultSnapshotCacheBytes, a negative value turns the cache off.
	SnapshotCacheBytes int

	// MaxGroupCommits bounds the Run creations and commits that share one
	// transaction, and so one sync (groupcommit.go); zero takes
	// DefaultMaxGroupCommits, 1 gives each a transaction and a sync of
	// its own.
	MaxGroupCommits int
}

// DefaultSnapshotCacheBytes is the snapshot cache's bound when Options sets
// none: about 40,000 Runs of a few steps.
const DefaultSnapshotCacheBytes = 64 << 20

func (o Options) withDefaults() Options {
	if o.KVMaxKeyBytes <= 0 {
		o.KVMaxKeyBytes = DefaultKVMaxKeyBytes
	}
	if o.KVMaxValueBytes <= 0 {
		o.KVMaxValueBytes = DefaultKVMaxValueBytes
	}
	if o.KVQuotaBytes <= 0 {
		o.KVQuotaBytes = DefaultKVQuotaBytes
	}
	if o.SnapshotCacheBytes == 0 {
		o.SnapshotCacheBytes = DefaultSnapshotCacheBytes
	}
	if o.MaxGroupCommits <= 0 {
		o.MaxGroupCommits = DefaultMaxGroupCommits
	}
	if o.GCInterval == 0 {
		o.GCInterval = DefaultGCInterval
	}
	if o.GCDiscardRatio <= 0 || o.GCDiscardRatio >= 1 {
		o.GCDiscardRatio = DefaultGCDiscardRatio
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = runtime.SystemClock{}
	}
	return o
}

// Store is runtime.Store on a Badger directory. Open one per directory and
// per process; Badger's directory lock refuses a second.
//
// Safe for concurrent use. Close waits for the calls in progress.
type Store struct {
	dir  string
	db   *badger.DB
	opts Options
	log  *slog.Logger
	// generation is this open's number. Nodes registered under an earlier
	// one belong to a process that no longer holds the directory lock, so
	// they are dead (RATIONALE.md, "Why does the Badger directory lock make
	// earlier incarnations dead?").
	generation uint64

	mu     sync.RWMutex // read-held by every call, write-held by Close
	closed bool
	stopGC chan struct{}
	gcDone chan struct{}

	kvMu      sync.Mutex
	kvWriters map[string]*leaderQueue[*kvOp] // by tenant and plugin: KVSet's write queues
	kvView    kvView                         // the read transaction KVGet shares while no KV write begins (kvview.go)

	commits *commitQueue // the Run creations and commits waiting to share a transaction (groupcommit.go)
	totals  tenantTotals // each tenant's stored bytes, kept by the writes (usage.go)
	snaps   *snapCache   // the snapshots written or read lately, for LoadRun (snapcache.go)

	// afterCommitWrite, when set (by tests), runs in Commit after its
	// transaction committed and before its snapshot is cached.
	afterCommitWrite func()
}

var _ runtime.Store = (*Store)(nil)

// Open opens the agenthost store in dir, creating and initialising it when
// dir is missing or empty. It refuses, and never recreates or wipes:
//   - a dir another process has open ("another agenthost process is
//     using DIR");
//   - a non-empty dir that is not a Badger directory (no MANIFEST);
//   - a Badger directory that is not an agenthost store, or was written
//     in a format this binary does not read;
//   - a damaged directory.
func Open(dir string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	dir = absDir(dir)
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	bopts := badger.DefaultOptions(dir).
		WithSyncWrites(!opts.NoSyncWrites).
		WithLogger(badgerLogger{opts.Logger}).
		WithNumVersionsToKeep(1)
	db, err := openBadger(bopts)
	if err != nil {
		if strings.Contains(err.Error(), "Cannot acquire directory lock") {
			return nil, fmt.Errorf("badgerstore: another agenthost process is using %s; stop it, or give this process another data directory: %w", dir, err)
		}
		return nil, fmt.Errorf("badgerstore: %s is damaged or unreadable; restore it from a backup, or move it aside to start with an empty store: %w", dir, err)
	}
	s := &Store{dir: dir, db: db, opts: opts, log: opts.Logger, stopGC: make(chan struct{}), gcDone: make(chan struct{}),
		snaps: newSnapCache(opts.SnapshotCacheBytes), commits: newCommitQueue(opts.MaxGroupCommits)}
	if err := s.initMeta(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if opts.GCInterval > 0 {
		go s.gcLoop()
	} else {
		close(s.gcDone)
	}
	return s, nil
}

// openBadger opens Badger, turning a panic on a damaged directory into an
// error.
func openBadger(o badger.Options) (db *badger.DB, err error) {
	defer func() {
		if p := recover(); p != nil {
			db, err = nil, fmt.Errorf("badger panicked while opening: %v", p)
		}
	}()
	return badger.Open(o)
}

// checkDir creates dir when it is missing, and refuses a non-empty dir that
// holds no Badger MANIFEST: it may be someone's files, and Badger would
// start a new database among them.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("badgerstore: create data directory %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("badgerstore: data directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("badgerstore: data directory %s is a file, not a directory; point the store at a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("badgerstore: read data directory %s: %w", dir, err)
	}
	var others []string
	for _, e := range entries {
		switch e.Name() {
		case badger.ManifestFilename:
			return nil
		case "LOCK": // Badger's pid file, left behind by a killed process
		default:
			others = append(others, e.Name())
		}
	}
	if len(others) > 0 {
		if len(others) > 3 {
			others = append(others[:3], "…")
		}
		return fmt.Errorf("badgerstore: %s is not empty and is not a Badger directory (no %s; it holds %s); "+
			"it is not an agenthost store, so it is left alone: give the store an empty or an existing agenthost directory",
			dir, badger.ManifestFilename, strings.Join(others, ", "))
	}
	return nil
}

// initMeta checks, or writes on a fresh store, the format version, and
// starts a new open generation.
func (s *Store) initMeta() error {
	return s.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(metaKey(metaFormat))
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
			it := txn.NewIterator(badger.IteratorOptions{})
			it.Rewind()
			nonEmpty := it.Valid()
			it.Close()
			if nonEmpty {
				return fmt.Errorf("badgerstore: %s is a Badger database but not an agenthost store (it has no format key); "+
					"give the store an empty or an existing agenthost directory", s.dir)
			}
			if err := txn.Set(metaKey(metaFormat), []byte(strconv.Itoa(formatVersion))); err != nil {
				return fmt.Errorf("badgerstore: initialise %s: %w", s.dir, err)
			}
		case err != nil:
			return fmt.Errorf("badgerstore: read the format version of %s: %w", s.dir, err)
		default:
			v, err := item.ValueCopy(nil)
			if err != nil {
				return fmt.Errorf("badgerstore: read the format version of %s: %w", s.dir, err)
			}
			n, err := strconv.Atoi(string(v))
			if err != nil || n < oldestFormat || n > formatVersion {
				return fmt.Errorf("badgerstore: %s holds store format %q, and this agenthost reads formats %d to %d only; "+
					"run the agenthost version that wrote it, or migrate the store", s.dir, v, oldestFormat, formatVersion)
			}
			if n < formatVersion {
				if err := txn.Set(metaKey(metaFormat), []byte(strconv.Itoa(formatVersion))); err != nil {
					return fmt.Errorf("badgerstore: move %s to store format %d: %w", s.dir, formatVersion, err)
				}
			}
		}
		var gen uint64
		item, err = txn.Get(metaKey(metaOpenGen))
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("badgerstore: read the open generation of %s: %w", s.dir, err)
		default:
			v, err := item.ValueCopy(nil)
			if err == nil {
				gen, err = readBE64(v)
			}
			if err != nil {
				return fmt.Errorf("badgerstore: read the open generation of %s: %w", s.dir, err)
			}
		}
		s.generation = gen + 1
		return txn.Set(metaKey(metaOpenGen), be64(s.generation))
	})
}

// Close stops the value-log GC and closes Badger, after the calls in
// progress return. It is safe to call more than once.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.stopGC)
	<-s.gcDone
	s.kvView.close()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("badgerstore: close %s: %w", s.dir, err)
	}
	return nil
}

// enter read-locks the store for one call; the caller must call s.leave.
func (s *Store) enter() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return fmt.Errorf("badgerstore: %s: %w", s.dir, runtime.ErrClosed)
	}
	return nil
}

func (s *Store) leave() { s.mu.RUnlock() }

// update runs fn in a read-write transaction and commits it, running it
// again when Badger reports a conflict with a concurrent transaction. fn
// must set its results afresh on every run.
func (s *Store) update(ctx context.Context, fn func(txn *badger.Txn) error) error {
	for attempt := 1; ; attempt++ {
		err := s.db.Update(fn)
		if !errors.Is(err, badger.ErrConflict) {
			return err
		}
		if attempt == maxTxnRetries {
			return fmt.Errorf("badgerstore: a transaction lost %d conflicts in a row: %w; retry later", attempt, runtime.ErrStoreUnavailable)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("badgerstore: gave up retrying a conflicting transaction: %w", err)
		}
	}
}

// gcLoop runs Badger's value-log GC every GCInterval until Close.
func (s *Store) gcLoop() {
	defer close(s.gcDone)
	t := time.NewTicker(s.opts.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopGC:
			return
		case <-t.C:
		}
		for rewrites := 0; ; rewrites++ {
			err := s.db.RunValueLogGC(s.opts.GCDiscardRatio)
			if err == nil {
				continue
			}
			if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
				s.log.Warn("badgerstore: value-log GC failed", "dir", s.dir, "err", err)
			}
			if rewrites > 0 {
				s.log.Debug("badgerstore: value-log GC", "dir", s.dir, "files_rewritten", rewrites)
			}
			break
		}
	}
}

// badgerLogger routes Badger's log lines to slog: warnings and errors as
// such, its chatty info and debug lines at Debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	b.l.Error("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (b badgerLogger) Infof(f string, a ...any) {
	if !b.l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	b.l.Debug("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (b badgerLogger) Debugf(f string, a ...any) {
	if !b.l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	b.l.Debug("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}

// absDir is used in messages so that an operator sees where the store is.
func absDir(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		return a
	}
	return dir
}

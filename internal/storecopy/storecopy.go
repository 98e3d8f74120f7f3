// Package storecopy is `agenthost store copy`: it copies every tenant's
// Runs, with their whole event logs and command IDs, and every plugin's KV
// from one store into another, empty one (Badger ↔ PostgreSQL), and
// refuses a source a live node drives, a non-empty target and pruned Runs
// it cannot recreate. Copy is the copy; NewCommand is its cobra command.
package storecopy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/pgstore"
	"github.com/agenthost/agenthost/runtime"
)

// Options say what Copy copies and how: the flags of `store copy`.
type Options struct {
	// From and To are the source and the target: badger:DIR or
	// postgres:DSN (a postgres:// URL alone will do; postgres: alone takes
	// the DSN from $AGENTHOST_STORE_DSN).
	From, To string
	// Schema is the PostgreSQL schema on either side (default agenthost).
	Schema string
	// Parallel is the number of sessions copied at once (at least 1).
	Parallel int
	// SkipPruned leaves out the Runs whose event log retention has pruned,
	// instead of refusing the source.
	SkipPruned bool
	// SkipKV copies no plugin KV, for a source that cannot list its keys.
	SkipKV bool
	// TenantsFrom is a config whose tenants are copied, for a source that
	// cannot list its own; nil when there is none.
	TenantsFrom *config.Config
	// Log receives the stores' warnings.
	Log *slog.Logger
}

// NewCommand returns `store copy`, which package main adds under `store`.
// loadConfig returns the config of --config or $AGENTHOST_CONFIG, or nil
// when neither is given.
func NewCommand(loadConfig func() (*config.Config, error)) *cobra.Command {
	o := Options{}
	cmd := &cobra.Command{
		Use:   "copy --from SPEC --to SPEC",
		Short: "Copy every tenant's Runs and plugin KV from one store to another",
		Long: `copy copies everything a store holds for every tenant into an empty store:
each Run with its whole event log (recreated with CreateRun and Commits that
replay the log, so the target's indexes are its own; the final snapshot is
byte for byte the source's), in the order of its session, with the command
IDs the source recorded; and every plugin's KV entries. Nothing of node or
session ownership is copied: the target starts with no owners, and the first
node to start on it recovers the sessions that have Runs in flight. (The
fencing epoch of such a session is carried, so the next owner's is higher
than any in its Runs' logs.)

A SPEC is badger:DIR or postgres:DSN (a postgres://… URL alone will do too).
postgres: with nothing after it takes the DSN from $AGENTHOST_STORE_DSN, which
keeps the password off the command line.

The target must be empty, and the source must not be in use: a Badger
directory is locked by the process that has it open, so copy refuses while
agenthost runs on it; for PostgreSQL, stop every node first (copy refuses
when a live node owns a session, but cannot see an idle one).

Runs whose event log retention has pruned cannot be recreated from their
log: copy refuses a source that has them, unless --skip-pruned leaves them
out (their snapshots are then not in the target).

It prints one line per tenant: Runs, Runs in flight, events and KV entries.`,
		Example: `  agenthost store copy --from badger:/var/lib/agenthost/data --to postgres://agenthost@db.internal:5432/agenthost
  AGENTHOST_STORE_DSN='postgres://agenthost:…@db.internal/agenthost' agenthost store copy --from badger:data --to postgres:
  agenthost store copy --from postgres: --to badger:/var/lib/agenthost/back --config agenthost.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig()
			if err != nil {
				return err
			}
			if cfg != nil {
				o.TenantsFrom = cfg
				if o.Schema == "" {
					o.Schema = cfg.Store.Postgres.Schema
				}
			}
			o.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return Copy(ctx, cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.From, "from", "", "the source store: badger:DIR or postgres:DSN")
	f.StringVar(&o.To, "to", "", "the target store, which must be empty: badger:DIR or postgres:DSN")
	f.StringVar(&o.Schema, "schema", "", "the PostgreSQL schema on either side (default: store.postgres.schema of --config, else agenthost)")
	f.IntVar(&o.Parallel, "parallel", 8, "sessions copied at once")
	f.BoolVar(&o.SkipPruned, "skip-pruned", false, "leave out the Runs whose event log retention has pruned, instead of refusing")
	f.BoolVar(&o.SkipKV, "skip-kv", false, "copy no plugin KV (for a source that cannot list its KV keys)")
	return cmd
}

// storeSpec is one side of a copy.
type storeSpec struct {
	driver string // config.DriverBadger or config.DriverPostgres
	where  string // the directory, or the DSN
}

// String names the store with the DSN's password hidden.
func (s storeSpec) String() string {
	if s.driver == config.DriverPostgres {
		return "postgres " + pgstore.RedactDSN(s.where)
	}
	return "badger " + s.where
}

// parseStoreSpec reads badger:DIR, postgres:DSN, postgres: (the DSN from
// $AGENTHOST_STORE_DSN) or a bare postgres:// URL.
func parseStoreSpec(flag, spec string) (storeSpec, error) {
	if strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://") {
		return storeSpec{driver: config.DriverPostgres, where: spec}, nil
	}
	driver, rest, ok := strings.Cut(spec, ":")
	switch {
	case ok && driver == config.DriverBadger:
		if rest == "" {
			return storeSpec{}, fmt.Errorf("store copy: %s badger: names no directory: write badger:DIR", flag)
		}
		abs, err := filepath.Abs(rest)
		if err != nil {
			return storeSpec{}, fmt.Errorf("store copy: %s %s: %w", flag, spec, err)
		}
		return storeSpec{driver: config.DriverBadger, where: abs}, nil
	case ok && driver == config.DriverPostgres:
		if strings.TrimSpace(rest) == "" {
			rest = os.Getenv(config.EnvPrefix + "_STORE_DSN")
			if strings.TrimSpace(rest) == "" {
				return storeSpec{}, fmt.Errorf("store copy: %s postgres: names no DSN and AGENTHOST_STORE_DSN is empty: write postgres:DSN, or set AGENTHOST_STORE_DSN", flag)
			}
		}
		return storeSpec{driver: config.DriverPostgres, where: rest}, nil
	}
	return storeSpec{}, fmt.Errorf("store copy: %s %q is not a store: want badger:DIR or postgres:DSN", flag, pgstore.RedactDSN(spec))
}

// exporter is the export path of a concrete store: everything it holds,
// whatever tenants a config declares, which the runtime.Store port cannot
// list. badgerstore.Store has it.
type exporter interface {
	// ExportSessions calls fn for every session that holds a Run, with its
	// fencing epoch.
	ExportSessions(ctx context.Context, fn func(tenant, session string, epoch uint64) error) error
	// ExportCommands calls fn for each command ID recorded for a Run, in
	// Seq order (the creation command with Seq 1), with the Seq it produced.
	ExportCommands(ctx context.Context, tenant, runID string, fn func(commandID string, seq int64) error) error
	// ExportKV calls fn for every plugin KV entry.
	ExportKV(ctx context.Context, fn func(tenant, plugin string, key, value []byte) error) error
}

var _ exporter = (*badgerstore.Store)(nil)

// openCopyStore opens one side of a copy. A source must exist: a missing
// or empty Badger directory is refused rather than created.
func openCopyStore(ctx context.Context, spec storeSpec, source bool, o Options) (runtime.Store, error) {
	side := "--to"
	if source {
		side = "--from"
	}
	if spec.driver == config.DriverPostgres {
		st, err := pgstore.Open(ctx, pgstore.Options{DSN: spec.where, Schema: o.Schema, Logger: o.Log, MaxConns: int32(o.Parallel + 2)})
		if err != nil {
			return nil, fmt.Errorf("store copy: %s %s: %w", side, spec, err)
		}
		return st, nil
	}
	if source {
		entries, err := os.ReadDir(spec.where)
		if err != nil || len(entries) == 0 {
			return nil, fmt.Errorf("store copy: --from %s: there is no store in that directory (is it the data_dir of your config?)", spec)
		}
	}
	st, err := badgerstore.Open(spec.where, badgerstore.Options{Logger: o.Log, GCInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("store copy: %s %s: %w", side, spec, err)
	}
	return st, nil
}

// sessionRef is one session of the source.
type sessionRef struct {
	tenant, session string
	epoch           uint64
}

// tenantCounts is what was copied of one tenant.
type tenantCounts struct {
	runs, inFlight, events, kv, pruned int
}

// copier copies one store into another.
type copier struct {
	src, dst runtime.Store
	ex       exporter // the source's export path; nil when it has none
	o        Options

	nodeMu sync.Mutex
	node   string // the incarnation that raises epochs on the target

	mu     sync.Mutex
	counts map[string]*tenantCounts
}

func (c *copier) count(tenant string, f func(*tenantCounts)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tc := c.counts[tenant]
	if tc == nil {
		tc = &tenantCounts{}
		c.counts[tenant] = tc
	}
	f(tc)
}

// Copy copies the store o.From into the empty store o.To and writes one
// line per tenant to out. It refuses, before it writes anything, a source
// a live node drives, a target that is not empty, and (unless
// o.SkipPruned) a source with pruned Runs.
func Copy(ctx context.Context, out io.Writer, o Options) (err error) {
	if o.From == "" || o.To == "" {
		return errors.New("store copy: both --from and --to are required: badger:DIR or postgres:DSN")
	}
	if o.Parallel < 1 {
		return fmt.Errorf("store copy: --parallel %d: must be at least 1", o.Parallel)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	from, err := parseStoreSpec("--from", o.From)
	if err != nil {
		return err
	}
	to, err := parseStoreSpec("--to", o.To)
	if err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("store copy: --from and --to name the same store (%s)", from)
	}
	started := time.Now()
	src, err := openCopyStore(ctx, from, true, o)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := openCopyStore(ctx, to, false, o)
	if err != nil {
		return err
	}
	defer dst.Close()
	c := &copier{src: src, dst: dst, o: o, counts: map[string]*tenantCounts{}}
	c.ex, _ = src.(exporter)
	if c.ex == nil && !o.SkipKV {
		return fmt.Errorf("store copy: --from %s cannot list its plugin KV keys yet: pass --skip-kv to copy the Runs without the plugins' KV", from)
	}

	if err := c.refuseLiveOwners(ctx, from); err != nil {
		return err
	}
	sessions, err := c.sessions(ctx, from)
	if err != nil {
		return err
	}
	tenants := map[string]bool{}
	for _, s := range sessions {
		tenants[s.tenant] = true
	}
	if err := c.refuseNonEmpty(ctx, to, tenants); err != nil {
		return err
	}
	if err := c.refusePruned(ctx, tenants); err != nil {
		return err
	}

	if err := c.copySessions(ctx, sessions); err != nil {
		return err
	}
	if !o.SkipKV {
		if err := c.copyKV(ctx); err != nil {
			return err
		}
	}
	return c.report(out, from, to, time.Since(started))
}

// refuseLiveOwners refuses a source a live node still drives: a session
// with Runs in flight whose owner is not orphaned. (A Badger source is
// locked by this process, so none of its nodes is live.)
func (c *copier) refuseLiveOwners(ctx context.Context, from storeSpec) error {
	orphaned, err := c.src.OrphanedSessions(ctx, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("store copy: --from %s: %w", from, err)
	}
	dead := map[[2]string]bool{}
	for _, s := range orphaned {
		dead[[2]string{s.Tenant, s.Session}] = true
	}
	return c.activeSessions(ctx, c.src, func(s runtime.SessionOwner) error {
		if s.Owner != "" && !dead[[2]string{s.Tenant, s.Session}] {
			return fmt.Errorf("store copy: --from %s is in use: the live node %s owns session %s/%s; stop every agenthost node on it first (after a crash, wait lease_ttl for the lease to run out)",
				from, s.Owner, s.Tenant, s.Session)
		}
		return nil
	})
}

// activeSessions pages through ActiveSessions.
func (c *copier) activeSessions(ctx context.Context, st runtime.Store, fn func(runtime.SessionOwner) error) error {
	const page = 1000
	var afterT, afterS string
	for {
		ss, err := st.ActiveSessions(ctx, afterT, afterS, page)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if err := fn(s); err != nil {
				return err
			}
		}
		if len(ss) < page {
			return nil
		}
		afterT, afterS = ss[len(ss)-1].Tenant, ss[len(ss)-1].Session
	}
}

// allStatuses are the statuses a Run can have, for RunsByStatus.
var allStatuses = []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting,
	loop.StatusCompleted, loop.StatusFailed, loop.StatusCancelled}

// runIDs pages through RunsByStatus.
func runIDs(ctx context.Context, st runtime.Store, tenant string, status loop.Status, fn func(id string) error) error {
	const page = 1000
	for after := ""; ; {
		ids, err := st.RunsByStatus(ctx, tenant, status, after, page)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := fn(id); err != nil {
				return err
			}
		}
		if len(ids) < page {
			return nil
		}
		after = ids[len(ids)-1]
	}
}

// sessions lists the source's sessions: through its export path, or, for
// a store without one, from the tenants of --config (every Run of each,
// by status, and the session each is in).
func (c *copier) sessions(ctx context.Context, from storeSpec) ([]sessionRef, error) {
	var out []sessionRef
	if c.ex != nil {
		err := c.ex.ExportSessions(ctx, func(tenant, session string, epoch uint64) error {
			out = append(out, sessionRef{tenant, session, epoch})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("store copy: --from %s: listing sessions: %w", from, err)
		}
		return out, nil
	}
	if c.o.TenantsFrom == nil {
		return nil, fmt.Errorf("store copy: --from %s cannot list its tenants: pass --config FILE, whose tenants are the ones copied", from)
	}
	epochs := map[[2]string]uint64{}
	if err := c.activeSessions(ctx, c.src, func(s runtime.SessionOwner) error {
		epochs[[2]string{s.Tenant, s.Session}] = s.Epoch
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store copy: --from %s: %w", from, err)
	}
	seen := map[[2]string]bool{}
	ids := make([]string, 0, len(c.o.TenantsFrom.Tenants))
	for id := range c.o.TenantsFrom.Tenants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, tenant := range ids {
		for _, st := range allStatuses {
			err := runIDs(ctx, c.src, tenant, st, func(id string) error {
				r, err := c.src.LoadRun(ctx, tenant, id)
				if err != nil {
					return err
				}
				k := [2]string{tenant, r.Session}
				if !seen[k] {
					seen[k] = true
					out = append(out, sessionRef{tenant, r.Session, epochs[k]})
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("store copy: --from %s: listing tenant %s's Runs: %w", from, tenant, err)
			}
		}
	}
	return out, nil
}

// errFound stops a scan at its first entry.
var errFound = errors.New("found")

// refuseNonEmpty refuses a target that holds anything of the tenants
// being copied, or any session with work, or (through its export path,
// when it has one) anything at all.
func (c *copier) refuseNonEmpty(ctx context.Context, to storeSpec, tenants map[string]bool) error {
	refuse := func(what string) error {
		return fmt.Errorf("store copy: --to %s is not empty (%s): copy into an empty store (a new directory, or a new database or schema)", to, what)
	}
	if ex, ok := c.dst.(exporter); ok {
		var what string
		err := ex.ExportSessions(ctx, func(tenant, session string, _ uint64) error {
			what = fmt.Sprintf("it has Runs in session %s/%s", tenant, session)
			return errFound
		})
		if err == nil {
			err = ex.ExportKV(ctx, func(tenant, plugin string, _, _ []byte) error {
				what = fmt.Sprintf("it has KV entries of plugin %s of tenant %s", plugin, tenant)
				return errFound
			})
		}
		if errors.Is(err, errFound) {
			return refuse(what)
		}
		if err != nil {
			return fmt.Errorf("store copy: --to %s: %w", to, err)
		}
		return nil
	}
	var what string
	err := c.activeSessions(ctx, c.dst, func(s runtime.SessionOwner) error {
		what = fmt.Sprintf("session %s/%s has Runs in flight", s.Tenant, s.Session)
		return errFound
	})
	for tenant := range tenants {
		for _, st := range allStatuses {
			if err != nil {
				break
			}
			err = runIDs(ctx, c.dst, tenant, st, func(id string) error {
				what = fmt.Sprintf("tenant %s has Run %s", tenant, id)
				return errFound
			})
		}
	}
	if errors.Is(err, errFound) {
		return refuse(what)
	}
	if err != nil {
		return fmt.Errorf("store copy: --to %s: %w", to, err)
	}
	return nil
}

// pruned reports whether a Run's log is gone, or its start is: retention
// pruned it (a terminal Run), so it cannot be replayed.
func (c *copier) pruned(ctx context.Context, tenant, id string) (bool, error) {
	evs, err := c.src.Events(ctx, tenant, id, 1, 1)
	if err != nil {
		return false, err
	}
	return len(evs) == 0 || evs[0].Seq != 1, nil
}

// refusePruned looks for terminal Runs whose logs are pruned before
// anything is written: copy refuses them unless --skip-pruned.
func (c *copier) refusePruned(ctx context.Context, tenants map[string]bool) error {
	if c.o.SkipPruned {
		return nil
	}
	n, example := 0, ""
	for tenant := range tenants {
		for _, st := range []loop.Status{loop.StatusCompleted, loop.StatusFailed, loop.StatusCancelled} {
			err := runIDs(ctx, c.src, tenant, st, func(id string) error {
				p, err := c.pruned(ctx, tenant, id)
				if p {
					if n++; example == "" {
						example = tenant + "/" + id
					}
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("store copy: reading the source's Runs: %w", err)
			}
		}
	}
	if n > 0 {
		return fmt.Errorf("store copy: %d terminal Runs (%s among them) have event logs that retention pruned, and a Run is recreated from its log: pass --skip-pruned to copy everything else without them", n, example)
	}
	return nil
}

// copySessions copies the sessions, o.Parallel at once; each session's
// Runs in order.
func (c *copier) copySessions(ctx context.Context, sessions []sessionRef) error {
	return inParallel(ctx, c.o.Parallel, func(ctx context.Context, emit func(sessionRef) error) error {
		for _, s := range sessions {
			if err := emit(s); err != nil {
				return err
			}
		}
		return nil
	}, c.copySession)
}

// inParallel runs do on every item produce emits, n at a time. The first
// error (of produce or of any do) stops the rest and is returned.
func inParallel[T any](ctx context.Context, n int, produce func(ctx context.Context, emit func(T) error) error,
	do func(ctx context.Context, item T) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan T)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) { errOnce.Do(func() { firstErr = err; cancel() }) }
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for item := range next {
				if ctx.Err() != nil {
					continue
				}
				if err := do(ctx, item); err != nil {
					fail(err)
				}
			}
		}()
	}
	err := produce(ctx, func(item T) error {
		select {
		case next <- item:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err != nil {
		return err
	}
	return ctx.Err()
}

// copySession copies a session's Runs in their order, then carries its
// fencing epoch when it has Runs in flight.
func (c *copier) copySession(ctx context.Context, s sessionRef) error {
	const page = 64
	skipped, live := false, false
	for after := int64(0); ; {
		runs, err := c.src.SessionRuns(ctx, s.tenant, s.session, after, page)
		if err != nil {
			return fmt.Errorf("store copy: reading session %s/%s: %w", s.tenant, s.session, err)
		}
		for _, sr := range runs {
			if sr.Run.Status.Terminal() {
				p, err := c.pruned(ctx, s.tenant, sr.Run.ID)
				if err != nil {
					return fmt.Errorf("store copy: reading run %s/%s: %w", s.tenant, sr.Run.ID, err)
				}
				if p { // refusePruned let it through: --skip-pruned
					skipped = true
					c.count(s.tenant, func(tc *tenantCounts) { tc.pruned++ })
					continue
				}
			} else {
				live = true
			}
			ord, err := c.copyRun(ctx, sr.Run)
			if err != nil {
				return err
			}
			if !skipped && ord != sr.Ordinal {
				return fmt.Errorf("store copy: run %s/%s got place %d in session %s, want %d: is the target in use?", s.tenant, sr.Run.ID, ord, s.session, sr.Ordinal)
			}
		}
		if len(runs) < page {
			break
		}
		after = runs[len(runs)-1].Ordinal
	}
	if live && s.epoch > 0 {
		return c.raiseEpoch(ctx, s)
	}
	return nil
}

// maxCommitEvents bounds the events of one replaying Commit when the log
// has no command boundaries to follow.
const maxCommitEvents = 64

// copyRun recreates one Run on the target: CreateRun with its first
// event, then Commits of the rest of its log, one per command the source
// recorded (with its command ID), the snapshot of each folded with
// loop.Apply and the last one the source's own snapshot. It checks that
// the target's snapshot is the source's, byte for byte in JSON, and
// returns the Run's place in its session.
func (c *copier) copyRun(ctx context.Context, run loop.Run) (int64, error) {
	t, id := run.Tenant, run.ID
	fail := func(what string, err error) (int64, error) {
		return 0, fmt.Errorf("store copy: run %s/%s: %s: %w", t, id, what, err)
	}
	evs, err := c.src.Events(ctx, t, id, 1, 0)
	if err != nil {
		return fail("reading its event log", err)
	}
	if int64(len(evs)) != run.Seq || len(evs) == 0 || evs[0].Seq != 1 || evs[len(evs)-1].Seq != run.Seq {
		return fail("its event log", fmt.Errorf("holds %d events for a Run at Seq %d: the source is inconsistent or in use", len(evs), run.Seq))
	}
	// The command IDs by the Seq their commit produced: one commit may
	// have applied several (Commit.AlsoCommandIDs: settlements of a Run
	// that arrived together), and the copy records them all.
	cmds := map[int64][]string{}
	if c.ex != nil {
		err := c.ex.ExportCommands(ctx, t, id, func(cmd string, seq int64) error {
			cmds[seq] = append(cmds[seq], cmd)
			return nil
		})
		if err != nil {
			return fail("reading its command IDs", err)
		}
	}
	cur, err := loop.Apply(loop.Run{}, evs[0])
	if err != nil {
		return fail("applying run_created", err)
	}
	if run.Seq == 1 {
		cur = run
	}
	first := func(seq int64) string {
		if l := cmds[seq]; len(l) > 0 {
			return l[0]
		}
		return ""
	}
	res, err := c.dst.CreateRun(ctx, runtime.CreateRun{Run: cur, Event: evs[0], CommandID: first(1)})
	if err != nil {
		return fail("creating it on the target", err)
	}
	if res.Duplicate {
		return fail("creating it on the target", fmt.Errorf("its creation command %q was used before on the target: is the target in use?", first(1)))
	}
	for cur.Seq < run.Seq {
		end := min(cur.Seq+maxCommitEvents, run.Seq) // the Seq this commit ends at
		for s := cur.Seq + 1; s <= end; s++ {
			if _, ok := cmds[s]; ok {
				end = s
				break
			}
		}
		batch := evs[cur.Seq:end]
		next := cur
		if end == run.Seq {
			next = run
		} else {
			for _, ev := range batch {
				if next, err = loop.Apply(next, ev); err != nil {
					return fail(fmt.Sprintf("applying event %d (%s)", ev.Seq, ev.Type), err)
				}
			}
		}
		var also []string
		if l := cmds[end]; len(l) > 1 {
			also = l[1:]
		}
		r, err := c.dst.Commit(ctx, runtime.Commit{Tenant: t, Session: run.Session, RunID: id, CommandID: first(end), AlsoCommandIDs: also,
			ExpectedSeq: cur.Seq, Events: batch, Run: next})
		if err != nil {
			return fail(fmt.Sprintf("committing events %d to %d on the target", cur.Seq+1, end), err)
		}
		if r.Duplicate || r.Seq != end {
			return fail("committing on the target", fmt.Errorf("the commit of events %d to %d gave Seq %d (duplicate %t): is the target in use?", cur.Seq+1, end, r.Seq, r.Duplicate))
		}
		cur = next
	}
	got, err := c.dst.LoadRun(ctx, t, id)
	if err != nil {
		return fail("reading it back from the target", err)
	}
	want, _ := json.Marshal(run)
	have, _ := json.Marshal(got)
	if string(want) != string(have) {
		return fail("checking the copy", errors.New("the target's snapshot differs from the source's"))
	}
	c.count(t, func(tc *tenantCounts) {
		tc.runs++
		tc.events += len(evs)
		if !run.Status.Terminal() {
			tc.inFlight++
		}
	})
	return res.Ordinal, nil
}

// raiseEpoch carries a session's fencing epoch to the target, where it
// starts at 0: effects in flight were dispatched under the source's
// epochs, and the next owner's must be higher (so that recovery attaches
// to them, and an event log's epochs never go down). The port raises an
// epoch one claim at a time, so a node of this process claims and
// releases the session until it is there; the session is left with no
// owner.
func (c *copier) raiseEpoch(ctx context.Context, s sessionRef) error {
	for {
		node, err := c.copyNode(ctx, "")
		if err != nil {
			return err
		}
		epoch, err := c.dst.ClaimSession(ctx, s.tenant, s.session, node, time.Now().UnixMilli())
		if errors.Is(err, runtime.ErrNodeExpired) {
			if _, err := c.copyNode(ctx, node); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("store copy: carrying the epoch of session %s/%s: %w", s.tenant, s.session, err)
		}
		if err := c.dst.ReleaseSession(ctx, s.tenant, s.session, node); err != nil {
			return fmt.Errorf("store copy: carrying the epoch of session %s/%s: %w", s.tenant, s.session, err)
		}
		if epoch >= s.epoch {
			return nil
		}
	}
}

// copyNodeLease is the lease of the incarnation that raises epochs. It
// is dead soon after the copy, and owns nothing.
const copyNodeLease = 30 * time.Second

// copyNode returns the node incarnation that raises epochs, registering a
// fresh one when there is none yet or expired is the current one.
func (c *copier) copyNode(ctx context.Context, expired string) (string, error) {
	c.nodeMu.Lock()
	defer c.nodeMu.Unlock()
	if c.node != "" && c.node != expired {
		return c.node, nil
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	node := "store-copy-" + hex.EncodeToString(b[:])
	if err := c.dst.RegisterNode(ctx, node, time.Now().Add(copyNodeLease).UnixMilli()); err != nil {
		return "", fmt.Errorf("store copy: registering %s on the target: %w", node, err)
	}
	c.node = node
	return node, nil
}

// kvEntry is one plugin KV entry.
type kvEntry struct {
	tenant, plugin string
	key, value     []byte
}

// copyKV copies every plugin KV entry, o.Parallel at once (a store groups
// the concurrent writes of one plugin).
func (c *copier) copyKV(ctx context.Context) error {
	return inParallel(ctx, c.o.Parallel, func(ctx context.Context, emit func(kvEntry) error) error {
		return c.ex.ExportKV(ctx, func(tenant, plugin string, key, value []byte) error {
			return emit(kvEntry{tenant, plugin, key, value})
		})
	}, func(ctx context.Context, e kvEntry) error {
		if err := c.dst.KVSet(ctx, e.tenant, e.plugin, e.key, e.value); err != nil {
			return fmt.Errorf("store copy: KV of plugin %s of tenant %s (a key of %d bytes, a value of %d): %w", e.plugin, e.tenant, len(e.key), len(e.value), err)
		}
		c.count(e.tenant, func(tc *tenantCounts) { tc.kv++ })
		return nil
	})
}

// report prints one line per tenant, and the totals.
func (c *copier) report(out io.Writer, from, to storeSpec, took time.Duration) error {
	tenants := make([]string, 0, len(c.counts))
	for t := range c.counts {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	var total tenantCounts
	fmt.Fprintf(out, "copied %s to %s\n", from, to)
	for _, t := range tenants {
		tc := c.counts[t]
		line := fmt.Sprintf("  tenant %s: %d Runs (%d in flight), %d events, %d KV entries", t, tc.runs, tc.inFlight, tc.events, tc.kv)
		if tc.pruned > 0 {
			line += fmt.Sprintf("; %d pruned Runs left out", tc.pruned)
		}
		fmt.Fprintln(out, line)
		total.runs += tc.runs
		total.inFlight += tc.inFlight
		total.events += tc.events
		total.kv += tc.kv
		total.pruned += tc.pruned
	}
	_, err := fmt.Fprintf(out, "  total: %d tenants, %d Runs (%d in flight), %d events, %d KV entries in %s\n",
		len(tenants), total.runs, total.inFlight, total.events, total.kv, took.Round(time.Millisecond))
	return err
}

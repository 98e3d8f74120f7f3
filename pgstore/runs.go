package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The statements of CreateRun and Commit. Each is prepared once per
// connection (pgx's statement cache) and sent in a pipelined batch, one
// implicit transaction; the writes of each are one statement of
// data-modifying CTEs.
const (
	sqlBegin         = "BEGIN"
	sqlCommit        = "COMMIT"
	sqlEnsureSession = `INSERT INTO sessions (tenant, session) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	sqlLockSession   = `SELECT last_ordinal, owner, epoch FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE`

	sqlLockSessionEpoch = `SELECT owner, epoch FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE`

	// sqlLockRun locks and reads a Run, and looks a command ID up ($3,
	// NULL for none) among the ones applied to it.
	sqlLockRun = `SELECT r.session, r.seq, r.live,
			(SELECT c.seq FROM commands c WHERE c.tenant = r.tenant AND c.run_id = r.run_id AND c.command_id = $3)
		FROM runs r WHERE r.tenant = $1 AND r.run_id = $2 FOR UPDATE OF r`
)

// The reads of Runs: LoadRun; Events, which also says whether the Run
// exists; SessionRuns (runs_by_session), CompletedRunsBefore (the Run's
// row, then runs_by_session backwards from its ordinal) and ActiveRuns
// (runs_active). CompletedRunsBefore reads the Run's row by its key alone,
// in a materialized CTE, and checks its session after: with the session
// in the same WHERE, runs_by_session bounded by (session, tenant) cost
// the same as the primary key on a table not yet analyzed, and a lookup
// through it read every Run of the session.
const (
	sqlLoadRun = `SELECT snapshot FROM runs WHERE tenant = $1 AND run_id = $2`
	sqlEvents  = `SELECT e.body FROM runs r
		LEFT JOIN LATERAL (SELECT seq, body FROM events
			WHERE tenant = r.tenant AND run_id = r.run_id AND seq >= $3 ORDER BY seq LIMIT $4) e ON true
		WHERE r.tenant = $1 AND r.run_id = $2 ORDER BY e.seq`
	sqlSessionRuns         = `SELECT ordinal, snapshot FROM runs WHERE tenant = $1 AND session = $2 AND ordinal > $3 ORDER BY ordinal LIMIT $4`
	sqlCompletedRunsBefore = `WITH r AS MATERIALIZED (SELECT tenant, session, ordinal FROM runs WHERE tenant = $1 AND run_id = $2)
		SELECT h.ordinal, h.snapshot FROM r
		LEFT JOIN LATERAL (SELECT ordinal, snapshot FROM runs
			WHERE tenant = r.tenant AND session = r.session AND ordinal < r.ordinal AND status = $4
			ORDER BY ordinal DESC LIMIT $5) h ON true
		WHERE r.session = $3
		ORDER BY h.ordinal DESC`
	sqlActiveRuns = `SELECT ordinal, snapshot FROM runs WHERE tenant = $1 AND session = $2 AND live ORDER BY ordinal`

	// RunsByStatus and RunsByStatusDesc, through runs_by_status.
	sqlRunsByStatus           = `SELECT run_id FROM runs WHERE tenant = $1 AND status = $2 AND run_id > $3 ORDER BY run_id LIMIT $4`
	sqlRunsByStatusDesc       = `SELECT run_id FROM runs WHERE tenant = $1 AND status = $2 ORDER BY run_id DESC LIMIT $3`
	sqlRunsByStatusDescBefore = `SELECT run_id FROM runs WHERE tenant = $1 AND status = $2 AND run_id < $4 ORDER BY run_id DESC LIMIT $3`
)

// sqlCreate looks the run ID and the creation command up and, if neither
// was used, writes the new Run at the session's next ordinal: the Run,
// its first event, its creation command, and the session's last ordinal
// and live count. If the claimant ($14, empty for none) is alive at $15 (now,
// or NULL) and the session has no owner, the same write claims the
// session for it, as ClaimSession's take would (owner $14, epoch + 1).
// A refused creation claims nothing and deletes the session's row again
// if it is empty (no Run, never claimed), which leaves the store as it
// was. Parameters: $1 tenant, $2 session, $3 run, $4 live (0 or 1), $5
// seq, $6 status, $7 has_executing, $8 updated_at, $9 creation command
// (NULL for none), $10 executing, $11 snapshot, $12 the first event, $13
// the bytes the Run holds (its stored_bytes: $11, $12 and $9). It returns
// whether the run ID is used, the ordinal and snapshot of the Run the
// command created (NULL when none), the new Run's ordinal (NULL when it
// wrote nothing) and the epoch of the claimant's claim on the session,
// taken or held already (NULL when none).
//
// With a first step ($16, the epoch of the claim it was made under; 0 for
// none), the Run is written as the step leaves it ($17 seq, $18 status,
// $19 has_executing, $20 updated_at, $21 executing, $22 snapshot, $25 its
// stored_bytes) with the step's events after the first ($23 their Seqs,
// $24 their JSON), when it is the session's first Run and the write
// claims the session at exactly that epoch; the last column says whether
// it was.
var sqlCreate = `WITH x AS (SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = $1 AND run_id = $3) AS used),
		d AS (SELECT r.ordinal, r.snapshot FROM runs r WHERE r.tenant = $1
			AND r.run_id = (SELECT c.run_id FROM create_commands c WHERE c.tenant = $1 AND c.command_id = $9)),
		ok0 AS (SELECT s.last_ordinal + 1 AS ord, s.epoch,
				CASE WHEN $14::text <> '' AND (s.owner = '' OR s.owner = $14)
					AND coalesce((SELECT ` + alive + ` FROM nodes n, (SELECT ` + dbNow(15) + ` AS now) AS c WHERE n.node_id = $14), false)
					THEN s.owner = '' END AS take
			FROM sessions s, x
			WHERE s.tenant = $1 AND s.session = $2 AND NOT x.used AND NOT EXISTS (SELECT 1 FROM d)),
		ok AS (SELECT ok0.*, coalesce(ok0.take, false) AND ok0.ord = 1 AND ok0.epoch + 1 = $16::bigint AS step FROM ok0),
		u AS (UPDATE sessions SET last_ordinal = ok.ord, live_count = live_count + $4,
				owner = CASE WHEN ok.take THEN $14 ELSE sessions.owner END,
				epoch = CASE WHEN ok.take THEN ok.epoch + 1 ELSE sessions.epoch END
			FROM ok WHERE sessions.tenant = $1 AND sessions.session = $2),
		j AS (DELETE FROM sessions WHERE tenant = $1 AND session = $2 AND NOT EXISTS (SELECT 1 FROM ok)
			AND last_ordinal = 0 AND owner = '' AND epoch = 0 AND live_count = 0),
		e AS (INSERT INTO events (tenant, run_id, seq, body) SELECT $1, $3, 1, $12 FROM ok
			UNION ALL SELECT $1, $3, u.seq, u.body FROM ok, unnest($23::bigint[], $24::bytea[]) AS u(seq, body) WHERE ok.step),
		c AS (INSERT INTO create_commands (tenant, command_id, run_id) SELECT $1, $9, $3 FROM ok WHERE $9::text IS NOT NULL),
		w AS (INSERT INTO runs (tenant, run_id, session, ordinal, seq, status, live, has_executing, updated_at, create_cmd, executing, snapshot, stored_bytes)
			SELECT $1, $3, $2, ok.ord, CASE WHEN ok.step THEN $17::bigint ELSE $5 END, CASE WHEN ok.step THEN $18::text ELSE $6 END, $4 > 0,
				CASE WHEN ok.step THEN $19::boolean ELSE $7 END, CASE WHEN ok.step THEN $20::bigint ELSE $8 END, $9,
				CASE WHEN ok.step THEN $21::bytea ELSE $10 END, CASE WHEN ok.step THEN $22::bytea ELSE $11 END,
				CASE WHEN ok.step THEN $25::bigint ELSE $13 END
			FROM ok RETURNING ordinal)
		SELECT x.used, d.ordinal, d.snapshot, (SELECT ordinal FROM w),
			(SELECT CASE WHEN ok.take THEN ok.epoch + 1 WHEN NOT ok.take THEN ok.epoch END FROM ok),
			coalesce((SELECT ok.step FROM ok), false)
		FROM x LEFT JOIN d ON true`

// commitSQL is the statement that locks and reads a Run, looks its
// command IDs up, and writes the commit if the checks Go makes on the same
// rows pass: no command ID was applied to it, it is of session $3, at Seq
// $4, the session's epoch is $5, and it does not leave a terminal status.
// Parameters: $1 tenant, $2 run, $6 the command ID (NULL for none), $7
// the events' Seqs, $8 their JSON, $9 the new Seq, $10 status, $11 live,
// $12 has_executing, $13 updated_at, $14 executing, $15 snapshot, $16
// what the commit adds to the Run's stored_bytes: the lengths of $15, of
// the events and of the command IDs (the old snapshot's length is taken
// off in SQL, where octet_length reads a TOASTed value's size without
// fetching it), and $17 to $16+also the further command IDs
// (Commit.AlsoCommandIDs: the commit is refused when one was applied
// before, and each is recorded). It returns the Run's row as read (no
// row: no such Run), the Seq the command ID was applied at and the least
// Seq one of the further ones was applied at (NULL for none), whether it
// wrote, and, when ending is set and it wrote, the live Runs its session has left (else NULL). When
// ending is set, a Run that ends leaves its session's live count and
// enters prunable.
//
// Each further command ID is a parameter of its own, looked up on the
// whole primary key, so that the plan PostgreSQL caches for the
// statement is a probe of the key per ID. An array of them, command_id =
// ANY($17), was planned (generically, once for all, on a fresh schema) as
// a filter over every command of the Run: each commit of a long Run read
// all the commands it had applied.
func commitSQL(ending bool, also int) string {
	var alsoSeq, ids strings.Builder
	ids.WriteString("$6::text")
	if also == 0 {
		alsoSeq.WriteString("NULL::bigint")
	} else {
		alsoSeq.WriteString("least(")
		for i := range also {
			if i > 0 {
				alsoSeq.WriteString(", ")
			}
			fmt.Fprintf(&alsoSeq, "(SELECT c.seq FROM commands c WHERE c.tenant = r.tenant AND c.run_id = r.run_id AND c.command_id = $%d::text)", 17+i)
			fmt.Fprintf(&ids, ", $%d::text", 17+i)
		}
		alsoSeq.WriteString(")")
	}
	q := `WITH r AS (
			SELECT r.session, r.seq, r.live,
				(SELECT c.seq FROM commands c WHERE c.tenant = r.tenant AND c.run_id = r.run_id AND c.command_id = $6) AS cmd_seq,
				` + alsoSeq.String() + ` AS also_seq
			FROM runs r WHERE r.tenant = $1 AND r.run_id = $2 FOR UPDATE OF r),
		ok AS (
			SELECT r.live FROM r WHERE r.cmd_seq IS NULL AND r.also_seq IS NULL AND r.session = $3 AND r.seq = $4 AND (r.live OR NOT $11::boolean)
				AND coalesce((SELECT s.epoch FROM sessions s WHERE s.tenant = $1 AND s.session = $3), 0) = $5),
		e AS (INSERT INTO events (tenant, run_id, seq, body)
			SELECT $1, $2, u.seq, u.body FROM ok, unnest($7::bigint[], $8::bytea[]) AS u(seq, body)),
		c AS (INSERT INTO commands (tenant, run_id, command_id, seq)
			SELECT $1, $2, x.id, $9 FROM ok, unnest(array_remove(ARRAY[` + ids.String() + `], NULL)) AS x(id)),`
	if ending {
		q += `
		l AS (UPDATE sessions SET live_count = live_count - 1 FROM ok WHERE ok.live AND sessions.tenant = $1 AND sessions.session = $3
			RETURNING sessions.live_count),
		p AS (INSERT INTO prunable (updated_at, tenant, run_id) SELECT $13, $1, $2 FROM ok WHERE ok.live ON CONFLICT DO NOTHING),`
	}
	sessionLive := "NULL::bigint"
	if ending {
		sessionLive = "(SELECT live_count FROM l)"
	}
	return q + `
		w AS (UPDATE runs SET seq = $9, status = $10, live = $11, has_executing = $12, updated_at = $13, executing = $14, snapshot = $15,
				stored_bytes = runs.stored_bytes - octet_length(runs.snapshot) + $16::bigint
			FROM ok WHERE runs.tenant = $1 AND runs.run_id = $2 RETURNING 1)
		SELECT r.session, r.seq, r.live, r.cmd_seq, r.also_seq, EXISTS (SELECT 1 FROM w), ` + sessionLive + ` FROM r`
}

// commitStatements holds commitSQL's texts for commits with up to
// len-1 further command IDs, by ending, then by how many; a commit with
// more (settlements of one Run that queued together, a copied history)
// has its text made when it commits, and prepared on each connection as
// the others are.
var commitStatements = func() (out [2][9]string) {
	for i, ending := range []bool{false, true} {
		for also := range out[i] {
			out[i][also] = commitSQL(ending, also)
		}
	}
	return out
}()

// commitStatement returns the commit statement for a commit that does or
// does not end its Run, with also further command IDs.
func commitStatement(ending bool, also int) string {
	i := 0
	if ending {
		i = 1
	}
	if also < len(commitStatements[i]) {
		return commitStatements[i][also]
	}
	return commitSQL(ending, also)
}

// encoded is what a snapshot writes: the JSON the store keeps, and its
// executing effects' records, as JSON (nil when none).
type encoded struct {
	snapshot  []byte
	executing []byte
}

func encodeRun(r loop.Run) (encoded, error) {
	e := encoded{snapshot: runcodec.Append(nil, &r)}
	var err error
	if recs := runtime.ExecutingRecords(r); len(recs) > 0 {
		if e.executing, err = json.Marshal(recs); err != nil {
			return encoded{}, err
		}
	}
	return e, nil
}

// optional is a text parameter: NULL for "".
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// CreateRun implements runtime.Store: one createCall, written in a
// transaction of its own or in one it shares with the commits and
// creations queued with it (groups.go).
func (s *Store) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	if err := c.Check(); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run: %w", err)
	}
	k, err := newCreateCall(c, s.nowParam())
	if err != nil {
		return runtime.CreateResult{}, err
	}
	if err := s.enter(); err != nil {
		return runtime.CreateResult{}, err
	}
	defer s.leave()
	t, id := c.Run.Tenant, c.Run.ID
	res, err := writeQueued(ctx, s, k)
	if err != nil {
		return runtime.CreateResult{}, fail("create run "+t+"/"+id, err)
	}
	// Hand back a copy decoded from the stored bytes, which shares nothing
	// with the caller's argument.
	stored := k.enc.snapshot
	switch {
	case res.Duplicate:
		stored = k.read.dup
	case res.Stepped:
		stored = k.step.enc.snapshot
	}
	if res.Run, err = runcodec.Unmarshal(stored); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s/%s: decode snapshot: %w", t, id, err)
	}
	if !res.Duplicate {
		s.feed.publish(runtime.Change{Tenant: t, Session: c.Run.Session, RunID: id, Seq: res.Run.Seq, Owner: k.owner})
	}
	return res, nil
}

// createCall is one CreateRun, three statements in the port's order:
// create the session's row if missing; lock it (its last ordinal, owner
// and epoch); in a statement of its own, look the run ID and the creation
// command up and, if neither was used, write the Run, its first event,
// its place in the session and its creation command, and claim the
// session for c.Claimant when no one owns it (sqlCreate). Go decides from
// what that statement read (duplicate, run ID used) and checks that the
// write agrees.
type createCall struct {
	c    runtime.CreateRun
	enc  encoded
	step firstStep
	args []any // sqlCreate's

	read createRead
	// owner is the session's owner once the creation is written: the
	// claimant when it claimed the session.
	owner string
}

// createRead is what a createCall's statements read.
type createRead struct {
	last, epoch            int64
	owner                  string
	used                   bool
	dupOrdinal, newOrdinal *int64
	dup                    []byte
	claimEpoch             *int64
	stepped                bool
}

func newCreateCall(c runtime.CreateRun, now *int64) (*createCall, error) {
	ev := c.Event
	ev.Seq = 1
	evb, err := runcodec.MarshalJSON(ev)
	if err != nil {
		return nil, fmt.Errorf("pgstore: create run %s: encode event: %w", c.Run.ID, err)
	}
	k := &createCall{c: c}
	if k.enc, err = encodeRun(c.Run); err != nil {
		return nil, fmt.Errorf("pgstore: create run %s: encode snapshot: %w", c.Run.ID, err)
	}
	if k.step, err = encodeFirstStep(c); err != nil {
		return nil, fmt.Errorf("pgstore: create run %s: %w", c.Run.ID, err)
	}
	enc, step := k.enc, k.step
	k.args = []any{c.Run.Tenant, c.Run.Session, c.Run.ID, boolInt(!c.Run.Status.Terminal()), c.Run.Seq, string(c.Run.Status),
		enc.executing != nil, c.Run.UpdatedAt, optional(c.CommandID), enc.executing, enc.snapshot, evb,
		int64(len(enc.snapshot) + len(evb) + len(c.CommandID)), c.Claimant, now,
		step.epoch, step.run.Seq, string(step.run.Status), step.enc.executing != nil, step.run.UpdatedAt,
		step.enc.executing, step.enc.snapshot, step.seqs, step.bodies, step.storedBytes + int64(len(evb)+len(c.CommandID))}
	return k, nil
}

func (k *createCall) orderKey() (tenant, session, run string) {
	return k.c.Run.Tenant, k.c.Run.Session, k.c.Run.ID
}

func (k *createCall) queue(b *pgx.Batch) {
	t, session := k.c.Run.Tenant, k.c.Run.Session
	b.Queue(sqlEnsureSession, t, session)
	b.Queue(sqlLockSession, t, session)
	b.Queue(sqlCreate, k.args...)
}

func (k *createCall) readResults(br pgx.BatchResults) error {
	r := createRead{}
	k.read = r
	err := execAll(br, 1)
	if err == nil {
		_, err = queryOne(br, &r.last, &r.owner, &r.epoch)
	}
	if err == nil {
		_, err = queryOne(br, &r.used, &r.dupOrdinal, &r.dup, &r.newOrdinal, &r.claimEpoch, &r.stepped)
	}
	k.read = r
	return err
}

// retryUnique: two creations of one ID racing, the second is written
// again and reads the first one's row.
func (k *createCall) retryUnique() bool { return true }

func (k *createCall) decide() (runtime.CreateResult, error) {
	c, r := k.c, k.read
	t, id := c.Run.Tenant, c.Run.ID
	k.owner = r.owner
	unowned := r.owner == ""
	var (
		res     runtime.CreateResult
		refused error
	)
	switch {
	case r.dupOrdinal != nil:
		res = runtime.CreateResult{Ordinal: *r.dupOrdinal, Duplicate: true}
	case r.used:
		refused = fmt.Errorf("pgstore: create run %s/%s: %w", t, id, runtime.ErrRunExists)
	default:
		res = runtime.CreateResult{Ordinal: r.last + 1}
	}
	wrote := refused == nil && !res.Duplicate
	if wrote != (r.newOrdinal != nil) || wrote && *r.newOrdinal != r.last+1 || !wrote && r.claimEpoch != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s/%s: the write's checks and the rows read disagree: %w", t, id, runtime.ErrStoreUnavailable)
	}
	if r.claimEpoch != nil {
		// A claim taken (no owner) or held already (the claimant's).
		if taken := unowned; !taken && r.owner != c.Claimant || taken && *r.claimEpoch != r.epoch+1 || !taken && *r.claimEpoch != r.epoch {
			return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s/%s: the claim of the session and the rows read disagree: %w", t, id, runtime.ErrStoreUnavailable)
		}
		res.Epoch, k.owner = uint64(*r.claimEpoch), c.Claimant
	}
	// The first step goes with the session's first Run, under the claim
	// the creation took for it at the step's epoch.
	wantStep := k.step.epoch > 0 && wrote && r.last == 0 && unowned && r.claimEpoch != nil && *r.claimEpoch == k.step.epoch
	if res.Stepped = r.stepped; r.stepped != wantStep {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s/%s: the first step's checks (wrote it: %v) and the rows read (write it: %v) disagree: %w",
			t, id, r.stepped, wantStep, runtime.ErrStoreUnavailable)
	}
	return res, refused
}

// firstStep is what CreateRun writes of a first step (runtime.FirstStep):
// all zero, with epoch 0, when there is none.
type firstStep struct {
	epoch       int64
	run         loop.Run
	enc         encoded
	seqs        []int64
	bodies      [][]byte
	storedBytes int64 // its snapshot and events, for stored_bytes
}

func encodeFirstStep(c runtime.CreateRun) (firstStep, error) {
	f := c.FirstStep
	if f == nil {
		return firstStep{seqs: []int64{}, bodies: [][]byte{}}, nil
	}
	step := firstStep{epoch: int64(f.Epoch), run: f.Run, seqs: make([]int64, len(f.Events)), bodies: make([][]byte, len(f.Events))}
	var err error
	if step.enc, err = encodeRun(f.Run); err != nil {
		return firstStep{}, fmt.Errorf("encode the first step's snapshot: %w", err)
	}
	step.storedBytes = int64(len(step.enc.snapshot))
	for i, ev := range f.Events {
		step.seqs[i] = ev.Seq
		if step.bodies[i], err = runcodec.MarshalJSON(ev); err != nil {
			return firstStep{}, fmt.Errorf("encode the first step's event %d: %w", ev.Seq, err)
		}
		step.storedBytes += int64(len(step.bodies[i]))
	}
	return step, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// LoadRun implements runtime.Store.
func (s *Store) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return loop.Run{}, fmt.Errorf("pgstore: load run: %w", err)
	}
	if err := s.enter(); err != nil {
		return loop.Run{}, err
	}
	defer s.leave()
	var snap []byte
	err := s.pool.QueryRow(ctx, sqlLoadRun, tenant, runID).Scan(&snap)
	if errors.Is(err, pgx.ErrNoRows) {
		return loop.Run{}, fmt.Errorf("pgstore: load run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
	}
	if err != nil {
		return loop.Run{}, fail("load run "+tenant+"/"+runID, err)
	}
	r, err := runcodec.Unmarshal(snap)
	if err != nil {
		return loop.Run{}, fmt.Errorf("pgstore: load run %s/%s: decode snapshot: %w", tenant, runID, err)
	}
	return r, nil
}

// Commit implements runtime.Store: one commitCall, written in a
// transaction of its own or in one it shares with the commits queued
// with it (groups.go).
func (s *Store) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	if err := c.CheckIDs(); err != nil {
		return runtime.CommitResult{}, fmt.Errorf("pgstore: commit: %w", err)
	}
	k := newCommitCall(c)
	if err := s.enter(); err != nil {
		return runtime.CommitResult{}, err
	}
	defer s.leave()
	res, err := writeQueued(ctx, s, k)
	if err != nil {
		return runtime.CommitResult{}, fail("commit to run "+c.Tenant+"/"+c.RunID, err)
	}
	if !res.Duplicate {
		s.feed.publish(runtime.Change{Tenant: c.Tenant, Session: c.Session, RunID: c.RunID, Seq: res.Seq, Owner: k.owner})
	}
	return res, nil
}

// commitCall is one Commit: the two statements it sends, in the port's
// order: lock the session row (whose epoch fences the commit); then, in
// a statement of its own, lock and read the Run, look the command IDs up
// and write the commit if the port's checks pass (commitSQL). A
// statement's snapshot is taken when it starts, so the one that reads and
// writes, which starts once the session lock is held, sees what the
// lock's previous holder committed. Locks are always taken session
// first, then Run. Go decides from the rows that statement read, in the
// port's order (duplicate command, malformed, version conflict, fenced),
// and checks that the write agrees: it wrote exactly when the commit goes
// ahead. A refused commit writes nothing.
type commitCall struct {
	c runtime.Commit
	// payloadErr is what is wrong with the payload: checked now, judged
	// after the command-ID lookup, so that a retried command gets its
	// first result whatever it carries. With one, only the lookup is sent.
	payloadErr error
	nowLive    bool
	write      string // the statement that reads and writes
	args       []any

	read commitRead // what the statements read, set by readResults
	// owner is the session's owner as read.
	owner string
}

// commitRead is what a commitCall's statements read.
type commitRead struct {
	epoch, seq      int64
	cmdSeq, alsoSeq *int64
	sessionLive     *int64 // after an ending write
	runSession      string
	live, runFound  bool
	written         bool
}

func newCommitCall(c runtime.Commit) *commitCall {
	k := &commitCall{c: c, nowLive: !c.Run.Status.Terminal()}
	k.payloadErr = c.Check()
	if k.payloadErr != nil {
		return k
	}
	seqs, bodies := make([]int64, len(c.Events)), make([][]byte, len(c.Events))
	added := int64(len(c.CommandID)) // to stored_bytes ($16)
	for _, also := range c.AlsoCommandIDs {
		added += int64(len(also))
	}
	for i, ev := range c.Events {
		seqs[i] = ev.Seq
		var err error
		if bodies[i], err = runcodec.MarshalJSON(ev); err != nil {
			k.payloadErr = fmt.Errorf("%w: encode event %d: %v", runtime.ErrInvalidRequest, ev.Seq, err)
			return k
		}
		added += int64(len(bodies[i]))
	}
	enc, err := encodeRun(c.Run)
	if err != nil {
		k.payloadErr = fmt.Errorf("%w: encode snapshot: %v", runtime.ErrInvalidRequest, err)
		return k
	}
	added += int64(len(enc.snapshot))
	k.write = commitStatement(!k.nowLive, len(c.AlsoCommandIDs))
	k.args = append(make([]any, 0, 16+len(c.AlsoCommandIDs)), c.Tenant, c.RunID, c.Session, c.ExpectedSeq, int64(c.Epoch), optional(c.CommandID),
		seqs, bodies, c.Run.Seq, string(c.Run.Status), k.nowLive, enc.executing != nil,
		c.Run.UpdatedAt, enc.executing, enc.snapshot, added)
	for _, also := range c.AlsoCommandIDs {
		k.args = append(k.args, also)
	}
	return k
}

// queue queues the call's statements on b.
func (k *commitCall) queue(b *pgx.Batch) {
	b.Queue(sqlLockSessionEpoch, k.c.Tenant, k.c.Session)
	if k.payloadErr == nil {
		b.Queue(k.write, k.args...)
	} else { // nothing to write: look the command up all the same
		b.Queue(sqlLockRun, k.c.Tenant, k.c.RunID, optional(k.c.CommandID))
	}
}

// readResults reads the results of the statements queue queued.
func (k *commitCall) readResults(br pgx.BatchResults) error {
	r := commitRead{}
	k.read, k.owner = r, ""
	_, err := queryOne(br, &k.owner, &r.epoch)
	if err != nil {
		return err
	}
	dest := []any{&r.runSession, &r.seq, &r.live, &r.cmdSeq}
	if k.payloadErr == nil {
		dest = append(dest, &r.alsoSeq, &r.written, &r.sessionLive)
	}
	r.runFound, err = queryOne(br, dest...)
	k.read = r
	return err
}

// decide judges the call from what its statements read, in the port's
// order, and checks that the write agrees.
func (k *commitCall) decide() (runtime.CommitResult, error) {
	c, r := k.c, k.read
	t, id := c.Tenant, c.RunID
	var (
		res     runtime.CommitResult
		refused error
	)
	switch {
	case r.cmdSeq != nil:
		res = runtime.CommitResult{Seq: *r.cmdSeq, Duplicate: true}
	case !r.runFound:
		refused = fmt.Errorf("pgstore: commit to run %s/%s: %w", t, id, runtime.ErrRunNotFound)
	case k.payloadErr != nil:
		refused = fmt.Errorf("pgstore: commit: %w", k.payloadErr)
	case r.runSession != c.Session:
		refused = fmt.Errorf("pgstore: commit to run %s: %w: it belongs to session %s, not %s", id, runtime.ErrInvalidRequest, r.runSession, c.Session)
	case r.seq != c.ExpectedSeq:
		refused = fmt.Errorf("pgstore: commit to run %s/%s at Seq %d: %w (stored Seq is %d)", t, id, c.ExpectedSeq, runtime.ErrVersionConflict, r.seq)
	case uint64(r.epoch) != c.Epoch:
		refused = fmt.Errorf("pgstore: commit to run %s/%s with epoch %d: %w (session epoch is %d)", t, id, c.Epoch, runtime.ErrFenced, r.epoch)
	case r.alsoSeq != nil:
		refused = fmt.Errorf("pgstore: commit to run %s/%s: %w: a command it also applies was applied at Seq %d", t, id, runtime.ErrVersionConflict, *r.alsoSeq)
	case !r.live && k.nowLive:
		refused = fmt.Errorf("pgstore: commit to run %s/%s: %w: it has ended, and the snapshot is %s", t, id, runtime.ErrInvalidRequest, c.Run.Status)
	default:
		res = runtime.CommitResult{Seq: c.Run.Seq, SessionIdle: r.sessionLive != nil && *r.sessionLive == 0}
	}
	// The write checked in SQL what Go checked on the rows it read: they
	// agree, or something is badly wrong.
	if wrote := refused == nil && !res.Duplicate; wrote != r.written {
		return runtime.CommitResult{}, fmt.Errorf("pgstore: commit to run %s/%s: the write's checks (wrote: %v) and the rows read (write: %v) disagree: %w",
			t, id, r.written, wrote, runtime.ErrStoreUnavailable)
	}
	return res, refused
}

func (k *commitCall) orderKey() (tenant, session, run string) {
	return k.c.Tenant, k.c.Session, k.c.RunID
}

func (k *commitCall) retryUnique() bool { return false }

// Events implements runtime.Store. One query answers both whether the Run
// exists and its events.
func (s *Store) Events(ctx context.Context, tenant, runID string, fromSeq int64, limit int) ([]loop.Event, error) {
	if err := checkIDs("tenant", tenant, "run", runID); err != nil {
		return nil, fmt.Errorf("pgstore: events: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	rows, err := s.pool.Query(ctx, sqlEvents, tenant, runID, fromSeq, limitParam(limit))
	if err != nil {
		return nil, fail("events of run "+tenant+"/"+runID, err)
	}
	var (
		out   []loop.Event
		found bool
	)
	for rows.Next() {
		found = true
		var body []byte
		if err := rows.Scan(&body); err != nil {
			rows.Close()
			return nil, fail("events of run "+tenant+"/"+runID, err)
		}
		if body == nil {
			continue
		}
		var ev loop.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: events of run %s/%s: decode: %w", tenant, runID, err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fail("events of run "+tenant+"/"+runID, err)
	}
	if !found {
		return nil, fmt.Errorf("pgstore: events of run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
	}
	return out, nil
}

// limitParam is a LIMIT: NULL (no limit) for limit <= 0.
func limitParam(limit int) *int64 {
	if limit <= 0 {
		return nil
	}
	l := int64(limit)
	return &l
}

// SessionRuns implements runtime.Store, through runs_by_session.
func (s *Store) SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("pgstore: session runs: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []runtime.SessionRun
	err := s.scanRuns(ctx, func(ord int64, r loop.Run) { out = append(out, runtime.SessionRun{Ordinal: ord, Run: r}) },
		sqlSessionRuns, tenant, session, after, limitParam(limit))
	if err != nil {
		return nil, fail("session runs of "+tenant+"/"+session, err)
	}
	return out, nil
}

// CompletedRunsBefore implements runtime.Store, through runs_by_session
// read backwards from the Run's ordinal, in one statement: the Run's row
// (none: no such Run in the session), joined to the completed Runs
// before it (a NULL snapshot: none).
func (s *Store) CompletedRunsBefore(ctx context.Context, tenant, session, runID string, limit int) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session, "run", runID); err != nil {
		return nil, fmt.Errorf("pgstore: completed runs before: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	what := "completed runs before " + tenant + "/" + runID
	rows, err := s.pool.Query(ctx, sqlCompletedRunsBefore, tenant, runID, session, string(loop.StatusCompleted), limitParam(limit))
	if err != nil {
		return nil, fail(what, err)
	}
	defer rows.Close()
	var (
		out   []loop.Run
		found bool
	)
	for rows.Next() {
		found = true
		var (
			ord  *int64
			snap []byte
		)
		if err := rows.Scan(&ord, &snap); err != nil {
			return nil, fail(what, err)
		}
		if ord == nil {
			continue
		}
		r, err := runcodec.Unmarshal(snap)
		if err != nil {
			return nil, fmt.Errorf("pgstore: %s: decode the snapshot at ordinal %d: %w", what, *ord, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fail(what, err)
	}
	if !found {
		return nil, fmt.Errorf("pgstore: completed runs before %s/%s in session %s: %w", tenant, runID, session, runtime.ErrRunNotFound)
	}
	slices.Reverse(out)
	return out, nil
}

// ActiveRuns implements runtime.Store, through runs_active: it never reads
// a terminal Run.
func (s *Store) ActiveRuns(ctx context.Context, tenant, session string) ([]loop.Run, error) {
	if err := checkIDs("tenant", tenant, "session", session); err != nil {
		return nil, fmt.Errorf("pgstore: active runs: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var out []loop.Run
	err := s.scanRuns(ctx, func(_ int64, r loop.Run) { out = append(out, r) },
		sqlActiveRuns, tenant, session)
	if err != nil {
		return nil, fail("active runs of "+tenant+"/"+session, err)
	}
	return out, nil
}

// scanRuns runs a query of (ordinal, snapshot) rows and decodes each.
func (s *Store) scanRuns(ctx context.Context, fn func(int64, loop.Run), q string, args ...any) error {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			ord  int64
			snap []byte
			r    loop.Run
		)
		if err := rows.Scan(&ord, &snap); err != nil {
			return err
		}
		if r, err = runcodec.Unmarshal(snap); err != nil {
			return fmt.Errorf("pgstore: decode the snapshot at ordinal %d: %w", ord, err)
		}
		fn(ord, r)
	}
	return rows.Err()
}

// RunsByStatus implements runtime.Store, through runs_by_status, in
// byte order of the run IDs (COLLATE "C").
func (s *Store) RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return nil, fmt.Errorf("pgstore: runs by status: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	rows, err := s.pool.Query(ctx, sqlRunsByStatus, tenant, string(status), after, limitParam(limit))
	if err != nil {
		return nil, fail("runs of "+tenant+" by status", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail("runs of "+tenant+" by status", err)
	}
	return out, nil
}

// RunsByStatusDesc implements runtime.Store: runs_by_status scanned
// backwards (an index on (status, tenant, run_id) serves ORDER BY run_id
// DESC under equal status and tenant). From the last Run the query has no
// bound on run_id, rather than one that an empty before would make match
// nothing.
func (s *Store) RunsByStatusDesc(ctx context.Context, tenant string, status loop.Status, before string, limit int) ([]string, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return nil, fmt.Errorf("pgstore: runs by status, descending: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	query, args := sqlRunsByStatusDesc, []any{tenant, string(status), limitParam(limit)}
	if before != "" {
		query, args = sqlRunsByStatusDescBefore, append(args, before)
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fail("runs of "+tenant+" by status, descending", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail("runs of "+tenant+" by status, descending", err)
	}
	return out, nil
}

// TenantStoredBytes implements runtime.Store: the sum of the tenant's
// runs rows' stored_bytes, read through the primary key (tenant, run_id).
// It reads every runs row of the tenant, so the API reads it through a
// short cache; stored_bytes is in no index, so that a Commit's update
// stays HOT, which rules out an index-only sum.
func (s *Store) TenantStoredBytes(ctx context.Context, tenant string) (int64, error) {
	if err := loop.CheckID("tenant", tenant); err != nil {
		return 0, fmt.Errorf("pgstore: stored bytes: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(stored_bytes), 0)::bigint FROM runs WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		return 0, fail("stored bytes of "+tenant, err)
	}
	return n, nil
}

// checkIDs checks IDs given as pairs: what the ID names, then the ID.
func checkIDs(whatAndID ...string) error {
	for i := 0; i+1 < len(whatAndID); i += 2 {
		if err := loop.CheckID(whatAndID[i], whatAndID[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// StepsFirstRuns reports that CreateRun writes a creation's FirstStep
// where the port allows it (runtime.FirstStepper).
func (s *Store) StepsFirstRuns() bool { return true }

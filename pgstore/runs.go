package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The statements of CreateRun and Commit. Each is prepared once per
// connection (pgx's statement cache) and sent in a pipelined batch.
const (
	sqlBegin         = "BEGIN"
	sqlCommit        = "COMMIT"
	sqlEnsureSession = `INSERT INTO sessions (tenant, session) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	sqlLockSession   = `SELECT last_ordinal, owner, epoch FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE`
	sqlCreateCmdRun  = `SELECT r.ordinal, r.snapshot FROM create_commands c
		JOIN runs r ON r.tenant = c.tenant AND r.run_id = c.run_id
		WHERE c.tenant = $1 AND c.command_id = $2`
	sqlRunExists  = `SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = $1 AND run_id = $2)`
	sqlNewOrdinal = `UPDATE sessions SET last_ordinal = $3, live_count = live_count + $4 WHERE tenant = $1 AND session = $2`
	sqlInsertRun  = `INSERT INTO runs (tenant, run_id, session, ordinal, seq, status, live, updated_at, create_cmd, executing, snapshot)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	sqlInsertEvents = `INSERT INTO events (tenant, run_id, seq, body)
		SELECT $1, $2, u.seq, u.body FROM unnest($3::bigint[], $4::bytea[]) AS u(seq, body)`
	sqlInsertCreateCmd = `INSERT INTO create_commands (tenant, command_id, run_id) VALUES ($1, $2, $3)`
	sqlInsertEffects   = `INSERT INTO effects (tenant, session, ordinal, run_id, effect_id, attempt, handle, epoch)
		SELECT $1, $2, $3, $4, u.effect_id, u.attempt, u.handle, u.epoch
		FROM unnest($5::text[], $6::integer[], $7::text[], $8::bigint[]) AS u(effect_id, attempt, handle, epoch)`
	sqlDeleteEffects  = `DELETE FROM effects WHERE tenant = $1 AND session = $2 AND ordinal = $3`
	sqlInsertPrunable = `INSERT INTO prunable (updated_at, tenant, run_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`
	sqlDeletePrunable = `DELETE FROM prunable WHERE tenant = $1 AND run_id = $2`

	sqlLockSessionEpoch = `SELECT owner, epoch FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE`
	sqlLockRun          = `SELECT session, ordinal, seq, live, executing FROM runs WHERE tenant = $1 AND run_id = $2 FOR UPDATE`
	sqlCommandSeq       = `SELECT seq FROM commands WHERE tenant = $1 AND run_id = $2 AND command_id = $3`
	sqlUpdateRun        = `UPDATE runs SET seq = $3, status = $4, live = $5, updated_at = $6, executing = $7, snapshot = $8
		WHERE tenant = $1 AND run_id = $2`
	sqlLiveDelta     = `UPDATE sessions SET live_count = live_count + $3 WHERE tenant = $1 AND session = $2`
	sqlInsertCommand = `INSERT INTO commands (tenant, run_id, command_id, seq) VALUES ($1, $2, $3, $4)`
)

// encoded is what a snapshot writes besides itself: the JSON the store
// keeps, and its executing effects' records.
type encoded struct {
	snapshot  []byte
	executing []byte // JSON of the records; nil when none
	records   []runtime.EffectRecord
}

func encodeRun(r loop.Run) (encoded, error) {
	snap, err := json.Marshal(r)
	if err != nil {
		return encoded{}, err
	}
	e := encoded{snapshot: snap, records: runtime.ExecutingRecords(r)}
	if len(e.records) > 0 {
		if e.executing, err = json.Marshal(e.records); err != nil {
			return encoded{}, err
		}
	}
	return e, nil
}

// queueEffects queues the insertion of a Run's executing effects.
func queueEffects(b *pgx.Batch, tenant, session string, ordinal int64, runID string, recs []runtime.EffectRecord) {
	ids := make([]string, len(recs))
	attempts := make([]int32, len(recs))
	handles := make([]string, len(recs))
	epochs := make([]int64, len(recs))
	for i, e := range recs {
		ids[i], attempts[i], handles[i], epochs[i] = e.EffectID, int32(e.Attempt), e.Handle, int64(e.Epoch)
	}
	b.Queue(sqlInsertEffects, tenant, session, ordinal, runID, ids, attempts, handles, epochs)
}

// CreateRun implements runtime.Store in one transaction of two round
// trips: the session's row is created if missing and locked, the creation
// command and the run ID looked up; then the Run, its first event, its
// place in the session and its indexes are written and committed.
func (s *Store) CreateRun(ctx context.Context, c runtime.CreateRun) (runtime.CreateResult, error) {
	if err := c.Check(); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run: %w", err)
	}
	ev := c.Event
	ev.Seq = 1
	evb, err := json.Marshal(ev)
	if err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s: encode event: %w", c.Run.ID, err)
	}
	enc, err := encodeRun(c.Run)
	if err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s: encode snapshot: %w", c.Run.ID, err)
	}
	if err := s.enter(); err != nil {
		return runtime.CreateResult{}, err
	}
	defer s.leave()
	t, id, session := c.Run.Tenant, c.Run.ID, c.Run.Session
	var (
		res   runtime.CreateResult
		dup   []byte
		owner string
	)
	err = s.inTx(ctx, true, func(ctx context.Context, conn *pgx.Conn) error {
		res, dup, owner = runtime.CreateResult{}, nil, ""
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(sqlEnsureSession, t, session)
		b.Queue(sqlLockSession, t, session)
		if c.CommandID != "" {
			b.Queue(sqlCreateCmdRun, t, c.CommandID)
		}
		b.Queue(sqlRunExists, t, id)
		br := conn.SendBatch(ctx, b)
		var (
			last, epoch int64
			exists      bool
			dupOrdinal  int64
			dupFound    bool
		)
		err := execAll(br, 2)
		if err == nil {
			_, err = queryOne(br, &last, &owner, &epoch)
		}
		if err == nil && c.CommandID != "" {
			dupFound, err = queryOne(br, &dupOrdinal, &dup)
		}
		if err == nil {
			_, err = queryOne(br, &exists)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if dupFound {
			res = runtime.CreateResult{Ordinal: dupOrdinal, Duplicate: true}
			return nil
		}
		dup = nil
		if exists {
			return fmt.Errorf("pgstore: create run %s/%s: %w", t, id, runtime.ErrRunExists)
		}
		ord := last + 1
		live := !c.Run.Status.Terminal()
		var cmd *string
		if c.CommandID != "" {
			cmd = &c.CommandID
		}
		b = &pgx.Batch{}
		b.Queue(sqlNewOrdinal, t, session, ord, boolInt(live))
		b.Queue(sqlInsertRun, t, id, session, ord, c.Run.Seq, string(c.Run.Status), live, c.Run.UpdatedAt, cmd, enc.executing, enc.snapshot)
		b.Queue(sqlInsertEvents, t, id, []int64{1}, [][]byte{evb})
		if cmd != nil {
			b.Queue(sqlInsertCreateCmd, t, c.CommandID, id)
		}
		if len(enc.records) > 0 {
			queueEffects(b, t, session, ord, id, enc.records)
		}
		b.Queue(sqlCommit)
		if err := sendWrites(ctx, conn, b); err != nil {
			return err
		}
		res = runtime.CreateResult{Ordinal: ord}
		return nil
	})
	if err != nil {
		return runtime.CreateResult{}, fail("create run "+t+"/"+id, err)
	}
	// Hand back a copy decoded from the stored bytes, which shares nothing
	// with the caller's argument.
	stored := enc.snapshot
	if res.Duplicate {
		stored = dup
	}
	if err := json.Unmarshal(stored, &res.Run); err != nil {
		return runtime.CreateResult{}, fmt.Errorf("pgstore: create run %s/%s: decode snapshot: %w", t, id, err)
	}
	if !res.Duplicate {
		s.feed.publish(runtime.Change{Tenant: t, Session: session, RunID: id, Seq: res.Run.Seq, Owner: owner})
	}
	return res, nil
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
	err := s.pool.QueryRow(ctx, `SELECT snapshot FROM runs WHERE tenant = $1 AND run_id = $2`, tenant, runID).Scan(&snap)
	if err == pgx.ErrNoRows {
		return loop.Run{}, fmt.Errorf("pgstore: load run %s/%s: %w", tenant, runID, runtime.ErrRunNotFound)
	}
	if err != nil {
		return loop.Run{}, fail("load run "+tenant+"/"+runID, err)
	}
	var r loop.Run
	if err := json.Unmarshal(snap, &r); err != nil {
		return loop.Run{}, fmt.Errorf("pgstore: load run %s/%s: decode snapshot: %w", tenant, runID, err)
	}
	return r, nil
}

// Commit implements runtime.Store, in one transaction of two round trips
// and in the port's order. The first batch begins, locks the session row
// (whose epoch fences the commit), then locks and reads the Run, then
// looks the command ID up; each read is its own statement, so under READ
// COMMITTED it sees what the lock holder before it committed. Locks are
// always taken session first, then Run. Go then decides (duplicate,
// malformed, version conflict, fenced) and, when the commit goes ahead,
// the second batch writes the events, the snapshot, the indexes that
// changed and the command ID, and commits.
func (s *Store) Commit(ctx context.Context, c runtime.Commit) (runtime.CommitResult, error) {
	if err := c.CheckIDs(); err != nil {
		return runtime.CommitResult{}, fmt.Errorf("pgstore: commit: %w", err)
	}
	// The payload is checked now but judged after the command-ID lookup,
	// so that a retried command gets its first result whatever it carries.
	payloadErr := c.Check()
	var (
		enc    encoded
		seqs   []int64
		bodies [][]byte
	)
	if payloadErr == nil {
		seqs, bodies = make([]int64, len(c.Events)), make([][]byte, len(c.Events))
		for i, ev := range c.Events {
			seqs[i] = ev.Seq
			if bodies[i], payloadErr = json.Marshal(ev); payloadErr != nil {
				payloadErr = fmt.Errorf("%w: encode event %d: %v", runtime.ErrInvalidRequest, ev.Seq, payloadErr)
				break
			}
		}
	}
	if payloadErr == nil {
		var err error
		if enc, err = encodeRun(c.Run); err != nil {
			payloadErr = fmt.Errorf("%w: encode snapshot: %v", runtime.ErrInvalidRequest, err)
		}
	}
	if err := s.enter(); err != nil {
		return runtime.CommitResult{}, err
	}
	defer s.leave()
	t, id := c.Tenant, c.RunID
	var (
		res   runtime.CommitResult
		owner string
	)
	err := s.inTx(ctx, false, func(ctx context.Context, conn *pgx.Conn) error {
		res, owner = runtime.CommitResult{}, ""
		b := &pgx.Batch{}
		b.Queue(sqlBegin)
		b.Queue(sqlLockSessionEpoch, t, c.Session)
		b.Queue(sqlLockRun, t, id)
		if c.CommandID != "" {
			b.Queue(sqlCommandSeq, t, id, c.CommandID)
		}
		br := conn.SendBatch(ctx, b)
		var (
			epoch, ordinal, seq, cmdSeq int64
			runSession                  string
			live, runFound, cmdFound    bool
			oldExec                     []byte
		)
		err := execAll(br, 1)
		if err == nil {
			_, err = queryOne(br, &owner, &epoch)
		}
		if err == nil {
			runFound, err = queryOne(br, &runSession, &ordinal, &seq, &live, &oldExec)
		}
		if err == nil && c.CommandID != "" {
			cmdFound, err = queryOne(br, &cmdSeq)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		switch {
		case err != nil:
			return err
		case cmdFound:
			res = runtime.CommitResult{Seq: cmdSeq, Duplicate: true}
			return nil
		case !runFound:
			return fmt.Errorf("pgstore: commit to run %s/%s: %w", t, id, runtime.ErrRunNotFound)
		case payloadErr != nil:
			return fmt.Errorf("pgstore: commit: %w", payloadErr)
		case runSession != c.Session:
			return fmt.Errorf("pgstore: commit to run %s: %w: it belongs to session %s, not %s", id, runtime.ErrInvalidRequest, runSession, c.Session)
		case seq != c.ExpectedSeq:
			return fmt.Errorf("pgstore: commit to run %s/%s at Seq %d: %w (stored Seq is %d)", t, id, c.ExpectedSeq, runtime.ErrVersionConflict, seq)
		case uint64(epoch) != c.Epoch:
			return fmt.Errorf("pgstore: commit to run %s/%s with epoch %d: %w (session epoch is %d)", t, id, c.Epoch, runtime.ErrFenced, epoch)
		}
		nowLive := !c.Run.Status.Terminal()
		b = &pgx.Batch{}
		b.Queue(sqlInsertEvents, t, id, seqs, bodies)
		b.Queue(sqlUpdateRun, t, id, c.Run.Seq, string(c.Run.Status), nowLive, c.Run.UpdatedAt, enc.executing, enc.snapshot)
		if !bytes.Equal(oldExec, enc.executing) {
			if oldExec != nil {
				b.Queue(sqlDeleteEffects, t, c.Session, ordinal)
			}
			if len(enc.records) > 0 {
				queueEffects(b, t, c.Session, ordinal, id, enc.records)
			}
		}
		switch {
		case live && !nowLive:
			b.Queue(sqlLiveDelta, t, c.Session, int64(-1))
			b.Queue(sqlInsertPrunable, c.Run.UpdatedAt, t, id)
		case !live && nowLive: // the loop never revives a Run; kept exact all the same
			b.Queue(sqlLiveDelta, t, c.Session, int64(1))
			b.Queue(sqlDeletePrunable, t, id)
		}
		if c.CommandID != "" {
			b.Queue(sqlInsertCommand, t, id, c.CommandID, c.Run.Seq)
		}
		b.Queue(sqlCommit)
		if err := sendWrites(ctx, conn, b); err != nil {
			return err
		}
		res = runtime.CommitResult{Seq: c.Run.Seq}
		return nil
	})
	if err != nil {
		return runtime.CommitResult{}, fail("commit to run "+t+"/"+id, err)
	}
	if !res.Duplicate {
		s.feed.publish(runtime.Change{Tenant: t, Session: c.Session, RunID: id, Seq: res.Seq, Owner: owner})
	}
	return res, nil
}

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
	rows, err := s.pool.Query(ctx, `SELECT e.body FROM runs r
		LEFT JOIN LATERAL (SELECT seq, body FROM events
			WHERE tenant = r.tenant AND run_id = r.run_id AND seq >= $3 ORDER BY seq LIMIT $4) e ON true
		WHERE r.tenant = $1 AND r.run_id = $2 ORDER BY e.seq`, tenant, runID, fromSeq, limitParam(limit))
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
		`SELECT ordinal, snapshot FROM runs WHERE tenant = $1 AND session = $2 AND ordinal > $3 ORDER BY ordinal LIMIT $4`,
		tenant, session, after, limitParam(limit))
	if err != nil {
		return nil, fail("session runs of "+tenant+"/"+session, err)
	}
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
		`SELECT ordinal, snapshot FROM runs WHERE tenant = $1 AND session = $2 AND live ORDER BY ordinal`, tenant, session)
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
		if err := json.Unmarshal(snap, &r); err != nil {
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
	rows, err := s.pool.Query(ctx, `SELECT run_id FROM runs WHERE tenant = $1 AND status = $2 AND run_id > $3 ORDER BY run_id LIMIT $4`,
		tenant, string(status), after, limitParam(limit))
	if err != nil {
		return nil, fail("runs of "+tenant+" by status", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail("runs of "+tenant+" by status", err)
	}
	return out, nil
}

func checkIDs(what1, id1, what2, id2 string) error {
	if err := loop.CheckID(what1, id1); err != nil {
		return err
	}
	return loop.CheckID(what2, id2)
}

package pgstore

import (
	"context"
	"fmt"

	"github.com/agenthost/agenthost/runtime"
)

// pruneBatch bounds the Runs one pruning transaction takes.
const pruneBatch = 500

// sqlPrune prunes up to $2 Runs of the prunable table older than $1, in
// one statement (one transaction): it takes their prunable rows (skipping
// rows another Prune holds), deletes their events, their command IDs and
// their creation command, lowers each Run's stored_bytes by the bytes it
// deleted, and counts each. The runs rows are updated with a subtraction,
// so that a commit that got to a row first is not undone.
const sqlPrune = `WITH due AS (
		DELETE FROM prunable p USING (
			SELECT updated_at, tenant, run_id FROM prunable WHERE updated_at < $1
			ORDER BY updated_at, tenant, run_id LIMIT $2 FOR UPDATE SKIP LOCKED) d
		WHERE p.updated_at = d.updated_at AND p.tenant = d.tenant AND p.run_id = d.run_id
		RETURNING p.tenant, p.run_id),
	ev AS (DELETE FROM events e USING due WHERE e.tenant = due.tenant AND e.run_id = due.run_id
		RETURNING e.tenant, e.run_id, octet_length(e.body) AS n),
	cm AS (DELETE FROM commands c USING due WHERE c.tenant = due.tenant AND c.run_id = due.run_id
		RETURNING c.tenant, c.run_id, octet_length(c.command_id) AS n),
	cc AS (DELETE FROM create_commands cc USING due, runs r
		WHERE r.tenant = due.tenant AND r.run_id = due.run_id
			AND cc.tenant = r.tenant AND cc.command_id = r.create_cmd AND cc.run_id = r.run_id
		RETURNING cc.tenant, cc.run_id, octet_length(cc.command_id) AS n),
	freed AS (SELECT tenant, run_id, sum(n) AS n
		FROM (SELECT * FROM ev UNION ALL SELECT * FROM cm UNION ALL SELECT * FROM cc) f GROUP BY tenant, run_id),
	sb AS (UPDATE runs r SET stored_bytes = r.stored_bytes - freed.n
		FROM freed WHERE r.tenant = freed.tenant AND r.run_id = freed.run_id)
	SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM ev), (SELECT count(*) FROM cm), (SELECT count(*) FROM cc)`

// Prune implements runtime.Store. It takes the terminal Runs from the
// prunable table in update order, pruneBatch per transaction, and deletes
// their event logs, command IDs and creation commands, taking their bytes
// off the Runs' stored_bytes; the snapshots stay.
// It is cross-tenant, safe to stop half-way, and safe to run on several
// nodes at once (each batch skips the rows another one holds).
//
// Once a Run's command IDs are pruned, a retried command is no longer
// recognised: it is decided afresh, and on a terminal Run that is a
// version conflict, not a duplicate.
func (s *Store) Prune(ctx context.Context, beforeMS int64) (runtime.PruneStats, error) {
	if err := s.enter(); err != nil {
		return runtime.PruneStats{}, err
	}
	defer s.leave()
	var st runtime.PruneStats
	for {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("pgstore: prune: %w", err)
		}
		var runs, events, cmds, created int64
		if err := s.pool.QueryRow(ctx, sqlPrune, beforeMS, pruneBatch).Scan(&runs, &events, &cmds, &created); err != nil {
			return st, fail("prune", err)
		}
		st.Runs += int(runs)
		st.Events += int(events)
		st.Commands += int(cmds + created)
		if runs < pruneBatch {
			return st, nil
		}
	}
}

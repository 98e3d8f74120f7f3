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
// their creation command, and counts each.
const sqlPrune = `WITH due AS (
		DELETE FROM prunable p USING (
			SELECT updated_at, tenant, run_id FROM prunable WHERE updated_at < $1
			ORDER BY updated_at, tenant, run_id LIMIT $2 FOR UPDATE SKIP LOCKED) d
		WHERE p.updated_at = d.updated_at AND p.tenant = d.tenant AND p.run_id = d.run_id
		RETURNING p.tenant, p.run_id),
	ev AS (DELETE FROM events e USING due WHERE e.tenant = due.tenant AND e.run_id = due.run_id RETURNING 1),
	cm AS (DELETE FROM commands c USING due WHERE c.tenant = due.tenant AND c.run_id = due.run_id RETURNING 1),
	cc AS (DELETE FROM create_commands cc USING due, runs r
		WHERE r.tenant = due.tenant AND r.run_id = due.run_id
			AND cc.tenant = r.tenant AND cc.command_id = r.create_cmd AND cc.run_id = r.run_id
		RETURNING 1)
	SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM ev), (SELECT count(*) FROM cm), (SELECT count(*) FROM cc)`

// Prune implements runtime.Store. It takes the terminal Runs from the
// prunable table in update order, pruneBatch per transaction, and deletes
// their event logs, command IDs and creation commands; the snapshots stay.
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

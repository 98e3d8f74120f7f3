-- agenthost schema version 6: the two secondary indexes of runs that
-- every query uses with the tenant lead with another column, so that
-- none of them can serve a lookup of a Run by its key, (tenant, run_id).
-- On a table PostgreSQL has not analyzed yet (a new schema, before
-- autovacuum's first ANALYZE), an index that leads with the tenant costs
-- the same as the primary key for that lookup; the planner took
-- runs_by_status, bounded by the tenant alone, and a pooled connection
-- kept that plan: every commit, load and creation read all the tenant's
-- Runs until autovacuum analyzed the table. The queries these indexes
-- serve name both their leading columns, so they read the same rows.
-- Writes to runs wait while the two indexes are built again: a few
-- seconds per million Runs.
DROP INDEX IF EXISTS runs_by_status;
CREATE INDEX runs_by_status ON runs (status, tenant, run_id);
DROP INDEX IF EXISTS runs_by_session;
CREATE UNIQUE INDEX runs_by_session ON runs (session, tenant, ordinal);

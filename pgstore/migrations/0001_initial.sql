-- agenthost schema version 1: the tables of runtime.Store on PostgreSQL.
-- The package doc (pgstore/doc.go) describes the layout. Every ID is text
-- COLLATE "C", so that ordering and paging compare bytes, as Badger's keys
-- do. Snapshots and events are the bytes json.Marshal gave (bytea, not
-- jsonb, which would rewrite them).

-- A session: the last ordinal given to its Runs, its owner incarnation
-- and fencing epoch, and how many of its Runs are not terminal. A Commit
-- locks it first; CreateRun and ClaimSession upsert it.
CREATE TABLE sessions (
    tenant       text COLLATE "C" NOT NULL,
    session      text COLLATE "C" NOT NULL,
    last_ordinal bigint NOT NULL DEFAULT 0,
    owner        text COLLATE "C" NOT NULL DEFAULT '',
    epoch        bigint NOT NULL DEFAULT 0,
    live_count   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session)
);
-- Sessions that hold work: OrphanedSessions and ActiveSessions.
CREATE INDEX sessions_live ON sessions (tenant, session) WHERE live_count > 0;

-- A Run: its snapshot and what the indexes derive from. live is
-- !status.Terminal(); executing is the JSON of the Run's executing
-- effects' records (runtime.EffectRecord), NULL when it has none, and
-- has_executing says which. The columns a Commit changes every time (seq,
-- updated_at, executing, snapshot) are in no index, so that its update can
-- be HOT.
CREATE TABLE runs (
    tenant        text COLLATE "C" NOT NULL,
    run_id        text COLLATE "C" NOT NULL,
    session       text COLLATE "C" NOT NULL,
    ordinal       bigint NOT NULL,
    seq           bigint NOT NULL,
    status        text COLLATE "C" NOT NULL,
    live          boolean NOT NULL,
    has_executing boolean NOT NULL,
    updated_at    bigint NOT NULL,
    create_cmd    text COLLATE "C",
    executing     bytea,
    snapshot      bytea NOT NULL,
    PRIMARY KEY (tenant, run_id)
) WITH (fillfactor = 85);
-- SessionRuns: a session's Runs in creation order.
CREATE UNIQUE INDEX runs_by_session ON runs (tenant, session, ordinal);
-- ActiveRuns: the non-terminal Runs of a session, in order.
CREATE INDEX runs_active ON runs (tenant, session, ordinal) WHERE live;
-- RunsByStatus: a tenant's Runs of one status, in ID order.
CREATE INDEX runs_by_status ON runs (tenant, status, run_id);
-- ExecutingEffects: the Runs of a session with effects in state executing.
CREATE INDEX runs_executing ON runs (tenant, session, ordinal) WHERE has_executing;

-- The event log of each Run, Seq 1…
CREATE TABLE events (
    tenant text COLLATE "C" NOT NULL,
    run_id text COLLATE "C" NOT NULL,
    seq    bigint NOT NULL,
    body   bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
);

-- The command IDs applied to each Run, with the Seq each produced.
CREATE TABLE commands (
    tenant     text COLLATE "C" NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    command_id text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    PRIMARY KEY (tenant, run_id, command_id)
);

-- The command IDs of CreateRun, scoped to the tenant.
CREATE TABLE create_commands (
    tenant     text COLLATE "C" NOT NULL,
    command_id text COLLATE "C" NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, command_id)
);

-- Terminal Runs whose log has not been pruned, by the update that ended
-- them: Prune.
CREATE TABLE prunable (
    updated_at bigint NOT NULL,
    tenant     text COLLATE "C" NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    PRIMARY KEY (updated_at, tenant, run_id)
);

-- Node incarnations and their leases, in the database's clock (Unix ms).
-- dead is set once a registration or renewal finds the lease run out: a
-- dead incarnation never comes back.
CREATE TABLE nodes (
    node_id    text COLLATE "C" NOT NULL PRIMARY KEY,
    expires_ms bigint NOT NULL,
    dead       boolean NOT NULL DEFAULT false
);

-- Plugin KV, and the bytes (keys plus values) each (tenant, plugin)
-- holds. A write locks the usage row, which serializes one plugin's
-- writes across nodes.
CREATE TABLE kv (
    tenant text COLLATE "C" NOT NULL,
    plugin text COLLATE "C" NOT NULL,
    key    bytea NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (tenant, plugin, key)
);
CREATE TABLE kv_usage (
    tenant text COLLATE "C" NOT NULL,
    plugin text COLLATE "C" NOT NULL,
    bytes  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, plugin)
);

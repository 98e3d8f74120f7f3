-- agenthost schema version 5: the model endpoints a provider's
-- rate-limited answer closed (runtime.EndpointGate), so that every node
-- sharing the database waits as long as the provider asked, not only the
-- node that got the answer. One row per endpoint (a model executor
-- plugin's ID) that was ever closed; closed_until_ms is in the database's
-- clock (Unix ms), so the nodes' clocks need not agree. Nothing already
-- stored changes.
CREATE TABLE IF NOT EXISTS endpoint_closures (
    endpoint        text COLLATE "C" NOT NULL PRIMARY KEY,
    closed_until_ms bigint NOT NULL
);

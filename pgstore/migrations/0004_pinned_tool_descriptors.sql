-- agenthost schema version 4: runs.snapshot may hold runcodec's version
-- 0x02, in which each tool of a Run's spec carries the descriptor the
-- builder shows the model (pinned when the Run is created, so that a tool
-- added to the config while the Run is in flight is never offered to it).
-- The layout does not change: rows written before hold version 0x01 or
-- JSON, which this version reads as well. The version is recorded so that
-- an agenthost that reads only 0x01 snapshots refuses this database
-- instead of failing on each Run written since.
SELECT 1;

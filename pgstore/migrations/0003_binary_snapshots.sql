-- agenthost schema version 3: runs.snapshot holds the binary form of a
-- Run's snapshot (internal/runcodec: a version byte 0x01, then its
-- fields), which decodes several times faster than its JSON on every
-- advance's reload. The layout does not change: a row written before holds
-- the snapshot's JSON, which this version reads as well, and the Run's next
-- commit rewrites it. The version is recorded so that an agenthost that
-- reads JSON snapshots only refuses this database instead of misreading
-- it. stored_bytes stays exact: a commit takes the old snapshot's
-- octet_length off, whichever form it is in.
SELECT 1;

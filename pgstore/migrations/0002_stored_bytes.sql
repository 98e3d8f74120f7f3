-- agenthost schema version 2: each Run's stored bytes, for the tenants'
-- storage quota (runtime.Store.TenantStoredBytes).
--
-- stored_bytes is what the Run holds: the length of its snapshot, of each
-- of its events, of each command ID applied to it, and of its creation
-- command while that is kept. CreateRun sets it, a Commit changes it in
-- the same statement that writes the Run, and Prune lowers it by what it
-- deletes. It is in no index, so that a Commit's update of the row stays
-- HOT; TenantStoredBytes sums it over the tenant's rows through the
-- primary key (tenant, run_id).
ALTER TABLE runs ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0;

-- The Runs already stored: counted from what they hold. This reads every
-- event once and rewrites every runs row.
UPDATE runs r SET stored_bytes = octet_length(r.snapshot)
    + coalesce((SELECT sum(octet_length(e.body)) FROM events e
        WHERE e.tenant = r.tenant AND e.run_id = r.run_id), 0)
    + coalesce((SELECT sum(octet_length(c.command_id)) FROM commands c
        WHERE c.tenant = r.tenant AND c.run_id = r.run_id), 0)
    + coalesce((SELECT octet_length(cc.command_id) FROM create_commands cc
        WHERE cc.tenant = r.tenant AND cc.command_id = r.create_cmd AND cc.run_id = r.run_id), 0);

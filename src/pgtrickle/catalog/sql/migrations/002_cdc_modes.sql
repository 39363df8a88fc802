-- pgtrickle catalog, version 2: change capture modes (trigger / auto / wal),
-- the WAL decoder's durable progress, and what CDC health needs.

ALTER TABLE pgtrickle.pgt_change_sources
    -- what the user asked for; 'default' follows the cdc_mode setting
    ADD COLUMN cdc_mode_setting text NOT NULL DEFAULT 'default'
        CHECK (cdc_mode_setting IN ('default', 'trigger', 'auto', 'wal')),
    -- why the source is captured the way it is (set on every transition / fallback)
    ADD COLUMN cdc_reason text,
    -- the table's REPLICA IDENTITY before WAL capture set it to FULL ('d', 'n', 'f', 'i')
    ADD COLUMN original_replica_identity "char",
    ADD COLUMN transitioned_at timestamptz;

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('cdc_mode', 'trigger',
     'default change capture of a source: trigger | auto (triggers, then WAL after the first refresh) | wal'),
    ('wal_transition_timeout', '30 seconds',
     'how long a trigger-to-WAL transition waits for the decoder to be running and caught up'),
    ('slot_lag_alert_bytes', '1073741824',
     'alert slot_lag_warning when the replication slot retains more WAL than this');

-- The WAL decoder's progress: every change of a transaction whose commit ends at
-- or before flushed_lsn is in the change buffers. Updated in the same
-- transaction as the buffer rows it covers, so a restart neither loses nor
-- duplicates a change.
CREATE TABLE pgtrickle.pgt_decoder_state (
    slot_name     text PRIMARY KEY,
    publication   text NOT NULL,
    flushed_lsn   pg_lsn NOT NULL,
    changes_total bigint NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Every buffer row records when it was captured (the writing transaction's
-- start for triggers, the commit time for WAL), for health checks and debugging.
DO $$
DECLARE
    b text;
BEGIN
    FOR b IN SELECT buffer_name FROM pgtrickle.pgt_change_sources LOOP
        EXECUTE format('ALTER TABLE pgtrickle_changes.%I ADD COLUMN IF NOT EXISTS captured_at timestamptz '
                       'NOT NULL DEFAULT now()', b);
    END LOOP;
END
$$;

-- Why a stream table needs reinitialization (shown as the reason of its next FULL refresh);
-- cleared with needs_reinit when a refresh completes.
ALTER TABLE pgtrickle.pgt_stream_tables ADD COLUMN IF NOT EXISTS reinit_reason text;

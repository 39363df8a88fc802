-- Why a stream table needs reinitialization, when pgtrickle asked for it (a partition
-- attached or detached with rows, an inheritance child joining or leaving): the next
-- (FULL) refresh reports it as its reason. Cleared with needs_reinit by a completed refresh.
ALTER TABLE pgtrickle.pgt_stream_tables ADD COLUMN IF NOT EXISTS reinit_reason text;

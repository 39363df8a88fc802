-- Why a stream table needs reinitialization, when pgtrickle asked for it (a partition
-- attached or detached with rows, an inheritance child joining or leaving): the next
-- (FULL) refresh reports it as its reason. Cleared with needs_reinit by a completed refresh.
-- reinit_xid: the transaction that asked; a refresh clears the request only when it
-- recomputed in full at a snapshot that sees that transaction (one already running
-- when the request committed would otherwise forget it).
ALTER TABLE pgtrickle.pgt_stream_tables ADD COLUMN IF NOT EXISTS reinit_reason text,
    ADD COLUMN IF NOT EXISTS reinit_xid xid8;

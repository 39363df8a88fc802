-- Hidden state tables: a node of a stream table's defining query whose value the delta rules
-- cannot re-derive cheaply (an aggregate of an aggregate, an aggregate joined on its values,
-- the input of a TopK) is kept in a table of its own in pgtrickle_changes, brought up to date
-- by the stream table's own refresh, in the same transaction (docs/ARCHITECTURE.md, "Hidden
-- state tables"). One row per kept node; dropped with the stream table.
CREATE TABLE IF NOT EXISTS pgtrickle.pgt_state_tables (
    pgt_id      bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables (pgt_id) ON DELETE CASCADE,
    position    integer NOT NULL,
    relid       oid NOT NULL,
    fingerprint text NOT NULL,
    reason      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pgt_id, position)
);
COMMENT ON TABLE pgtrickle.pgt_state_tables IS
    'hidden state tables of stream tables: one per node of the defining query kept as a table';
REVOKE ALL ON pgtrickle.pgt_state_tables FROM PUBLIC;

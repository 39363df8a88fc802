-- pgtrickle catalog, version 9: atomic refresh groups (diamond consistency and explicit groups).
-- (Functions are in api.sql: alter_stream_table(diamond_consistency), create_refresh_group, drop_refresh_group.)

ALTER TABLE pgtrickle.pgt_stream_tables
    -- 'atomic': when this stream table is the fan-in of a diamond, it and the stream tables between
    -- the shared ancestor and it refresh as one group (one snapshot, one transaction).
    ADD COLUMN diamond_consistency text NOT NULL DEFAULT 'atomic'
        CHECK (diamond_consistency IN ('atomic', 'none'));

CREATE TABLE pgtrickle.pgt_refresh_groups (
    group_id    bigserial PRIMARY KEY,
    group_name  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL DEFAULT session_user
);

CREATE TABLE pgtrickle.pgt_refresh_group_members (
    group_id  bigint NOT NULL REFERENCES pgtrickle.pgt_refresh_groups ON DELETE CASCADE,
    pgt_id    bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables ON DELETE CASCADE,
    PRIMARY KEY (group_id, pgt_id)
);
CREATE INDEX ON pgtrickle.pgt_refresh_group_members (pgt_id);

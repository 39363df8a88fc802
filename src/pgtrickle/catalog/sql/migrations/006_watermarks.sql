-- pgtrickle catalog, version 6: user-provided watermarks and watermark groups.
-- An external loader says "source S is complete through time T" with
-- pgtrickle.advance_watermark(S, T); watermark groups couple sources whose
-- data must be consumed together; stream tables are gated or held back.

-- Per-source watermark: the latest advancement of each source.
CREATE TABLE pgtrickle.pgt_watermarks (
    source_relid     oid PRIMARY KEY,
    watermark        timestamptz NOT NULL,
    advancement_id   bigint NOT NULL,
    advanced_at      timestamptz NOT NULL,
    advanced_by      name NOT NULL,
    application_name text
);

-- Every advancement, with the advancing transaction's xid and snapshot: the
-- changes of the source "as of watermark T" are those visible in that
-- snapshot plus the advancing transaction's own (hold_back reads them).
CREATE TABLE pgtrickle.pgt_watermark_history (
    advancement_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_relid       oid NOT NULL,
    watermark          timestamptz NOT NULL,
    previous_watermark timestamptz,
    advanced_at        timestamptz NOT NULL,
    advanced_by        name NOT NULL,
    application_name   text,
    xid                xid8 NOT NULL,
    snapshot           pg_snapshot NOT NULL
);
CREATE INDEX ON pgtrickle.pgt_watermark_history (source_relid, watermark);

CREATE TABLE pgtrickle.pgt_watermark_groups (
    group_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_name          text NOT NULL UNIQUE,
    tolerance           interval NOT NULL DEFAULT '0 seconds' CHECK (tolerance >= '0 seconds'),
    stale_after         interval CHECK (stale_after > '0 seconds'),
    -- the group's minimum watermark the last time it was aligned (NULL: never yet)
    effective_watermark timestamptz,
    aligned_at          timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pgtrickle.pgt_watermark_group_sources (
    group_id            bigint NOT NULL REFERENCES pgtrickle.pgt_watermark_groups ON DELETE CASCADE,
    source_relid        oid NOT NULL,
    -- this source's advancement when the group was last aligned (hold_back reads the source as of it)
    aligned_advancement bigint,
    -- a watermark_stuck alert was sent at this time (cleared, with watermark_resumed, when it moves)
    stuck_since         timestamptz,
    PRIMARY KEY (group_id, source_relid)
);
CREATE INDEX ON pgtrickle.pgt_watermark_group_sources (source_relid);

ALTER TABLE pgtrickle.pgt_stream_tables
    -- 'inferred': gate when the stream table depends (transitively) on two or more sources of one group
    ADD COLUMN watermark_gating text NOT NULL DEFAULT 'inferred'
        CHECK (watermark_gating IN ('inferred', 'none', 'gate', 'hold_back')),
    -- the external point in time the contents reflect: minimum of the applicable groups at the last refresh
    ADD COLUMN effective_watermark timestamptz,
    -- hold_back: {"sources": {relid: snapshot each source was read at}, "groups": {group_id: watermark}}
    ADD COLUMN watermark_positions jsonb;

ALTER TABLE pgtrickle.pgt_refresh_history ADD COLUMN effective_watermark timestamptz;

-- The highest xid below which cleanup has deleted a buffer's rows: a hold_back
-- refresh can rebuild a source as of an older snapshot only from rows still there.
ALTER TABLE pgtrickle.pgt_change_sources ADD COLUMN cleaned_below xid8;

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('watermark_history_retention', '7 days',
     'watermark advancements older than this are pruned (the latest per source, and those a group was last aligned at, are kept)');

-- The signature of alter_stream_table changes: drop the old one (api.sql re-creates it).
DROP FUNCTION IF EXISTS pgtrickle.alter_stream_table(text, text, text, text, text, bigint, double precision,
                                                       double precision, integer, text, double precision);

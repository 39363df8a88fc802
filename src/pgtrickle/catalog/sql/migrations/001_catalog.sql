-- pgtrickle catalog, version 1.
-- Tables only: functions and views live in api.sql, which is re-applied on
-- every install so that upgrades replace them.

CREATE SCHEMA IF NOT EXISTS pgtrickle;
CREATE SCHEMA IF NOT EXISTS pgtrickle_changes;

COMMENT ON SCHEMA pgtrickle IS 'pgtrickle catalog and SQL API';
COMMENT ON SCHEMA pgtrickle_changes IS 'pgtrickle change buffers and refresh staging tables';

CREATE TABLE pgtrickle.pgt_settings (
    name        text PRIMARY KEY,
    value       text NOT NULL,
    description text NOT NULL
);

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('default_schedule', '1m',
     'schedule of a stream table created without one, and of a calculated one with no scheduled downstream'),
    ('history_retention', '7 days',
     'refresh history older than this is pruned by the daemon');

CREATE SEQUENCE pgtrickle.pgt_stream_tables_pgt_id_seq;

CREATE TABLE pgtrickle.pgt_stream_tables (
    pgt_id             bigint PRIMARY KEY DEFAULT nextval('pgtrickle.pgt_stream_tables_pgt_id_seq'),
    pgt_relid          oid NOT NULL UNIQUE,
    pgt_schema         text NOT NULL,
    pgt_name           text NOT NULL,
    def_view           oid NOT NULL,
    defining_query     text NOT NULL,
    normalized_query   text NOT NULL,
    schedule           text NOT NULL,
    refresh_mode       text NOT NULL CHECK (refresh_mode IN ('AUTO', 'FULL', 'DIFFERENTIAL')),
    status             text NOT NULL DEFAULT 'INITIALIZING'
                       CHECK (status IN ('INITIALIZING', 'ACTIVE', 'SUSPENDED', 'ERROR')),
    needs_reinit       boolean NOT NULL DEFAULT true,
    frontier           pg_snapshot,
    frontier_lsn       pg_lsn,
    data_timestamp     timestamptz,
    last_refresh_at    timestamptz,
    last_attempt_at    timestamptz,
    consecutive_errors integer NOT NULL DEFAULT 0,
    last_error         text,
    created_by         name NOT NULL DEFAULT session_user,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (pgt_schema, pgt_name)
);
ALTER SEQUENCE pgtrickle.pgt_stream_tables_pgt_id_seq OWNED BY pgtrickle.pgt_stream_tables.pgt_id;

-- Sources whose changes are captured (plain tables), or stream tables, each
-- with one change buffer shared by every consumer.
CREATE TABLE pgtrickle.pgt_change_sources (
    source_relid   oid PRIMARY KEY,
    source_schema  text NOT NULL,
    source_name    text NOT NULL,
    source_kind    text NOT NULL CHECK (source_kind IN ('TABLE', 'STREAM_TABLE')),
    buffer_name    text NOT NULL UNIQUE,
    -- captured columns: [{"attnum": n, "name": "...", "type": "...", "buf": "<buffer column suffix>"}]
    columns        jsonb NOT NULL DEFAULT '[]',
    key_columns    text[] NOT NULL DEFAULT '{}',
    cdc_mode       text NOT NULL DEFAULT 'trigger' CHECK (cdc_mode IN ('trigger', 'wal')),
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pgtrickle.pgt_dependencies (
    pgt_id        bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables ON DELETE CASCADE,
    source_relid  oid NOT NULL REFERENCES pgtrickle.pgt_change_sources,
    columns_used  text[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (pgt_id, source_relid)
);
CREATE INDEX ON pgtrickle.pgt_dependencies (source_relid);

CREATE TABLE pgtrickle.pgt_refresh_history (
    refresh_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pgt_id            bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables ON DELETE CASCADE,
    action            text NOT NULL
                      CHECK (action IN ('FULL', 'DIFFERENTIAL', 'NO_DATA', 'SKIP')),
    status            text NOT NULL
                      CHECK (status IN ('RUNNING', 'COMPLETED', 'FAILED', 'SKIPPED', 'ABANDONED')),
    initiated_by      text NOT NULL CHECK (initiated_by IN ('SCHEDULER', 'MANUAL', 'INITIAL')),
    rows_inserted     bigint,
    rows_deleted      bigint,
    delta_row_count   bigint,
    start_time        timestamptz NOT NULL DEFAULT clock_timestamp(),
    end_time          timestamptz,
    was_full_fallback boolean NOT NULL DEFAULT false,
    mode_reason       text,
    skip_reason       text,
    error_message     text,
    frontier          pg_snapshot,
    spark_seconds     double precision
);
CREATE INDEX ON pgtrickle.pgt_refresh_history (pgt_id, refresh_id DESC);

CREATE TABLE pgtrickle.pgt_refresh_requests (
    request_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pgt_id        bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables ON DELETE CASCADE,
    kind          text NOT NULL CHECK (kind IN ('INITIALIZE', 'REFRESH')),
    force         boolean NOT NULL DEFAULT false,
    requested_by  name NOT NULL DEFAULT session_user,
    requested_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON pgtrickle.pgt_refresh_requests (pgt_id);

-- pgtrickle SQL API, the public entry points (installed after every _api_* function).
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- ---------------------------------------------------------- public entry points
--
-- The functions that take names take them in the caller's terms: an unqualified
-- name is resolved through the caller's search_path. These entry points hand
-- that search_path to the implementation (pgtrickle._api_*), which runs with its
-- own fixed one and sets the caller's only to resolve those names. They are
-- SQL-standard bodies (BEGIN ATOMIC): parsed once, here, so nothing in the
-- caller's search_path can change what they call.

-- Find a stream table by a name in the caller's terms (the daemon and the CLI use it too).
CREATE OR REPLACE FUNCTION pgtrickle._find_st(p_name text)
RETURNS pgtrickle.pgt_stream_tables LANGUAGE sql
BEGIN ATOMIC
    SELECT * FROM pgtrickle._find_st($1, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.create_stream_table(
    name text,
    query text,
    schedule text DEFAULT NULL,
    refresh_mode text DEFAULT 'AUTO',
    initialize boolean DEFAULT true)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_create_stream_table($1, $2, $3, $4, $5, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.advance_watermark(source text, watermark timestamptz)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_advance_watermark($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.alter_stream_table(
    name text,
    schedule text DEFAULT NULL,
    refresh_mode text DEFAULT NULL,
    status text DEFAULT NULL,
    circuit_breaker text DEFAULT NULL,
    circuit_breaker_ceiling bigint DEFAULT NULL,
    circuit_breaker_max_ratio double precision DEFAULT NULL,
    circuit_breaker_sensitivity double precision DEFAULT NULL,
    circuit_breaker_window integer DEFAULT NULL,
    circuit_breaker_baseline text DEFAULT NULL,
    differential_fallback_ratio double precision DEFAULT NULL,
    watermark_gating text DEFAULT NULL,
    diamond_consistency text DEFAULT NULL)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_alter_stream_table($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.create_refresh_group(name text, members text[])
RETURNS bigint LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_create_refresh_group($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.drop_refresh_group(name text)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_drop_refresh_group($1);
END;

CREATE OR REPLACE FUNCTION pgtrickle.drop_stream_table(name text, cascade boolean DEFAULT false)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_drop_stream_table($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.refresh_stream_table(name text, force boolean DEFAULT false)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_refresh_stream_table($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.reset_circuit_breaker(name text, action text DEFAULT 'apply')
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_reset_circuit_breaker($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.inspect_circuit_breaker(name text, sample_rows integer DEFAULT 5)
RETURNS TABLE (source text, action text, changes bigint, first_captured timestamptz,
               last_captured timestamptz, sample jsonb) LANGUAGE sql
BEGIN ATOMIC
    SELECT * FROM pgtrickle._api_inspect_circuit_breaker($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.explain_refresh_mode(name text)
RETURNS TABLE (configured_mode text, effective_mode text, reason text, analyzed_at timestamptz) LANGUAGE sql
BEGIN ATOMIC
    SELECT * FROM pgtrickle._api_explain_refresh_mode($1, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.resume_stream_table(name text)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_resume_stream_table($1, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.get_staleness(name text)
RETURNS interval LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_get_staleness($1, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.get_refresh_history(name text, max_rows integer DEFAULT 20)
RETURNS TABLE (refresh_id bigint, action text, status text, initiated_by text,
               rows_inserted bigint, rows_deleted bigint, delta_row_count bigint,
               start_time timestamptz, end_time timestamptz, duration interval,
               was_full_fallback boolean, mode_reason text, skip_reason text, error_message text,
               spark_jobs integer, spark_stages integer, spark_jobs_why text) LANGUAGE sql
BEGIN ATOMIC
    SELECT * FROM pgtrickle._api_get_refresh_history($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.set_user_triggers(name text, mode text)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_set_user_triggers($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.publish_stream_table(name text, publication text)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_publish_stream_table($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.watermark_history(source text, max_rows integer DEFAULT 20)
RETURNS TABLE (advancement_id bigint, watermark timestamptz, previous_watermark timestamptz,
               advanced_at timestamptz, advanced_by name, application_name text, xid xid8, snapshot pg_snapshot) LANGUAGE sql
BEGIN ATOMIC
    SELECT * FROM pgtrickle._api_watermark_history($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.create_watermark_group(
    name text,
    sources text[],
    tolerance interval DEFAULT '0 seconds',
    stale_after interval DEFAULT NULL)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_create_watermark_group($1, $2, $3, $4, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.alter_watermark_group(
    name text,
    sources text[] DEFAULT NULL,
    tolerance interval DEFAULT NULL,
    stale_after interval DEFAULT NULL)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_alter_watermark_group($1, $2, $3, $4, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.set_cdc_mode(source text, mode text)
RETURNS void LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_set_cdc_mode($1, $2, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.normalize_query(query text)
RETURNS text LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_normalize_query($1, pg_catalog.current_setting('search_path'));
END;

CREATE OR REPLACE FUNCTION pgtrickle.stream_table_query_changed(name text, query text)
RETURNS boolean LANGUAGE sql
BEGIN ATOMIC
    SELECT pgtrickle._api_stream_table_query_changed($1, $2, pg_catalog.current_setting('search_path'));
END;

COMMENT ON FUNCTION pgtrickle.create_stream_table(text, text, text, text, boolean) IS
'Create a stream table: a table kept equal to the result of a query. schedule: duration (''30s'', ''1h30m''), cron, or ''calculated''; refresh_mode: AUTO | FULL | DIFFERENTIAL.';

COMMENT ON FUNCTION pgtrickle.normalize_query(text) IS
'A defining query in the normalized, schema-qualified form the catalog keeps (pg_get_viewdef), parsed in the caller''s search_path with the caller''s rights; nothing is created.';

COMMENT ON FUNCTION pgtrickle.stream_table_query_changed(text, text) IS
'Whether a query differs, in normalized form, from the defining query a stream table has now (so replacing the stream table would change what it computes).';

COMMENT ON FUNCTION pgtrickle.refresh_stream_table(text, boolean) IS
'Ask the pgtrickle daemon to refresh a stream table now (force => true passes an open circuit breaker and a closed watermark gate). Runs when the calling transaction commits, and does not wait (a NOTICE says so when no daemon is running); `pgtrickle refresh NAME` waits for the result.';

COMMENT ON FUNCTION pgtrickle.advance_watermark(text, timestamptz) IS
'Say that a source table is complete through a point in time (monotonic; part of the caller''s transaction).';

COMMENT ON FUNCTION pgtrickle.explain_refresh_mode(text) IS
'Which refresh mode runs for a stream table (FULL or DIFFERENTIAL) and why, as analysed by the refresh engine.';

COMMENT ON FUNCTION pgtrickle.resume_stream_table(text) IS
'Resume a SUSPENDED (or ERROR) stream table: status ACTIVE, error count reset, a refresh queued, alert resumed.';

COMMENT ON FUNCTION pgtrickle.get_staleness(text) IS
'How old a stream table''s data is: now() minus the time of the snapshot it reflects; NULL when never refreshed. A stream table whose query reads the clock reflects the time of its last recompute (it ages until its next scheduled refresh).';

COMMENT ON FUNCTION pgtrickle.set_user_triggers(text, text) IS
'How refreshes of one stream table treat its user triggers: auto | on | off, or default / NULL for the user_triggers setting.';

COMMENT ON FUNCTION pgtrickle.publish_stream_table(text, text) IS
'Publish a stream table for logical replication: REPLICA IDENTITY FULL, and CREATE PUBLICATION ... FOR TABLE (or ADD TABLE to an existing one).';

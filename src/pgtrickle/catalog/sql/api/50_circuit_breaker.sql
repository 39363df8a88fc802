-- pgtrickle SQL API, alerts and the circuit breaker.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- --------------------------------------------------------- circuit breaker

-- Send one alert: a row in pgtrickle.alerts and a NOTIFY on pg_trickle_alert, both at
-- commit. The payload needs "event"; "at" is added when missing, "alert_id" always.
-- (Every alert goes through here, so the table and the channel never disagree.)
CREATE OR REPLACE FUNCTION pgtrickle._send_alert(p_payload jsonb)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_payload jsonb;
    v_id bigint;
    v_text text;
BEGIN
    IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' OR coalesce(p_payload->>'event', '') = '' THEN
        RAISE EXCEPTION 'an alert payload must be a JSON object with an "event"'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_payload := jsonb_build_object('at', clock_timestamp()) || p_payload;
    INSERT INTO pgtrickle.alerts (event, st_schema, st_name, payload)
    VALUES (v_payload->>'event', v_payload->>'schema', v_payload->>'st_name', v_payload)
    RETURNING alert_id INTO v_id;
    v_payload := v_payload || jsonb_build_object('alert_id', v_id);
    UPDATE pgtrickle.alerts SET payload = v_payload WHERE alert_id = v_id;
    v_text := v_payload::text;
    IF octet_length(v_text) > 7800 THEN
        -- NOTIFY payloads are limited to 8000 bytes: send the essentials, the row has it all.
        v_text := (jsonb_build_object('truncated', true) || jsonb_strip_nulls(jsonb_build_object(
            'event', v_payload->'event', 'st_name', v_payload->'st_name', 'schema', v_payload->'schema',
            'at', v_payload->'at', 'alert_id', v_id)))::text;
    END IF;
    PERFORM pg_notify('pg_trickle_alert', v_text);
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._alert(p_event text, st pgtrickle.pgt_stream_tables, p_fields jsonb)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._send_alert(jsonb_build_object(
        'event', p_event, 'st_name', st.pgt_name, 'schema', st.pgt_schema, 'at', clock_timestamp())
        || coalesce(p_fields, '{}'))
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_reset_circuit_breaker(name text, action text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_action text := lower(btrim(action));
    v_snapshot pg_snapshot;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'reset the circuit breaker of');
    IF v_action IS NULL OR v_action NOT IN ('apply', 'reinitialize', 'skip_changes') THEN
        RAISE EXCEPTION 'invalid action %', coalesce(quote_literal(left(action, 80)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '''apply'' applies the held-back changes, ''reinitialize'' recomputes the stream table, ''skip_changes'' drops the held-back changes.';
    END IF;
    SELECT * INTO st FROM pgtrickle.pgt_stream_tables WHERE pgt_id = st.pgt_id FOR UPDATE;
    IF st.cb_state <> 'open' THEN
        RAISE NOTICE 'the circuit breaker of stream table % is not open; nothing to reset',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name);
        RETURN;
    END IF;
    IF v_action = 'skip_changes' THEN
        -- Forget the held-back changes: the frontier moves past them without applying them.
        v_snapshot := pg_current_snapshot();
        UPDATE pgtrickle.pgt_stream_tables
           SET frontier = v_snapshot, frontier_lsn = pg_current_wal_lsn(),
               -- (A query that reads the clock was not recomputed: its data keeps its time.)
               data_timestamp = CASE WHEN st.reads_clock THEN data_timestamp ELSE now() END
         WHERE pgt_id = st.pgt_id;
        INSERT INTO pgtrickle.pgt_refresh_history
            (pgt_id, action, status, initiated_by, rows_inserted, rows_deleted, delta_row_count,
             end_time, skip_reason, frontier)
        VALUES (st.pgt_id, 'SKIP', 'SKIPPED', 'MANUAL', 0, 0, st.cb_last_delta, clock_timestamp(),
                format('changes skipped by reset_circuit_breaker (%s held back: %s)', st.cb_last_delta,
                       st.cb_trip_reason), v_snapshot);
    ELSIF v_action = 'reinitialize' THEN
        UPDATE pgtrickle.pgt_stream_tables SET needs_reinit = true WHERE pgt_id = st.pgt_id;
        INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind, force) VALUES (st.pgt_id, 'REFRESH', true);
    ELSE
        INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind, force) VALUES (st.pgt_id, 'REFRESH', true);
    END IF;
    UPDATE pgtrickle.pgt_stream_tables
       SET cb_state = 'closed', cb_tripped_at = NULL, updated_at = now()
     WHERE pgt_id = st.pgt_id;
    DELETE FROM pgtrickle.pgt_quarantine WHERE pgt_id = st.pgt_id;
    PERFORM pgtrickle._alert('circuit_breaker_reset', st, jsonb_build_object(
        'action', v_action, 'trip_reason', st.cb_trip_reason, 'delta_row_count', st.cb_last_delta,
        'reset_by', session_user));
    PERFORM pg_notify('pgtrickle_refresh', st.pgt_id::text);
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle.circuit_breaker_status()
RETURNS TABLE (st_name text, mode text, state text, tripped_at timestamptz, trip_reason text,
               baseline_mean double precision, baseline_stddev double precision, last_delta bigint,
               last_deletes bigint, ceiling bigint, max_ratio double precision,
               sensitivity double precision, window_size integer, baseline text,
               computed_threshold double precision, quarantined_changes bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._display_name(s.pgt_schema, s.pgt_name), pgtrickle._cb_mode(s.cb_mode), s.cb_state,
           s.cb_tripped_at, s.cb_trip_reason, s.cb_baseline_mean, s.cb_baseline_stddev, s.cb_last_delta,
           s.cb_last_deletes, s.cb_ceiling, s.cb_max_ratio, s.cb_sensitivity, s.cb_window, s.cb_baseline,
           s.cb_threshold, (SELECT count(*) FROM pgtrickle.pgt_quarantine q WHERE q.pgt_id = s.pgt_id)
      FROM pgtrickle.pgt_stream_tables s
     ORDER BY 1
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_inspect_circuit_breaker(name text, sample_rows integer, caller_path text)
RETURNS TABLE (source text, action text, changes bigint, first_captured timestamptz,
               last_captured timestamptz, sample jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'inspect the circuit breaker of');
    -- The held-back changes are rows of the sources: show them only to a role that may read those.
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d WHERE d.pgt_id = st.pgt_id
                AND NOT has_table_privilege(pgtrickle._caller(), d.source_relid, 'SELECT')) THEN
        RAISE EXCEPTION 'permission denied: role % may not read every source of stream table %, whose held-back changes these are',
            quote_ident(pgtrickle._caller()), pgtrickle._display_name(st.pgt_schema, st.pgt_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'pgtrickle.circuit_breaker_status() shows the counts without the rows.';
    END IF;
    IF sample_rows IS NULL OR sample_rows < 0 OR sample_rows > 1000 THEN
        RAISE EXCEPTION 'sample_rows must be between 0 and 1000, got %', coalesce(sample_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF st.cb_state <> 'open' THEN
        RAISE NOTICE 'the circuit breaker of stream table % is not open',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name);
    END IF;
    RETURN QUERY
        SELECT q.source,
               CASE q.action WHEN 'I' THEN 'INSERT' WHEN 'D' THEN 'DELETE' WHEN 'U' THEN 'UPDATE'
                             ELSE 'TRUNCATE' END,
               count(*), min(q.captured_at), max(q.captured_at),
               (SELECT coalesce(jsonb_agg(x.change), '[]') FROM (
                    SELECT q2.change FROM pgtrickle.pgt_quarantine q2
                     WHERE q2.pgt_id = st.pgt_id AND q2.source = q.source AND q2.action = q.action
                     ORDER BY q2.change_id LIMIT sample_rows) x)
          FROM pgtrickle.pgt_quarantine q
         WHERE q.pgt_id = st.pgt_id
         GROUP BY q.source, q.action
         ORDER BY q.source, q.action;
END
$$;

-- pgtrickle SQL API, operations: refresh modes, resume, staleness, alerts, pruning,
-- user triggers, publishing, normalized queries, values Spark cannot carry.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- ------------------------------------------------------------ refresh modes

CREATE OR REPLACE FUNCTION pgtrickle._api_explain_refresh_mode(name text, caller_path text)
RETURNS TABLE (configured_mode text, effective_mode text, reason text, analyzed_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    configured_mode := st.refresh_mode;
    analyzed_at := st.mode_analyzed_at;
    IF st.reads_clock AND st.refresh_mode <> 'DIFFERENTIAL' THEN
        effective_mode := 'FULL';
        reason := 'the query reads the clock (now(), current_date, ...): it is recomputed in full at every '
                  'scheduled refresh, with or without source changes, with the clock read at the refresh''s snapshot';
    ELSIF st.refresh_mode = 'FULL' THEN
        effective_mode := 'FULL';
        reason := 'refresh_mode is FULL';
    ELSIF st.mode_analyzed_at IS NULL THEN
        effective_mode := NULL;
        reason := 'not analysed yet: the query is analysed at the first refresh '
                  '(or run: pgtrickle explain ' || pgtrickle._display_name(st.pgt_schema, st.pgt_name) || ')';
    ELSE
        effective_mode := st.mode_effective;
        reason := st.mode_reason;
    END IF;
    RETURN NEXT;
END
$$;


-- Checked before every refresh: the daemon fills a stream table with its own rights, so its owner must
-- still be allowed to read every source (a REVOKE after creation stops the refreshes, as it would stop
-- REFRESH MATERIALIZED VIEW). NULL when it may; else the message of the failed refresh.
CREATE OR REPLACE FUNCTION pgtrickle._owner_cannot_read(p_pgt_id bigint)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    st pgtrickle.pgt_stream_tables;
    dep record;
BEGIN
    SELECT * INTO st FROM pgtrickle.pgt_stream_tables WHERE pgt_id = p_pgt_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = st.created_by) THEN
        RETURN format('the owner of stream table %s, role %I, no longer exists; a stream table is refreshed '
                      'only while its owner may read its sources (drop it, or recreate it as another role)',
                      pgtrickle._display_name(st.pgt_schema, st.pgt_name), st.created_by);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
                WHERE a.attrelid = st.pgt_relid AND a.attnum > 0 AND NOT a.attisdropped AND t.typtype = 'd') THEN
        RETURN format('stream table %s has a column of a domain type (left by an older pgtrickle, whose upgrade '
                      'could not change it): writing it would run the domain''s CHECK with pgtrickle''s rights; '
                      'drop what depends on the column and run pgtrickle install',
                      pgtrickle._display_name(st.pgt_schema, st.pgt_name));
    END IF;
    FOR dep IN
        SELECT d.source_relid AS relid, d.columns_used AS cols, n.nspname, c.relname
          FROM pgtrickle.pgt_dependencies d
          JOIN pg_catalog.pg_class c ON c.oid = d.source_relid
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE d.pgt_id = p_pgt_id
         ORDER BY n.nspname, c.relname
    LOOP
        IF pgtrickle._rls_refusal(dep.relid, st.created_by, pgtrickle._display_name(st.pgt_schema, st.pgt_name))
           IS NOT NULL THEN
            RETURN pgtrickle._rls_refusal(dep.relid, st.created_by, pgtrickle._display_name(st.pgt_schema, st.pgt_name));
        END IF;
        IF NOT pgtrickle._caller_may_read(st.created_by, dep.relid, st.def_view) THEN
            RETURN format('permission denied: %I, the owner of stream table %s, may no longer read %I.%I; '
                          'GRANT SELECT ON %I.%I TO %I to refresh it again',
                          st.created_by, pgtrickle._display_name(st.pgt_schema, st.pgt_name), dep.nspname,
                          dep.relname, dep.nspname, dep.relname, st.created_by);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- --------------------------------------------------------------- operations

CREATE OR REPLACE FUNCTION pgtrickle._api_resume_stream_table(name text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_status text;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'resume');
    SELECT * INTO st FROM pgtrickle.pgt_stream_tables WHERE pgt_id = st.pgt_id FOR UPDATE;
    IF st.status NOT IN ('SUSPENDED', 'ERROR') THEN
        RAISE EXCEPTION 'stream table % is %, not SUSPENDED or in ERROR: there is nothing to resume',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name), st.status
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'pgtrickle.refresh_stream_table(name) refreshes it now.';
    END IF;
    v_status := CASE WHEN st.frontier IS NULL THEN 'INITIALIZING' ELSE 'ACTIVE' END;
    UPDATE pgtrickle.pgt_stream_tables
       SET status = v_status, consecutive_errors = 0, updated_at = now()
     WHERE pgt_id = st.pgt_id;
    -- Refresh at once rather than at the next scheduled time: resuming is an explicit ask.
    INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind) VALUES (st.pgt_id, 'REFRESH');
    PERFORM pgtrickle._alert('resumed', st, jsonb_build_object(
        'previous_status', st.status, 'status', v_status, 'consecutive_errors', st.consecutive_errors,
        'last_error', st.last_error, 'resumed_by', session_user));
    PERFORM pg_notify('pgtrickle_refresh', st.pgt_id::text);
END
$$;


CREATE OR REPLACE FUNCTION pgtrickle._api_get_staleness(name text, caller_path text)
RETURNS interval LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    -- NULL: never refreshed, so there is no data to be stale.
    RETURN now() - st.data_timestamp;
END
$$;


-- Alerts that follow from catalog changes, whoever makes them (the refresh
-- engine, DDL event triggers, the SQL API): into ERROR, needing reinitialization.
CREATE OR REPLACE FUNCTION pgtrickle._st_change_alerts()
RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    IF NEW.status = 'ERROR' AND OLD.status IS DISTINCT FROM 'ERROR' THEN
        PERFORM pgtrickle._alert('stream_table_error', NEW, jsonb_build_object(
            'previous_status', OLD.status, 'error', NEW.last_error));
    END IF;
    -- (A stream table going into ERROR needs re-creating, not reinitializing: one alert is enough.)
    IF NEW.needs_reinit AND NOT OLD.needs_reinit AND NEW.status <> 'ERROR' THEN
        PERFORM pgtrickle._alert('reinitialize_needed', NEW, jsonb_build_object(
            'status', NEW.status, 'error', NEW.last_error, 'reason', NEW.reinit_reason));
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS status_change_alerts ON pgtrickle.pgt_stream_tables;
CREATE TRIGGER status_change_alerts
    AFTER UPDATE OF status, needs_reinit ON pgtrickle.pgt_stream_tables
    FOR EACH ROW
    WHEN ((NEW.status = 'ERROR' AND OLD.status IS DISTINCT FROM 'ERROR')
          OR (NEW.needs_reinit AND NOT OLD.needs_reinit AND NEW.status <> 'ERROR'))
    EXECUTE FUNCTION pgtrickle._st_change_alerts();

-- Prune refresh history and alerts past their retention; returns (history rows, alert rows) deleted.
CREATE OR REPLACE FUNCTION pgtrickle._prune(OUT history_deleted bigint, OUT alerts_deleted bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    DELETE FROM pgtrickle.pgt_refresh_history
     WHERE end_time < now() - coalesce(pgtrickle._setting('history_retention'), '7 days')::interval;
    GET DIAGNOSTICS history_deleted = ROW_COUNT;
    DELETE FROM pgtrickle.alerts
     WHERE at < now() - coalesce(pgtrickle._setting('alert_retention'), '7 days')::interval;
    GET DIAGNOSTICS alerts_deleted = ROW_COUNT;
END
$$;

-- ------------------------------------------------- user triggers, publishing

CREATE OR REPLACE FUNCTION pgtrickle._api_set_user_triggers(name text, mode text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_mode text := lower(btrim(mode));
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'change the user triggers of');
    IF v_mode IS NOT NULL AND v_mode NOT IN ('auto', 'on', 'off', 'default') THEN
        RAISE EXCEPTION 'invalid user_triggers %', quote_literal(left(mode, 80))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''auto'', ''on'', ''off'', or ''default'' / NULL (the user_triggers setting).';
    END IF;
    UPDATE pgtrickle.pgt_stream_tables
       SET user_triggers = CASE WHEN v_mode = 'default' THEN NULL ELSE v_mode END, updated_at = now()
     WHERE pgt_id = st.pgt_id;
END
$$;


-- Publish a stream table for logical replication: REPLICA IDENTITY FULL (its
-- rows may have no unique key: duplicates of a linear query share their
-- __pgt_row_id), then CREATE PUBLICATION ... FOR TABLE, or add it to an
-- existing publication.
CREATE OR REPLACE FUNCTION pgtrickle._api_publish_stream_table(name text, publication text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_table text;
    v_pub pg_publication;
    v_caller name;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    v_caller := pgtrickle._require_owner(st, 'publish');
    IF publication IS NULL OR btrim(publication) = '' THEN
        RAISE EXCEPTION 'publication name must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_table := st.pgt_relid::regclass::text;
    SELECT * INTO v_pub FROM pg_publication p WHERE p.pubname = publication;
    -- As if the caller ran CREATE / ALTER PUBLICATION: a new one needs CREATE on the
    -- database, an existing one its owner.
    IF NOT pgtrickle._is_admin(v_caller) THEN
        IF v_pub.oid IS NULL AND NOT has_database_privilege(v_caller, current_database(), 'CREATE') THEN
            RAISE EXCEPTION 'permission denied: role % may not create publications in database %',
                quote_ident(v_caller), quote_ident(current_database())
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('GRANT CREATE ON DATABASE %I TO %I;', current_database(), v_caller);
        ELSIF v_pub.oid IS NOT NULL AND NOT pg_has_role(v_caller, v_pub.pubowner, 'USAGE') THEN
            RAISE EXCEPTION 'permission denied: role % does not own publication %', quote_ident(v_caller),
                quote_ident(publication) USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', v_table);
    IF v_pub.oid IS NULL THEN
        EXECUTE format('CREATE PUBLICATION %I FOR TABLE %s', publication, v_table);
        IF v_caller <> current_user AND has_database_privilege(v_caller, current_database(), 'CREATE') THEN
            EXECUTE format('ALTER PUBLICATION %I OWNER TO %I', publication, v_caller);
        END IF;
    ELSIF NOT v_pub.puballtables AND NOT EXISTS (
            SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = v_pub.oid AND r.prrelid = st.pgt_relid) THEN
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', publication, v_table);
    END IF;
END
$$;

-- ------------------------------------------------------ normalized queries
-- What a defining query becomes once PostgreSQL has parsed it (pg_get_viewdef, schema-qualified):
-- the form the catalog compares, so tools (the dbt materialization) can tell whether a stream
-- table's query changed without comparing whitespace, comments or how names were written.
-- SECURITY INVOKER: the caller parses the query as a temporary view of their own session,
-- with their own rights, and it is gone when the function returns.
CREATE OR REPLACE FUNCTION pgtrickle._api_normalize_query(query text, caller_path text)
RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_query text;
    v_view text := 'pgt_normalize_' || pg_catalog.pg_backend_pid() || '_' || pg_catalog.pg_current_xact_id();
    v_norm text;
BEGIN
    IF query IS NULL OR btrim(query) = '' THEN
        RAISE EXCEPTION 'query must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgtrickle._check_query_text(query, '(candidate)');
    v_query := regexp_replace(query, ';\s*$', '');
    PERFORM pgtrickle._create_query_view(pg_catalog.format('TEMPORARY VIEW %I', v_view), v_query, caller_path,
                                         NULL, NULL, NULL);
    v_norm := pgtrickle._normalized_query(pg_catalog.format('pg_temp.%I', v_view)::regclass);
    EXECUTE pg_catalog.format('DROP VIEW pg_temp.%I', v_view);
    RETURN v_norm;
END
$$;

-- Whether create_stream_table(name, query) would now define a different query than the
-- stream table `name` has (compared in normalized form, against the defining view as it is
-- now, so renames of sources since creation do not count as a change).
CREATE OR REPLACE FUNCTION pgtrickle._api_stream_table_query_changed(name text, query text, caller_path text)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables := pgtrickle._find_st(name, caller_path);
BEGIN
    RETURN pgtrickle._api_normalize_query(query, caller_path)
           IS DISTINCT FROM coalesce(pgtrickle._normalized_query(st.def_view), st.normalized_query);
END
$$;

-- ------------------------------------------------------- values Spark cannot carry
-- Called by a refresh's JDBC reads (spark/carry.py) only for a value that Spark's type for its
-- column cannot hold exactly: the refresh stops, naming the column, its type and the value.
CREATE OR REPLACE FUNCTION pgtrickle._value_not_carried(p_value anyelement, p_column text, p_type text,
                                                        p_sqlstate text, p_hint text)
RETURNS anyelement LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'column % (%) holds %, which Spark cannot carry exactly; the refresh changes nothing',
        p_column, p_type, left(p_value::text, 100)
        USING ERRCODE = p_sqlstate, HINT = p_hint,
              DETAIL = 'pgtrickle refuses a value rather than store it altered (docs/TYPES.md).';
END
$$;

-- pgtrickle SQL API, CDC modes, capture health and repair.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- --------------------------------------------------------------- CDC modes

CREATE OR REPLACE FUNCTION pgtrickle._cdc_notify(p_relid oid, p_from text, p_to text, p_reason text)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pg_notify('pg_trickle_cdc_transition', json_build_object(
        'event', 'cdc_transition', 'source', p_relid::regclass::text, 'from', p_from, 'to', p_to,
        'reason', p_reason, 'at', clock_timestamp())::text)
$$;

-- The cut from trigger to WAL capture, atomically: the table joins the
-- publication and loses its capture triggers in one transaction. Writers
-- wait for its lock, so every transaction that wrote the table committed
-- either before the cut (captured by the trigger; not published then) or
-- after it (published; no trigger): no gap, no duplicate.
CREATE OR REPLACE FUNCTION pgtrickle._transition_to_wal(p_relid oid, p_publication text, p_reason text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    v_identity "char";
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid FOR UPDATE;
    IF NOT FOUND OR src.cdc_mode = 'wal' OR src.source_kind <> 'TABLE' THEN
        RETURN;
    END IF;
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', p_relid::regclass);
    IF EXISTS (SELECT 1 FROM pgtrickle._hierarchy_members(p_relid)) THEN
        RAISE EXCEPTION 'source % has partitions or inheritance children: WAL capture does not follow them',
            p_relid::regclass USING ERRCODE = 'feature_not_supported',
            HINT = 'The source stays on trigger capture, which captures every partition and child.';
    END IF;
    SELECT relreplident INTO v_identity FROM pg_class WHERE oid = p_relid;
    IF v_identity <> 'f' THEN
        -- UPDATE and DELETE must carry the whole old row for the change buffers.
        EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', p_relid::regclass);
    END IF;
    EXECUTE format('ALTER PUBLICATION %I ADD TABLE ONLY %s', p_publication, p_relid::regclass);
    PERFORM pgtrickle._drop_capture_triggers(p_relid);
    -- (a partition's changes are published under its own name, whichever table a statement names)
    PERFORM pgtrickle._drop_ancestor_captures(p_relid);
    UPDATE pgtrickle.pgt_change_sources
       SET cdc_mode = 'wal', cdc_reason = p_reason, transitioned_at = now(),
           original_replica_identity = coalesce(original_replica_identity, v_identity)
     WHERE source_relid = p_relid;
    PERFORM pgtrickle._cdc_notify(p_relid, 'trigger', 'wal', p_reason);
END
$$;

-- Leave WAL capture (source no longer needed, or going back to triggers).
CREATE OR REPLACE FUNCTION pgtrickle._stop_wal_capture(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    v_pub text;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid FOR UPDATE;
    FOR v_pub IN SELECT p.pubname FROM pg_publication p JOIN pg_publication_rel r ON r.prpubid = p.oid
                  WHERE r.prrelid = p_relid AND p.pubname = 'pgtrickle_pub' LOOP
        -- ONLY: an inheritance child that joined meanwhile is not in the publication.
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE ONLY %s', v_pub, p_relid::regclass);
    END LOOP;
    IF src.original_replica_identity IS NOT NULL AND src.original_replica_identity <> 'f' THEN
        EXECUTE format('ALTER TABLE %s REPLICA IDENTITY %s', p_relid::regclass,
                       CASE src.original_replica_identity WHEN 'n' THEN 'NOTHING' ELSE 'DEFAULT' END);
    END IF;
    UPDATE pgtrickle.pgt_change_sources SET original_replica_identity = NULL WHERE source_relid = p_relid;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._transition_to_trigger(p_relid oid, p_reason text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid FOR UPDATE;
    IF NOT FOUND OR src.cdc_mode = 'trigger' THEN
        IF FOUND AND p_reason IS DISTINCT FROM src.cdc_reason THEN
            UPDATE pgtrickle.pgt_change_sources SET cdc_reason = p_reason WHERE source_relid = p_relid;
        END IF;
        RETURN;
    END IF;
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', p_relid::regclass);
    PERFORM pgtrickle._stop_wal_capture(p_relid);
    PERFORM pgtrickle._build_capture(p_relid);
    UPDATE pgtrickle.pgt_change_sources
       SET cdc_mode = 'trigger', cdc_reason = p_reason, transitioned_at = now()
     WHERE source_relid = p_relid;
    PERFORM pgtrickle._cdc_notify(p_relid, 'wal', 'trigger', p_reason);
END
$$;

-- Without WAL sources, the slot and publication would only hold WAL: drop them
-- (when no decoder is attached; otherwise the daemon does it).
CREATE OR REPLACE FUNCTION pgtrickle._drop_wal_infrastructure_if_unused()
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    st record;
BEGIN
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_change_sources WHERE cdc_mode = 'wal') THEN
        RETURN false;
    END IF;
    FOR st IN SELECT d.slot_name, s.active FROM pgtrickle.pgt_decoder_state d
               LEFT JOIN pg_replication_slots s ON s.slot_name = d.slot_name LOOP
        IF coalesce(st.active, false) THEN
            RETURN false;
        END IF;
        IF st.active IS NOT NULL THEN
            PERFORM pg_drop_replication_slot(st.slot_name);
        END IF;
        DELETE FROM pgtrickle.pgt_decoder_state WHERE slot_name = st.slot_name;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'pgtrickle_pub') THEN
        DROP PUBLICATION pgtrickle_pub;
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_set_cdc_mode(source text, mode text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_relid oid;
    v_mode text := lower(btrim(mode));
BEGIN
    PERFORM pgtrickle._require_admin('change the change capture mode of a source');
    IF source IS NULL THEN
        RAISE EXCEPTION 'source must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_mode IS NULL OR v_mode NOT IN ('default', 'trigger', 'auto', 'wal') THEN
        RAISE EXCEPTION 'invalid cdc_mode %', coalesce(quote_literal(left(mode, 80)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use ''trigger'', ''auto'', ''wal'', or ''default'' (the cdc_mode setting).';
    END IF;
    v_relid := (pgtrickle._in_caller_path(caller_path, source)).relid;
    IF v_relid IS NULL OR NOT EXISTS (SELECT 1 FROM pgtrickle.pgt_change_sources
                                       WHERE source_relid = v_relid AND source_kind = 'TABLE') THEN
        RAISE EXCEPTION 'table % is not a source of any stream table', quote_literal(source)
            USING ERRCODE = 'undefined_object',
                  HINT = 'pgtrickle.check_cdc_health() lists the captured sources.';
    END IF;
    IF v_mode = 'wal' AND EXISTS (SELECT 1 FROM pgtrickle._hierarchy_members(v_relid)) THEN
        RAISE EXCEPTION 'source % has partitions or inheritance children: WAL capture does not follow them',
            v_relid::regclass USING ERRCODE = 'feature_not_supported',
            HINT = 'Keep it on trigger capture (''trigger'' or ''auto''), which captures every partition and child.';
    END IF;
    UPDATE pgtrickle.pgt_change_sources SET cdc_mode_setting = v_mode WHERE source_relid = v_relid;
    PERFORM pg_notify('pgtrickle_refresh', '');
END
$$;

-- What is missing of a source's change capture (empty: intact). Objects dropped by hand
-- (a buffer table or view, the trigger function, a trigger) or a capture trigger disabled
-- mean changes may have been lost; pgtrickle._repair_capture (run by `pgtrickle install`)
-- recreates them.
CREATE OR REPLACE FUNCTION pgtrickle._capture_problems(p_relid oid)
RETURNS text[] LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    v_problems text[] := '{}';
    v_missing text[];
    v_disabled text[];
    v_have text[];
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    IF NOT FOUND THEN
        RETURN v_problems;
    END IF;
    -- Looked up in pg_class (not to_regclass): callers without rights on pgtrickle_changes see it too.
    v_have := ARRAY(SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'pgtrickle_changes'
                       AND c.relname IN (src.buffer_name, src.buffer_name || '_rows', src.buffer_name || '_batches'));
    IF NOT src.buffer_name || '_rows' = ANY (v_have) THEN
        v_problems := v_problems || format('change buffer table %s is missing',
                                           pgtrickle._buffer_part(src.buffer_name, 'rows'));
    END IF;
    IF src.source_kind = 'TABLE' AND NOT src.buffer_name || '_batches' = ANY (v_have) THEN
        v_problems := v_problems || format('change buffer table %s is missing',
                                           pgtrickle._buffer_part(src.buffer_name, 'batches'));
    END IF;
    IF NOT src.buffer_name = ANY (v_have) THEN
        v_problems := v_problems || format('change buffer view pgtrickle_changes.%I is missing', src.buffer_name);
    END IF;
    IF src.source_kind = 'TABLE' AND src.cdc_mode = 'trigger' AND EXISTS (SELECT 1 FROM pg_class WHERE oid = p_relid) THEN
        IF NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                        WHERE n.nspname = 'pgtrickle_changes' AND p.proname = 'capture_' || p_relid
                          AND p.pronargs = 0) THEN
            v_problems := v_problems || format('capture trigger function pgtrickle_changes.%I() is missing',
                                               'capture_' || p_relid);
        END IF;
        SELECT coalesce(array_agg(n ORDER BY o) FILTER (WHERE t.tgname IS NULL), '{}'),
               coalesce(array_agg(n ORDER BY o) FILTER (WHERE t.tgenabled = 'D'), '{}')
          INTO v_missing, v_disabled
          FROM unnest(ARRAY['pgt_capture_ins', 'pgt_capture_upd', 'pgt_capture_del', 'pgt_capture_trunc'])
               WITH ORDINALITY AS w(n, o)
          LEFT JOIN pg_trigger t ON t.tgrelid = p_relid AND t.tgname = w.n;
        IF cardinality(v_missing) > 0 THEN
            v_problems := v_problems || format('capture trigger(s) %s on %s missing',
                                               array_to_string(v_missing, ', '), p_relid::regclass);
        END IF;
        IF cardinality(v_disabled) > 0 THEN
            v_problems := v_problems || format('capture trigger(s) %s on %s disabled',
                                               array_to_string(v_disabled, ', '), p_relid::regclass);
        END IF;
    END IF;
    RETURN v_problems;
END
$$;

-- Recreate what is missing of a source's change capture (see _capture_problems) and mark
-- every stream table reading it for reinitialization: changes made while it was broken may
-- be lost. Returns the problems repaired (empty: nothing to do). A source whose table is
-- gone is left to the DDL tracking.
CREATE OR REPLACE FUNCTION pgtrickle._repair_capture(p_relid oid)
RETURNS text[] LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    v_problems text[];
    v_rows text;
    v_batches text;
    v_display text;
    col record;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid FOR UPDATE;
    IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = p_relid) THEN
        RETURN '{}';
    END IF;
    v_problems := pgtrickle._capture_problems(p_relid);
    IF cardinality(v_problems) = 0 THEN
        RETURN v_problems;
    END IF;
    v_rows := pgtrickle._buffer_part(src.buffer_name, 'rows');
    v_batches := pgtrickle._buffer_part(src.buffer_name, 'batches');
    EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', src.buffer_name);
    IF to_regclass(v_rows) IS NULL THEN
        -- The batches table takes its change ids from the rows table's sequence, gone with it:
        -- both are made anew (what they held is superseded by the reinitialization below).
        EXECUTE format('DROP TABLE IF EXISTS %s', v_batches);
        PERFORM pgtrickle._create_buffer_parts(src.buffer_name, src.source_kind);
        FOR col IN
            SELECT c->>'buf' AS buf,
                   coalesce(pgtrickle._storage_type(a.atttypid, a.atttypmod), c->>'type') AS type
              FROM jsonb_array_elements(src.columns) WITH ORDINALITY AS j(c, i)
              LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = src.source_relid
                                                 AND a.attnum = (c->>'attnum')::int AND NOT a.attisdropped
             ORDER BY j.i
        LOOP
            EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s, ADD COLUMN %I %s', v_rows,
                           'new_' || col.buf, col.type, 'old_' || col.buf, col.type);
        END LOOP;
    ELSIF src.source_kind = 'TABLE' AND to_regclass(v_batches) IS NULL THEN
        PERFORM pgtrickle._create_buffer_batches(src.buffer_name);
    END IF;
    IF src.source_kind = 'TABLE' THEN
        FOR col IN
            SELECT c->>'buf' AS buf, a.atttypid
              FROM jsonb_array_elements(src.columns) WITH ORDINALITY AS j(c, i)
              JOIN pg_attribute a ON a.attrelid = p_relid AND a.attnum = (c->>'attnum')::int
             WHERE NOT EXISTS (SELECT 1 FROM pg_attribute b WHERE b.attrelid = v_batches::regclass
                                  AND b.attname = 'v_' || (c->>'buf') AND NOT b.attisdropped)
             ORDER BY j.i
        LOOP
            PERFORM pgtrickle._add_batch_column(src.buffer_name, col.buf, col.atttypid);
        END LOOP;
    END IF;
    PERFORM pgtrickle._build_buffer_view(p_relid);
    IF src.source_kind = 'TABLE' AND src.cdc_mode = 'trigger' THEN
        PERFORM pgtrickle._build_capture(p_relid);
    END IF;
    -- The buffer misses changes before now: a hold_back refresh must not rebuild a source from it.
    UPDATE pgtrickle.pgt_change_sources
       SET cleaned_below = greatest(cleaned_below, pg_snapshot_xmax(pg_current_snapshot()))
     WHERE source_relid = p_relid;
    v_display := pgtrickle._display_name(src.source_schema, src.source_name);
    UPDATE pgtrickle.pgt_stream_tables s
       SET needs_reinit = true, updated_at = now(),
           reinit_reason = format('the change capture of %s was broken (%s) and was repaired by pgtrickle install; '
                                  'changes made meanwhile may be lost', v_display, array_to_string(v_problems, '; '))
      FROM pgtrickle.pgt_dependencies d
     WHERE d.pgt_id = s.pgt_id AND d.source_relid = p_relid;
    RETURN v_problems;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle.check_cdc_health()
RETURNS TABLE (source text, cdc_mode text, cdc_mode_setting text, reason text, slot_name text,
               slot_active boolean, lag_bytes numeric, pending_rows bigint, oldest_pending_age interval,
               replica_identity text, problems text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src record;
    v_default text := coalesce(pgtrickle._setting('cdc_mode'), 'trigger');
    v_lag_limit numeric := coalesce(pgtrickle._setting('slot_lag_alert_bytes'), '1073741824')::numeric;
    v_horizon xid8;
    v_problems text[];
BEGIN
    PERFORM pgtrickle._require_user('check change capture health');
    FOR src IN
        SELECT c.*, d.slot_name AS slot, s.active, s.wal_status,
               pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn) AS lag,
               (SELECT relreplident FROM pg_class WHERE oid = c.source_relid) AS ident
          FROM pgtrickle.pgt_change_sources c
          LEFT JOIN pgtrickle.pgt_decoder_state d ON c.cdc_mode = 'wal'
          LEFT JOIN pg_replication_slots s ON s.slot_name = d.slot_name
         WHERE c.source_kind = 'TABLE'
         ORDER BY c.source_schema, c.source_name
    LOOP
        v_problems := '{}';
        SELECT min(pg_snapshot_xmin(st.frontier)) INTO v_horizon
          FROM pgtrickle.pgt_dependencies dep JOIN pgtrickle.pgt_stream_tables st USING (pgt_id)
         WHERE dep.source_relid = src.source_relid;
        source := pgtrickle._display_name(src.source_schema, src.source_name);
        cdc_mode := src.cdc_mode;
        cdc_mode_setting := CASE WHEN src.cdc_mode_setting = 'default' THEN v_default || ' (default)'
                                 ELSE src.cdc_mode_setting END;
        reason := src.cdc_reason;
        slot_name := src.slot;
        slot_active := src.active;
        lag_bytes := src.lag;
        replica_identity := CASE src.ident WHEN 'd' THEN 'default' WHEN 'f' THEN 'full'
                                           WHEN 'n' THEN 'nothing' WHEN 'i' THEN 'index' END;
        -- A broken capture is a problem of this source only: the others are still checked.
        v_problems := pgtrickle._capture_problems(src.source_relid);
        pending_rows := NULL;
        oldest_pending_age := NULL;
        IF cardinality(v_problems) = 0 THEN
            BEGIN
                EXECUTE format('SELECT count(*), now() - min(captured_at) FROM pgtrickle_changes.%I WHERE xid >= %L::xid8',
                               src.buffer_name, coalesce(v_horizon, '0'::xid8))
                   INTO pending_rows, oldest_pending_age;
            EXCEPTION WHEN OTHERS THEN
                v_problems := v_problems || format('the change buffer cannot be read: %s', SQLERRM);
            END;
        END IF;
        IF src.cdc_mode = 'wal' THEN
            IF src.slot IS NULL OR src.active IS NULL THEN
                v_problems := v_problems || 'replication slot is missing'::text;
            ELSIF NOT src.active THEN
                v_problems := v_problems || 'no WAL decoder is attached to the slot (is `pgtrickle run` running?)'::text;
            END IF;
            IF src.lag > v_lag_limit THEN
                v_problems := v_problems || format('slot retains %s of WAL (alert above %s)',
                                                   pg_size_pretty(src.lag), pg_size_pretty(v_lag_limit));
            END IF;
            IF src.wal_status IN ('unreserved', 'lost') THEN
                v_problems := v_problems || format('slot WAL status is %s', src.wal_status);
            END IF;
            IF src.ident <> 'f' THEN
                v_problems := v_problems || 'REPLICA IDENTITY is not FULL'::text;
            END IF;
        END IF;
        v_problems := v_problems || pgtrickle._hierarchy_problems(src.source_relid);
        problems := v_problems;
        RETURN NEXT;
    END LOOP;
END
$$;

-- pgtrickle SQL API, watermarks and watermark groups.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- ---------------------------------------------------------------- watermarks

-- A relation for messages: schema-qualified, quoted only where needed.
CREATE OR REPLACE FUNCTION pgtrickle._rel_display(p_relid oid)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
                       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_relid),
                    'relation ' || p_relid::text)
$$;

-- Resolve a table an external process loads (a watermark source). Any text is
-- only ever looked up, never executed.
DROP FUNCTION IF EXISTS pgtrickle._watermark_source(text);
CREATE OR REPLACE FUNCTION pgtrickle._watermark_source(p_source text, p_path text)
RETURNS oid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_relid oid;
    v_kind "char";
    v_schema text;
BEGIN
    IF p_source IS NULL OR btrim(p_source) = '' THEN
        RAISE EXCEPTION 'watermark source must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_relid := (pgtrickle._in_caller_path(p_path, p_source)).relid;
    IF v_relid IS NULL THEN
        RAISE EXCEPTION 'table % does not exist', quote_literal(left(p_source, 100))
            USING ERRCODE = 'undefined_table',
                  HINT = 'Give the table an external process loads, as name or schema.name (quote special characters: ''"My Table"'').';
    END IF;
    SELECT c.relkind, n.nspname INTO v_kind, v_schema
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = v_relid;
    IF v_kind NOT IN ('r', 'p') OR v_schema IN ('pgtrickle', 'pgtrickle_changes', 'pg_catalog', 'information_schema') THEN
        RAISE EXCEPTION '% is not a table an external process loads', pgtrickle._rel_display(v_relid)
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables WHERE pgt_relid = v_relid) THEN
        RAISE EXCEPTION '% is a stream table: watermarks belong to the tables it is computed from',
            pgtrickle._rel_display(v_relid) USING ERRCODE = 'wrong_object_type';
    END IF;
    RETURN v_relid;
END
$$;

-- A group that is aligned now (every member has a watermark, max - min <= tolerance)
-- records its minimum as its effective watermark, and each member's advancement:
-- the point hold_back stream tables read the members at. Call with the group row locked.
CREATE OR REPLACE FUNCTION pgtrickle._record_alignment(p_group_id bigint)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_min timestamptz;
    v_max timestamptz;
    v_known bigint;
    v_members bigint;
    v_tolerance interval;
BEGIN
    SELECT min(w.watermark), max(w.watermark), count(w.watermark), count(*)
      INTO v_min, v_max, v_known, v_members
      FROM pgtrickle.pgt_watermark_group_sources m
      LEFT JOIN pgtrickle.pgt_watermarks w USING (source_relid)
     WHERE m.group_id = p_group_id;
    SELECT tolerance INTO v_tolerance FROM pgtrickle.pgt_watermark_groups WHERE group_id = p_group_id;
    IF v_members = 0 OR v_known < v_members OR v_max - v_min > v_tolerance THEN
        RETURN false;
    END IF;
    UPDATE pgtrickle.pgt_watermark_groups SET effective_watermark = v_min, aligned_at = clock_timestamp()
     WHERE group_id = p_group_id;
    UPDATE pgtrickle.pgt_watermark_group_sources m SET aligned_advancement = w.advancement_id
      FROM pgtrickle.pgt_watermarks w
     WHERE w.source_relid = m.source_relid AND m.group_id = p_group_id;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._advance_watermark(p_relid oid, p_watermark timestamptz)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    cur pgtrickle.pgt_watermarks;
    v_name text := pgtrickle._rel_display(p_relid);
    v_adv bigint;
    v_now timestamptz := clock_timestamp();
    v_app text := nullif(current_setting('application_name', true), '');
    g record;
BEGIN
    IF p_watermark IS NULL THEN
        RAISE EXCEPTION 'watermark of % must not be NULL', v_name USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT isfinite(p_watermark) THEN
        RAISE EXCEPTION 'watermark of % must be a finite timestamp, not %', v_name, p_watermark
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Python and Spark hold years 1..9999; a day is kept at each end so every time zone can show it.
    IF p_watermark < '0001-01-02 00:00:00+00' OR p_watermark >= '9999-12-31 00:00:00+00' THEN
        RAISE EXCEPTION 'watermark of % must lie from 0001-01-02 to 9999-12-30 (UTC), not %',
            v_name, p_watermark
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pgtrickle and Spark hold timestamps of years 1 to 9999 only (docs/WATERMARKS.md).';
    END IF;
    -- One advancement of a source at a time (a first one has no row to lock yet).
    PERFORM pg_advisory_xact_lock((x'70677477'::bigint << 32) | p_relid::bigint);
    SELECT * INTO cur FROM pgtrickle.pgt_watermarks WHERE source_relid = p_relid FOR UPDATE;
    -- A current watermark outside that range (left by an older version or written by hand) may be
    -- replaced by any valid one, even an earlier one: that is how it is undone.
    IF FOUND AND p_watermark < cur.watermark
       AND cur.watermark >= '0001-01-02 00:00:00+00' AND cur.watermark < '9999-12-31 00:00:00+00' THEN
        RAISE EXCEPTION 'watermark of % cannot go backwards: % is before its current watermark %',
            v_name, p_watermark, cur.watermark
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Watermarks only advance: a watermark says the source is complete through that time.';
    END IF;
    IF FOUND AND p_watermark = cur.watermark THEN
        RETURN;  -- the same value: nothing to do
    END IF;
    -- Lock the source's groups (in id order) before taking the snapshot, so that an
    -- alignment is judged on every member's latest committed watermark.
    PERFORM 1 FROM pgtrickle.pgt_watermark_groups
      WHERE group_id IN (SELECT group_id FROM pgtrickle.pgt_watermark_group_sources WHERE source_relid = p_relid)
      ORDER BY group_id FOR UPDATE;
    INSERT INTO pgtrickle.pgt_watermark_history
        (source_relid, watermark, previous_watermark, advanced_at, advanced_by, application_name, xid, snapshot)
    VALUES (p_relid, p_watermark, cur.watermark, v_now, session_user, v_app, pg_current_xact_id(),
            pg_current_snapshot())
    RETURNING advancement_id INTO v_adv;
    INSERT INTO pgtrickle.pgt_watermarks
        (source_relid, watermark, advancement_id, advanced_at, advanced_by, application_name)
    VALUES (p_relid, p_watermark, v_adv, v_now, session_user, v_app)
    ON CONFLICT (source_relid) DO UPDATE
       SET watermark = EXCLUDED.watermark, advancement_id = EXCLUDED.advancement_id,
           advanced_at = EXCLUDED.advanced_at, advanced_by = EXCLUDED.advanced_by,
           application_name = EXCLUDED.application_name;
    FOR g IN SELECT group_id FROM pgtrickle.pgt_watermark_group_sources WHERE source_relid = p_relid
              ORDER BY group_id LOOP
        PERFORM pgtrickle._record_alignment(g.group_id);
    END LOOP;
    FOR g IN UPDATE pgtrickle.pgt_watermark_group_sources m SET stuck_since = NULL
               FROM pgtrickle.pgt_watermark_groups wg
              WHERE m.source_relid = p_relid AND m.stuck_since IS NOT NULL AND wg.group_id = m.group_id
             RETURNING wg.group_name, m.group_id LOOP
        PERFORM pgtrickle._send_alert(jsonb_build_object(
            'event', 'watermark_resumed', 'group', g.group_name, 'source', v_name,
            'watermark', p_watermark, 'previous_watermark', cur.watermark, 'at', v_now));
    END LOOP;
    -- Wake the daemon (delivered at commit): gating is re-evaluated on its next tick.
    PERFORM pg_notify('pgtrickle_refresh', 'watermark');
END
$$;

-- Who may say a source is complete: pgtrickle_admin, or a role that may write the source (its loader).
CREATE OR REPLACE FUNCTION pgtrickle._require_loader(p_relid oid)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_caller name := pgtrickle._require_user('advance watermarks');
BEGIN
    IF NOT pgtrickle._is_admin(v_caller)
       AND NOT has_table_privilege(v_caller, p_relid, 'INSERT, UPDATE, DELETE, TRUNCATE') THEN
        RAISE EXCEPTION 'permission denied: role % may not advance the watermark of %, which it may not write',
            quote_ident(v_caller), pgtrickle._rel_display(p_relid)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'The process that loads a table advances its watermark: it needs INSERT (or UPDATE, DELETE, TRUNCATE) on it, or membership in pgtrickle_admin.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_advance_watermark(source text, watermark timestamptz, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_relid oid := pgtrickle._watermark_source(source, caller_path);
BEGIN
    PERFORM pgtrickle._require_loader(v_relid);
    PERFORM pgtrickle._advance_watermark(v_relid, watermark);
END
$$;

-- (A regclass argument is resolved by the caller, in the caller's search_path.)
CREATE OR REPLACE FUNCTION pgtrickle.advance_watermark(source regclass, watermark timestamptz)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_relid oid;
BEGIN
    IF source IS NULL THEN
        RAISE EXCEPTION 'watermark source must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_relid := pgtrickle._watermark_source(source::oid::regclass::text, 'pg_catalog');
    PERFORM pgtrickle._require_loader(v_relid);
    PERFORM pgtrickle._advance_watermark(v_relid, watermark);
END
$$;


CREATE OR REPLACE FUNCTION pgtrickle._watermark_group_name(p_name text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    IF p_name IS NULL OR btrim(p_name) = '' THEN
        RAISE EXCEPTION 'watermark group name must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(p_name) > 63 THEN
        RAISE EXCEPTION 'watermark group name % is too long (at most 63 bytes)', quote_literal(left(p_name, 100))
            USING ERRCODE = 'name_too_long';
    END IF;
    RETURN p_name;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._find_watermark_group(p_name text)
RETURNS pgtrickle.pgt_watermark_groups LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    g pgtrickle.pgt_watermark_groups;
BEGIN
    SELECT * INTO g FROM pgtrickle.pgt_watermark_groups
     WHERE group_name = pgtrickle._watermark_group_name(p_name) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'watermark group % does not exist', quote_literal(left(p_name, 100))
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT group_name FROM pgtrickle.watermark_groups() lists them.';
    END IF;
    RETURN g;
END
$$;

-- Resolve and check a group's sources: at least two distinct tables.
DROP FUNCTION IF EXISTS pgtrickle._watermark_group_sources(text, text[]);
CREATE OR REPLACE FUNCTION pgtrickle._watermark_group_sources(p_group text, p_sources text[], p_path text)
RETURNS oid[] LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_relids oid[] := '{}';
    v_relid oid;
    v_source text;
BEGIN
    IF p_sources IS NULL OR cardinality(p_sources) = 0 THEN
        RAISE EXCEPTION 'watermark group % needs its sources (at least two tables)', quote_literal(p_group)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH v_source IN ARRAY p_sources LOOP
        IF v_source IS NULL THEN
            RAISE EXCEPTION 'the sources of watermark group % must not contain NULL', quote_literal(p_group)
                USING ERRCODE = 'null_value_not_allowed';
        END IF;
        v_relid := pgtrickle._watermark_source(v_source, p_path);
        IF v_relid = ANY (v_relids) THEN
            RAISE EXCEPTION 'source % is listed twice in watermark group %', pgtrickle._rel_display(v_relid),
                quote_literal(p_group) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_relids := v_relids || v_relid;
    END LOOP;
    IF cardinality(v_relids) < 2 THEN
        RAISE EXCEPTION 'watermark group % needs at least two sources, got one (%)', quote_literal(p_group),
            pgtrickle._rel_display(v_relids[1])
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A group aligns sources with each other; a single source needs no group.';
    END IF;
    RETURN v_relids;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._check_intervals(p_group text, p_tolerance interval, p_stale_after interval)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    IF NOT (p_tolerance >= interval '0' AND p_tolerance <= interval '366 days') THEN
        RAISE EXCEPTION 'tolerance of watermark group % must be between 0 and 366 days, got %', quote_literal(p_group),
            p_tolerance USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (p_stale_after >= interval '0' AND p_stale_after <= interval '366 days') THEN
        RAISE EXCEPTION 'stale_after of watermark group % must be between 0 and 366 days, got %', quote_literal(p_group),
            p_stale_after USING ERRCODE = 'invalid_parameter_value',
            HINT = 'NULL or ''0 seconds'' turns watermark_stuck alerts off.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_create_watermark_group(name text, sources text[], tolerance interval, stale_after interval, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_name text := pgtrickle._watermark_group_name(name);
    v_relids oid[];
    v_id bigint;
BEGIN
    PERFORM pgtrickle._require_admin('create watermark groups');
    IF tolerance IS NULL THEN
        RAISE EXCEPTION 'tolerance of watermark group % must not be NULL', quote_literal(v_name)
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Use ''0 seconds'' for strict alignment.';
    END IF;
    PERFORM pgtrickle._check_intervals(v_name, tolerance, stale_after);
    v_relids := pgtrickle._watermark_group_sources(v_name, sources, caller_path);
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_groups g WHERE g.group_name = v_name) THEN
        RAISE EXCEPTION 'watermark group % already exists', quote_literal(v_name) USING ERRCODE = 'duplicate_object',
            HINT = 'Change it with pgtrickle.alter_watermark_group, or drop it first.';
    END IF;
    INSERT INTO pgtrickle.pgt_watermark_groups (group_name, tolerance, stale_after)
    VALUES (v_name, tolerance, nullif(stale_after, interval '0'))
    RETURNING group_id INTO v_id;
    INSERT INTO pgtrickle.pgt_watermark_group_sources (group_id, source_relid)
    SELECT v_id, unnest(v_relids);
    PERFORM pgtrickle._record_alignment(v_id);
    PERFORM pg_notify('pgtrickle_refresh', 'watermark');
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_alter_watermark_group(name text, sources text[], tolerance interval, stale_after interval, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    g pgtrickle.pgt_watermark_groups;
    v_relids oid[];
BEGIN
    PERFORM pgtrickle._require_admin('alter watermark groups');
    g := pgtrickle._find_watermark_group(name);
    PERFORM pgtrickle._check_intervals(g.group_name, tolerance, stale_after);
    IF sources IS NOT NULL THEN
        v_relids := pgtrickle._watermark_group_sources(g.group_name, sources, caller_path);
        IF v_relids::oid[] @> ARRAY(SELECT source_relid FROM pgtrickle.pgt_watermark_group_sources m
                                     WHERE m.group_id = g.group_id)
           AND v_relids::oid[] <@ ARRAY(SELECT source_relid FROM pgtrickle.pgt_watermark_group_sources m
                                          WHERE m.group_id = g.group_id) THEN
            v_relids := NULL;  -- the same sources
        END IF;
    END IF;
    IF v_relids IS NOT NULL THEN
        -- Other sources: the group's past aligned point no longer describes it.
        DELETE FROM pgtrickle.pgt_watermark_group_sources m WHERE m.group_id = g.group_id;
        INSERT INTO pgtrickle.pgt_watermark_group_sources (group_id, source_relid)
        SELECT g.group_id, unnest(v_relids);
        UPDATE pgtrickle.pgt_watermark_groups SET effective_watermark = NULL, aligned_at = NULL
         WHERE group_id = g.group_id;
    END IF;
    UPDATE pgtrickle.pgt_watermark_groups wg
       SET tolerance = coalesce(tolerance, wg.tolerance),
           stale_after = CASE WHEN stale_after IS NULL THEN wg.stale_after
                              ELSE nullif(stale_after, interval '0') END,
           updated_at = now()
     WHERE wg.group_id = g.group_id;
    -- A wider tolerance may align the group now (it applies from the daemon's next tick).
    PERFORM pgtrickle._record_alignment(g.group_id);
    PERFORM pg_notify('pgtrickle_refresh', 'watermark');
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle.drop_watermark_group(name text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    g pgtrickle.pgt_watermark_groups;
BEGIN
    PERFORM pgtrickle._require_admin('drop watermark groups');
    g := pgtrickle._find_watermark_group(name);
    DELETE FROM pgtrickle.pgt_watermark_groups WHERE group_id = g.group_id;
    PERFORM pg_notify('pgtrickle_refresh', 'watermark');
END
$$;

-- The plain tables a stream table reads, directly or through other stream tables.
CREATE OR REPLACE FUNCTION pgtrickle._base_sources(p_pgt_id bigint)
RETURNS SETOF oid LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    WITH RECURSIVE walk(relid, depth) AS (
        SELECT d.source_relid, 0 FROM pgtrickle.pgt_dependencies d WHERE d.pgt_id = p_pgt_id
        UNION
        SELECT d.source_relid, w.depth + 1
          FROM walk w
          JOIN pgtrickle.pgt_stream_tables s ON s.pgt_relid = w.relid
          JOIN pgtrickle.pgt_dependencies d ON d.pgt_id = s.pgt_id
         WHERE w.depth < 1000
    )
    SELECT DISTINCT w.relid FROM walk w
     WHERE NOT EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = w.relid)
$$;

-- The watermark gating of a stream table: the setting, or inferred (gate when it
-- depends on two or more sources of one group). Mirrors pgtrickle.gates.watermark.
CREATE OR REPLACE FUNCTION pgtrickle._watermark_mode(p_pgt_id bigint, OUT mode text, OUT origin text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_setting text;
BEGIN
    SELECT watermark_gating INTO v_setting FROM pgtrickle.pgt_stream_tables WHERE pgt_id = p_pgt_id;
    IF v_setting IS DISTINCT FROM 'inferred' THEN
        mode := v_setting;
        origin := 'set';
        RETURN;
    END IF;
    origin := 'inferred';
    mode := CASE WHEN EXISTS (
                SELECT 1 FROM pgtrickle.pgt_watermark_group_sources m
                 WHERE m.source_relid IN (SELECT pgtrickle._base_sources(p_pgt_id))
                 GROUP BY m.group_id HAVING count(*) >= 2) THEN 'gate' ELSE 'none' END;
END
$$;

-- Live state of each group. Mirrors pgtrickle.gates.watermark.group_state.
CREATE OR REPLACE FUNCTION pgtrickle._watermark_group_states()
RETURNS TABLE (group_id bigint, min_watermark timestamptz, max_watermark timestamptz, state text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT g.group_id, min(w.watermark), max(w.watermark),
           CASE WHEN count(w.watermark) < count(*) THEN 'bootstrapping'
                WHEN max(w.watermark) - min(w.watermark) <= g.tolerance THEN 'aligned'
                ELSE 'misaligned' END
      FROM pgtrickle.pgt_watermark_groups g
      LEFT JOIN pgtrickle.pgt_watermark_group_sources m USING (group_id)
      LEFT JOIN pgtrickle.pgt_watermarks w ON w.source_relid = m.source_relid
     GROUP BY g.group_id, g.tolerance
$$;

-- Why a refresh of a 'gate' stream table is held back now (NULL: it is not).
CREATE OR REPLACE FUNCTION pgtrickle._watermark_gate_reason(p_pgt_id bigint)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT 'gated: ' || string_agg(format('watermark group %s is misaligned: min %s, max %s, lag %s > tolerance %s',
                                          g.group_name, s.min_watermark, s.max_watermark,
                                          s.max_watermark - s.min_watermark, g.tolerance), '; '
                                   ORDER BY g.group_name)
      FROM pgtrickle._watermark_group_states() s
      JOIN pgtrickle.pgt_watermark_groups g USING (group_id)
     WHERE s.state = 'misaligned'
       AND (pgtrickle._watermark_mode(p_pgt_id)).mode = 'gate'
       AND EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_group_sources m
                    WHERE m.group_id = g.group_id
                      AND m.source_relid IN (SELECT pgtrickle._base_sources(p_pgt_id)))
$$;

CREATE OR REPLACE FUNCTION pgtrickle.watermarks()
RETURNS TABLE (source text, watermark timestamptz, advanced_at timestamptz, advanced_by name,
               application_name text, advancements bigint, groups text[], stuck_in text[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._rel_display(w.source_relid), w.watermark, w.advanced_at, w.advanced_by, w.application_name,
           (SELECT count(*) FROM pgtrickle.pgt_watermark_history h WHERE h.source_relid = w.source_relid),
           coalesce((SELECT array_agg(g.group_name ORDER BY g.group_name)
                       FROM pgtrickle.pgt_watermark_group_sources m JOIN pgtrickle.pgt_watermark_groups g USING (group_id)
                      WHERE m.source_relid = w.source_relid), '{}'),
           coalesce((SELECT array_agg(g.group_name ORDER BY g.group_name)
                       FROM pgtrickle.pgt_watermark_group_sources m JOIN pgtrickle.pgt_watermark_groups g USING (group_id)
                      WHERE m.source_relid = w.source_relid AND m.stuck_since IS NOT NULL), '{}')
      FROM pgtrickle.pgt_watermarks w
     ORDER BY 1
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_watermark_history(source text, max_rows integer, caller_path text)
RETURNS TABLE (advancement_id bigint, watermark timestamptz, previous_watermark timestamptz,
               advanced_at timestamptz, advanced_by name, application_name text, xid xid8, snapshot pg_snapshot)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_relid oid := pgtrickle._watermark_source(source, caller_path);
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 1000000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 1000000, got %', coalesce(max_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT h.advancement_id, h.watermark, h.previous_watermark, h.advanced_at, h.advanced_by,
               h.application_name, h.xid, h.snapshot
          FROM pgtrickle.pgt_watermark_history h
         WHERE h.source_relid = v_relid
         ORDER BY h.advancement_id DESC
         LIMIT max_rows;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle.watermark_groups()
RETURNS TABLE (group_name text, sources text[], tolerance interval, stale_after interval,
               created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT g.group_name,
           (SELECT array_agg(pgtrickle._rel_display(m.source_relid) ORDER BY pgtrickle._rel_display(m.source_relid))
              FROM pgtrickle.pgt_watermark_group_sources m WHERE m.group_id = g.group_id),
           g.tolerance, g.stale_after, g.created_at, g.updated_at
      FROM pgtrickle.pgt_watermark_groups g
     ORDER BY g.group_name
$$;

CREATE OR REPLACE FUNCTION pgtrickle.watermark_status()
RETURNS TABLE (group_name text, min_watermark timestamptz, max_watermark timestamptz, lag interval,
               tolerance interval, aligned boolean, effective_watermark timestamptz, state text,
               aligned_at timestamptz, lagging_sources text[], stuck_sources text[], stream_tables text[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT g.group_name, s.min_watermark, s.max_watermark, s.max_watermark - s.min_watermark, g.tolerance,
           s.state = 'aligned', g.effective_watermark, s.state, g.aligned_at,
           -- members without a watermark, or at the minimum while the group is not aligned
           coalesce((SELECT array_agg(pgtrickle._rel_display(m.source_relid) ORDER BY pgtrickle._rel_display(m.source_relid))
                       FROM pgtrickle.pgt_watermark_group_sources m
                       LEFT JOIN pgtrickle.pgt_watermarks w ON w.source_relid = m.source_relid
                      WHERE m.group_id = g.group_id
                        AND (w.watermark IS NULL OR (s.state = 'misaligned' AND w.watermark = s.min_watermark))),
                    '{}'),
           coalesce((SELECT array_agg(pgtrickle._rel_display(m.source_relid) ORDER BY pgtrickle._rel_display(m.source_relid))
                       FROM pgtrickle.pgt_watermark_group_sources m
                      WHERE m.group_id = g.group_id AND m.stuck_since IS NOT NULL), '{}'),
           coalesce((SELECT array_agg(pgtrickle._display_name(st.pgt_schema, st.pgt_name) || ' (' || md.mode || ')'
                                      ORDER BY st.pgt_id)
                       FROM pgtrickle.pgt_stream_tables st
                       CROSS JOIN LATERAL pgtrickle._watermark_mode(st.pgt_id) md
                      WHERE EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_group_sources m
                                     WHERE m.group_id = g.group_id
                                       AND m.source_relid IN (SELECT pgtrickle._base_sources(st.pgt_id)))),
                    '{}')
      FROM pgtrickle.pgt_watermark_groups g
      JOIN pgtrickle._watermark_group_states() s USING (group_id)
     ORDER BY g.group_name
$$;

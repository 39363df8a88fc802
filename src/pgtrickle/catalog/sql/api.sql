-- pgtrickle SQL API: functions and views over the catalog.
-- Re-applied on every `pgtrickle install`, so every object here is
-- CREATE OR REPLACE. Internal helpers start with an underscore.
-- Every identifier built into dynamic SQL goes through format('%I').

-- ---------------------------------------------------------------- helpers

CREATE OR REPLACE FUNCTION pgtrickle._setting(p_name text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT value FROM pgtrickle.pgt_settings WHERE name = p_name
$$;

-- Refuse a number outside [p_min, p_max] (NaN and infinities included) with 22023, naming the
-- parameter and its range (docs/BAD_INPUTS.md lists every bound).
CREATE OR REPLACE FUNCTION pgtrickle._check_bound(p_param text, p_value numeric, p_min numeric, p_max numeric,
                                                  p_unit text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_value IS NOT NULL AND NOT (p_value >= p_min AND p_value <= p_max) THEN
        RAISE EXCEPTION '% must be between % and % (%), got %', p_param, p_min, p_max, p_unit, p_value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- Every row of pgtrickle.pgt_settings is checked when written (trigger validate_setting_bounds,
-- migration 012): a value out of its documented range, or not of its type, is refused with
-- 22023 and changes nothing. Returns the value to store (normalised). Settings not listed
-- here are stored as given.
CREATE OR REPLACE FUNCTION pgtrickle._validate_setting(p_name text, p_value text)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v text := btrim(p_value);
    -- name => {kind, min, max, unit}
    v_kind text;
    v_min text;
    v_max text;
    v_unit text;
    v_num numeric;
    v_iv interval;
BEGIN
    SELECT b.kind, b.lo, b.hi, b.unit INTO v_kind, v_min, v_max, v_unit
      FROM (VALUES
        ('max_query_length', 'integer', '1024', '104857600', 'bytes of defining query text'),
        ('slot_lag_alert_bytes', 'integer', '-1', '1000000000000000', 'bytes of retained WAL; -1: whenever a slot exists'),
        ('circuit_breaker_cold_start_ceiling', 'integer', '1', '1000000000000000', 'pending changes'),
        ('auto_suspend_after', 'integer', '0', '1000', 'consecutive failed refreshes; 0: never'),
        ('stale_data_factor', 'number', '0', '1000', 'times the schedule''s period; 0: never'),
        ('differential_fallback_ratio', 'ratio', '0', '1000', 'pending changes per source row, above 0'),
        ('history_retention', 'interval', '1 hour', '3650 days', NULL),
        ('alert_retention', 'interval', '1 hour', '3650 days', NULL),
        ('watermark_history_retention', 'interval', '1 hour', '3650 days', NULL),
        ('wal_transition_timeout', 'interval', '1 second', '1 hour', NULL),
        ('default_schedule', 'schedule', NULL, NULL, NULL),
        ('cdc_mode', 'enum', 'trigger,auto,wal', NULL, NULL),
        ('circuit_breaker_default', 'enum', 'none,fixed,adaptive', NULL, NULL)
      ) AS b(name, kind, lo, hi, unit)
     WHERE b.name = p_name;
    IF v_kind IS NULL THEN
        RETURN p_value;
    END IF;
    IF v_kind = 'schedule' THEN
        BEGIN
            RETURN pgtrickle._validate_schedule(p_value);
        EXCEPTION WHEN invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS v_unit = MESSAGE_TEXT, v_min = PG_EXCEPTION_HINT;
            RAISE EXCEPTION 'setting %: %', p_name, v_unit USING ERRCODE = 'invalid_parameter_value', HINT = v_min;
        END;
    END IF;
    IF v_kind = 'enum' THEN
        v := lower(v);
        IF v IS NULL OR NOT v = ANY (string_to_array(v_min, ',')) THEN
            RAISE EXCEPTION 'invalid % %', p_name, coalesce(quote_literal(left(p_value, 80)), 'NULL')
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('Use one of: %s.', replace(v_min, ',', ', '));
        END IF;
        RETURN v;
    END IF;
    IF v_kind = 'interval' THEN
        BEGIN
            v_iv := v::interval;
        EXCEPTION WHEN others THEN
            v_iv := NULL;
        END;
        IF v_iv IS NULL OR NOT (v_iv >= v_min::interval AND v_iv <= v_max::interval) THEN
            RAISE EXCEPTION 'setting % must be an interval between % and %, got %', p_name, v_min, v_max,
                coalesce(quote_literal(left(p_value, 80)), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN v;
    END IF;
    BEGIN
        v_num := v::numeric;
    EXCEPTION WHEN others THEN
        v_num := NULL;
    END;
    IF v_num IS NULL
       OR (v_kind = 'integer' AND v_num <> trunc(v_num))
       OR NOT (v_num >= v_min::numeric AND v_num <= v_max::numeric)
       OR (v_kind = 'ratio' AND v_num <= 0) THEN
        RAISE EXCEPTION 'setting % must be % between % and % (%), got %', p_name,
            CASE v_kind WHEN 'integer' THEN 'an integer' ELSE 'a number' END, v_min, v_max, v_unit,
            coalesce(quote_literal(left(p_value, 80)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN CASE WHEN v_kind = 'integer' THEN trunc(v_num)::text ELSE v_num::text END;
END
$$;

-- ------------------------------------------------------------- privileges
--
-- Every function here runs with a fixed search_path (pg_catalog first, pg_temp
-- last), so no function, operator or table a user creates can stand in for one
-- the API uses. The functions that change anything are SECURITY DEFINER: they
-- run as the role that installed pgtrickle (which owns the catalog) and check
-- the calling role themselves (docs/SECURITY.md). The caller's own search_path
-- is used for one thing only: resolving the names the caller passes (and the
-- defining query), through the public entry points at the end of this file.

-- The role the caller acts as: SET ROLE if any, else the session's role. (Inside a
-- SECURITY DEFINER function current_user is pgtrickle's owner, not the caller.)
CREATE OR REPLACE FUNCTION pgtrickle._caller()
RETURNS name LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._is_admin(p_role name)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pg_has_role(p_role, 'pgtrickle_admin', 'USAGE')
$$;

-- Callers of the API must be pgtrickle users (members of pgtrickle_user or pgtrickle_admin, or superusers).
CREATE OR REPLACE FUNCTION pgtrickle._require_user(p_what text)
RETURNS name LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_caller name := pgtrickle._caller();
BEGIN
    IF NOT pg_has_role(v_caller, 'pgtrickle_user', 'USAGE') THEN
        RAISE EXCEPTION 'permission denied: role % may not %', quote_ident(v_caller), p_what
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('pgtrickle users are members of pgtrickle_user: GRANT pgtrickle_user TO %I;', v_caller);
    END IF;
    RETURN v_caller;
END
$$;

-- Configuration (settings, watermark groups, CDC modes) needs pgtrickle_admin.
CREATE OR REPLACE FUNCTION pgtrickle._require_admin(p_what text)
RETURNS name LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_caller name := pgtrickle._caller();
BEGIN
    IF NOT pgtrickle._is_admin(v_caller) THEN
        RAISE EXCEPTION 'permission denied: only members of pgtrickle_admin may %; role % is not one', p_what,
            quote_ident(v_caller)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A superuser (or an admin of pgtrickle_admin) can run: GRANT pgtrickle_admin TO %I;',
                                v_caller);
    END IF;
    RETURN v_caller;
END
$$;

-- Altering, refreshing, resuming or dropping a stream table needs its owner (the role
-- that created it, or a member of that role) or pgtrickle_admin.
CREATE OR REPLACE FUNCTION pgtrickle._require_owner(st pgtrickle.pgt_stream_tables, p_what text)
RETURNS name LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_caller name := pgtrickle._require_user(p_what || ' a stream table');
    v_owner oid := (SELECT oid FROM pg_roles WHERE rolname = st.created_by);
BEGIN
    IF pgtrickle._is_admin(v_caller) OR (v_owner IS NOT NULL AND pg_has_role(v_caller, v_owner, 'USAGE')) THEN
        RETURN v_caller;
    END IF;
    RAISE EXCEPTION 'permission denied: role % may not % stream table %, which is owned by %', quote_ident(v_caller),
        p_what, pgtrickle._display_name(st.pgt_schema, st.pgt_name),
        coalesce(quote_ident(st.created_by), 'nobody')
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only the owner of a stream table (or a member of the owning role) and members of pgtrickle_admin may change it.';
END
$$;

-- Resolve a relation name, and read the current schema and search path, the way the
-- caller sees them. Only fully qualified built-ins run while the caller's path is set.
CREATE OR REPLACE FUNCTION pgtrickle._in_caller_path(p_path text, p_name text,
    OUT relid oid, OUT caller_schema name, OUT caller_schemas name[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', coalesce(p_path, ''), true);
    caller_schema := pg_catalog.current_schema();
    caller_schemas := pg_catalog.current_schemas(false);
    IF p_name IS NOT NULL THEN
        BEGIN
            relid := pg_catalog.to_regclass(p_name);
        EXCEPTION WHEN others THEN
            relid := NULL;
        END;
    END IF;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
END
$$;

-- Split a possibly schema-qualified name into schema and relation name; an
-- unqualified name means the caller's current schema (p_path: the caller's search_path).
DROP FUNCTION IF EXISTS pgtrickle._parse_name(text);
CREATE OR REPLACE FUNCTION pgtrickle._parse_name(p_name text, p_path text, OUT schema_name text, OUT rel_name text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    parts text[];
BEGIN
    IF p_name IS NULL OR btrim(p_name) = '' THEN
        RAISE EXCEPTION 'stream table name must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    BEGIN
        parts := parse_ident(p_name);
    EXCEPTION WHEN others THEN
        RAISE EXCEPTION 'invalid stream table name %: %', quote_literal(left(p_name, 100)), SQLERRM
            USING ERRCODE = 'invalid_name',
                  HINT = 'Use name or schema.name; quote parts that contain special characters, e.g. ''"My Table"''.';
    END;
    IF array_length(parts, 1) > 2 THEN
        RAISE EXCEPTION 'invalid stream table name %: expected name or schema.name',
            quote_literal(left(p_name, 100)) USING ERRCODE = 'invalid_name';
    END IF;
    IF array_length(parts, 1) = 2 THEN
        schema_name := parts[1];
        rel_name := parts[2];
    ELSE
        schema_name := (pgtrickle._in_caller_path(p_path, NULL)).caller_schema;
        rel_name := parts[1];
        IF schema_name IS NULL THEN
            RAISE EXCEPTION 'no schema has been selected to create stream table % in', quote_ident(rel_name)
                USING ERRCODE = 'invalid_schema_name', HINT = 'Qualify the name with a schema.';
        END IF;
    END IF;
    IF octet_length(rel_name) > 63 OR octet_length(schema_name) > 63 THEN
        RAISE EXCEPTION 'stream table name % is too long: identifiers are limited to 63 bytes',
            quote_literal(left(p_name, 100)) USING ERRCODE = 'name_too_long';
    END IF;
    IF rel_name = '' THEN
        RAISE EXCEPTION 'stream table name must not be empty' USING ERRCODE = 'invalid_name';
    END IF;
END
$$;

-- The defining query as PostgreSQL holds it now (names schema-qualified; it
-- follows renames of source columns and tables).
CREATE OR REPLACE FUNCTION pgtrickle._normalized_query(p_view oid)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_get_viewdef(p_view, true)
$$;

-- Whether a defining view reads the clock: calls now(), clock_timestamp(), statement_timestamp(),
-- transaction_timestamp() or timeofday(), or uses current_date, current_time, current_timestamp,
-- localtime or localtimestamp. Read from PostgreSQL's own parse tree of the view (so a column or
-- a string that happens to say "now" does not count); such a stream table is recomputed on every
-- scheduled refresh even when its sources did not change.
CREATE OR REPLACE FUNCTION pgtrickle._reads_clock(p_view oid)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_rewrite r
         WHERE r.ev_class = p_view
           AND (r.ev_action::text ~ 'SQLVALUEFUNCTION :op [0-9]+ :type (1082|1083|1114|1184|1266) '
                OR EXISTS (SELECT 1
                             FROM regexp_matches(r.ev_action::text, ':funcid ([0-9]+) ', 'g') AS f(id)
                             JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid
                            WHERE p.pronamespace = 'pg_catalog'::regnamespace
                              AND p.proname IN ('now', 'clock_timestamp', 'statement_timestamp',
                                                'transaction_timestamp', 'timeofday'))))
$$;

-- Why a defining view cannot become a stream table refreshed in p_mode, or NULL. Read, like
-- _reads_clock, from PostgreSQL's own parse tree of the view: node fields print as ':field value'
-- and names print with blanks escaped, constants as bytes, so nothing the user writes can imitate a
-- node. Every refresh computes the query on Spark (sql/translate.py); what it can never run there
-- is refused in every mode, what has no delta rule is refused for 'DIFFERENTIAL' (dvm/analysis.py
-- decides the same from the query text: tests/integration/test_creation_refusals.py holds both to it).
CREATE OR REPLACE FUNCTION pgtrickle._query_refusal(p_view oid, p_mode text)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tree text;
    v_name text;
BEGIN
    SELECT string_agg(r.ev_action::text, ' ') INTO v_tree FROM pg_catalog.pg_rewrite r WHERE r.ev_class = p_view;
    IF v_tree IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_tree ~ ':hasRecursive true' THEN
        RETURN 'WITH RECURSIVE (a recursive common table expression) cannot be refreshed in any mode: '
            'every refresh computes the query on Spark, where pgtrickle does not run recursive queries';
    END IF;
    -- A function in FROM (RTE_FUNCTION = 3, RTE_TABLEFUNC = 4: XMLTABLE / JSON_TABLE).
    IF v_tree ~ ':rtekind [34] ' THEN
        SELECT p.proname INTO v_name
          FROM regexp_matches(v_tree, 'RANGETBLFUNCTION :funcexpr \{FUNCEXPR :funcid ([0-9]+) ', 'g') AS f(id)
          JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid LIMIT 1;
        RETURN format('the function %s in FROM cannot be refreshed in any mode: every refresh computes the '
                      'query on Spark, which has no equivalent of a function in FROM',
                      coalesce(quote_ident(v_name) || '()', '(XMLTABLE / JSON_TABLE)'));
    END IF;
    SELECT p.proname INTO v_name
      FROM regexp_matches(v_tree, 'FUNCEXPR :funcid ([0-9]+) :funcresulttype [0-9]+ :funcretset true ', 'g') AS f(id)
      JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid LIMIT 1;
    IF v_name IS NOT NULL OR v_tree ~ ':opretset true ' THEN
        RETURN format('the set-returning function %s cannot be refreshed in any mode: every refresh computes '
                      'the query on Spark, which has no equivalent of it', coalesce(quote_ident(v_name) || '()', 'operator'));
    END IF;
    SELECT p.proname INTO v_name
      FROM regexp_matches(v_tree, ':funcid ([0-9]+) ', 'g') AS f(id)
      JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid
     WHERE p.pronamespace = 'pg_catalog'::regnamespace
       AND p.proname IN ('nextval', 'currval', 'setval', 'lastval') LIMIT 1;
    IF v_name IS NOT NULL THEN
        RETURN format('the sequence function %s() cannot be refreshed in any mode: it changes or reads '
                      'PostgreSQL session state, which a refresh on Spark cannot', v_name);
    END IF;
    IF p_mode <> 'DIFFERENTIAL' THEN
        RETURN NULL;
    END IF;
    -- No delta rule: a volatile function (its result changes without the data changing), the clock.
    SELECT p.oid::regprocedure::text INTO v_name
      FROM regexp_matches(v_tree, ':(?:funcid|aggfnoid|winfnoid|opfuncid) ([0-9]+) ', 'g') AS f(id)
      JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid
     WHERE p.provolatile = 'v' LIMIT 1;
    IF v_name IS NULL THEN
        SELECT p.oid::regprocedure::text INTO v_name
          FROM regexp_matches(v_tree, ':opno ([0-9]+) ', 'g') AS f(id)
          JOIN pg_catalog.pg_operator o ON o.oid = f.id[1]::oid
          JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
         WHERE p.provolatile = 'v' LIMIT 1;
    END IF;
    IF v_name IS NOT NULL THEN
        RETURN format('refresh_mode DIFFERENTIAL is not possible: the query calls the volatile function %s, '
                      'whose result changes without the data changing (no delta rule)', v_name);
    END IF;
    IF pgtrickle._reads_clock(p_view) THEN
        RETURN 'refresh_mode DIFFERENTIAL is not possible: the query reads the clock (now(), current_date, ...), '
               'whose result changes without the data changing (no delta rule)';
    END IF;
    RETURN NULL;
END
$$;

-- Find a stream table by name: qualified, or resolved through the caller's search_path.
DROP FUNCTION IF EXISTS pgtrickle._find_st(text);
CREATE OR REPLACE FUNCTION pgtrickle._find_st(p_name text, p_path text)
RETURNS pgtrickle.pgt_stream_tables LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_schema text;
    v_name text;
    st pgtrickle.pgt_stream_tables;
    v_seen record;
BEGIN
    SELECT schema_name, rel_name INTO v_schema, v_name FROM pgtrickle._parse_name(p_name, p_path);
    IF array_length(parse_ident(p_name), 1) = 2 THEN
        SELECT * INTO st FROM pgtrickle.pgt_stream_tables s
         WHERE s.pgt_schema = v_schema AND s.pgt_name = v_name;
    ELSE
        v_seen := pgtrickle._in_caller_path(p_path, quote_ident(v_name));
        SELECT s.* INTO st FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = v_seen.relid;
        IF NOT FOUND THEN
            SELECT s.* INTO st FROM pgtrickle.pgt_stream_tables s
             WHERE s.pgt_name = v_name AND s.pgt_schema::name = ANY (v_seen.caller_schemas)
             ORDER BY array_position(v_seen.caller_schemas, s.pgt_schema::name)
             LIMIT 1;
        END IF;
    END IF;
    IF st.pgt_id IS NULL THEN
        RAISE EXCEPTION 'stream table % does not exist', quote_literal(p_name)
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT name FROM pgtrickle.stream_tables_info lists the stream tables.';
    END IF;
    RETURN st;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._display_name(p_schema text, p_name text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT quote_ident(p_schema) || '.' || quote_ident(p_name)
$$;

-- Schedules: the SQL half of pgtrickle's one schedule grammar (docs/SQL_API.md, "Schedules").
-- The daemon's half is pgtrickle.scheduler.schedule / pgtrickle.scheduler.cron; both accept
-- exactly the same strings (tests/integration/test_schedule_grammar.py checks it with random
-- input), and the API stores the canonical form, which the daemon parses back to the same schedule.
DROP FUNCTION IF EXISTS pgtrickle._cron_field_ok(text, int, int, text[]);

-- The values of one cron field (lower-case): a comma list of *, n, a-b (a <= b), each with an
-- optional /step (1..p_max; n/step means n-p_max/step); names are p_names (the first is p_min).
-- NULL when the field is not valid.
CREATE OR REPLACE FUNCTION pgtrickle._cron_field(p_field text, p_min int, p_max int, p_names text[])
RETURNS int[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    item text;
    m text[];
    ends int[];
    tok text;
    v int;
    step int;
    lo int;
    hi int;
    result int[] := '{}';
BEGIN
    FOREACH item IN ARRAY string_to_array(p_field, ',') LOOP
        m := regexp_match(item, '^(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?$');
        IF m IS NULL THEN
            RETURN NULL;
        END IF;
        step := 1;
        IF m[2] IS NOT NULL THEN
            IF m[2]::numeric < 1 OR m[2]::numeric > p_max THEN
                RETURN NULL;
            END IF;
            step := m[2]::int;
        END IF;
        IF m[1] = '*' THEN
            lo := p_min;
            hi := p_max;
        ELSE
            ends := '{}';
            FOREACH tok IN ARRAY string_to_array(m[1], '-') LOOP
                IF tok ~ '^[0-9]+$' THEN
                    IF tok::numeric < p_min OR tok::numeric > p_max THEN
                        RETURN NULL;
                    END IF;
                    v := tok::int;
                ELSIF p_names IS NOT NULL AND array_position(p_names, tok) IS NOT NULL THEN
                    v := array_position(p_names, tok) - 1 + p_min;
                ELSE
                    RETURN NULL;
                END IF;
                ends := ends || v;
            END LOOP;
            lo := ends[1];
            hi := CASE WHEN array_length(ends, 1) = 2 THEN ends[2]
                       WHEN m[2] IS NOT NULL THEN p_max ELSE lo END;
            IF hi < lo THEN
                RETURN NULL;
            END IF;
        END IF;
        result := result || ARRAY(SELECT generate_series(lo, hi, step));
    END LOOP;
    RETURN result;
END
$$;

-- Validate a schedule; returns its canonical form (what the catalog stores): 'calculated', an
-- @alias, a duration with units largest first ('90 m' -> '1h30m'), or a cron expression in
-- lower case with single spaces.
CREATE OR REPLACE FUNCTION pgtrickle._validate_schedule(p_schedule text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ws constant text := ' ' || chr(9) || chr(10) || chr(11) || chr(12) || chr(13);
    s text := btrim(p_schedule, ws);
    l text := lower(s);
    f text[];
    total numeric := 0;
    part text[];
    units constant text[] := ARRAY['w', 'd', 'h', 'm', 's', 'ms'];
    unit_ms constant numeric[] := ARRAY[604800000, 86400000, 3600000, 60000, 1000, 1];
    last_rank int := 0;
    rank int;
    canonical text := '';
    n numeric;
    doms int[];
    months int[];
    shown text := quote_literal(left(p_schedule, 80));
    accepted constant text :=
        'Use a duration such as ''30s'', ''5m'', ''1h30m'' (units ms, s, m, h, d, w; 1s to 366d), '
        'a 5-field cron expression such as ''*/5 * * * *'' or @hourly/@daily/@weekly/@monthly/@yearly, '
        'or ''calculated''.';
BEGIN
    IF s IS NULL OR s = '' THEN
        RAISE EXCEPTION 'schedule must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF length(s) > 200 THEN
        RAISE EXCEPTION 'invalid schedule %: longer than 200 characters', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF s ~ '[^\x01-\x7f]' THEN
        RAISE EXCEPTION 'invalid schedule %', shown USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF l = 'calculated' THEN
        RETURN 'calculated';
    END IF;
    IF left(s, 1) = '@' THEN
        IF l IN ('@hourly', '@daily', '@weekly', '@monthly', '@yearly') THEN
            RETURN l;
        END IF;
        RAISE EXCEPTION 'invalid schedule %: not a supported cron alias', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF l ~ ('^([0-9]+[' || ws || ']*(ms|s|m|h|d|w)[' || ws || ']*)+$') THEN
        FOR part IN SELECT regexp_matches(l, '([0-9]+)[' || ws || ']*(ms|s|m|h|d|w)', 'g') LOOP
            rank := array_position(units, part[2]);
            IF rank <= last_rank THEN
                RAISE EXCEPTION 'invalid schedule %: duration units must appear once each, largest first', shown
                    USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
            END IF;
            last_rank := rank;
            total := total + part[1]::numeric * unit_ms[rank];
        END LOOP;
        IF total < 1000 OR total > 31622400000 THEN  -- 1s to 366d, in ms
            RAISE EXCEPTION 'invalid schedule %: duration out of range (1s to 366d)', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        FOR rank IN 1 .. 6 LOOP
            n := div(total, unit_ms[rank]);
            total := total - n * unit_ms[rank];
            IF n > 0 THEN
                canonical := canonical || n::text || units[rank];
            END IF;
        END LOOP;
        RETURN canonical;
    END IF;
    f := regexp_split_to_array(l, '[' || ws || ']+');
    IF array_length(f, 1) > 1 THEN
        IF array_length(f, 1) <> 5 THEN
            RAISE EXCEPTION 'invalid schedule %: a cron expression has exactly 5 fields (minute hour day-of-month month day-of-week)',
                shown USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        doms := pgtrickle._cron_field(f[3], 1, 31, NULL);
        months := pgtrickle._cron_field(f[4], 1, 12,
            ARRAY['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec']);
        IF pgtrickle._cron_field(f[1], 0, 59, NULL) IS NULL OR pgtrickle._cron_field(f[2], 0, 23, NULL) IS NULL
           OR doms IS NULL OR months IS NULL
           OR pgtrickle._cron_field(f[5], 0, 7, ARRAY['sun','mon','tue','wed','thu','fri','sat']) IS NULL THEN
            RAISE EXCEPTION 'invalid schedule %: not a valid cron expression', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        -- The day matches when both day fields do, unless neither is '*' (then either is enough):
        -- so only a day of month that none of the months has can make it never fire.
        IF (f[3] = '*' OR f[5] = '*')
           AND NOT EXISTS (SELECT 1 FROM unnest(doms) d, unnest(months) mo
                            WHERE d <= (ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[mo]) THEN
            RAISE EXCEPTION 'invalid schedule %: the cron expression never fires (no chosen month has that day)', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        RETURN array_to_string(f, ' ');
    END IF;
    RAISE EXCEPTION 'invalid schedule %', shown
        USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._validate_refresh_mode(p_mode text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m text := upper(btrim(p_mode));
BEGIN
    IF m IS NULL OR m NOT IN ('AUTO', 'FULL', 'DIFFERENTIAL') THEN
        RAISE EXCEPTION 'invalid refresh_mode %', coalesce(quote_literal(left(p_mode, 80)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''AUTO'', ''FULL'' or ''DIFFERENTIAL''.';
    END IF;
    RETURN m;
END
$$;

-- The quadratic character-by-character scanner that used to decide "one statement" is gone:
-- PostgreSQL's own parser decides it now (_api_create_stream_table opens a cursor on
-- EXPLAIN <query>, which refuses a multi-statement text before anything runs).
DROP FUNCTION IF EXISTS pgtrickle._is_single_statement(text);

-- Checks of a defining query's text that must run before PostgreSQL parses it, each linear in
-- its size: the max_query_length limit, and the few shapes PostgreSQL's own lexer takes
-- quadratic time over (measured: 40k characters of them pinned a backend for seconds).
CREATE OR REPLACE FUNCTION pgtrickle._check_query_text(p_query text, p_display text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_limit bigint := coalesce(pgtrickle._setting('max_query_length')::bigint, 1048576);
    v_size bigint := octet_length(p_query);
    v_shape text;
BEGIN
    IF v_size > v_limit THEN
        RAISE EXCEPTION 'defining query of stream table % is too long: % bytes, the limit is % bytes (setting max_query_length)',
            p_display, v_size, v_limit
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Shorten the query, or raise the limit: UPDATE pgtrickle.pgt_settings SET value = ''<bytes>'' WHERE name = ''max_query_length'';';
    END IF;
    -- One regular expression each, so the scan is a single linear pass (no back-references).
    IF p_query ~ '/\*[-~!@#^&|`?+*/%<>=]*/\*' THEN
        v_shape := 'two comment openings (/*) in one run of operator characters';
    ELSIF p_query ~ '(?:\+-?){32}' THEN
        v_shape := 'a run of 32 or more + and - characters';
    ELSIF p_query ~* '0[xob][0-9a-f_]{250}' THEN
        v_shape := 'a hexadecimal, octal or binary literal of 250 or more digits';
    END IF;
    IF v_shape IS NOT NULL THEN
        RAISE EXCEPTION 'defining query of stream table % contains %, which PostgreSQL''s parser takes quadratic time over',
            p_display, v_shape
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Separate the characters with spaces (nested comments: /* /* */ */), or shorten the literal.';
    END IF;
END
$$;

-- ------------------------------------------------------------ change capture

CREATE OR REPLACE FUNCTION pgtrickle._buffer_column(p_attname text, p_attnum int)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN octet_length(p_attname) <= 56 THEN p_attname ELSE 'col' || p_attnum END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._drop_capture_triggers(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    trg text;
BEGIN
    FOREACH trg IN ARRAY ARRAY['pgt_capture_ins', 'pgt_capture_upd', 'pgt_capture_del', 'pgt_capture_trunc'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trg, p_relid::regclass);
    END LOOP;
END
$$;

-- The change buffer of a source is the view pgtrickle_changes.changes_<relid>
-- (change_id, xid, action, captured_at, new_<col>, old_<col>, ...) over
--   changes_<relid>_rows     one row per change: WAL capture, trigger-captured
--                            UPDATEs and TRUNCATEs, stream tables' changes;
--   changes_<relid>_batches  (tables only) the INSERTed and DELETEd rows of a
--                            statement, packed up to 4096 to a row, column by
--                            column: v_<col> is an array of that column's values
--                            (its type without modifier; text for array and composite types),
--                            stored uncompressed out of line. A bulk statement
--                            writes one heap tuple and a few TOAST chunks per 4096
--                            changes instead of 4096 heap tuples.
-- change_id comes from one sequence that steps by 4096: a batch takes one value v
-- and its changes are v .. v+4095, so ids stay unique and in statement order.
CREATE OR REPLACE FUNCTION pgtrickle._buffer_part(p_buffer text, p_part text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('pgtrickle_changes.%I', p_buffer || '_' || p_part)
$$;

-- How many changes a buffer's batches hold (0 without a batches table).
CREATE OR REPLACE FUNCTION pgtrickle._batched_changes(p_buffer text)
RETURNS float8 LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    n float8;
BEGIN
    IF to_regclass(pgtrickle._buffer_part(p_buffer, 'batches')) IS NULL THEN
        RETURN 0;
    END IF;
    EXECUTE format('SELECT coalesce(sum(n_changes), 0) FROM %s', pgtrickle._buffer_part(p_buffer, 'batches')) INTO n;
    RETURN n;
END
$$;

-- (Re)create the view of a source's change buffer from its parts.
CREATE OR REPLACE FUNCTION pgtrickle._build_buffer_view(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    view_cols text := '';
    batch_cols text := '';
    funcs text := '';
    aliases text := '';
    col record;
    body text;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    FOR col IN
        SELECT c->>'buf' AS buf, format_type(a.atttypid, a.atttypmod) AS type, a.atttypid AS typid
          FROM jsonb_array_elements(src.columns) WITH ORDINALITY AS j(c, i)
          LEFT JOIN pg_attribute a
            ON a.attrelid = to_regclass(pgtrickle._buffer_part(src.buffer_name, 'rows'))
           AND a.attname = 'new_' || (c->>'buf') AND NOT a.attisdropped
         ORDER BY j.i
    LOOP
        view_cols := view_cols || format(', %I, %I', 'new_' || col.buf, 'old_' || col.buf);
        PERFORM pgtrickle._refuse_user_text_cast(col.typid, p_relid);
        -- The cast gives back the exact type (numeric(10,2), varchar(n), an array type
        -- packed as text...), so the view's columns have the rows table's types.
        batch_cols := batch_cols || format(', (CASE WHEN b.action = ''I'' THEN e.%1$I END)::%2$s,'
                                           ' (CASE WHEN b.action = ''D'' THEN e.%1$I END)::%2$s',
                                           'v_' || col.buf, col.type);
        funcs := funcs || format(', unnest(b.%I)', 'v_' || col.buf);
        aliases := aliases || format(', %I', 'v_' || col.buf);
    END LOOP;
    body := format('SELECT change_id, xid, action, captured_at%s FROM %s', view_cols,
                   pgtrickle._buffer_part(src.buffer_name, 'rows'));
    IF src.source_kind = 'TABLE' THEN
        -- generate_series gives every change a row even where a column's array is NULL
        -- (a batch written before that column was captured): ROWS FROM pads with NULLs.
        body := body || format(
            ' UNION ALL SELECT b.change_id + e.__ord - 1, b.xid, b.action, b.captured_at%s'
            ' FROM %s b CROSS JOIN LATERAL ROWS FROM (generate_series(1, b.n_changes)%s) AS e(__ord%s)',
            batch_cols, pgtrickle._buffer_part(src.buffer_name, 'batches'), funcs, aliases);
    END IF;
    EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', src.buffer_name);
    EXECUTE format('CREATE VIEW pgtrickle_changes.%I (change_id, xid, action, captured_at%s) AS %s',
                   src.buffer_name, view_cols, body);
    EXECUTE format('COMMENT ON VIEW pgtrickle_changes.%I IS %L', src.buffer_name,
                   'pgtrickle change buffer of ' || coalesce(p_relid::regclass::text, src.source_name));
END
$$;

-- A type by its schema-qualified name, without modifier: format_type() would say
-- "character" for bpchar, which means char(1).
CREATE OR REPLACE FUNCTION pgtrickle._type_name(p_type oid)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%I.%I', n.nspname, t.typname) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
     WHERE t.oid = p_type
$$;

-- The packed column of a source column in a buffer's batches table: an array of its type
-- without modifier; text for an array type (arrays of arrays must have equal dimensions)
-- and for a composite type (unnest() in ROWS FROM would spread its fields over columns).
CREATE OR REPLACE FUNCTION pgtrickle._add_batch_column(p_buffer text, p_buf text, p_type oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_elem text := pgtrickle._type_name(
        CASE WHEN (SELECT typcategory = 'A' OR typtype = 'c' FROM pg_type
                    WHERE oid = coalesce(nullif((SELECT typbasetype FROM pg_type WHERE oid = p_type), 0), p_type))
             THEN 'pg_catalog.text'::regtype ELSE pgtrickle._base_type(p_type) END);
BEGIN
    EXECUTE format('ALTER TABLE %1$s ADD COLUMN %2$I %3$s[], ALTER COLUMN %2$I SET STORAGE EXTERNAL',
                   pgtrickle._buffer_part(p_buffer, 'batches'), 'v_' || p_buf, v_elem);
END
$$;

-- (Re)generate the capture trigger function of a tracked table from the
-- captured columns recorded in pgt_change_sources.
CREATE OR REPLACE FUNCTION pgtrickle._build_capture(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    fn text;
    buf text;
    batches text;
    b_cols text;
    b_aggs text;
    new_cols text := '';
    old_cols text := '';
    n_vals text := '';
    o_vals text := '';
    n_row text := '';
    o_row text := '';
    key_join text := '';
    key_first text;
    col record;
    k text;
    body text;
    tbl text;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    fn := format('pgtrickle_changes.%I', 'capture_' || p_relid);
    buf := pgtrickle._buffer_part(src.buffer_name, 'rows');
    batches := pgtrickle._buffer_part(src.buffer_name, 'batches');
    tbl := p_relid::regclass::text;
    FOR col IN
        SELECT c->>'name' AS name, c->>'buf' AS buf
          FROM jsonb_array_elements(src.columns) c
    LOOP
        new_cols := new_cols || format(', %I', 'new_' || col.buf);
        old_cols := old_cols || format(', %I', 'old_' || col.buf);
        n_vals := n_vals || format(', n.%I', col.name);
        o_vals := o_vals || format(', o.%I', col.name);
    END LOOP;
    -- Packing: each captured column, cast to its batch array's element type (a no-op
    -- but for array types, packed as text), aggregated into that array.
    SELECT coalesce(string_agg(format(', %I', a.attname), '' ORDER BY j.i), ''),
           coalesce(string_agg(format(', array_agg(p.c%s)', j.i), '' ORDER BY j.i), ''),
           coalesce(string_agg(pgtrickle._packed_value('n', c->>'name', t.typelem, j.i), '' ORDER BY j.i), ''),
           coalesce(string_agg(pgtrickle._packed_value('o', c->>'name', t.typelem, j.i), '' ORDER BY j.i), '')
      INTO b_cols, b_aggs, n_row, o_row
      FROM jsonb_array_elements(src.columns) WITH ORDINALITY AS j(c, i)
      JOIN pg_attribute a ON a.attrelid = batches::regclass AND a.attname = 'v_' || (c->>'buf')
      JOIN pg_type t ON t.oid = a.atttypid;
    FOREACH k IN ARRAY src.key_columns LOOP
        key_join := key_join || CASE WHEN key_join = '' THEN '' ELSE ' AND ' END
                    || format('o.%1$I = n.%1$I', k);
        key_first := coalesce(key_first, k);
    END LOOP;

    -- work_mem: the packing aggregate holds up to ~256 MB of a big statement's rows in
    -- memory before it spills to disk.
    body := format($b$
CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' AS $f$
DECLARE
    v_xid xid8 := pg_current_xact_id();
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO %8$s (xid, action, n_changes%9$s)
        SELECT v_xid, 'I', count(*)%12$s
          FROM (SELECT %10$s(row_number() OVER () - 1) / 4096 AS k FROM __pgt_new n) p
         GROUP BY p.k;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO %8$s (xid, action, n_changes%9$s)
        SELECT v_xid, 'D', count(*)%12$s
          FROM (SELECT %11$s(row_number() OVER () - 1) / 4096 AS k FROM __pgt_old o) p
         GROUP BY p.k;
    ELSIF TG_OP = 'UPDATE' THEN
        %7$s
    ELSIF TG_OP = 'TRUNCATE' THEN
        INSERT INTO %2$s (xid, action) VALUES (v_xid, 'T');
    END IF;
    RETURN NULL;
END
$f$ $b$,
        fn, buf, new_cols, old_cols, n_vals, o_vals,
        CASE WHEN key_join = '' THEN
            format($u$INSERT INTO %1$s (xid, action%2$s) SELECT v_xid, 'D'%4$s FROM __pgt_old o;
        INSERT INTO %1$s (xid, action%3$s) SELECT v_xid, 'I'%5$s FROM __pgt_new n;$u$,
                   buf, old_cols, new_cols, o_vals, n_vals)
        ELSE
            format($u$INSERT INTO %1$s (xid, action%2$s%3$s)
            SELECT v_xid, CASE WHEN o.%6$I IS NULL THEN 'I' WHEN n.%6$I IS NULL THEN 'D' ELSE 'U' END%4$s%5$s
              FROM __pgt_old o FULL JOIN __pgt_new n ON %7$s;$u$,
                   buf, new_cols, old_cols, n_vals, o_vals, key_first, key_join)
        END,
        batches, b_cols, n_row, o_row, b_aggs);
    EXECUTE body;

    -- One trigger per event: transition tables need single-event triggers.
    PERFORM pgtrickle._drop_capture_triggers(p_relid);
    EXECUTE format('CREATE TRIGGER pgt_capture_ins AFTER INSERT ON %s REFERENCING NEW TABLE AS __pgt_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', tbl, fn);
    EXECUTE format('CREATE TRIGGER pgt_capture_upd AFTER UPDATE ON %s REFERENCING OLD TABLE AS __pgt_old '
                   'NEW TABLE AS __pgt_new FOR EACH STATEMENT EXECUTE FUNCTION %s()', tbl, fn);
    EXECUTE format('CREATE TRIGGER pgt_capture_del AFTER DELETE ON %s REFERENCING OLD TABLE AS __pgt_old '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', tbl, fn);
    EXECUTE format('CREATE TRIGGER pgt_capture_trunc AFTER TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', tbl, fn);
    -- Partitions and inheritance children write the same buffer; a source that is a
    -- partition is captured through the tables above it too (capture_hierarchy.sql).
    PERFORM pgtrickle._sync_member_capture(p_relid);
    PERFORM pgtrickle._build_ancestor_capture(p_relid, body, fn);
END
$$;

-- The tables (and, for a table source, the element type) of a new change buffer.
CREATE OR REPLACE FUNCTION pgtrickle._create_buffer_parts(p_buffer text, p_kind text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    EXECUTE format(
        'CREATE TABLE %s ('
        ' change_id bigint GENERATED ALWAYS AS IDENTITY (INCREMENT BY 4096 CACHE 1000),'
        ' xid xid8 NOT NULL,'
        ' action "char" NOT NULL,'
        ' captured_at timestamptz NOT NULL DEFAULT now())', pgtrickle._buffer_part(p_buffer, 'rows'));
    IF p_kind = 'TABLE' THEN
        PERFORM pgtrickle._create_buffer_batches(p_buffer);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._create_buffer_batches(p_buffer text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    EXECUTE format(
        'CREATE TABLE %s ('
        ' change_id bigint NOT NULL DEFAULT nextval(%L::regclass),'
        ' xid xid8 NOT NULL,'
        ' action "char" NOT NULL,'
        ' captured_at timestamptz NOT NULL DEFAULT now(),'
        ' n_changes integer NOT NULL)',
        pgtrickle._buffer_part(p_buffer, 'batches'),
        pg_get_serial_sequence(pgtrickle._buffer_part(p_buffer, 'rows'), 'change_id'));
END
$$;

-- Create the change buffer of a source (table or stream table) if missing,
-- and make sure the given columns are captured.
CREATE OR REPLACE FUNCTION pgtrickle._ensure_capture(p_relid oid, p_kind text, p_columns text[])
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    v_buffer text := 'changes_' || p_relid;
    v_keys text[];
    v_want text[];
    v_cols jsonb;
    col record;
    changed boolean := false;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM pgtrickle._create_buffer_parts(v_buffer, p_kind);
        SELECT coalesce(array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum)), '{}')
          INTO v_keys
          FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
         WHERE i.indrelid = p_relid AND i.indisprimary;
        INSERT INTO pgtrickle.pgt_change_sources
            (source_relid, source_schema, source_name, source_kind, buffer_name, key_columns)
        SELECT p_relid, n.nspname, c.relname, p_kind, v_buffer, v_keys
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = p_relid
        RETURNING * INTO src;
        changed := true;
    END IF;
    v_want := ARRAY(SELECT DISTINCT unnest(p_columns || src.key_columns));
    v_cols := src.columns;
    FOR col IN
        SELECT a.attname::text AS name, a.attnum, format_type(a.atttypid, a.atttypmod) AS type, a.atttypid AS typid,
               pgtrickle._storage_type(a.atttypid, a.atttypmod) AS storage
          FROM pg_attribute a
         WHERE a.attrelid = p_relid AND a.attname = ANY (v_want) AND a.attnum > 0 AND NOT a.attisdropped
           AND NOT v_cols @> jsonb_build_array(jsonb_build_object('attnum', a.attnum))
         ORDER BY a.attnum
    LOOP
        EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', src.buffer_name);
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s, ADD COLUMN %I %s',
                       pgtrickle._buffer_part(src.buffer_name, 'rows'),
                       'new_' || pgtrickle._buffer_column(col.name, col.attnum), col.storage,
                       'old_' || pgtrickle._buffer_column(col.name, col.attnum), col.storage);
        IF src.source_kind = 'TABLE' THEN
            PERFORM pgtrickle._add_batch_column(src.buffer_name, pgtrickle._buffer_column(col.name, col.attnum),
                                                col.typid);
        END IF;
        v_cols := v_cols || jsonb_build_array(
            jsonb_build_object('attnum', col.attnum, 'name', col.name, 'type', col.type,
                               'buf', pgtrickle._buffer_column(col.name, col.attnum)));
        changed := true;
    END LOOP;
    IF changed THEN
        UPDATE pgtrickle.pgt_change_sources SET columns = v_cols WHERE source_relid = p_relid;
        PERFORM pgtrickle._build_buffer_view(p_relid);
        -- Stream tables have no triggers: pgtrickle records their changes when it applies a refresh.
        IF p_kind = 'TABLE' THEN
            PERFORM pgtrickle._build_capture(p_relid);
        END IF;
    END IF;
END
$$;

-- Remove capture objects of a source no stream table reads any more.
CREATE OR REPLACE FUNCTION pgtrickle._drop_capture_if_unused(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    IF NOT FOUND OR EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies WHERE source_relid = p_relid) THEN
        RETURN;
    END IF;
    IF src.source_kind = 'TABLE' AND src.cdc_mode = 'wal' AND EXISTS (SELECT 1 FROM pg_class WHERE oid = p_relid) THEN
        PERFORM pgtrickle._stop_wal_capture(p_relid);
    END IF;
    IF src.source_kind = 'TABLE' AND EXISTS (SELECT 1 FROM pg_class WHERE oid = p_relid) THEN
        PERFORM pgtrickle._drop_capture_triggers(p_relid);
    END IF;
    PERFORM pgtrickle._drop_member_captures(p_relid);
    EXECUTE format('DROP FUNCTION IF EXISTS pgtrickle_changes.%I()', 'capture_' || p_relid);
    EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', src.buffer_name);
    EXECUTE format('DROP TABLE IF EXISTS %s, %s', pgtrickle._buffer_part(src.buffer_name, 'rows'),
                   pgtrickle._buffer_part(src.buffer_name, 'batches'));
    DELETE FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    PERFORM pgtrickle._drop_wal_infrastructure_if_unused();
END
$$;

-- Whether p_caller may read what a defining query (the view p_view) reads of p_relid, decided
-- as PostgreSQL decides it for a query the caller runs: from the columns the parser marked as
-- selected (the view's permission info). A whole-row reference (s, s::text, row_to_json(s), ...)
-- needs SELECT on every column; a system column needs SELECT on the table; so does reading no
-- column at all (count(*): stricter than PostgreSQL, which accepts SELECT on any column).
CREATE OR REPLACE FUNCTION pgtrickle._caller_may_read(p_caller name, p_relid oid, p_view oid)
RETURNS boolean LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- Bits of selectedCols are attnum - FirstLowInvalidHeapAttributeNumber (-7): 7 is the whole row.
    v_pattern text := CASE WHEN current_setting('server_version_num')::int >= 160000
                           THEN '\{RTEPERMISSIONINFO :relid ([0-9]+) [^}]*:selectedCols \(b([ 0-9]*)\)'
                           ELSE ':rtekind 0 :relid ([0-9]+) (?:[^:]|:(?!selectedCols ))*:selectedCols \(b([ 0-9]*)\)' END;
    v_bits int[];
BEGIN
    IF has_table_privilege(p_caller, p_relid, 'SELECT') THEN
        RETURN true;
    END IF;
    SELECT coalesce(array_agg(DISTINCT bit::int), '{}') INTO v_bits
      FROM pg_rewrite r,
           regexp_matches(r.ev_action::text, v_pattern, 'g') AS m,
           unnest(string_to_array(btrim(m[2]), ' ')) AS bit
     WHERE r.ev_class = p_view AND m[1]::oid = p_relid AND bit <> '';
    IF v_bits = '{}' THEN
        RETURN false;  -- no column (count(*)): stricter than PostgreSQL, SELECT on the table
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(v_bits) b WHERE b < 7) THEN
        RETURN false;  -- a system column: only SELECT on the table grants it
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM pg_attribute a
         WHERE a.attrelid = p_relid AND a.attnum > 0 AND NOT a.attisdropped
           AND (7 = ANY (v_bits) OR a.attnum + 7 = ANY (v_bits))
           AND NOT has_column_privilege(p_caller, p_relid, a.attnum, 'SELECT'));
END
$$;

-- ------------------------------------------------------------------ the API

CREATE OR REPLACE FUNCTION pgtrickle._api_create_stream_table(
    name text,
    query text,
    schedule text,
    refresh_mode text,
    initialize boolean,
    caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_schema text;
    v_name text;
    v_display text;
    v_schedule text;
    v_mode text;
    v_query text;
    v_id bigint;
    v_view_name text;
    v_view oid;
    v_relid oid;
    v_norm text;
    v_bad record;
    dep record;
    v_state text;
    v_msg text;
    v_detail text;
    v_hint text;
    v_caller name := pgtrickle._require_user('create stream tables');
    v_definer name := current_user;
    v_fn record;
    v_check refcursor;
BEGIN
    SELECT schema_name, rel_name INTO v_schema, v_name FROM pgtrickle._parse_name(name, caller_path);
    v_display := pgtrickle._display_name(v_schema, v_name);
    IF query IS NULL OR btrim(query) = '' THEN
        RAISE EXCEPTION 'defining query of stream table % must not be NULL or empty', v_display
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_schedule := pgtrickle._validate_schedule(coalesce(schedule, pgtrickle._setting('default_schedule')));
    v_mode := pgtrickle._validate_refresh_mode(refresh_mode);
    IF initialize IS NULL THEN
        RAISE EXCEPTION 'initialize must be true or false, not NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = v_schema) THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(v_schema) USING ERRCODE = 'invalid_schema_name';
    END IF;
    IF v_schema IN ('pgtrickle', 'pgtrickle_changes', 'pg_catalog', 'information_schema') THEN
        RAISE EXCEPTION 'stream tables cannot be created in schema %', quote_ident(v_schema)
            USING ERRCODE = 'invalid_schema_name';
    END IF;
    -- The stream table is created by pgtrickle's owner: the caller must be allowed to create it themselves.
    IF NOT has_schema_privilege(v_caller, (SELECT oid FROM pg_namespace WHERE nspname = v_schema), 'CREATE') THEN
        RAISE EXCEPTION 'permission denied: role % may not create tables in schema %', quote_ident(v_caller),
            quote_ident(v_schema)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('GRANT CREATE ON SCHEMA %I TO %I; or create the stream table in a schema of your own.',
                                v_schema, v_caller);
    END IF;
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables WHERE pgt_schema = v_schema AND pgt_name = v_name) THEN
        RAISE EXCEPTION 'stream table % already exists', v_display USING ERRCODE = 'duplicate_object',
            HINT = 'Drop it first with pgtrickle.drop_stream_table, or choose another name.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = v_schema AND c.relname = v_name) THEN
        RAISE EXCEPTION 'relation % already exists', v_display USING ERRCODE = 'duplicate_table';
    END IF;
    PERFORM pgtrickle._check_query_text(query, v_display);
    v_query := regexp_replace(query, ';\s*$', '');

    v_id := nextval('pgtrickle.pgt_stream_tables_pgt_id_seq');
    v_view_name := 'pgt_def_' || v_id;
    BEGIN
        -- The defining query means what it means to the caller: parse it in the caller's search_path.
        PERFORM pg_catalog.set_config('search_path', coalesce(caller_path, ''), true);
        -- One statement, decided by PostgreSQL's parser in linear time: a cursor opens on exactly
        -- one statement, and every statement of the text is parsed (nothing runs, nothing is
        -- planned: EXPLAIN would run only when fetched) before a second one is refused (42P11).
        OPEN v_check FOR EXECUTE 'EXPLAIN ' || v_query;
        CLOSE v_check;
        EXECUTE pg_catalog.format('CREATE VIEW pgtrickle.%I AS %s', v_view_name, v_query);
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
    EXCEPTION WHEN others THEN
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT,
                                v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        IF v_state = '42P01' AND (v_msg = format('relation "%s" does not exist', v_name)
                                  OR v_msg = format('relation "%s.%s" does not exist', v_schema, v_name)) THEN
            RAISE EXCEPTION 'stream table % cannot be defined in terms of itself', v_display
                USING ERRCODE = 'invalid_recursion';
        END IF;
        IF v_state = '42P11' THEN
            RAISE EXCEPTION 'defining query of stream table % must be a single SELECT statement', v_display
                USING ERRCODE = 'syntax_error',
                      DETAIL = 'The query text contains more than one statement.';
        END IF;
        IF v_state = '42601' THEN
            v_hint := coalesce(v_hint, 'The defining query must be a single SELECT (or WITH ... SELECT, VALUES) query.');
        END IF;
        RAISE EXCEPTION 'invalid defining query for stream table %: %', v_display, v_msg
            USING ERRCODE = v_state, DETAIL = coalesce(v_detail, ''), HINT = coalesce(v_hint, '');
    END;
    v_view := format('pgtrickle.%I', v_view_name)::regclass;

    FOR v_bad IN SELECT attnum, attname FROM pg_catalog.pg_attribute
                  WHERE attrelid = v_view AND attnum > 0 AND NOT attisdropped
                    AND (attname = '?column?' OR attname LIKE '\_\_pgt\_%') LOOP
        RAISE EXCEPTION 'column % of the defining query of % needs a name', v_bad.attnum, v_display
            USING ERRCODE = 'invalid_column_reference',
                  HINT = format('Give the expression an alias (AS name); names starting with __pgt_ are reserved (got %s).',
                                quote_ident(v_bad.attname));
    END LOOP;

    -- What the query reads, from the view's dependencies.
    FOR dep IN
        SELECT d.refobjid AS relid, c.relkind, n.nspname, c.relname,
               array_agg(DISTINCT a.attname::text) FILTER (WHERE a.attname IS NOT NULL) AS cols,
               EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = d.refobjid) AS is_st
          FROM pg_catalog.pg_rewrite r
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
                                     AND d.refclassid = 'pg_catalog.pg_class'::regclass
          JOIN pg_catalog.pg_class c ON c.oid = d.refobjid
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                             AND d.refobjsubid > 0
         WHERE r.ev_class = v_view AND d.refobjid <> v_view
         GROUP BY d.refobjid, c.relkind, n.nspname, c.relname
    LOOP
        IF dep.nspname IN ('pgtrickle', 'pgtrickle_changes') THEN
            RAISE EXCEPTION 'the defining query of % reads pgtrickle''s own table %.%', v_display,
                quote_ident(dep.nspname), quote_ident(dep.relname) USING ERRCODE = 'feature_not_supported';
        END IF;
        IF dep.relkind NOT IN ('r', 'p') THEN
            RAISE EXCEPTION 'source %.% of stream table % is a %, which is not supported', quote_ident(dep.nspname),
                quote_ident(dep.relname), v_display,
                CASE dep.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                 WHEN 'f' THEN 'foreign table' ELSE 'relation of kind ' || dep.relkind::text END
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Stream tables read tables and other stream tables. Inline the view''s query, or make it a stream table.';
        END IF;
        IF dep.relkind = 'r' AND (SELECT relpersistence FROM pg_class WHERE oid = dep.relid) = 't' THEN
            RAISE EXCEPTION 'source %.% of stream table % is a temporary table', quote_ident(dep.nspname),
                quote_ident(dep.relname), v_display USING ERRCODE = 'feature_not_supported';
        END IF;
        IF pgtrickle._rls_refusal(dep.relid, v_caller, v_display) IS NOT NULL THEN
            RAISE EXCEPTION '%', pgtrickle._rls_refusal(dep.relid, v_caller, v_display)
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Filter the rows the stream table may show in its query, or give the owner BYPASSRLS.';
        END IF;
        PERFORM pgtrickle._check_storable(dep.relid, dep.cols,
                                          format('source %s of stream table %s:', dep.relid::regclass, v_display));
        -- The daemon fills the table with its own rights: the caller must be allowed to read what it shows.
        IF NOT pgtrickle._caller_may_read(v_caller, dep.relid, v_view) THEN
            RAISE EXCEPTION 'permission denied: role % may not read %.%, which the defining query of % reads',
                v_caller, quote_ident(dep.nspname), quote_ident(dep.relname), v_display
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('A stream table shows what its query reads. GRANT SELECT ON %I.%I TO %I first.',
                                    dep.nspname, dep.relname, v_caller);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
                    WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.ev_class = v_view
                      AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid <> v_view) THEN
        RAISE EXCEPTION 'the defining query of % reads no table', v_display
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A stream table maintains a query over tables; a constant query needs no stream table.';
    END IF;
    -- The query runs with pgtrickle's rights (the daemon's): it may call only functions (and operators)
    -- that are built in or owned by a superuser or pgtrickle's owner, never code another role can change.
    FOR v_fn IN
        SELECT p.oid::regprocedure::text AS fn, p.oid, p.proowner, r.rolsuper, n.nspname
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_rewrite rw ON rw.oid = d.objid
          LEFT JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::regclass AND o.oid = d.refobjid
          JOIN pg_catalog.pg_proc p ON p.oid = CASE WHEN d.refclassid = 'pg_catalog.pg_proc'::regclass THEN d.refobjid
                                                     ELSE o.oprcode::oid END
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
         WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND rw.ev_class = v_view
           AND d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass)
    LOOP
        IF v_fn.nspname <> 'pg_catalog' AND NOT v_fn.rolsuper AND v_fn.proowner <> (SELECT oid FROM pg_roles WHERE rolname = v_definer) THEN
            RAISE EXCEPTION 'the defining query of % calls %, which is owned by %: pgtrickle runs defining queries with its own rights, so they may call only built-in functions and functions owned by a superuser',
                v_display, v_fn.fn, quote_ident((SELECT rolname FROM pg_roles WHERE oid = v_fn.proowner))
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Inline the function''s logic in the query, or have a superuser own the function (ALTER FUNCTION ... OWNER TO).';
        END IF;
        IF NOT has_function_privilege(v_caller, v_fn.oid, 'EXECUTE') THEN
            RAISE EXCEPTION 'permission denied: role % may not execute %, which the defining query of % calls',
                quote_ident(v_caller), v_fn.fn, v_display USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;

    -- What no refresh can run, and what refresh_mode DIFFERENTIAL has no rule for: refused now
    -- rather than at the first refresh.
    v_msg := pgtrickle._query_refusal(v_view, v_mode);
    IF v_msg IS NOT NULL THEN
        RAISE EXCEPTION 'stream table % cannot be created: %', v_display, v_msg
            USING ERRCODE = 'feature_not_supported',
                  HINT = CASE WHEN v_mode = 'DIFFERENTIAL' AND v_msg LIKE 'refresh_mode DIFFERENTIAL%'
                              THEN 'Use refresh_mode => ''AUTO'' or ''FULL''.'
                              ELSE 'Rewrite the query without it.' END;
    END IF;

    v_norm := pgtrickle._normalized_query(v_view);

    -- Columns in storage types: a domain is stored as its base type (writing a domain value
    -- would run its CHECK, code of the domain's owner, with the daemon's rights).
    PERFORM pgtrickle._check_storable(v_view, NULL, format('stream table %s:', v_display));
    -- Refreshes compare stored values (the apply): each column's type needs an equality they may run.
    PERFORM pgtrickle._equality_operator(a.atttypid, format('stream table %s: column %I has', v_display, a.attname))
       FROM pg_attribute a WHERE a.attrelid = v_view AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('CREATE TABLE %I.%I (%s)', v_schema, v_name,
                   (SELECT string_agg(format('%I %s%s', a.attname, pgtrickle._storage_type(a.atttypid, a.atttypmod),
                                             CASE WHEN a.attcollation <> 0 THEN
                                                 (SELECT format(' COLLATE %I.%I', cn.nspname, co.collname)
                                                    FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                                                   WHERE co.oid = a.attcollation) ELSE '' END),
                                      ', ' ORDER BY a.attnum)
                      FROM pg_attribute a WHERE a.attrelid = v_view AND a.attnum > 0 AND NOT a.attisdropped));
    v_relid := format('%I.%I', v_schema, v_name)::regclass;
    EXECUTE format('ALTER TABLE %I.%I ADD COLUMN __pgt_row_id bigint', v_schema, v_name);
    EXECUTE format('COMMENT ON TABLE %I.%I IS %L', v_schema, v_name,
                   'pgtrickle stream table; its contents are maintained by pgtrickle');
    -- The table stays pgtrickle's (whoever owns a table can make writes into it run their code -
    -- triggers, rules, index expressions - and the daemon writes it with its own rights). The
    -- creator reads it and decides who else may: reading follows ordinary grants.
    IF v_caller <> v_definer THEN
        EXECUTE format('GRANT SELECT ON %I.%I TO %I WITH GRANT OPTION', v_schema, v_name, v_caller);
    END IF;

    INSERT INTO pgtrickle.pgt_stream_tables
        (pgt_id, pgt_relid, pgt_schema, pgt_name, def_view, defining_query, normalized_query,
         schedule, refresh_mode, created_by, reads_clock)
    VALUES (v_id, v_relid, v_schema, v_name, v_view, query, v_norm, v_schedule, v_mode, v_caller,
            pgtrickle._reads_clock(v_view));

    PERFORM pgtrickle._ensure_capture(v_relid, 'STREAM_TABLE', '{}');
    FOR dep IN
        SELECT d.refobjid AS relid,
               coalesce(array_agg(DISTINCT a.attname::text) FILTER (WHERE a.attname IS NOT NULL), '{}') AS cols,
               EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = d.refobjid) AS is_st
          FROM pg_catalog.pg_rewrite r
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
                                     AND d.refclassid = 'pg_catalog.pg_class'::regclass
          LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                             AND d.refobjsubid > 0
         WHERE r.ev_class = v_view AND d.refobjid <> v_view
         GROUP BY d.refobjid
    LOOP
        PERFORM pgtrickle._ensure_capture(dep.relid, CASE WHEN dep.is_st THEN 'STREAM_TABLE' ELSE 'TABLE' END,
                                          dep.cols);
        INSERT INTO pgtrickle.pgt_dependencies (pgt_id, source_relid, columns_used)
        VALUES (v_id, dep.relid, dep.cols);
    END LOOP;

    IF initialize THEN
        INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind) VALUES (v_id, 'INITIALIZE');
        PERFORM pg_notify('pgtrickle_refresh', v_id::text);
    END IF;
END
$$;


DROP FUNCTION IF EXISTS pgtrickle.alter_stream_table(text, text, text, text, text, bigint, double precision,
                                                       double precision, integer, text);
DROP FUNCTION IF EXISTS pgtrickle.alter_stream_table(text, text, text, text, text, bigint, double precision,
                                                       double precision, integer, text, double precision);
DROP FUNCTION IF EXISTS pgtrickle.alter_stream_table(text, text, text, text, text, bigint, double precision,
                                                       double precision, integer, text, double precision, text);
DROP FUNCTION IF EXISTS pgtrickle._api_alter_stream_table(text, text, text, text, text, bigint, double precision,
                                                            double precision, integer, text, double precision, text, text);
CREATE OR REPLACE FUNCTION pgtrickle._api_alter_stream_table(name text, schedule text, refresh_mode text, status text, circuit_breaker text, circuit_breaker_ceiling bigint, circuit_breaker_max_ratio double precision, circuit_breaker_sensitivity double precision, circuit_breaker_window integer, circuit_breaker_baseline text, differential_fallback_ratio double precision, watermark_gating text, diamond_consistency text, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_status text;
    v_cb text;
    v_wm text;
    v_dc text;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'alter');
    SELECT * INTO st FROM pgtrickle.pgt_stream_tables WHERE pgt_id = st.pgt_id FOR UPDATE;
    IF schedule IS NOT NULL THEN
        UPDATE pgtrickle.pgt_stream_tables SET schedule = pgtrickle._validate_schedule(schedule), updated_at = now()
         WHERE pgt_id = st.pgt_id;
    END IF;
    IF refresh_mode IS NOT NULL THEN
        v_dc := pgtrickle._query_refusal(st.def_view, pgtrickle._validate_refresh_mode(refresh_mode));
        IF v_dc IS NOT NULL THEN
            RAISE EXCEPTION 'stream table % cannot be altered: %', pgtrickle._display_name(st.pgt_schema, st.pgt_name),
                v_dc USING ERRCODE = 'feature_not_supported', HINT = 'Use refresh_mode => ''AUTO'' or ''FULL''.';
        END IF;
        v_dc := NULL;
        UPDATE pgtrickle.pgt_stream_tables SET refresh_mode = pgtrickle._validate_refresh_mode(refresh_mode),
               updated_at = now()
         WHERE pgt_id = st.pgt_id;
    END IF;
    IF status IS NOT NULL THEN
        v_status := upper(btrim(status));
        IF v_status NOT IN ('ACTIVE', 'SUSPENDED') THEN
            RAISE EXCEPTION 'invalid status %', quote_literal(left(status, 80))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set ''SUSPENDED'' to pause refreshes and ''ACTIVE'' to resume them.';
        END IF;
        UPDATE pgtrickle.pgt_stream_tables s
           SET status = CASE WHEN v_status = 'ACTIVE' AND s.frontier IS NULL THEN 'INITIALIZING' ELSE v_status END,
               consecutive_errors = CASE WHEN v_status = 'ACTIVE' THEN 0 ELSE s.consecutive_errors END,
               updated_at = now()
         WHERE pgt_id = st.pgt_id;
    END IF;
    IF circuit_breaker IS NOT NULL THEN
        v_cb := lower(btrim(circuit_breaker));
        IF v_cb NOT IN ('none', 'fixed', 'adaptive', 'default') THEN
            RAISE EXCEPTION 'invalid circuit_breaker %', quote_literal(left(circuit_breaker, 80))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use ''none'', ''fixed'', ''adaptive'', or ''default'' (the circuit_breaker_default setting).';
        END IF;
    END IF;
    PERFORM pgtrickle._check_bound('circuit_breaker_ceiling', circuit_breaker_ceiling, 1, 1000000000000000,
                                   'pending changes');
    IF circuit_breaker_max_ratio IS NOT NULL
       AND NOT (circuit_breaker_max_ratio > 0 AND circuit_breaker_max_ratio <= 1000) THEN
        RAISE EXCEPTION 'circuit_breaker_max_ratio must be above 0 and at most 1000 (changes per source row), got %',
            circuit_breaker_max_ratio USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF circuit_breaker_sensitivity IS NOT NULL
       AND NOT (circuit_breaker_sensitivity > 0 AND circuit_breaker_sensitivity <= 100) THEN
        RAISE EXCEPTION 'circuit_breaker_sensitivity must be above 0 and at most 100 (standard deviations), got %',
            circuit_breaker_sensitivity USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF circuit_breaker_window IS NOT NULL AND NOT (circuit_breaker_window BETWEEN 2 AND 10000) THEN
        RAISE EXCEPTION 'circuit_breaker_window must be between 2 and 10000 refreshes, got %', circuit_breaker_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF circuit_breaker_baseline IS NOT NULL AND lower(btrim(circuit_breaker_baseline)) NOT IN ('window', 'ewma') THEN
        RAISE EXCEPTION 'invalid circuit_breaker_baseline %', quote_literal(left(circuit_breaker_baseline, 80))
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''window'' or ''ewma''.';
    END IF;
    IF differential_fallback_ratio IS NOT NULL
       AND NOT (differential_fallback_ratio > 0 AND differential_fallback_ratio <= 1) THEN
        RAISE EXCEPTION 'differential_fallback_ratio must be above 0 and at most 1 (pending changes per source row), got %',
            differential_fallback_ratio USING ERRCODE = 'invalid_parameter_value',
            HINT = 'A DIFFERENTIAL refresh whose changes exceed this fraction of its sources'' rows runs FULL instead.';
    END IF;
    IF watermark_gating IS NOT NULL THEN
        v_wm := lower(btrim(watermark_gating));
        IF v_wm NOT IN ('none', 'gate', 'hold_back', 'inferred') THEN
            RAISE EXCEPTION 'invalid watermark_gating %', quote_literal(left(watermark_gating, 80))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use ''none'', ''gate'', ''hold_back'', or ''inferred'' (gate when the stream table depends on two or more sources of one watermark group).';
        END IF;
    END IF;
    IF diamond_consistency IS NOT NULL THEN
        v_dc := lower(btrim(diamond_consistency));
        IF v_dc NOT IN ('atomic', 'none') THEN
            RAISE EXCEPTION 'invalid diamond_consistency %', quote_literal(left(diamond_consistency, 80))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use ''atomic'' (a diamond ending here refreshes as one group) or ''none''.';
        END IF;
    END IF;
    UPDATE pgtrickle.pgt_stream_tables s
       SET diff_fallback_ratio = coalesce(differential_fallback_ratio, s.diff_fallback_ratio),
           watermark_gating = coalesce(v_wm, s.watermark_gating),
           diamond_consistency = coalesce(v_dc, s.diamond_consistency),
           cb_mode = coalesce(v_cb, s.cb_mode),
           cb_ceiling = coalesce(circuit_breaker_ceiling, s.cb_ceiling),
           cb_max_ratio = coalesce(circuit_breaker_max_ratio, s.cb_max_ratio),
           cb_sensitivity = coalesce(circuit_breaker_sensitivity, s.cb_sensitivity),
           cb_window = coalesce(circuit_breaker_window, s.cb_window),
           cb_baseline = coalesce(lower(btrim(circuit_breaker_baseline)), s.cb_baseline),
           updated_at = now()
     WHERE pgt_id = st.pgt_id
    RETURNING * INTO st;
    IF pgtrickle._cb_mode(st.cb_mode) = 'fixed' AND st.cb_ceiling IS NULL AND st.cb_max_ratio IS NULL THEN
        RAISE EXCEPTION 'a fixed circuit breaker needs circuit_breaker_ceiling or circuit_breaker_max_ratio'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_notify('pgtrickle_refresh', st.pgt_id::text);
END
$$;

-- The hidden state tables of a stream table (migration 019), dropped with it or when its
-- query no longer keeps them (the refresh engine, refresh/state_tables.py).
CREATE OR REPLACE FUNCTION pgtrickle._drop_state_tables(p_id bigint, p_keep oid[] DEFAULT '{}')
RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    r record;
    n integer := 0;
BEGIN
    FOR r IN DELETE FROM pgtrickle.pgt_state_tables
              WHERE pgt_id = p_id AND NOT relid = ANY (p_keep) RETURNING relid LOOP
        IF EXISTS (SELECT 1 FROM pg_class WHERE oid = r.relid) THEN
            EXECUTE format('DROP TABLE %s', r.relid::regclass);
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._drop_one(p_id bigint)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_sources oid[];
    s oid;
BEGIN
    SELECT * INTO st FROM pgtrickle.pgt_stream_tables WHERE pgt_id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(source_relid), '{}') INTO v_sources
      FROM pgtrickle.pgt_dependencies WHERE pgt_id = p_id;
    PERFORM pgtrickle._drop_state_tables(p_id);
    DELETE FROM pgtrickle.pgt_stream_tables WHERE pgt_id = p_id;
    EXECUTE format('DROP VIEW IF EXISTS pgtrickle.%I', 'pgt_def_' || p_id);
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = st.pgt_relid) THEN
        EXECUTE format('DROP TABLE %s', st.pgt_relid::regclass);
    END IF;
    EXECUTE format('DROP TABLE IF EXISTS pgtrickle_changes.%I', 'stage_' || p_id);
    PERFORM pgtrickle._drop_capture_if_unused(st.pgt_relid);
    FOREACH s IN ARRAY v_sources LOOP
        PERFORM pgtrickle._drop_capture_if_unused(s);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_drop_stream_table(name text, cascade boolean, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_dependents text;
    v_id bigint;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'drop');
    IF cascade IS NULL THEN
        RAISE EXCEPTION 'cascade must be true or false, not NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT string_agg(pgtrickle._display_name(s.pgt_schema, s.pgt_name), ', ' ORDER BY s.pgt_id) INTO v_dependents
      FROM pgtrickle.pgt_dependencies d JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)
     WHERE d.source_relid = st.pgt_relid;
    IF v_dependents IS NOT NULL AND NOT cascade THEN
        RAISE EXCEPTION 'cannot drop stream table % because other stream tables depend on it: %',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name), v_dependents
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = 'Use pgtrickle.drop_stream_table(name, cascade => true) to drop them too.';
    END IF;
    -- Downstream first, deepest first. (As with DROP TABLE ... CASCADE, the owner of a
    -- stream table may drop the stream tables built on it, whoever owns them.)
    FOR v_id IN
        WITH RECURSIVE down(pgt_id, depth) AS (
            SELECT st.pgt_id, 0
            UNION
            SELECT d.pgt_id, down.depth + 1
              FROM down JOIN pgtrickle.pgt_stream_tables u ON u.pgt_id = down.pgt_id
              JOIN pgtrickle.pgt_dependencies d ON d.source_relid = u.pgt_relid
             WHERE down.depth < 1000
        )
        SELECT pgt_id FROM down GROUP BY pgt_id ORDER BY max(depth) DESC, pgt_id
    LOOP
        PERFORM pgtrickle._drop_one(v_id);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._api_refresh_stream_table(name text, force boolean, caller_path text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_gate text;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    PERFORM pgtrickle._require_owner(st, 'refresh');
    IF force IS NULL THEN
        RAISE EXCEPTION 'force must be true or false, not NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF st.cb_state = 'open' AND NOT force THEN
        RAISE EXCEPTION 'the circuit breaker of stream table % is open: %',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name), st.cb_trip_reason
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Inspect with pgtrickle.inspect_circuit_breaker(name), then pgtrickle.reset_circuit_breaker(name, action => ...), or refresh anyway with force => true.';
    END IF;
    v_gate := pgtrickle._watermark_gate_reason(st.pgt_id);
    IF v_gate IS NOT NULL AND NOT force THEN
        RAISE EXCEPTION 'stream table % is held back by watermark gating (%)',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name), v_gate
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'SELECT * FROM pgtrickle.watermark_status() shows which source lags; refresh anyway with force => true.';
    END IF;
    IF st.status IN ('SUSPENDED', 'ERROR') THEN
        RAISE NOTICE 'stream table % is %: it is refreshed once, as asked, and not automatically until pgtrickle.resume_stream_table(%)',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name), st.status,
            quote_literal(pgtrickle._display_name(st.pgt_schema, st.pgt_name));
    END IF;
    INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind, force) VALUES (st.pgt_id, 'REFRESH', force);
    PERFORM pg_notify('pgtrickle_refresh', st.pgt_id::text);
END
$$;


CREATE OR REPLACE FUNCTION pgtrickle._cb_mode(p_mode text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT CASE WHEN p_mode = 'default' THEN coalesce(pgtrickle._setting('circuit_breaker_default'), 'none')
                ELSE p_mode END
$$;

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

DROP VIEW IF EXISTS pgtrickle.stream_tables_info;
CREATE VIEW pgtrickle.stream_tables_info AS
SELECT s.pgt_id,
       pgtrickle._display_name(s.pgt_schema, s.pgt_name) AS name,
       s.pgt_schema AS schema_name,
       s.pgt_name AS table_name,
       s.status,
       s.refresh_mode,
       CASE WHEN s.refresh_mode = 'FULL' THEN 'FULL'
            ELSE coalesce(s.mode_effective, s.refresh_mode) END AS effective_mode,
       s.mode_reason,
       s.schedule,
       s.needs_reinit,
       s.last_refresh_at,
       s.data_timestamp,
       now() - s.data_timestamp AS staleness,
       s.frontier,
       s.consecutive_errors,
       s.last_error,
       (SELECT count(*) FROM pgtrickle.pgt_refresh_requests r WHERE r.pgt_id = s.pgt_id) AS pending_requests,
       s.defining_query,
       s.created_at,
       pgtrickle._cb_mode(s.cb_mode) AS circuit_breaker,
       s.cb_state AS circuit_breaker_state,
       wm.mode AS watermark_gating,
       wm.origin AS watermark_gating_origin,
       coalesce((SELECT array_agg(g.group_name ORDER BY g.group_name) FROM pgtrickle.pgt_watermark_groups g
                  WHERE EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_group_sources m
                                 WHERE m.group_id = g.group_id
                                   AND m.source_relid IN (SELECT pgtrickle._base_sources(s.pgt_id)))),
                '{}') AS watermark_groups,
       s.effective_watermark,
       pgtrickle._watermark_gate_reason(s.pgt_id) AS watermark_gate
  FROM pgtrickle.pgt_stream_tables s
  CROSS JOIN LATERAL pgtrickle._watermark_mode(s.pgt_id) wm;

CREATE OR REPLACE FUNCTION pgtrickle._api_get_refresh_history(name text, max_rows integer, caller_path text)
RETURNS TABLE (refresh_id bigint, action text, status text, initiated_by text,
               rows_inserted bigint, rows_deleted bigint, delta_row_count bigint,
               start_time timestamptz, end_time timestamptz, duration interval,
               was_full_fallback boolean, mode_reason text, skip_reason text, error_message text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
BEGIN
    st := pgtrickle._find_st(name, caller_path);
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 1000000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 1000000, got %', coalesce(max_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT h.refresh_id, h.action, h.status, h.initiated_by, h.rows_inserted, h.rows_deleted,
               h.delta_row_count, h.start_time, h.end_time, h.end_time - h.start_time,
               h.was_full_fallback, h.mode_reason, h.skip_reason, h.error_message
          FROM pgtrickle.pgt_refresh_history h
         WHERE h.pgt_id = st.pgt_id
         ORDER BY h.refresh_id DESC
         LIMIT max_rows;
END
$$;

-- ------------------------------------------------------------ DDL tracking

-- (The DDL tracking functions run as pgtrickle's owner: the role whose DDL fires them -
-- the owner of a source, say - has no rights on the catalog. They act only on the
-- objects the DDL command itself dropped or altered.)
-- A stream table's storage dropped by hand: forget it. A defining view
-- dropped by CASCADE from a source: the stream table is in error.
CREATE OR REPLACE FUNCTION pgtrickle._on_sql_drop()
RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    obj record;
    st pgtrickle.pgt_stream_tables;
BEGIN
    -- A partition or inheritance child dropped with its rows (capture_hierarchy.sql).
    PERFORM pgtrickle._follow_member_drops();
    FOR obj IN SELECT * FROM pg_event_trigger_dropped_objects()
                WHERE classid = 'pg_catalog.pg_class'::regclass AND objsubid = 0 LOOP
        FOR st IN SELECT * FROM pgtrickle.pgt_stream_tables WHERE pgt_relid = obj.objid LOOP
            PERFORM pgtrickle._drop_one(st.pgt_id);
        END LOOP;
        UPDATE pgtrickle.pgt_stream_tables
           SET status = 'ERROR', needs_reinit = true, updated_at = now(),
               last_error = format('a source of this stream table was dropped (%s); drop and re-create the stream table',
                                   obj.object_identity)
         WHERE def_view = obj.objid;
        IF EXISTS (SELECT 1 FROM pgtrickle.pgt_change_sources WHERE source_relid = obj.objid) THEN
            DELETE FROM pgtrickle.pgt_dependencies WHERE source_relid = obj.objid;
            PERFORM pgtrickle._drop_capture_if_unused(obj.objid);
        END IF;
        -- A dropped table has no watermark any more and leaves its watermark groups.
        DELETE FROM pgtrickle.pgt_watermark_group_sources WHERE source_relid = obj.objid;
        DELETE FROM pgtrickle.pgt_watermarks WHERE source_relid = obj.objid;
        DELETE FROM pgtrickle.pgt_watermark_history WHERE source_relid = obj.objid;
    END LOOP;
END
$$;

-- Source columns renamed or retyped: regenerate the capture function with the new
-- names, follow type changes in the buffer. (The WAL decoder re-reads the
-- captured columns when PostgreSQL sends the relation's new description.)
CREATE OR REPLACE FUNCTION pgtrickle._on_ddl_end()
RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    cmd record;
    col record;
    src pgtrickle.pgt_change_sources;
    v_cols jsonb;
BEGIN
    -- Partitions and inheritance children created, attached, detached (capture_hierarchy.sql).
    IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()
                WHERE command_tag IN ('CREATE TABLE', 'ALTER TABLE')
                  AND classid = 'pg_catalog.pg_class'::regclass
                  AND schema_name NOT IN ('pgtrickle', 'pgtrickle_changes')) THEN
        PERFORM pgtrickle._follow_hierarchy_ddl();
    END IF;
    FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands()
                WHERE command_tag = 'ALTER TABLE' AND classid = 'pg_catalog.pg_class'::regclass LOOP
        SELECT * INTO src FROM pgtrickle.pgt_change_sources
         WHERE source_relid = cmd.objid AND source_kind = 'TABLE';
        CONTINUE WHEN NOT FOUND;
        SELECT coalesce(jsonb_agg(jsonb_build_object('attnum', a.attnum, 'name', a.attname,
                                                     'type', format_type(a.atttypid, a.atttypmod),
                                                     'buf', c->>'buf',
                                                     -- earlier names, for WAL changes decoded after a rename
                                                     'former', CASE WHEN c->>'name' <> a.attname::text
                                                         THEN coalesce(c->'former', '[]') || to_jsonb(c->>'name')
                                                         ELSE coalesce(c->'former', '[]') END)
                                  ORDER BY a.attnum), '[]')
          INTO v_cols
          FROM jsonb_array_elements(src.columns) c
          JOIN pg_attribute a ON a.attrelid = src.source_relid AND a.attnum = (c->>'attnum')::int
         WHERE NOT a.attisdropped;
        -- A captured column whose type changed: the buffer column follows, and the stream
        -- tables reading the source are recomputed (pending buffer values of that column
        -- cannot be converted reliably).
        FOR col IN
            SELECT c->>'buf' AS buf, pgtrickle._storage_type(a.atttypid, a.atttypmod) AS new_type, a.atttypid AS typid
              FROM jsonb_array_elements(src.columns) c
              JOIN pg_attribute a ON a.attrelid = src.source_relid AND a.attnum = (c->>'attnum')::int
             WHERE NOT a.attisdropped AND format_type(a.atttypid, a.atttypmod) <> c->>'type'
        LOOP
            EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', src.buffer_name);
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING NULL, '
                           'ALTER COLUMN %I TYPE %s USING NULL', pgtrickle._buffer_part(src.buffer_name, 'rows'),
                           'new_' || col.buf, col.new_type, 'old_' || col.buf, col.new_type);
            -- Packed values of the column become NULL too.
            EXECUTE format('ALTER TABLE %s DROP COLUMN %I', pgtrickle._buffer_part(src.buffer_name, 'batches'),
                           'v_' || col.buf);
            PERFORM pgtrickle._add_batch_column(src.buffer_name, col.buf, col.typid);
            UPDATE pgtrickle.pgt_stream_tables s SET needs_reinit = true
              FROM pgtrickle.pgt_dependencies d
             WHERE d.pgt_id = s.pgt_id AND d.source_relid = src.source_relid;
        END LOOP;
        UPDATE pgtrickle.pgt_change_sources
           SET columns = v_cols,
               key_columns = coalesce((SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum))
                                         FROM pg_index i JOIN pg_attribute a
                                           ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                                        WHERE i.indrelid = src.source_relid AND i.indisprimary), '{}')
         WHERE source_relid = src.source_relid;
        PERFORM pgtrickle._build_buffer_view(src.source_relid);
        IF src.cdc_mode = 'trigger' THEN
            PERFORM pgtrickle._build_capture(src.source_relid);
        END IF;
    END LOOP;
END
$$;

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

-- ----------------------------------------------------------- refresh groups
-- (public entry points create_refresh_group / drop_refresh_group at the end of this file)
DROP FUNCTION IF EXISTS pgtrickle.create_refresh_group(text, text[]);
DROP FUNCTION IF EXISTS pgtrickle.drop_refresh_group(text);

CREATE OR REPLACE FUNCTION pgtrickle._api_create_refresh_group(name text, members text[], caller_path text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_name text := btrim(name);
    v_group bigint;
    v_ids bigint[] := '{}';
    v_member text;
    st pgtrickle.pgt_stream_tables;
BEGIN
    IF v_name IS NULL OR v_name = '' THEN
        RAISE EXCEPTION 'a refresh group needs a name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(v_name) > 63 THEN
        RAISE EXCEPTION 'refresh group name % is longer than 63 characters', quote_literal(left(v_name, 80))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF members IS NULL OR cardinality(members) < 2 THEN
        RAISE EXCEPTION 'a refresh group needs at least two member stream tables, got %',
            coalesce(cardinality(members), 0)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Example: pgtrickle.create_refresh_group(''reports'', ARRAY[''by_day'', ''by_region'']).';
    END IF;
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_refresh_groups g WHERE g.group_name = v_name) THEN
        RAISE EXCEPTION 'refresh group % already exists', quote_literal(v_name)
            USING ERRCODE = 'duplicate_object', HINT = 'Drop it first with pgtrickle.drop_refresh_group.';
    END IF;
    FOREACH v_member IN ARRAY members LOOP
        IF v_member IS NULL THEN
            RAISE EXCEPTION 'refresh group members cannot be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        st := pgtrickle._find_st(v_member, caller_path);
        -- Grouping changes how a stream table is refreshed: its owner's (or an admin's) decision.
        PERFORM pgtrickle._require_owner(st, 'group');
        IF st.pgt_id = ANY (v_ids) THEN
            RAISE EXCEPTION 'stream table % is listed twice', pgtrickle._display_name(st.pgt_schema, st.pgt_name)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_ids := v_ids || st.pgt_id;
    END LOOP;
    INSERT INTO pgtrickle.pgt_refresh_groups (group_name) VALUES (v_name) RETURNING group_id INTO v_group;
    INSERT INTO pgtrickle.pgt_refresh_group_members (group_id, pgt_id) SELECT v_group, unnest(v_ids);
    PERFORM pg_notify('pgtrickle_refresh', v_ids[1]::text);
    RETURN v_group;
END
$$;

COMMENT ON FUNCTION pgtrickle._api_create_refresh_group(text, text[], text) IS
'Make stream tables refresh as one atomic group: one snapshot, one transaction, all or none.';

CREATE OR REPLACE FUNCTION pgtrickle._api_drop_refresh_group(name text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    st pgtrickle.pgt_stream_tables;
BEGIN
    FOR st IN SELECT s.* FROM pgtrickle.pgt_stream_tables s
                JOIN pgtrickle.pgt_refresh_group_members m USING (pgt_id)
                JOIN pgtrickle.pgt_refresh_groups g USING (group_id)
               WHERE g.group_name = btrim(name) ORDER BY s.pgt_id LOOP
        PERFORM pgtrickle._require_owner(st, 'ungroup');
    END LOOP;
    DELETE FROM pgtrickle.pgt_refresh_groups g WHERE g.group_name = btrim(name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'refresh group % does not exist', coalesce(quote_literal(name), 'NULL')
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT * FROM pgtrickle.refresh_groups lists them.';
    END IF;
END
$$;

COMMENT ON FUNCTION pgtrickle._api_drop_refresh_group(text) IS
'Drop an explicit refresh group (its members refresh on their own again; diamonds stay atomic).';

CREATE OR REPLACE VIEW pgtrickle.refresh_groups AS
SELECT g.group_name,
       array_agg(pgtrickle._display_name(s.pgt_schema, s.pgt_name) ORDER BY s.pgt_id) AS members,
       g.created_at, g.created_by
  FROM pgtrickle.pgt_refresh_groups g
  JOIN pgtrickle.pgt_refresh_group_members m USING (group_id)
  JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)
 GROUP BY g.group_id, g.group_name, g.created_at, g.created_by;

COMMENT ON VIEW pgtrickle.refresh_groups IS
'Explicit refresh groups and their members (diamonds are grouped automatically and shown by pgtrickle status).';

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
    v_check refcursor;
    v_state text;
    v_msg text;
    v_detail text;
    v_hint text;
BEGIN
    IF query IS NULL OR btrim(query) = '' THEN
        RAISE EXCEPTION 'query must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgtrickle._check_query_text(query, '(candidate)');
    v_query := regexp_replace(query, ';\s*$', '');
    BEGIN
        PERFORM pg_catalog.set_config('search_path', coalesce(caller_path, ''), true);
        OPEN v_check FOR EXECUTE 'EXPLAIN ' || v_query;
        CLOSE v_check;
        EXECUTE pg_catalog.format('CREATE TEMPORARY VIEW %I AS %s', v_view, v_query);
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
    EXCEPTION WHEN others THEN
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT,
                                v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        IF v_state = '42P11' THEN
            RAISE EXCEPTION 'a defining query must be a single SELECT statement'
                USING ERRCODE = 'syntax_error', DETAIL = 'The query text contains more than one statement.';
        END IF;
        RAISE EXCEPTION 'invalid defining query: %', v_msg
            USING ERRCODE = v_state, DETAIL = coalesce(v_detail, ''), HINT = coalesce(v_hint, '');
    END;
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
               was_full_fallback boolean, mode_reason text, skip_reason text, error_message text) LANGUAGE sql
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
'Ask the pgtrickle daemon to refresh a stream table now (force => true passes an open circuit breaker and a closed watermark gate). Runs when the calling transaction commits; `pgtrickle refresh NAME` refreshes synchronously.';

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

-- ------------------------------------------------------- buffer upgrade
-- Buffers from before migration 11 have only their rows table: give them their
-- batches table and view, and regenerate their capture triggers. (Only in the install
-- that applies migration 11: later, a buffer in that shape had its batches table and
-- view dropped by hand, and pending changes with them - pgtrickle._repair_capture,
-- run by install after this, recreates them and reinitializes its stream tables.)
DO $$
DECLARE
    src pgtrickle.pgt_change_sources;
    col record;
BEGIN
    FOR src IN SELECT * FROM pgtrickle.pgt_change_sources
                WHERE EXISTS (SELECT 1 FROM pgtrickle.pgt_schema_version WHERE version = 11 AND applied_at = now())
                  AND to_regclass(format('pgtrickle_changes.%I', buffer_name)) IS NULL
                  AND to_regclass(format('pgtrickle_changes.%I', buffer_name || '_rows')) IS NOT NULL LOOP
        IF src.source_kind = 'TABLE' THEN
            PERFORM pgtrickle._create_buffer_batches(src.buffer_name);
            FOR col IN SELECT c->>'buf' AS buf, coalesce(a.atttypid, 'text'::regtype) AS typid
                         FROM jsonb_array_elements(src.columns) c
                         LEFT JOIN pg_attribute a
                           ON a.attrelid = src.source_relid AND a.attnum = (c->>'attnum')::int LOOP
                PERFORM pgtrickle._add_batch_column(src.buffer_name, col.buf, col.typid);
            END LOOP;
        END IF;
        PERFORM pgtrickle._build_buffer_view(src.source_relid);
        IF src.source_kind = 'TABLE' AND src.cdc_mode = 'trigger'
           AND EXISTS (SELECT 1 FROM pg_class WHERE oid = src.source_relid) THEN
            PERFORM pgtrickle._build_capture(src.source_relid);
        END IF;
    END LOOP;
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

-- ------------------------------------------------------------------- grants
-- (The view is re-created above on every install, so its grant is given here.)
GRANT SELECT ON pgtrickle.stream_tables_info TO pgtrickle_user;

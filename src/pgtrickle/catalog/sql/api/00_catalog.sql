-- pgtrickle SQL API, catalog: settings, privileges, names, defining-query introspection.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

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
-- defining query), through the public entry points (90_entry_points.sql).

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
-- is refused in every mode, what has no delta rule is refused for 'DIFFERENTIAL' (the delta engine's
-- lowering, dvm/lower*.py, refuses the same from the query text: tests/integration/test_query_regressions.py
-- holds both to it).
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

-- pgtrickle SQL API, stream tables: create, alter, drop, refresh, stream_tables_info.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

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
-- PostgreSQL's own parser decides it now (_create_query_view opens a cursor on
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

-- create_stream_table, step 1: where the stream table goes must be free, and the caller allowed
-- to create a table there.
CREATE OR REPLACE FUNCTION pgtrickle._check_st_target(p_schema text, p_name text, p_display text, p_caller name)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = p_schema) THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(p_schema) USING ERRCODE = 'invalid_schema_name';
    END IF;
    IF p_schema IN ('pgtrickle', 'pgtrickle_changes', 'pg_catalog', 'information_schema') THEN
        RAISE EXCEPTION 'stream tables cannot be created in schema %', quote_ident(p_schema)
            USING ERRCODE = 'invalid_schema_name';
    END IF;
    -- The stream table is created by pgtrickle's owner: the caller must be allowed to create it themselves.
    IF NOT has_schema_privilege(p_caller, (SELECT oid FROM pg_namespace WHERE nspname = p_schema), 'CREATE') THEN
        RAISE EXCEPTION 'permission denied: role % may not create tables in schema %', quote_ident(p_caller),
            quote_ident(p_schema)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('GRANT CREATE ON SCHEMA %I TO %I; or create the stream table in a schema of your own.',
                                p_schema, p_caller);
    END IF;
    IF EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables WHERE pgt_schema = p_schema AND pgt_name = p_name) THEN
        RAISE EXCEPTION 'stream table % already exists', p_display USING ERRCODE = 'duplicate_object',
            HINT = 'Drop it first with pgtrickle.drop_stream_table, or choose another name.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = p_schema AND c.relname = p_name) THEN
        RAISE EXCEPTION 'relation % already exists', p_display USING ERRCODE = 'duplicate_table';
    END IF;
END
$$;

-- Parse a defining query in the caller's search_path (p_path) by creating a view of it: p_view
-- says which (a qualified view, or TEMPORARY VIEW <name>). PostgreSQL's errors come back as
-- errors of the defining query, naming the stream table p_display when there is one (then a
-- query reading p_schema.p_name, the stream table itself, is refused as recursive).
CREATE OR REPLACE FUNCTION pgtrickle._create_query_view(p_view text, p_query text, p_path text,
                                                       p_display text, p_schema text, p_name text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_check refcursor;
    v_state text;
    v_msg text;
    v_detail text;
    v_hint text;
    v_of text := coalesce(' of stream table ' || p_display, '');
BEGIN
    -- The defining query means what it means to the caller: parse it in the caller's search_path.
    PERFORM pg_catalog.set_config('search_path', coalesce(p_path, ''), true);
    -- One statement, decided by PostgreSQL's parser in linear time: a cursor opens on exactly
    -- one statement, and every statement of the text is parsed (nothing runs, nothing is
    -- planned: EXPLAIN would run only when fetched) before a second one is refused (42P11).
    OPEN v_check FOR EXECUTE 'EXPLAIN ' || p_query;
    CLOSE v_check;
    EXECUTE pg_catalog.format('CREATE %s AS %s', p_view, p_query);
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
EXCEPTION WHEN others THEN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pgtrickle, pg_temp', true);
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    IF v_state = '42P01' AND p_display IS NOT NULL
       AND (v_msg = format('relation "%s" does not exist', p_name)
            OR v_msg = format('relation "%s.%s" does not exist', p_schema, p_name)) THEN
        RAISE EXCEPTION 'stream table % cannot be defined in terms of itself', p_display
            USING ERRCODE = 'invalid_recursion';
    END IF;
    IF v_state = '42P11' THEN
        RAISE EXCEPTION '%', CASE WHEN p_display IS NULL THEN 'a defining query must be a single SELECT statement'
                                  ELSE format('defining query%s must be a single SELECT statement', v_of) END
            USING ERRCODE = 'syntax_error',
                  DETAIL = 'The query text contains more than one statement.';
    END IF;
    IF v_state = '42601' AND p_display IS NOT NULL THEN
        v_hint := coalesce(v_hint, 'The defining query must be a single SELECT (or WITH ... SELECT, VALUES) query.');
    END IF;
    RAISE EXCEPTION 'invalid defining query%: %', CASE WHEN p_display IS NULL THEN '' ELSE ' for stream table ' || p_display END,
        v_msg USING ERRCODE = v_state, DETAIL = coalesce(v_detail, ''), HINT = coalesce(v_hint, '');
END
$$;

-- create_stream_table, step 3: what the defining view p_view reads - named columns, tables (or
-- stream tables) the caller may read and the daemon may store - and the functions it calls.
CREATE OR REPLACE FUNCTION pgtrickle._check_defining_view(p_view oid, p_display text, p_caller name,
                                                         p_definer name)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_bad record;
    dep record;
    v_fn record;
BEGIN
    FOR v_bad IN SELECT attnum, attname FROM pg_catalog.pg_attribute
                  WHERE attrelid = p_view AND attnum > 0 AND NOT attisdropped
                    AND (attname = '?column?' OR attname LIKE '\_\_pgt\_%') LOOP
        RAISE EXCEPTION 'column % of the defining query of % needs a name', v_bad.attnum, p_display
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
         WHERE r.ev_class = p_view AND d.refobjid <> p_view
         GROUP BY d.refobjid, c.relkind, n.nspname, c.relname
    LOOP
        IF dep.nspname IN ('pgtrickle', 'pgtrickle_changes') THEN
            RAISE EXCEPTION 'the defining query of % reads pgtrickle''s own table %.%', p_display,
                quote_ident(dep.nspname), quote_ident(dep.relname) USING ERRCODE = 'feature_not_supported';
        END IF;
        IF dep.relkind NOT IN ('r', 'p') THEN
            RAISE EXCEPTION 'source %.% of stream table % is a %, which is not supported', quote_ident(dep.nspname),
                quote_ident(dep.relname), p_display,
                CASE dep.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                 WHEN 'f' THEN 'foreign table' ELSE 'relation of kind ' || dep.relkind::text END
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Stream tables read tables and other stream tables. Inline the view''s query, or make it a stream table.';
        END IF;
        IF dep.relkind = 'r' AND (SELECT relpersistence FROM pg_class WHERE oid = dep.relid) = 't' THEN
            RAISE EXCEPTION 'source %.% of stream table % is a temporary table', quote_ident(dep.nspname),
                quote_ident(dep.relname), p_display USING ERRCODE = 'feature_not_supported';
        END IF;
        IF pgtrickle._rls_refusal(dep.relid, p_caller, p_display) IS NOT NULL THEN
            RAISE EXCEPTION '%', pgtrickle._rls_refusal(dep.relid, p_caller, p_display)
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Filter the rows the stream table may show in its query, or give the owner BYPASSRLS.';
        END IF;
        PERFORM pgtrickle._check_storable(dep.relid, dep.cols,
                                          format('source %s of stream table %s:', dep.relid::regclass, p_display));
        -- The daemon fills the table with its own rights: the caller must be allowed to read what it shows.
        IF NOT pgtrickle._caller_may_read(p_caller, dep.relid, p_view) THEN
            RAISE EXCEPTION 'permission denied: role % may not read %.%, which the defining query of % reads',
                p_caller, quote_ident(dep.nspname), quote_ident(dep.relname), p_display
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('A stream table shows what its query reads. GRANT SELECT ON %I.%I TO %I first.',
                                    dep.nspname, dep.relname, p_caller);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
                    WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.ev_class = p_view
                      AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid <> p_view) THEN
        RAISE EXCEPTION 'the defining query of % reads no table', p_display
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
         WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND rw.ev_class = p_view
           AND d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass)
    LOOP
        IF v_fn.nspname <> 'pg_catalog' AND NOT v_fn.rolsuper AND v_fn.proowner <> (SELECT oid FROM pg_roles WHERE rolname = p_definer) THEN
            RAISE EXCEPTION 'the defining query of % calls %, which is owned by %: pgtrickle runs defining queries with its own rights, so they may call only built-in functions and functions owned by a superuser',
                p_display, v_fn.fn, quote_ident((SELECT rolname FROM pg_roles WHERE oid = v_fn.proowner))
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Inline the function''s logic in the query, or have a superuser own the function (ALTER FUNCTION ... OWNER TO).';
        END IF;
        IF NOT has_function_privilege(p_caller, v_fn.oid, 'EXECUTE') THEN
            RAISE EXCEPTION 'permission denied: role % may not execute %, which the defining query of % calls',
                quote_ident(p_caller), v_fn.fn, p_display USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
END
$$;

-- create_stream_table, step 4: the stream table's own table, its columns in storage types, owned
-- by pgtrickle (p_definer) and readable by its creator (p_caller).
CREATE OR REPLACE FUNCTION pgtrickle._create_st_storage(p_schema text, p_name text, p_view oid, p_display text,
                                                       p_caller name, p_definer name)
RETURNS oid LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_relid oid;
BEGIN
    -- Columns in storage types: a domain is stored as its base type (writing a domain value
    -- would run its CHECK, code of the domain's owner, with the daemon's rights).
    PERFORM pgtrickle._check_storable(p_view, NULL, format('stream table %s:', p_display));
    -- Refreshes compare stored values (the apply): each column's type needs an equality they may run.
    PERFORM pgtrickle._equality_operator(a.atttypid, format('stream table %s: column %I has', p_display, a.attname))
       FROM pg_attribute a WHERE a.attrelid = p_view AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('CREATE TABLE %I.%I (%s)', p_schema, p_name,
                   (SELECT string_agg(format('%I %s%s', a.attname, pgtrickle._storage_type(a.atttypid, a.atttypmod),
                                             CASE WHEN a.attcollation <> 0 THEN
                                                 (SELECT format(' COLLATE %I.%I', cn.nspname, co.collname)
                                                    FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                                                   WHERE co.oid = a.attcollation) ELSE '' END),
                                      ', ' ORDER BY a.attnum)
                      FROM pg_attribute a WHERE a.attrelid = p_view AND a.attnum > 0 AND NOT a.attisdropped));
    v_relid := format('%I.%I', p_schema, p_name)::regclass;
    EXECUTE format('ALTER TABLE %I.%I ADD COLUMN __pgt_row_id bigint', p_schema, p_name);
    EXECUTE format('COMMENT ON TABLE %I.%I IS %L', p_schema, p_name,
                   'pgtrickle stream table; its contents are maintained by pgtrickle');
    -- The table stays pgtrickle's (whoever owns a table can make writes into it run their code -
    -- triggers, rules, index expressions - and the daemon writes it with its own rights). The
    -- creator reads it and decides who else may: reading follows ordinary grants.
    IF p_caller <> p_definer THEN
        EXECUTE format('GRANT SELECT ON %I.%I TO %I WITH GRANT OPTION', p_schema, p_name, p_caller);
    END IF;
    RETURN v_relid;
END
$$;

-- create_stream_table, step 5: capture every source the defining view reads, and record it.
CREATE OR REPLACE FUNCTION pgtrickle._record_sources(p_id bigint, p_view oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    dep record;
BEGIN
    FOR dep IN
        SELECT d.refobjid AS relid,
               coalesce(array_agg(DISTINCT a.attname::text) FILTER (WHERE a.attname IS NOT NULL), '{}') AS cols,
               EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = d.refobjid) AS is_st
          FROM pg_catalog.pg_rewrite r
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
                                     AND d.refclassid = 'pg_catalog.pg_class'::regclass
          LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                             AND d.refobjsubid > 0
         WHERE r.ev_class = p_view AND d.refobjid <> p_view
         GROUP BY d.refobjid
    LOOP
        PERFORM pgtrickle._ensure_capture(dep.relid, CASE WHEN dep.is_st THEN 'STREAM_TABLE' ELSE 'TABLE' END,
                                          dep.cols);
        INSERT INTO pgtrickle.pgt_dependencies (pgt_id, source_relid, columns_used)
        VALUES (p_id, dep.relid, dep.cols);
    END LOOP;
END
$$;

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
    v_view oid;
    v_relid oid;
    v_msg text;
    v_norm text;
    v_caller name := pgtrickle._require_user('create stream tables');
    v_definer name := current_user;
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
    PERFORM pgtrickle._check_st_target(v_schema, v_name, v_display, v_caller);
    PERFORM pgtrickle._check_query_text(query, v_display);
    v_query := regexp_replace(query, ';\s*$', '');

    v_id := nextval('pgtrickle.pgt_stream_tables_pgt_id_seq');
    PERFORM pgtrickle._create_query_view(format('VIEW pgtrickle.%I', 'pgt_def_' || v_id), v_query, caller_path,
                                         v_display, v_schema, v_name);
    v_view := format('pgtrickle.%I', 'pgt_def_' || v_id)::regclass;
    PERFORM pgtrickle._check_defining_view(v_view, v_display, v_caller, v_definer);

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

    v_relid := pgtrickle._create_st_storage(v_schema, v_name, v_view, v_display, v_caller, v_definer);

    INSERT INTO pgtrickle.pgt_stream_tables
        (pgt_id, pgt_relid, pgt_schema, pgt_name, def_view, defining_query, normalized_query,
         schedule, refresh_mode, created_by, reads_clock)
    VALUES (v_id, v_relid, v_schema, v_name, v_view, query, v_norm, v_schedule, v_mode, v_caller,
            pgtrickle._reads_clock(v_view));

    PERFORM pgtrickle._ensure_capture(v_relid, 'STREAM_TABLE', '{}');
    PERFORM pgtrickle._record_sources(v_id, v_view);

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

-- The hidden state tables of a stream table (migration 020), dropped with it or when its
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
    IF NOT EXISTS (SELECT FROM pgtrickle._serving_daemons()) THEN
        RAISE NOTICE 'no pgtrickle daemon is running on this database: stream table % is refreshed when one starts',
            pgtrickle._display_name(st.pgt_schema, st.pgt_name)
            USING HINT = 'Start one with `pgtrickle run`, or refresh now with `pgtrickle refresh NAME`.';
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION pgtrickle._cb_mode(p_mode text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT CASE WHEN p_mode = 'default' THEN coalesce(pgtrickle._setting('circuit_breaker_default'), 'none')
                ELSE p_mode END
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
               was_full_fallback boolean, mode_reason text, skip_reason text, error_message text,
               spark_jobs integer, spark_stages integer, spark_jobs_why text)
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
               h.was_full_fallback, h.mode_reason, h.skip_reason, h.error_message,
               h.spark_jobs, h.spark_stages, h.spark_jobs_why
          FROM pgtrickle.pgt_refresh_history h
         WHERE h.pgt_id = st.pgt_id
         ORDER BY h.refresh_id DESC
         LIMIT max_rows;
END
$$;

-- ------------------------------------------------------------------- grants
-- (The view is re-created on every install, so its grant is given here.)
GRANT SELECT ON pgtrickle.stream_tables_info TO pgtrickle_user;

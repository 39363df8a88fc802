-- pgtrickle SQL API, change capture: change buffers and capture triggers.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- ------------------------------------------------------------ change capture

CREATE OR REPLACE FUNCTION pgtrickle._buffer_column(p_attname text, p_attnum int)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN octet_length(p_attname) <= 56 THEN p_attname ELSE 'col' || p_attnum END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._drop_capture_triggers(p_relid oid)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._drop_statement_triggers('pgt_capture', p_relid)
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
BEGIN
    SELECT * INTO src FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid;
    fn := format('pgtrickle_changes.%I', 'capture_' || p_relid);
    buf := pgtrickle._buffer_part(src.buffer_name, 'rows');
    batches := pgtrickle._buffer_part(src.buffer_name, 'batches');
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
    -- Wakes the daemon (scheduler/wake.py): at most once per 100 ms per session and source (a
    -- notifying commit serializes with every other notifying commit); PostgreSQL also sends one
    -- per transaction and payload. The daemon re-checks the readers once after a wake.
    IF coalesce(current_setting('pgtrickle.notified_%13$s', true), '') = ''
       OR current_setting('pgtrickle.notified_%13$s', true)::float8
          < extract(epoch FROM clock_timestamp()) - 0.1 THEN
        PERFORM pg_notify('pgtrickle_changes', %13$L);
        PERFORM set_config('pgtrickle.notified_%13$s', extract(epoch FROM clock_timestamp())::text, false);
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
        batches, b_cols, n_row, o_row, b_aggs, p_relid::text);
    EXECUTE body;

    PERFORM pgtrickle._create_statement_triggers('pgt_capture', p_relid, fn);
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

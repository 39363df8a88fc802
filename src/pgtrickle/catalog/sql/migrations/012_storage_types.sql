-- Stream tables and change buffers store a domain as its base type (issue 16): writing a
-- domain value runs the domain's CHECK, which can call code of the domain's owner, and
-- the daemon writes with its own rights. Existing columns of a domain type change to the
-- base type (binary-compatible: no table rewrite). A buffer's view is rebuilt around it.
DO $migration$
DECLARE
    r record;
    v_base text;
    v_bufs oid[] := '{}';
    v_src oid;
BEGIN
    FOR r IN
        SELECT c.oid AS relid, c.relname, a.attname, a.atttypid,
               EXISTS (SELECT 1 FROM pgtrickle.pgt_stream_tables s WHERE s.pgt_relid = c.oid) AS is_st
          FROM pg_catalog.pg_attribute a
          JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
          JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind = 'r'
           AND (t.typtype = 'd' OR (t.typcategory = 'A' AND (SELECT e.typtype FROM pg_catalog.pg_type e
                                                              WHERE e.oid = t.typelem) = 'd'))
           AND (c.oid IN (SELECT pgt_relid FROM pgtrickle.pgt_stream_tables)
                OR c.relnamespace = 'pgtrickle_changes'::regnamespace)
    LOOP
        WITH RECURSIVE chain(typ, base, mod) AS (
            SELECT t.oid, t.typbasetype, t.typtypmod FROM pg_catalog.pg_type t
             WHERE t.oid = coalesce((SELECT nullif(e.oid, 0) FROM pg_catalog.pg_type a2
                                       JOIN pg_catalog.pg_type e ON e.oid = a2.typelem
                                      WHERE a2.oid = r.atttypid AND a2.typcategory = 'A' AND e.typtype = 'd'),
                                    r.atttypid)
            UNION ALL
            SELECT t.oid, t.typbasetype, t.typtypmod FROM chain ch JOIN pg_catalog.pg_type t ON t.oid = ch.base
             WHERE ch.base <> 0
        )
        SELECT format_type(ch.base, ch.mod) INTO v_base
          FROM chain ch JOIN pg_catalog.pg_type b ON b.oid = ch.base WHERE b.typtype <> 'd';
        IF (SELECT typtype FROM pg_catalog.pg_type WHERE oid = r.atttypid) <> 'd' THEN
            v_base := v_base || '[]';
        END IF;
        IF NOT r.is_st THEN
            -- changes_<oid>_rows / changes_<oid>_batches: drop the view first, rebuild it below.
            v_src := substring(r.relname FROM '^changes_(\d+)_')::oid;
            IF v_src IS NOT NULL THEN
                EXECUTE format('DROP VIEW IF EXISTS pgtrickle_changes.%I', 'changes_' || v_src);
                v_bufs := v_bufs || v_src;
            END IF;
        END IF;
        BEGIN
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s', r.relid::regclass, r.attname, v_base);
        EXCEPTION WHEN dependent_objects_still_exist OR feature_not_supported THEN
            RAISE WARNING 'pgtrickle: column % of % keeps its domain type %: %', quote_ident(r.attname),
                r.relid::regclass, r.atttypid::regtype, SQLERRM
                USING HINT = 'Drop the objects that depend on it and run pgtrickle install again; '
                             'its refreshes are refused until then.';
        END;
    END LOOP;
    FOR v_src IN SELECT DISTINCT unnest(v_bufs) LOOP
        IF EXISTS (SELECT 1 FROM pgtrickle.pgt_change_sources WHERE source_relid = v_src) THEN
            PERFORM pgtrickle._build_buffer_view(v_src);
            IF (SELECT source_kind = 'TABLE' AND cdc_mode = 'trigger' FROM pgtrickle.pgt_change_sources
                 WHERE source_relid = v_src) THEN
                PERFORM pgtrickle._build_capture(v_src);
            END IF;
        END IF;
    END LOOP;
END
$migration$;

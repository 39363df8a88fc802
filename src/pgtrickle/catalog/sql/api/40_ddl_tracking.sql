-- pgtrickle SQL API, DDL tracking (the event trigger functions).
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

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

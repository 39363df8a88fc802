-- pgtrickle SQL API, install step: buffers from before migration 11 (runs after every function).
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

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

-- ------------------------------------------------------- change notifications
-- Capture functions built before they sent NOTIFY pgtrickle_changes are rebuilt once (at install).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.source_relid
               FROM pgtrickle.pgt_change_sources c
               JOIN pg_proc p ON p.oid = to_regproc(format('pgtrickle_changes.%I', 'capture_' || c.source_relid))
              WHERE c.source_kind = 'TABLE' AND c.cdc_mode = 'trigger'
                AND p.prosrc NOT LIKE '%pgtrickle.notified_%'
                AND EXISTS (SELECT 1 FROM pg_class WHERE oid = c.source_relid) LOOP
        PERFORM pgtrickle._build_capture(r.source_relid);
    END LOOP;
END
$$;

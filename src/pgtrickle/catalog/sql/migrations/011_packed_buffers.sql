-- Change buffers become a view over two parts (see pgtrickle._build_buffer_view):
-- the table that held one row per change is kept, renamed changes_<relid>_rows,
-- and its change ids now step by 4096 so that a packed batch of statement-trigger
-- changes can take one id for up to 4096 changes. The batches table
-- and the view are created by api.sql for every source that lacks them.
DO $$
DECLARE
    b text;
BEGIN
    FOR b IN SELECT buffer_name FROM pgtrickle.pgt_change_sources LOOP
        IF to_regclass(format('pgtrickle_changes.%I', b)) IS NOT NULL
           AND to_regclass(format('pgtrickle_changes.%I', b || '_rows')) IS NULL THEN
            EXECUTE format('ALTER TABLE pgtrickle_changes.%I RENAME TO %I', b, b || '_rows');
            EXECUTE format('ALTER TABLE pgtrickle_changes.%I ALTER COLUMN change_id SET INCREMENT BY 4096', b || '_rows');
        END IF;
    END LOOP;
END
$$;

-- pgtrickle SQL API, refresh groups.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- ----------------------------------------------------------- refresh groups
-- (public entry points create_refresh_group / drop_refresh_group in 90_entry_points.sql)
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

-- pgtrickle: refresh commands served by a running daemon (table: migration 018; docs/CLI.md).
-- Installed with the other API files on every install (functions are re-created).
--
-- A daemon that serves commands holds a shared advisory lock (1885828196, 1) on its listener
-- connection for as long as it runs (pgtrickle.daemon.serving.DAEMON_LOCK). PostgreSQL releases
-- it when that connection ends, however the daemon ended (a crash, SIGKILL, a lost network), so a
-- daemon that is gone is never taken for a live one.

-- The backend pids of the daemons serving this database now.
CREATE OR REPLACE FUNCTION pgtrickle._serving_daemons()
RETURNS SETOF integer LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted
       AND l.classid = 1885828196 AND l.objid = 1 AND l.objsubid = 2
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     ORDER BY l.pid
$$;

-- Queue a refresh command for a daemon: the named stream tables (NULL: every one), each of
-- which the caller may refresh. Returns the command's id; the daemon is woken when the caller
-- commits (the command line runs in autocommit).
CREATE OR REPLACE FUNCTION pgtrickle._api_submit_refresh(p_names text[], p_force boolean, p_caller_path text)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    st pgtrickle.pgt_stream_tables;
    v_ids bigint[];
    v_name text;
    v_id bigint;
BEGIN
    IF p_force IS NULL THEN
        RAISE EXCEPTION 'force must be true or false, not NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_names IS NULL THEN
        FOR st IN SELECT * FROM pgtrickle.pgt_stream_tables ORDER BY pgt_id LOOP
            PERFORM pgtrickle._require_owner(st, 'refresh');
        END LOOP;
    ELSE
        v_ids := ARRAY[]::bigint[];
        FOREACH v_name IN ARRAY p_names LOOP
            st := pgtrickle._find_st(v_name, p_caller_path);
            PERFORM pgtrickle._require_owner(st, 'refresh');
            IF NOT st.pgt_id = ANY(v_ids) THEN
                v_ids := v_ids || st.pgt_id;
            END IF;
        END LOOP;
    END IF;
    INSERT INTO pgtrickle.pgt_refresh_commands (pgt_ids, force) VALUES (v_ids, p_force)
    RETURNING command_id INTO v_id;
    PERFORM pg_notify('pgtrickle_refresh', '');
    RETURN v_id;
END
$$;

-- Forget a command of the caller's: after reading its result, or withdrawing it
-- (p_only_unclaimed: only while no daemon has claimed it). Whether a row was deleted.
CREATE OR REPLACE FUNCTION pgtrickle._api_forget_refresh_command(p_command_id bigint, p_only_unclaimed boolean)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    DELETE FROM pgtrickle.pgt_refresh_commands
     WHERE command_id = p_command_id AND requested_by = session_user
       AND (NOT p_only_unclaimed OR claimed_by IS NULL);
    RETURN FOUND;
END
$$;

-- pgtrickle catalog, version 10: the privilege model (docs/SECURITY.md).
--
-- * pgtrickle_user  (NOLOGIN): may create stream tables over what it may read,
--                   and alter / refresh / drop the ones it owns; reads the catalog.
-- * pgtrickle_admin (NOLOGIN, member of pgtrickle_user): configuration — settings,
--                   watermark groups, CDC modes — and every stream table's
--                   alter / refresh / resume / circuit breaker / drop.
-- The SQL API functions that change anything are SECURITY DEFINER (they run as
-- the role that installed pgtrickle) with a fixed search_path, and check the
-- calling role themselves (api.sql). Nobody else may write the catalog or the
-- change buffers directly.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgtrickle_user') THEN
        BEGIN
            CREATE ROLE pgtrickle_user NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'installing pgtrickle creates the roles pgtrickle_user and pgtrickle_admin, '
                            'and role % may not create roles', current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Install as a superuser, or have one run: CREATE ROLE pgtrickle_user NOLOGIN; '
                             'CREATE ROLE pgtrickle_admin NOLOGIN IN ROLE pgtrickle_user;';
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgtrickle_admin') THEN
        BEGIN
            CREATE ROLE pgtrickle_admin NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'installing pgtrickle creates the role pgtrickle_admin, and role % may not create roles',
                current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Install as a superuser, or have one run: CREATE ROLE pgtrickle_admin NOLOGIN IN ROLE pgtrickle_user;';
        END;
    END IF;
    IF NOT pg_catalog.pg_has_role('pgtrickle_admin', 'pgtrickle_user', 'MEMBER') THEN
        GRANT pgtrickle_user TO pgtrickle_admin;
    END IF;
END
$$;

COMMENT ON ROLE pgtrickle_user IS 'pgtrickle: may create stream tables over tables it may read, and manage its own';
COMMENT ON ROLE pgtrickle_admin IS 'pgtrickle: configuration (settings, watermark groups, CDC modes) and every stream table';

-- Nobody but pgtrickle's owner writes the catalog or reads the change buffers
-- (they hold source rows). The API's SECURITY DEFINER functions do it for callers.
REVOKE ALL ON SCHEMA pgtrickle, pgtrickle_changes FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgtrickle FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgtrickle_changes FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgtrickle FROM PUBLIC;

-- Anyone may look names up in pgtrickle (the API functions check the caller themselves, with
-- errors that say which role to grant); the tables need the grants below.
GRANT USAGE ON SCHEMA pgtrickle TO PUBLIC;
-- The catalog is readable by users (names, schedules, defining queries, errors);
-- quarantined changes are source rows: only inspect_circuit_breaker shows them.
GRANT SELECT ON pgtrickle.pgt_settings, pgtrickle.pgt_stream_tables, pgtrickle.pgt_change_sources,
                pgtrickle.pgt_dependencies, pgtrickle.pgt_refresh_history, pgtrickle.pgt_refresh_requests,
                pgtrickle.pgt_schema_version, pgtrickle.pgt_decoder_state, pgtrickle.pgt_watermarks,
                pgtrickle.pgt_watermark_history, pgtrickle.pgt_watermark_groups,
                pgtrickle.pgt_watermark_group_sources, pgtrickle.alerts
   TO pgtrickle_user;
-- Settings are configuration: admins change them with plain UPDATE (docs/CONFIGURATION.md).
GRANT INSERT, UPDATE, DELETE ON pgtrickle.pgt_settings TO pgtrickle_admin;

-- The settings validation trigger (migration 8) runs with a fixed search_path too.
ALTER FUNCTION pgtrickle._check_setting() SET search_path = pg_catalog, pgtrickle, pg_temp;

-- Capture trigger functions now run as pgtrickle's owner (SECURITY DEFINER), so
-- a role that may write a source needs no rights on the change buffers: rebuild them.
DO $$
DECLARE
    r oid;
BEGIN
    FOR r IN SELECT source_relid FROM pgtrickle.pgt_change_sources
              WHERE source_kind = 'TABLE'
                AND pg_catalog.to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || source_relid)) IS NOT NULL
    LOOP
        EXECUTE format('ALTER FUNCTION pgtrickle_changes.%I() SECURITY DEFINER '
                       'SET search_path = pg_catalog, pgtrickle, pg_temp', 'capture_' || r);
    END LOOP;
END
$$;

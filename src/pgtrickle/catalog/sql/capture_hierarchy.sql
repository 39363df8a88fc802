-- pgtrickle: change capture of partitions and inheritance children (docs/ARCHITECTURE.md,
-- "Partitions and inheritance children"). Installed after the migrations and before sql/api/.
--
-- A table source's capture trigger function pgtrickle_changes.capture_<source> fires on the
-- source itself (triggers pgt_capture_*) and on every table below it in its partition or
-- inheritance hierarchy, at any depth (triggers pgt_member_<source>_*): all of them write
-- the source's change buffer. A statement through a parent fires only that parent's
-- statement triggers, and its transition tables hold the rows of every affected child in
-- the parent's row type, so each change is captured exactly once, by the table the
-- statement named. The function names columns, never positions: one function serves
-- members whose columns are in another order (PL/pgSQL compiles it per table).

-- The four statement triggers that run a capture function on one table, named <p_prefix>_ins,
-- _upd, _del and _trunc (one per event: transition tables need single-event triggers). The
-- source's own (pgt_capture), its members' (pgt_member_<source>) and its ancestors'
-- (pgt_ancestor_<source>) are all made and dropped by these two.
CREATE OR REPLACE FUNCTION pgtrickle._drop_statement_triggers(p_prefix text, p_table oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    ev text;
BEGIN
    FOREACH ev IN ARRAY ARRAY['ins', 'upd', 'del', 'trunc'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', p_prefix || '_' || ev, p_table::regclass);
    END LOOP;
END
$$;

-- (Re)create them, running p_fn (a qualified function name).
CREATE OR REPLACE FUNCTION pgtrickle._create_statement_triggers(p_prefix text, p_table oid, p_fn text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    tbl text := p_table::regclass::text;
BEGIN
    PERFORM pgtrickle._drop_statement_triggers(p_prefix, p_table);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS __pgt_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', p_prefix || '_ins', tbl, p_fn);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS __pgt_old '
                   'NEW TABLE AS __pgt_new FOR EACH STATEMENT EXECUTE FUNCTION %s()', p_prefix || '_upd', tbl, p_fn);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS __pgt_old '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', p_prefix || '_del', tbl, p_fn);
    EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
                   p_prefix || '_trunc', tbl, p_fn);
END
$$;

-- The tables other than p_except with triggers running the capture function p_fn (unqualified,
-- in pgtrickle_changes), and whether all four.
CREATE OR REPLACE FUNCTION pgtrickle._tables_running(p_fn text, p_except oid)
RETURNS TABLE (relid oid, complete boolean) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.tgrelid, count(*) = 4
      FROM pg_trigger t
     WHERE t.tgfoid = to_regprocedure(format('pgtrickle_changes.%I()', p_fn))
       AND t.tgrelid IS DISTINCT FROM p_except
     GROUP BY t.tgrelid
$$;

-- Every table below p_relid in its partition / inheritance hierarchy, at any depth. A
-- temporary child is left out: only its own session sees its rows, never a refresh.
CREATE OR REPLACE FUNCTION pgtrickle._hierarchy_members(p_relid oid)
RETURNS TABLE (member_relid oid, member_kind "char") LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE m (relid) AS (
        SELECT inhrelid FROM pg_inherits WHERE inhparent = p_relid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN m ON i.inhparent = m.relid)
    SELECT c.oid, c.relkind FROM m JOIN pg_class c ON c.oid = m.relid WHERE c.relpersistence <> 't'
$$;

-- The tables other than the source that carry its capture triggers, and whether all four.
CREATE OR REPLACE FUNCTION pgtrickle._captured_members(p_relid oid)
RETURNS TABLE (member_relid oid, complete boolean) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.relid, r.complete FROM pgtrickle._tables_running('capture_' || p_relid, p_relid) r
$$;

-- (Member trigger names are built by _create_statement_triggers now.)
DROP FUNCTION IF EXISTS pgtrickle._member_trigger(oid, text);

CREATE OR REPLACE FUNCTION pgtrickle._drop_member_capture(p_relid oid, p_member oid)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._drop_statement_triggers(format('pgt_member_%s', p_relid), p_member)
$$;

-- Remove a source's capture from every other table, below and above it (source no
-- longer captured by triggers).
CREATE OR REPLACE FUNCTION pgtrickle._drop_member_captures(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    PERFORM pgtrickle._drop_member_capture(p_relid, c.member_relid) FROM pgtrickle._captured_members(p_relid) c;
    PERFORM pgtrickle._drop_ancestor_captures(p_relid);
    EXECUTE format('DROP FUNCTION IF EXISTS pgtrickle_changes.%I()', 'capture_' || p_relid || '_via');
END
$$;

-- ------------------------------------------------ a source that is a partition itself
-- A statement naming a partitioned table above a partition source fires only that
-- table's triggers. Each of them carries pgt_ancestor_<source>_* triggers running
-- capture_<source>_via: the source's capture function with the transition tables
-- filtered by the source's partition constraint (pg_get_partition_constraintdef, which
-- includes its ancestors' bounds) - a row satisfies it exactly when it lies in the
-- source. An inheritance child has no such constraint: writes naming its parent are not
-- captured for it (check_cdc_health() says so).

CREATE OR REPLACE FUNCTION pgtrickle._partition_ancestors(p_relid oid)
RETURNS TABLE (ancestor_relid oid) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.relid::oid FROM pg_partition_ancestors(p_relid) a WHERE a.relid::oid <> p_relid
$$;

CREATE OR REPLACE FUNCTION pgtrickle._captured_ancestors(p_relid oid)
RETURNS TABLE (ancestor_relid oid, complete boolean) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.relid, r.complete FROM pgtrickle._tables_running('capture_' || p_relid || '_via', NULL) r
$$;

CREATE OR REPLACE FUNCTION pgtrickle._drop_ancestor_capture(p_relid oid, p_ancestor oid)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT pgtrickle._drop_statement_triggers(format('pgt_ancestor_%s', p_relid), p_ancestor)
$$;

CREATE OR REPLACE FUNCTION pgtrickle._drop_ancestor_captures(p_relid oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    PERFORM pgtrickle._drop_ancestor_capture(p_relid, c.ancestor_relid) FROM pgtrickle._captured_ancestors(p_relid) c;
END
$$;

-- (Re)build capture_<source>_via from the body of the source's capture function (called
-- by pgtrickle._build_capture) and put its triggers on exactly the source's ancestors.
CREATE OR REPLACE FUNCTION pgtrickle._build_ancestor_capture(p_relid oid, p_body text, p_fn text)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v_cons text := pg_get_partition_constraintdef(p_relid);
    v_via text := format('pgtrickle_changes.%I', 'capture_' || p_relid || '_via');
    a oid;
    ev text;
BEGIN
    IF v_cons IS NULL OR NOT EXISTS (SELECT 1 FROM pgtrickle._partition_ancestors(p_relid)) THEN
        PERFORM pgtrickle._drop_ancestor_captures(p_relid);
        EXECUTE format('DROP FUNCTION IF EXISTS %s()', v_via);
        RETURN;
    END IF;
    EXECUTE replace(replace(replace(p_body, p_fn || '()', v_via || '()'),
                            '__pgt_new n', format('(SELECT * FROM __pgt_new WHERE %s) n', v_cons)),
                    '__pgt_old o', format('(SELECT * FROM __pgt_old WHERE %s) o', v_cons));
    FOR a IN SELECT c.ancestor_relid FROM pgtrickle._captured_ancestors(p_relid) c
              WHERE c.ancestor_relid NOT IN (SELECT x.ancestor_relid FROM pgtrickle._partition_ancestors(p_relid) x)
    LOOP
        PERFORM pgtrickle._drop_ancestor_capture(p_relid, a);
    END LOOP;
    FOR a IN SELECT x.ancestor_relid FROM pgtrickle._partition_ancestors(p_relid) x
              WHERE x.ancestor_relid NOT IN (SELECT c.ancestor_relid FROM pgtrickle._captured_ancestors(p_relid) c
                                              WHERE c.complete)
    LOOP
        PERFORM pgtrickle._create_statement_triggers(format('pgt_ancestor_%s', p_relid), a, v_via);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._install_member_capture(p_relid oid, p_member oid)
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    PERFORM pgtrickle._create_statement_triggers(format('pgt_member_%s', p_relid), p_member,
                                                 format('pgtrickle_changes.%I', 'capture_' || p_relid));
END
$$;

-- Make a trigger-captured table source's capture cover exactly its hierarchy as it is now.
-- Returns the members that joined (gained capture) or left (lost it). Foreign-table
-- members cannot have transition-table triggers: check_cdc_health() reports them.
CREATE OR REPLACE FUNCTION pgtrickle._sync_member_capture(p_relid oid)
RETURNS TABLE (member_relid oid, joined boolean) LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    m oid;
BEGIN
    FOR m IN SELECT c.member_relid FROM pgtrickle._captured_members(p_relid) c
              WHERE c.member_relid NOT IN (SELECT h.member_relid FROM pgtrickle._hierarchy_members(p_relid) h
                                            WHERE h.member_kind IN ('r', 'p'))
    LOOP
        PERFORM pgtrickle._drop_member_capture(p_relid, m);
        member_relid := m;
        joined := false;
        RETURN NEXT;
    END LOOP;
    FOR m IN SELECT h.member_relid FROM pgtrickle._hierarchy_members(p_relid) h
              WHERE h.member_kind IN ('r', 'p')
                AND h.member_relid NOT IN (SELECT c.member_relid FROM pgtrickle._captured_members(p_relid) c
                                            WHERE c.complete)
    LOOP
        PERFORM pgtrickle._install_member_capture(p_relid, m);
        member_relid := m;
        joined := true;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Whether a table holds rows of its own (not counting its children). Unreadable: assume so.
CREATE OR REPLACE FUNCTION pgtrickle._holds_rows(p_relid oid)
RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    v boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %s)', p_relid::regclass) INTO v;
    RETURN v;
EXCEPTION WHEN insufficient_privilege THEN
    RETURN true;
END
$$;

-- Why rows came into or left a source with a member, in the user's words.
CREATE OR REPLACE FUNCTION pgtrickle._membership_reason(p_relid oid, p_member oid, p_joined boolean)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT CASE
        WHEN p_joined AND m.relispartition THEN
            format('partition %s was attached to source %s with rows already in it', p_member::regclass,
                   p_relid::regclass)
        WHEN p_joined THEN
            format('table %s became an inheritance child of source %s with rows already in it (INHERIT)',
                   p_member::regclass, p_relid::regclass)
        WHEN s.relkind = 'p' THEN
            format('partition %s was detached from source %s: its rows left it', p_member::regclass,
                   p_relid::regclass)
        ELSE
            format('table %s is no longer an inheritance child of source %s (NO INHERIT): its rows left it',
                   p_member::regclass, p_relid::regclass)
        END
      FROM pg_class m, pg_class s WHERE m.oid = p_member AND s.oid = p_relid
$$;

-- The stream tables reading a source must be recomputed: the next refresh is FULL and says why.
CREATE OR REPLACE FUNCTION pgtrickle._request_reinit(p_relid oid, p_reason text)
RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    UPDATE pgtrickle.pgt_stream_tables s
       SET needs_reinit = true, updated_at = now(), reinit_xid = pg_current_xact_id(),
           reinit_reason = CASE WHEN s.needs_reinit AND s.reinit_reason IS NOT NULL
                                     AND position(p_reason IN s.reinit_reason) = 0
                                THEN s.reinit_reason || '; ' || p_reason
                                WHEN s.needs_reinit AND s.reinit_reason IS NOT NULL THEN s.reinit_reason
                                ELSE p_reason END
      FROM pgtrickle.pgt_dependencies d
     WHERE d.pgt_id = s.pgt_id AND d.source_relid = p_relid
$$;

-- After CREATE TABLE / ALTER TABLE (called by pgtrickle._on_ddl_end): every table source
-- whose hierarchy changed gets capture on its new members and loses it on former ones.
-- Rows that came or went with a member (ATTACH / DETACH PARTITION, INHERIT / NO INHERIT)
-- were never changes in the buffer: the stream tables reading the source are recomputed.
-- A source on WAL capture that gains members goes back to triggers (WAL capture does not
-- follow partitions and children; see pgtrickle.cdc.modes.hierarchy_blocker).
CREATE OR REPLACE FUNCTION pgtrickle._follow_hierarchy_ddl()
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    src pgtrickle.pgt_change_sources;
    chg record;
BEGIN
    -- Not again for the ALTER TABLEs it runs itself (the move back from WAL capture).
    IF current_setting('pgtrickle.following_hierarchy', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM set_config('pgtrickle.following_hierarchy', 'on', true);
    FOR src IN
        SELECT c.* FROM pgtrickle.pgt_change_sources c JOIN pg_class r ON r.oid = c.source_relid
         WHERE c.source_kind = 'TABLE'
           AND (r.relhassubclass OR EXISTS (SELECT 1 FROM pgtrickle._captured_members(c.source_relid)))
           -- (not a source being set up: _build_capture covers its members when it is built)
           AND to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || c.source_relid)) IS NOT NULL
         ORDER BY c.source_relid
    LOOP
        IF src.cdc_mode = 'wal' THEN
            IF NOT EXISTS (SELECT 1 FROM pgtrickle._hierarchy_members(src.source_relid)) THEN
                CONTINUE;
            END IF;
            FOR chg IN SELECT h.member_relid FROM pgtrickle._hierarchy_members(src.source_relid) h
                        WHERE h.member_kind = 'r' AND pgtrickle._holds_rows(h.member_relid) LOOP
                PERFORM pgtrickle._request_reinit(src.source_relid,
                    pgtrickle._membership_reason(src.source_relid, chg.member_relid, true));
            END LOOP;
            PERFORM pgtrickle._transition_to_trigger(src.source_relid,
                'the table has partitions or inheritance children: WAL capture does not follow them');
            CONTINUE;
        END IF;
        FOR chg IN SELECT * FROM pgtrickle._sync_member_capture(src.source_relid) LOOP
            IF pgtrickle._holds_rows(chg.member_relid) THEN
                PERFORM pgtrickle._request_reinit(src.source_relid,
                    pgtrickle._membership_reason(src.source_relid, chg.member_relid, chg.joined));
            END IF;
        END LOOP;
    END LOOP;
    -- A source that became, or stopped being, a partition (ATTACH / DETACH of the source
    -- itself or of a table above it): its capture through its ancestors follows. Its
    -- own rows do not change.
    FOR src IN
        SELECT c.* FROM pgtrickle.pgt_change_sources c JOIN pg_class r ON r.oid = c.source_relid
         WHERE c.source_kind = 'TABLE' AND c.cdc_mode = 'trigger'
           AND to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || c.source_relid)) IS NOT NULL
           AND (r.relispartition OR EXISTS (SELECT 1 FROM pgtrickle._captured_ancestors(c.source_relid)))
           AND (EXISTS (SELECT ancestor_relid FROM pgtrickle._partition_ancestors(c.source_relid)
                        EXCEPT SELECT ancestor_relid FROM pgtrickle._captured_ancestors(c.source_relid) WHERE complete)
                OR EXISTS (SELECT ancestor_relid FROM pgtrickle._captured_ancestors(c.source_relid)
                           EXCEPT SELECT ancestor_relid FROM pgtrickle._partition_ancestors(c.source_relid)))
         ORDER BY c.source_relid
    LOOP
        PERFORM pgtrickle._build_capture(src.source_relid);
    END LOOP;
    PERFORM set_config('pgtrickle.following_hierarchy', 'off', true);
END
$$;

-- Problems of a source's hierarchy for check_cdc_health(): members without (complete)
-- capture, and - for a source that is itself a partition or child - the writes that name
-- its parent, which fire only the parent's statement triggers.
CREATE OR REPLACE FUNCTION pgtrickle._hierarchy_problems(p_relid oid)
RETURNS text[] LANGUAGE sql STABLE
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
    SELECT coalesce((SELECT array_agg(format('it is an inheritance child of %s: statements naming %s '
                                             'that change its rows are not captured for it', i.inhparent::regclass,
                                             i.inhparent::regclass) ORDER BY i.inhparent::regclass::text)
                       FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                      WHERE i.inhrelid = p_relid AND NOT c.relispartition), '{}')
        || coalesce((SELECT array_agg(format('partitioned table %s above it lacks its capture triggers: statements '
                                             'naming it are not captured for it', a.ancestor_relid::regclass)
                                      ORDER BY a.ancestor_relid::regclass::text)
                       FROM pgtrickle._partition_ancestors(p_relid) a
                      WHERE (SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_relid = p_relid) = 'trigger'
                        AND NOT EXISTS (SELECT 1 FROM pgtrickle._captured_ancestors(p_relid) c
                                         WHERE c.ancestor_relid = a.ancestor_relid AND c.complete)), '{}')
        || coalesce(array_agg(
               CASE WHEN h.member_kind = 'f'
                    THEN format('partition or child %s is a foreign table: its writes are not captured',
                                h.member_relid::regclass)
                    ELSE format('partition or child %s lacks capture triggers', h.member_relid::regclass) END
               ORDER BY h.member_relid::regclass::text), '{}')
      FROM pgtrickle._hierarchy_members(p_relid) h
     WHERE h.member_kind IN ('r', 'p', 'f')
       AND NOT EXISTS (SELECT 1 FROM pgtrickle._captured_members(p_relid) c
                        WHERE c.member_relid = h.member_relid AND c.complete)
$$;

-- After DROP (called by pgtrickle._on_sql_drop): a partition or inheritance child dropped
-- with its table took its rows out of the source without a change: recompute the stream
-- tables reading it. (Member triggers that pgtrickle itself drops leave their table.)
CREATE OR REPLACE FUNCTION pgtrickle._follow_member_drops()
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
DECLARE
    obj record;
    v_src oid;
BEGIN
    FOR obj IN SELECT address_names FROM pg_event_trigger_dropped_objects()
                WHERE classid = 'pg_catalog.pg_trigger'::regclass
                  AND address_names[3] ~ '^pgt_member_[0-9]+_ins$' LOOP
        CONTINUE WHEN to_regclass(format('%I.%I', obj.address_names[1], obj.address_names[2])) IS NOT NULL;
        v_src := substring(obj.address_names[3] FROM '^pgt_member_([0-9]+)_ins$')::oid;
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = v_src);
        PERFORM pgtrickle._request_reinit(v_src,
            format('partition or inheritance child %I.%I of source %s was dropped with the rows in it',
                   obj.address_names[1], obj.address_names[2], v_src::regclass));
    END LOOP;
END
$$;

-- Upgrade: sources captured before partitions and children were followed get capture on
-- their members now; members already holding rows may have had uncaptured writes. A
-- source that is a partition gets capture through the tables above it; statements naming
-- them were not captured for it before.
DO $$
DECLARE
    src pgtrickle.pgt_change_sources;
    chg record;
    v_fn text;
BEGIN
    FOR src IN SELECT c.* FROM pgtrickle.pgt_change_sources c JOIN pg_class r ON r.oid = c.source_relid
                WHERE c.source_kind = 'TABLE' AND c.cdc_mode = 'trigger' AND r.relispartition
                  AND to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || c.source_relid)) IS NOT NULL
                  AND to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || c.source_relid || '_via')) IS NULL
    LOOP
        v_fn := format('pgtrickle_changes.%I', 'capture_' || src.source_relid);
        PERFORM pgtrickle._build_ancestor_capture(src.source_relid, pg_get_functiondef(v_fn::regproc), v_fn);
        PERFORM pgtrickle._request_reinit(src.source_relid,
            format('source %s is a partition: statements naming the tables above it were not captured for it '
                   'before this version', src.source_relid::regclass));
    END LOOP;
    FOR src IN SELECT c.* FROM pgtrickle.pgt_change_sources c JOIN pg_class r ON r.oid = c.source_relid
                WHERE c.source_kind = 'TABLE' AND c.cdc_mode = 'trigger' AND r.relhassubclass
                  AND to_regprocedure(format('pgtrickle_changes.%I()', 'capture_' || c.source_relid)) IS NOT NULL
    LOOP
        FOR chg IN SELECT * FROM pgtrickle._sync_member_capture(src.source_relid) LOOP
            IF chg.joined AND pgtrickle._holds_rows(chg.member_relid) THEN
                PERFORM pgtrickle._request_reinit(src.source_relid,
                    format('partition or inheritance child %s of source %s was not captured before this version',
                           chg.member_relid::regclass, src.source_relid::regclass));
            END IF;
        END LOOP;
    END LOOP;
END
$$;

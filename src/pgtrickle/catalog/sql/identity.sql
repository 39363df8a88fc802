-- pgtrickle: what the daemon stores and how it follows the objects it works on.
-- Installed before the SQL API's area files (sql/api/) on every install (functions are re-created).
--
-- Two rules keep the daemon from ever running code another role controls
-- (see docs/SECURITY.md, "Code the daemon never runs"):
--   * values are stored in types whose input runs no user code: a domain is
--     stored as its base type (its CHECK would run the domain owner's
--     functions), and a composite or range type with a domain inside is refused;
--   * objects are tracked by OID: names are followed through renames
--     (_sync_names, run by the pgtrickle_rename event trigger, and the daemon
--     reads names from the OIDs at each refresh).

-- The type pgtrickle stores a value of p_type (with modifier p_typmod) in: the
-- type itself, but a domain (also an array's element domain) becomes its base type.
CREATE OR REPLACE FUNCTION pgtrickle._storage_type(p_type oid, p_typmod integer)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    v_elem record;
BEGIN
    SELECT typtype, typbasetype, typtypmod, typelem, typcategory INTO t FROM pg_type WHERE oid = p_type;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'type % does not exist', p_type USING ERRCODE = 'undefined_object';
    END IF;
    IF t.typtype = 'd' THEN
        RETURN pgtrickle._storage_type(t.typbasetype, t.typtypmod);
    END IF;
    IF t.typcategory = 'A' AND t.typelem <> 0 THEN
        SELECT typtype, typbasetype, typtypmod INTO v_elem FROM pg_type WHERE oid = t.typelem;
        IF v_elem.typtype = 'd' THEN
            RETURN pgtrickle._storage_type(t.typelem, p_typmod) || '[]';
        END IF;
    END IF;
    RETURN format_type(p_type, p_typmod);
END
$$;

-- The innermost base type of a domain (the type itself otherwise).
CREATE OR REPLACE FUNCTION pgtrickle._base_type(p_type oid)
RETURNS oid LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE chain(typ, base) AS (
        SELECT oid, typbasetype FROM pg_type WHERE oid = p_type
        UNION ALL
        SELECT t.oid, t.typbasetype FROM chain c JOIN pg_type t ON t.oid = c.base WHERE c.base <> 0
    )
    SELECT typ FROM chain WHERE base = 0
$$;

-- The first domain found *inside* p_type (an attribute of a composite type, the
-- subtype of a range, an array's element, at any depth), or NULL. A top-level
-- domain does not count: _storage_type stores it as its base type.
-- Reading such a value back in (COPY, a cast from text) would run the domain's
-- CHECK, which may call its owner's functions, with the reader's rights.
CREATE OR REPLACE FUNCTION pgtrickle._domain_inside(p_type oid, p_depth integer DEFAULT 0)
RETURNS regtype LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    a record;
    v_found regtype;
BEGIN
    IF p_depth > 32 THEN
        RETURN NULL;
    END IF;
    SELECT typtype, typbasetype, typelem, typcategory, typrelid INTO t FROM pg_type WHERE oid = p_type;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF t.typtype = 'd' THEN
        IF p_depth > 0 THEN
            RETURN p_type::regtype;
        END IF;
        RETURN pgtrickle._domain_inside(t.typbasetype, p_depth);
    END IF;
    IF t.typcategory = 'A' AND t.typelem <> 0 THEN
        -- An array of a domain counts as inside: its values cross to Spark in the array
        -- type PostgreSQL reports for the column, which a change buffer could not hold.
        RETURN pgtrickle._domain_inside(t.typelem, p_depth + 1);
    END IF;
    IF t.typtype = 'c' THEN
        FOR a IN SELECT atttypid FROM pg_attribute
                  WHERE attrelid = t.typrelid AND attnum > 0 AND NOT attisdropped ORDER BY attnum LOOP
            v_found := pgtrickle._domain_inside(a.atttypid, p_depth + 1);
            IF v_found IS NOT NULL THEN
                RETURN v_found;
            END IF;
        END LOOP;
    ELSIF t.typtype = 'r' THEN
        RETURN pgtrickle._domain_inside((SELECT rngsubtype FROM pg_range WHERE rngtypid = p_type), p_depth + 1);
    ELSIF t.typtype = 'm' THEN
        RETURN pgtrickle._domain_inside((SELECT rngtypid FROM pg_range WHERE rngmultitypid = p_type), p_depth);
    END IF;
    RETURN NULL;
END
$$;

-- How the daemon's statements compare two stored values of type p_type (a domain: its base type).
-- NULL: `=` as PostgreSQL resolves it with search_path = pg_catalog (built-in types, and enums,
-- composites, ranges and arrays, whose `=` is built in and polymorphic). A base type from another
-- schema (CREATE TYPE by a superuser, or an extension's such as citext) has its `=` beside it,
-- which pg_catalog's search_path does not find: the result is then the schema-qualified
-- OPERATOR(schema.=) of the type's default btree (else hash) operator class, the one GROUP BY,
-- DISTINCT and EXCEPT ALL use. That operator's function runs inside the daemon's statements, so it
-- must be code no ordinary role controls: built in, or owned by a superuser or pgtrickle's owner
-- (as for functions in a defining query); else, or with no such operator class, p_what is refused.
CREATE OR REPLACE FUNCTION pgtrickle._equality_operator(p_type oid, p_what text)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_type oid := pgtrickle._base_type(p_type);
    t record;
    o record;
BEGIN
    SELECT typtype, typnamespace, typcategory, typelem INTO t FROM pg_type WHERE oid = v_type;
    IF NOT FOUND OR t.typtype <> 'b' OR t.typnamespace = 'pg_catalog'::regnamespace
       OR (t.typcategory = 'A' AND t.typelem <> 0) THEN
        RETURN NULL;
    END IF;
    SELECT op.oid, n.nspname, op.oprcode, p.pronamespace, p.proowner, r.rolsuper INTO o
      FROM pg_opclass c
      JOIN pg_am am ON am.oid = c.opcmethod
      JOIN pg_amop ao ON ao.amopfamily = c.opcfamily AND ao.amoplefttype = c.opcintype
                     AND ao.amoprighttype = c.opcintype
                     AND ao.amopstrategy = CASE am.amname WHEN 'btree' THEN 3 ELSE 1 END
      JOIN pg_operator op ON op.oid = ao.amopopr
      JOIN pg_namespace n ON n.oid = op.oprnamespace
      JOIN pg_proc p ON p.oid = op.oprcode
      JOIN pg_roles r ON r.oid = p.proowner
     WHERE c.opcdefault AND c.opcintype = v_type AND am.amname IN ('btree', 'hash') AND op.oprname = '='
     ORDER BY am.amname = 'btree' DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION '% type % has no default btree or hash operator class with an = operator, so pgtrickle cannot compare its values',
            p_what, v_type::regtype
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Cast the column to a type with equality in the query, or create a default operator class for the type.';
    END IF;
    IF o.pronamespace <> 'pg_catalog'::regnamespace AND NOT o.rolsuper
       AND o.proowner <> (SELECT relowner FROM pg_class WHERE oid = 'pgtrickle.pgt_stream_tables'::regclass) THEN
        RAISE EXCEPTION '% type % compares with %, whose function % is owned by %: pgtrickle would run it with its own rights',
            p_what, v_type::regtype, o.oid::regoperator, o.oprcode::regprocedure,
            quote_ident((SELECT rolname FROM pg_roles WHERE oid = o.proowner))
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Have a superuser own the function (ALTER FUNCTION ... OWNER TO), or cast the column to a built-in type in the query.';
    END IF;
    IF o.nspname = 'pg_catalog' THEN
        RETURN NULL;
    END IF;
    RETURN format('OPERATOR(%I.=)', o.nspname);
END
$$;

-- Refuse a column whose values pgtrickle could not store without running a domain's code.
CREATE OR REPLACE FUNCTION pgtrickle._check_storable(p_rel regclass, p_columns text[], p_what text)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a record;
    v_dom regtype;
BEGIN
    FOR a IN SELECT attname, atttypid FROM pg_attribute
              WHERE attrelid = p_rel AND attnum > 0 AND NOT attisdropped
                AND (p_columns IS NULL OR attname::text = ANY (p_columns))
              ORDER BY attnum LOOP
        v_dom := pgtrickle._domain_inside(a.atttypid);
        IF v_dom IS NOT NULL THEN
            RAISE EXCEPTION '% column % has type %, which contains domain %', p_what, quote_ident(a.attname),
                a.atttypid::regtype, v_dom
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'pgtrickle stores values without their domains: reading a value of a composite or '
                               'range type with a domain inside would run the domain''s CHECK, and so code of its '
                               'owner, with pgtrickle''s rights.',
                      HINT = 'Select the fields you need (or cast the column to a type without domains) in the query.';
        END IF;
    END LOOP;
END
$$;

-- A captured column's value as packed into a batch array of element type p_elem, for the
-- capture trigger (which runs with pgtrickle's rights): a cast to the element type, but a
-- value packed as text goes through the type's output function (format's %s) instead of
-- `::text` — the owner of a type may CREATE CAST (their_type AS text) WITH FUNCTION, and
-- a cast would run that function with pgtrickle's rights on every write to the source.
CREATE OR REPLACE FUNCTION pgtrickle._packed_value(p_row text, p_column text, p_elem oid, p_i bigint)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p_elem = 'pg_catalog.text'::regtype
                THEN format('CASE WHEN pg_catalog.num_nulls(%1$s.%2$I) = 0 THEN pg_catalog.format(''%%s'', %1$s.%2$I) END AS c%3$s, ',
                            p_row, p_column, p_i)
                ELSE format('%s.%I::%s AS c%s, ', p_row, p_column,
                            (SELECT format('%I.%I', n.nspname, t.typname) FROM pg_type t
                               JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = p_elem), p_i) END
$$;

-- The change buffer's view turns values packed as text back into their type with a cast,
-- which the daemon then runs when it reads the buffer. Refuse a type whose cast from text
-- is a function another role could have written (the owner of a type may create one).
CREATE OR REPLACE FUNCTION pgtrickle._refuse_user_text_cast(p_type oid, p_relid oid)
RETURNS void LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_fn regprocedure;
BEGIN
    SELECT c.castfunc INTO v_fn
      FROM pg_cast c JOIN pg_proc p ON p.oid = c.castfunc JOIN pg_roles r ON r.oid = p.proowner
     WHERE c.castsource IN ('pg_catalog.text'::regtype, 'pg_catalog.varchar'::regtype) AND c.casttarget = p_type
       AND c.castmethod = 'f' AND NOT r.rolsuper AND p.pronamespace <> 'pg_catalog'::regnamespace;
    IF v_fn IS NOT NULL THEN
        RAISE EXCEPTION 'a column of % has type %, which has a cast from text by %, a function of an ordinary role',
            p_relid::regclass, p_type::regtype, v_fn
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'pgtrickle turns packed changes of this type back from text, and the cast would run '
                           'that function with pgtrickle''s rights.',
                  HINT = 'Drop the cast (or have a superuser own its function), or do not capture this column.';
    END IF;
END
$$;

-- Whether row-level security policies of p_relid apply to role p_role (as
-- PostgreSQL decides it: not for superusers, BYPASSRLS roles, or the table's
-- owner unless FORCE ROW LEVEL SECURITY).
CREATE OR REPLACE FUNCTION pgtrickle._rls_applies(p_relid oid, p_role name)
RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.relrowsecurity
           AND NOT coalesce(r.rolsuper OR r.rolbypassrls, false)
           AND (c.relforcerowsecurity OR NOT coalesce(pg_has_role(p_role, c.relowner, 'USAGE'), false))
      FROM pg_class c LEFT JOIN pg_roles r ON r.rolname = p_role
     WHERE c.oid = p_relid
$$;

-- The message refusing a source with row-level security for p_role, or NULL.
CREATE OR REPLACE FUNCTION pgtrickle._rls_refusal(p_relid oid, p_role name, p_display text)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('source %s of stream table %s has row-level security that applies to its owner %I: '
                  'a stream table is filled by pgtrickle, which cannot apply another role''s policies, so it '
                  'would show rows its owner may not see', p_relid::regclass, p_display, p_role)
     WHERE coalesce(pgtrickle._rls_applies(p_relid, p_role), false)
$$;

-- Follow renames: the names recorded for stream tables and sources become the
-- current names of their OIDs (ALTER TABLE ... RENAME / SET SCHEMA, ALTER SCHEMA ... RENAME).
CREATE OR REPLACE FUNCTION pgtrickle._sync_names()
RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    UPDATE pgtrickle.pgt_stream_tables s
       SET pgt_schema = n.nspname, pgt_name = c.relname, updated_at = now()
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = s.pgt_relid
       AND (s.pgt_schema, s.pgt_name) IS DISTINCT FROM (n.nspname::text, c.relname::text);
    UPDATE pgtrickle.pgt_change_sources s
       SET source_schema = n.nspname, source_name = c.relname
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = s.source_relid
       AND (s.source_schema, s.source_name) IS DISTINCT FROM (n.nspname::text, c.relname::text);
END
$$;

CREATE OR REPLACE FUNCTION pgtrickle._on_rename()
RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    PERFORM pgtrickle._sync_names();
END
$$;

-- The first step of pinning relations (pgtrickle.catalog.identity.pin), in one round trip:
-- a superuser caller share-locks the pg_namespace rows of their schemas until its transaction
-- ends (ALTER SCHEMA ... RENAME and DROP SCHEMA wait; row locks on a catalog need UPDATE
-- rights on it, so no other role can), then gets each relation's current schema, name and
-- kind. SECURITY INVOKER: it locks and reads with the caller's rights, as the caller's own
-- statements did. The checks of the answer are the caller's (pure Python).
CREATE OR REPLACE FUNCTION pgtrickle._pin_relations(p_relids oid[])
RETURNS TABLE (relid bigint, schema_name text, rel_name text, kind text) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user) THEN
        PERFORM 1 FROM pg_namespace
          WHERE oid IN (SELECT c.relnamespace FROM pg_class c WHERE c.oid = ANY (p_relids))
          FOR SHARE;
    END IF;
    RETURN QUERY
        SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relkind::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = ANY (p_relids);
END
$$;

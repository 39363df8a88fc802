"""An ordinary role must not run code with the daemon's rights (issue 16, docs/SECURITY.md).

The attacker is ``analyst``: a pgtrickle_user that owns schema ``a`` and may
create schemas. Its functions log ``current_user`` into ``a.log`` and try to
make ``analyst`` a superuser. The daemon runs as the superuser of the test
server, as the docs allow. Every test asserts that the attacker is still no
superuser and that its code never ran as anyone but itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import psycopg
import pytest

from pgtrickle.catalog import identity
from pgtrickle.errors import PgTrickleError
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, refresh, refresh_and_check

pytestmark = pytest.mark.integration

ANALYST = f"analyst_{os.getpid()}"

EVIL_BODY = f"""
BEGIN
    INSERT INTO a.log VALUES (current_user);
    BEGIN
        EXECUTE 'ALTER ROLE {ANALYST} SUPERUSER';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
"""


@pytest.fixture
def attacker(db: Database) -> Iterator[Database]:
    db.sql(f"DROP ROLE IF EXISTS {ANALYST}")
    db.sql(f"CREATE ROLE {ANALYST}")
    db.sql(f"GRANT pgtrickle_user TO {ANALYST}")
    db.sql(f"GRANT CREATE ON DATABASE {db.dsn.rsplit('/', 1)[1]} TO {ANALYST}")
    db.sql(f"CREATE SCHEMA a AUTHORIZATION {ANALYST}")
    db.sql(f"SET ROLE {ANALYST}")
    db.sql("CREATE TABLE a.log (who name)")
    db.sql("GRANT INSERT ON a.log TO PUBLIC")
    db.sql(
        f"CREATE FUNCTION a.evil(v int) RETURNS boolean LANGUAGE plpgsql AS $${EVIL_BODY} RETURN true; END $$"
    )
    db.sql(
        "CREATE FUNCTION a.evil_trigger() RETURNS trigger LANGUAGE plpgsql AS "
        f"$${EVIL_BODY} RETURN NEW; END $$"
    )
    db.sql("RESET ROLE")
    try:
        yield db
    finally:
        db.sql("RESET ROLE")
        db.sql(f"DROP OWNED BY {ANALYST} CASCADE")
        db.sql(f"DROP ROLE {ANALYST}")


def as_analyst(db: Database, statement: str) -> None:
    db.sql(f"SET ROLE {ANALYST}")
    try:
        db.sql(statement)
    finally:
        db.sql("RESET ROLE")


def assert_not_escalated(db: Database) -> None:
    assert db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ANALYST,)) is False
    runs_as = {r[0] for r in db.sql("SELECT DISTINCT who::text FROM a.log")}
    assert runs_as <= {ANALYST}, f"the attacker's code ran as {runs_as - {ANALYST}}"


def test_a_domain_check_never_runs_with_the_daemons_rights(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db = attacker
    as_analyst(db, "CREATE DOMAIN a.dom AS int CHECK (a.evil(VALUE))")
    as_analyst(db, "CREATE TABLE a.t (id int PRIMARY KEY, v a.dom)")
    as_analyst(db, "INSERT INTO a.t SELECT g, g FROM generate_series(1, 200) g")
    as_analyst(db, "INSERT INTO a.t VALUES (1000, NULL)")
    as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_dom', 'SELECT id, v FROM a.t')")
    # The stream table stores the domain's base type: writing it runs no CHECK.
    types = db.sql(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'a.st_dom'::regclass AND attnum > 0 AND NOT attisdropped"
        " AND attname NOT LIKE '\\_\\_pgt%%' ORDER BY attnum"
    )
    assert types == [("id", "integer"), ("v", "integer")]
    refresh_and_check(db, "a.st_dom")
    as_analyst(db, "INSERT INTO a.t VALUES (300, 3)")
    as_analyst(db, "UPDATE a.t SET v = 20 WHERE id = 2")
    as_analyst(db, "DELETE FROM a.t WHERE id = 1")
    [outcome] = refresh_and_check(db, "a.st_dom")
    assert outcome.action.name == "DIFFERENTIAL", outcome.reason
    assert_not_escalated(db)


def test_a_composite_type_with_a_domain_inside_is_refused(attacker: Database) -> None:
    db = attacker
    as_analyst(db, "CREATE DOMAIN a.dom AS int CHECK (a.evil(VALUE))")
    as_analyst(db, "CREATE TYPE a.pair AS (x int, y a.dom)")
    as_analyst(db, "CREATE TABLE a.t (id int PRIMARY KEY, p a.pair, w a.dom[])")
    with pytest.raises(
        psycopg.errors.FeatureNotSupported, match="column p has type a.pair, which contains domain"
    ):
        as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_pair', 'SELECT id, p FROM a.t')")
    with pytest.raises(
        psycopg.errors.FeatureNotSupported, match=r"column w has type a.dom\[\], which contains"
    ):
        as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_pair', 'SELECT id, w FROM a.t')")
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    assert db.scalar("SELECT to_regclass('a.st_pair')") is None
    assert_not_escalated(db)


def test_a_source_renamed_and_replaced_by_a_view_is_not_read(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db = attacker
    as_analyst(db, "CREATE TABLE a.src (id int PRIMARY KEY, v int)")
    as_analyst(db, "INSERT INTO a.src SELECT g, g FROM generate_series(1, 200) g")
    as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_src', 'SELECT id, v FROM a.src')")
    refresh_and_check(db, "a.st_src")
    as_analyst(
        db,
        "CREATE FUNCTION a.f_evil() RETURNS TABLE (id int, v int) LANGUAGE plpgsql AS "
        f"$${EVIL_BODY} RETURN QUERY SELECT 99999, 99; END $$",
    )
    as_analyst(db, "ALTER TABLE a.src RENAME TO src_old")
    as_analyst(db, "CREATE VIEW a.src AS SELECT * FROM a.f_evil()")
    as_analyst(db, "INSERT INTO a.src_old VALUES (1006, 6)")
    [outcome] = refresh_and_check(db, "a.st_src")  # follows the OID to a.src_old
    assert outcome.action.name == "DIFFERENTIAL"
    assert db.scalar("SELECT count(*) FROM a.st_src WHERE id = 99999") == 0
    assert (
        db.scalar("SELECT source_name FROM pgtrickle.pgt_change_sources WHERE source_kind = 'TABLE'")
        == "src_old"
    )
    assert_not_escalated(db)


def test_a_schema_renamed_under_a_stream_table_leaves_the_impostor_untouched(
    attacker: Database, spark
) -> None:  # type: ignore[no-untyped-def]
    db = attacker
    as_analyst(db, "CREATE TABLE a.src (id int PRIMARY KEY, v int)")
    as_analyst(db, "INSERT INTO a.src SELECT g, g FROM generate_series(1, 5) g")
    as_analyst(
        db,
        "SELECT pgtrickle.create_stream_table('a.st_full', 'SELECT id, v FROM a.src', "
        "refresh_mode => 'FULL')",
    )
    refresh_and_check(db, "a.st_full")
    as_analyst(db, "ALTER SCHEMA a RENAME TO a_old")
    as_analyst(db, "CREATE SCHEMA a")
    as_analyst(db, "CREATE TABLE a.log (who name)")
    as_analyst(db, "GRANT INSERT ON a.log TO PUBLIC")
    as_analyst(
        db,
        "CREATE FUNCTION a.evil_trigger() RETURNS trigger LANGUAGE plpgsql AS "
        f"$${EVIL_BODY.replace('a.log', 'a.log')} RETURN NEW; END $$",
    )
    as_analyst(db, "CREATE TABLE a.st_full (id int, v int, __pgt_row_id bigint)")
    as_analyst(
        db,
        "CREATE TRIGGER t BEFORE INSERT OR DELETE OR UPDATE OR TRUNCATE ON a.st_full "
        "FOR EACH STATEMENT EXECUTE FUNCTION a.evil_trigger()",
    )
    as_analyst(db, "INSERT INTO a_old.src VALUES (6, 6)")
    [outcome] = refresh_and_check(db, "a_old.st_full")
    assert outcome.action.name == "FULL"
    assert db.scalar("SELECT count(*) FROM a_old.st_full") == 6
    assert db.scalar("SELECT pgt_schema FROM pgtrickle.pgt_stream_tables") == "a_old"
    assert db.scalar("SELECT count(*) FROM a.log") == 0  # the impostor's trigger never fired
    assert db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ANALYST,)) is False
    as_analyst(db, "SELECT pgtrickle.drop_stream_table('a_old.st_full')")
    assert db.scalar("SELECT to_regclass('a_old.st_full')") is None
    assert db.scalar("SELECT to_regclass('a.st_full')") is not None  # drop follows the OID, not the name


def test_row_level_security_that_applies_to_the_owner_is_refused(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db = attacker
    db.sql("CREATE TABLE public.docs (id int PRIMARY KEY, owner name, body text)")
    db.sql(f"INSERT INTO public.docs VALUES (1, '{ANALYST}', 'mine'), (2, 'bob', 'secret'), (3, 'eve', 'x')")
    db.sql("ALTER TABLE public.docs ENABLE ROW LEVEL SECURITY")
    db.sql("CREATE POLICY own ON public.docs USING (owner = current_user)")
    db.sql(f"GRANT SELECT ON public.docs TO {ANALYST}")
    db.sql(f"SET ROLE {ANALYST}")
    assert db.scalar("SELECT count(*) FROM public.docs") == 1
    db.sql("RESET ROLE")
    with pytest.raises(
        psycopg.errors.FeatureNotSupported, match="row-level security that applies to its owner"
    ):
        as_analyst(
            db, "SELECT pgtrickle.create_stream_table('a.st_docs', 'SELECT id, body FROM public.docs')"
        )
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    # Security enabled after creation stops the refreshes (contents unchanged) until it no longer applies.
    db.sql("ALTER TABLE public.docs DISABLE ROW LEVEL SECURITY")
    as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_docs', 'SELECT id, body FROM public.docs')")
    refresh_and_check(db, "a.st_docs")
    db.sql("ALTER TABLE public.docs ENABLE ROW LEVEL SECURITY")
    db.sql("INSERT INTO public.docs VALUES (4, 'eve', 'new')")
    with pytest.raises(PgTrickleError, match="row-level security that applies to its owner"):
        refresh(db, "a.st_docs")
    assert db.scalar("SELECT count(*) FROM a.st_docs") == 3
    db.sql(f"ALTER ROLE {ANALYST} BYPASSRLS")  # it sees every row now, as its stream table does
    refresh_and_check(db, "a.st_docs")
    assert db.scalar("SELECT count(*) FROM a.st_docs") == 4


def test_renames_of_sources_schemas_and_stream_tables_are_followed(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    db = attacker
    as_analyst(db, "CREATE TABLE a.src (id int PRIMARY KEY, g int, v int)")
    as_analyst(db, "INSERT INTO a.src SELECT i, i % 3, i FROM generate_series(1, 300) i")
    as_analyst(
        db,
        "SELECT pgtrickle.create_stream_table('a.totals', "
        "'SELECT g, sum(v) AS total, count(*) AS n FROM a.src GROUP BY g')",
    )
    refresh_and_check(db, "a.totals")
    as_analyst(db, "ALTER TABLE a.src RENAME TO source2")
    as_analyst(db, "INSERT INTO a.source2 VALUES (1000, 1, 10)")
    [outcome] = refresh_and_check(db, "a.totals")
    assert outcome.action.name == "DIFFERENTIAL"
    as_analyst(db, "ALTER SCHEMA a RENAME TO b")
    as_analyst(db, "UPDATE b.source2 SET v = v + 1 WHERE id IN (2, 5)")
    [outcome] = refresh_and_check(db, "b.totals")
    assert outcome.action.name == "DIFFERENTIAL"
    db.sql("ALTER TABLE b.totals RENAME TO totals2")  # its table is pgtrickle's
    as_analyst(db, "DELETE FROM b.source2 WHERE id = 1")
    [outcome] = refresh_and_check(db, "b.totals2")
    assert outcome.action.name == "DIFFERENTIAL"
    as_analyst(db, "SELECT pgtrickle.alter_stream_table('b.totals2', schedule => '5m')")
    assert db.sql("SELECT pgt_schema, pgt_name FROM pgtrickle.pgt_stream_tables") == [("b", "totals2")]
    assert db.sql("SELECT status FROM pgtrickle.pgt_stream_tables") == [("ACTIVE",)]


def test_a_pinned_relation_cannot_be_renamed_or_moved_until_the_transaction_ends(db: Database) -> None:
    db.sql("CREATE SCHEMA p")
    db.sql("CREATE TABLE p.t (id int)")
    relid = int(db.scalar("SELECT 'p.t'::regclass::oid::bigint"))  # type: ignore[arg-type]
    for mode, blocked in (
        (identity.READ, ("ALTER SCHEMA p RENAME TO q", "DROP SCHEMA p CASCADE")),
        (
            identity.WRITE,
            (
                "ALTER SCHEMA p RENAME TO q",
                "ALTER TABLE p.t RENAME TO u",
                "ALTER TABLE p.t SET SCHEMA public",
                "DROP SCHEMA p CASCADE",
            ),
        ),
    ):
        with psycopg.connect(db.dsn) as holder:
            identity.pin(holder, [identity.Pin(relid, "p", "t")], mode)
            with psycopg.connect(db.dsn, autocommit=True) as other:
                other.execute("SET lock_timeout = '300ms'")
                for ddl in blocked:
                    with pytest.raises(psycopg.errors.LockNotAvailable):
                        other.execute(ddl)
            holder.rollback()
    # A reading session locks and checks the tables itself (a coordinator holding their locks for
    # the whole job would deadlock with DDL that Spark's sessions queue behind).
    guard = identity.session_guard([identity.Pin(relid, "p", "t")])
    with psycopg.connect(db.dsn, autocommit=True) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + guard)
        with psycopg.connect(db.dsn, autocommit=True) as other:
            other.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("ALTER TABLE p.t RENAME TO u")
        reader.execute("ROLLBACK")
    # A stale name, a view in its place, a dropped table: refused before anything is read.
    db.sql("ALTER TABLE p.t RENAME TO u")
    with psycopg.connect(db.dsn) as conn:
        with pytest.raises(identity.RelationIdentityChanged, match="renamed to p.u"):
            identity.pin(conn, [identity.Pin(relid, "p", "t")], identity.READ)
    with psycopg.connect(db.dsn, autocommit=True) as reader:
        with pytest.raises(psycopg.errors.UndefinedTable):  # the name leads nowhere now
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + guard)
    db.sql("CREATE VIEW p.t AS SELECT 1 AS id")
    with psycopg.connect(db.dsn) as conn:
        with pytest.raises(identity.RelationIdentityChanged):
            identity.pin(conn, [identity.Pin(relid, "p", "t")], identity.READ)
    with psycopg.connect(db.dsn, autocommit=True) as reader:  # a view in its place: locked, never read
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="renamed or replaced"):
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + guard)
    db.sql("DROP TABLE p.u")
    with psycopg.connect(db.dsn) as conn:
        with pytest.raises(identity.RelationIdentityChanged, match="no longer exists"):
            identity.pin(conn, [identity.Pin(relid, "p", "u")], identity.WRITE)


def test_a_schema_rename_waits_for_a_running_refresh_to_end(
    attacker: Database,
    spark,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window between pinning a source and Spark's connections parsing its name is closed."""
    db = attacker
    as_analyst(db, "CREATE TABLE a.src (id int PRIMARY KEY, v int)")
    as_analyst(db, "INSERT INTO a.src SELECT g, g FROM generate_series(1, 50) g")
    as_analyst(
        db,
        "SELECT pgtrickle.create_stream_table('a.st_src', 'SELECT id, v FROM a.src', refresh_mode => 'FULL')",
    )
    from pgtrickle import faults

    entered, release = threading.Event(), threading.Event()

    def hold(name: str) -> None:
        if name == "refresh.spark_job":
            entered.set()
            release.wait(30)

    errors: list[BaseException] = []

    def run() -> None:
        try:
            refresh(db, "a.st_src")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    monkeypatch.setattr(faults, "point", hold)
    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert entered.wait(120)
        with psycopg.connect(db.dsn, autocommit=True) as other:
            other.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("ALTER SCHEMA a RENAME TO a_old")
    finally:
        release.set()
        worker.join(120)
    assert not errors, errors
    assert_oracle(db, "a.st_src")
    assert_not_escalated(db)


def test_upgrade_stores_existing_domain_columns_as_their_base_types(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    """Stream tables and buffers created by an older version hold domain-typed columns: migration 012
    changes them to the base type, and a column it could not change stops the refreshes."""
    from pgtrickle.catalog.install import install

    db = attacker
    as_analyst(db, "CREATE DOMAIN a.dom AS varchar(20) CHECK (a.evil(length(VALUE)))")
    as_analyst(db, "CREATE TABLE a.t (id int PRIMARY KEY, v a.dom)")
    as_analyst(db, "INSERT INTO a.t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_dom', 'SELECT id, v FROM a.t')")
    relid = db.scalar("SELECT 'a.t'::regclass::oid::bigint")
    # What an older version left: the domain type in the stream table and in the change buffer.
    db.sql(f"DROP VIEW pgtrickle_changes.changes_{relid}")
    db.sql(
        f"ALTER TABLE pgtrickle_changes.changes_{relid}_rows ALTER COLUMN new_v TYPE a.dom, "
        "ALTER COLUMN old_v TYPE a.dom"
    )
    db.sql(f"ALTER TABLE pgtrickle_changes.changes_{relid}_batches ALTER COLUMN v_v TYPE a.dom[]")
    db.sql(f"SELECT pgtrickle._build_buffer_view({relid})")
    db.sql("ALTER TABLE a.st_dom ALTER COLUMN v TYPE a.dom")
    with pytest.raises(PgTrickleError, match="domain"):
        refresh(db, "a.st_dom")
    db.sql("DELETE FROM pgtrickle.pgt_schema_version WHERE version = 12")
    install(db.conn)
    types = {
        r[0]: r[1]
        for r in db.sql(
            "SELECT attrelid::regclass::text || '.' || attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            f" WHERE attrelid IN ('a.st_dom'::regclass, 'pgtrickle_changes.changes_{relid}_rows'::regclass,"
            f" 'pgtrickle_changes.changes_{relid}_batches'::regclass) AND attname IN ('v', 'new_v', 'old_v', 'v_v')"
        )
    }
    assert types == {
        "a.st_dom.v": "character varying(20)",
        f"pgtrickle_changes.changes_{relid}_rows.new_v": "character varying(20)",
        f"pgtrickle_changes.changes_{relid}_rows.old_v": "character varying(20)",
        f"pgtrickle_changes.changes_{relid}_batches.v_v": "character varying(20)[]",
    }
    refresh_and_check(db, "a.st_dom")
    as_analyst(db, "INSERT INTO a.t VALUES (500, 'new')")
    as_analyst(db, "UPDATE a.t SET v = 'changed' WHERE id = 3")
    [outcome] = refresh_and_check(db, "a.st_dom")
    assert outcome.action.name == "DIFFERENTIAL"
    assert_not_escalated(db)


def test_a_cast_of_the_roles_own_type_never_runs_with_the_daemons_rights(attacker: Database, spark) -> None:  # type: ignore[no-untyped-def]
    """The capture trigger packs composite values as text and the buffer view casts them back: a cast
    the type's owner created must not run there (the trigger and the daemon have pgtrickle's rights)."""
    db = attacker
    as_analyst(db, "CREATE TYPE a.ct AS (x int, y text)")
    as_analyst(
        db,
        f"CREATE FUNCTION a.ct_to_text(a.ct) RETURNS text LANGUAGE plpgsql AS $${EVIL_BODY} "
        "RETURN 'hijacked'; END $$",
    )
    as_analyst(db, "CREATE CAST (a.ct AS text) WITH FUNCTION a.ct_to_text(a.ct)")
    as_analyst(db, "CREATE TABLE a.t (id int PRIMARY KEY, p a.ct)")
    as_analyst(db, "INSERT INTO a.t SELECT g, ROW(g, 'y' || g)::a.ct FROM generate_series(1, 100) g")
    as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_ct', 'SELECT id, p FROM a.t')")
    db.sql("DELETE FROM a.log")  # the role's own cast calls so far ran as itself
    refresh_and_check(db, "a.st_ct")
    db.sql("INSERT INTO a.t VALUES (500, ROW(5, 'five'))")  # as the superuser: the capture trigger packs it
    as_analyst(db, "DELETE FROM a.t WHERE id = 1")
    [outcome] = refresh_and_check(db, "a.st_ct")
    assert outcome.action.name == "DIFFERENTIAL"
    assert db.scalar("SELECT count(*) FROM a.st_ct WHERE (p).y = 'five'") == 1
    assert_not_escalated(db)
    # A cast *from* text would run when pgtrickle reads the buffer: refused.
    as_analyst(
        db,
        f"CREATE FUNCTION a.text_to_ct(text) RETURNS a.ct LANGUAGE plpgsql AS $${EVIL_BODY} "
        "RETURN NULL; END $$",
    )
    as_analyst(db, "CREATE CAST (text AS a.ct) WITH FUNCTION a.text_to_ct(text)")
    as_analyst(db, "CREATE TABLE a.u (id int PRIMARY KEY, p a.ct)")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="has a cast from text by a.text_to_ct"):
        as_analyst(db, "SELECT pgtrickle.create_stream_table('a.st_u', 'SELECT id, p FROM a.u')")
    assert_not_escalated(db)

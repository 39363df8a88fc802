"""Privileges and search_path safety of the SQL API (docs/SECURITY.md), on a real PostgreSQL.

Roles are cluster-wide, so every role here carries the test process id and is
dropped at the end. Each caller acts through SET ROLE on the superuser's
connection (pgtrickle acts for the role set), except where a real login matters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import Database
from pgtrickle.errors import PgTrickleError
from tests.integration.helpers import catalog_fingerprint, create_st, refresh, refresh_and_check

pytestmark = pytest.mark.integration

PID = os.getpid()
SAFE_PATH = "search_path=pg_catalog, pgtrickle, pg_temp"


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 3), g FROM generate_series(1, 10) g")
    return db


@pytest.fixture
def roles(shop: Database) -> Iterator[dict[str, str]]:
    """alice and bob (pgtrickle users), ada (pgtrickle admin), carol (no pgtrickle role), wally (a writer)."""
    names = {k: f"{k}_{PID}" for k in ("alice", "bob", "ada", "carol", "wally")}
    for name in names.values():
        shop.sql(f"DROP ROLE IF EXISTS {name}")
        shop.sql(f"CREATE ROLE {name}")
    shop.sql(f"GRANT pgtrickle_user TO {names['alice']}, {names['bob']}")
    shop.sql(f"GRANT pgtrickle_admin TO {names['ada']}")
    for key in ("alice", "bob", "carol"):
        shop.sql(f"GRANT CREATE, USAGE ON SCHEMA public TO {names[key]}")
        shop.sql(f"GRANT SELECT ON orders TO {names[key]}")
    shop.sql(f"GRANT SELECT, INSERT, UPDATE ON orders TO {names['wally']}")
    try:
        yield names
    finally:
        shop.sql("RESET ROLE")
        for name in names.values():
            shop.sql(f"DROP OWNED BY {name}")
            shop.sql(f"DROP ROLE {name}")


@contextmanager
def acting_as(db: Database, role: str) -> Iterator[None]:
    db.sql(f"SET ROLE {role}")
    try:
        yield
    finally:
        db.sql("RESET ROLE")


def _denied(
    db: Database, role: str, query: str, params: object = None
) -> psycopg.errors.InsufficientPrivilege:
    with acting_as(db, role), pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        db.sql(query, params)
    return info.value


# ------------------------------------------------------------------ search_path


def test_every_pgtrickle_function_runs_with_a_fixed_search_path(shop: Database) -> None:
    """Each function sets search_path (pg_catalog first, pg_temp last), or is a SQL-standard body
    (BEGIN ATOMIC), which is parsed at creation and cannot be redirected at call time."""
    rows = shop.sql(
        "SELECT n.nspname || '.' || p.proname, p.proconfig, p.prosqlbody IS NOT NULL, p.prosecdef"
        "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgtrickle'"
    )
    assert len(rows) > 60
    unsafe = []
    for name, config, atomic, _ in rows:
        paths = [c.split("=", 1)[1] for c in (config or []) if c.startswith("search_path=")]
        if atomic:
            continue
        if not paths:
            unsafe.append(name)
            continue
        parts = [p.strip() for p in paths[0].split(",")]
        if (
            parts[0] != "pg_catalog"
            or parts[-1] != "pg_temp"
            or not set(parts) <= {"pg_catalog", "pgtrickle", "pg_temp"}
        ):
            unsafe.append(f"{name}: {paths[0]}")
    assert unsafe == []
    # Every SECURITY DEFINER function is one of the checked API implementations.
    definers = sorted(name for name, _, _, secdef in rows if secdef)
    assert definers and all(
        n.startswith("pgtrickle._api_")
        or n
        in (
            "pgtrickle.advance_watermark",
            "pgtrickle.check_cdc_health",
            "pgtrickle.drop_watermark_group",
            "pgtrickle._on_sql_drop",
            "pgtrickle._on_ddl_end",
            "pgtrickle._on_rename",
        )
        for n in definers
    ), definers
    # The capture trigger functions write the buffers for any writer: definer rights, fixed path.
    create_st(shop, "s", "SELECT id FROM orders")
    capture = shop.sql(
        "SELECT prosecdef, proconfig FROM pg_proc WHERE pronamespace = 'pgtrickle_changes'::regnamespace"
    )
    assert capture == [(True, ["search_path=pg_catalog, pg_temp", "work_mem=128MB"])]


def _plant_hostile_objects(db: Database) -> None:
    """Functions, an operator and tables that stand in for what the API uses, in a schema searched
    before pg_catalog, and temporary tables shadowing catalog tables (pg_temp is searched first)."""
    db.sql("CREATE SCHEMA evil")
    for fn, args in (
        ("lower", "text"),
        ("upper", "text"),
        ("btrim", "text"),
        ("quote_ident", "text"),
        ("quote_literal", "text"),
        ("to_regclass", "text"),
        ("now", ""),
        ("current_schema", ""),
        ("nextval", "regclass"),
        ("pg_notify", "text, text"),
        ("parse_ident", "text, boolean"),
        ("has_table_privilege", "oid, text"),
    ):
        ret = {
            "now": "timestamptz",
            "to_regclass": "regclass",
            "nextval": "bigint",
            "pg_notify": "void",
            "parse_ident": "text[]",
            "has_table_privilege": "boolean",
            "current_schema": "name",
        }.get(fn, "text")
        db.sql(
            f"CREATE FUNCTION evil.{fn}({args}) RETURNS {ret} LANGUAGE plpgsql AS "
            f"$$BEGIN RAISE EXCEPTION 'hijacked: {fn}'; END$$"
        )
    db.sql(
        "CREATE FUNCTION evil.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'hijacked: text = text'; END$$"
    )
    db.sql("CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.text_eq)")
    db.sql(
        "CREATE FUNCTION evil.bigint_eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'hijacked: bigint = bigint'; END$$"
    )
    db.sql("CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.bigint_eq)")
    db.sql("CREATE TABLE evil.pgt_stream_tables (pgt_id bigint)")
    _plant_temp_tables(db)


def _plant_temp_tables(db: Database) -> None:
    db.sql('CREATE TEMP TABLE pg_class (oid oid, relname name, relnamespace oid, relkind "char")')
    db.sql("CREATE TEMP TABLE pg_namespace (oid oid, nspname name)")
    db.sql("CREATE TEMP TABLE pg_attribute (attrelid oid, attname name, attnum int2)")
    db.sql("CREATE TEMP TABLE pg_trigger (tgrelid oid, tgname name)")


def test_hostile_functions_operators_and_tables_do_not_hijack_the_api(shop: Database, spark) -> None:  # type: ignore[no-untyped-def]
    shop.sql("CREATE TABLE loads (id int PRIMARY KEY, v int)")
    shop.sql("CREATE TABLE loads2 (id int PRIMARY KEY, v int)")
    _plant_hostile_objects(shop)
    shop.sql("SET search_path = public, evil, pg_catalog")
    # The hostile objects are live: unprotected SQL in this session would run them.
    for probe, what in (
        ("SELECT lower('X')", "lower"),
        ("SELECT 'a'::text = 'a'::text", "text = text"),
        ("SELECT 1::bigint = 1::bigint", "bigint = bigint"),
        ("SELECT now()", "now"),
    ):
        with pytest.raises(psycopg.errors.RaiseException, match=f"hijacked: {what}"):
            shop.sql(probe)
    assert shop.scalar("SELECT count(*) FROM pg_class") == 0  # the temp table, not the catalog
    # The API is unaffected: every call below goes through names, operators and catalog tables.
    create_st(
        shop,
        "by_customer",
        "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer",
        schedule="1m",
        refresh_mode="DIFFERENTIAL",
    )
    create_st(shop, "public.big", "SELECT id, amount FROM orders WHERE amount > 5", refresh_mode="FULL")
    shop.sql(
        "SELECT pgtrickle.alter_stream_table('by_customer', schedule => '2m', circuit_breaker => 'none')"
    )
    shop.sql("SELECT pgtrickle.refresh_stream_table('big')")
    shop.sql("SELECT pgtrickle.set_user_triggers('big', 'off')")
    assert shop.sql("SELECT configured_mode FROM pgtrickle.explain_refresh_mode('by_customer')") == [
        ("DIFFERENTIAL",)
    ]
    assert shop.sql("SELECT * FROM pgtrickle.get_refresh_history('big')") == []
    assert shop.scalar("SELECT pgtrickle.get_staleness('big') IS NULL")
    shop.sql("SELECT pgtrickle.advance_watermark('loads', '2026-01-01 00:00+00')")
    shop.sql("SELECT pgtrickle.create_watermark_group('g', ARRAY['loads', 'loads2'], tolerance => '1 hour')")
    shop.sql("SELECT pgtrickle.alter_watermark_group('g', tolerance => '2 hours')")
    assert shop.sql("SELECT source FROM pgtrickle.watermarks()") == [("public.loads",)]
    assert len(shop.sql("SELECT * FROM pgtrickle.watermark_history('loads')")) == 1
    shop.sql("SELECT pgtrickle.drop_watermark_group('g')")
    shop.sql("SELECT pgtrickle.advance_watermark('loads2'::regclass, '2026-01-01 00:00+00')")
    shop.sql("SELECT pgtrickle.set_cdc_mode('orders', 'trigger')")
    shop.sql("SELECT pgtrickle.reset_circuit_breaker('big')")  # not open: a notice, nothing to do
    assert shop.sql("SELECT * FROM pgtrickle.inspect_circuit_breaker('big')") == []
    shop.sql("SELECT pgtrickle.publish_stream_table('big', 'big_pub')")
    assert shop.sql("SELECT pubname FROM pg_catalog.pg_publication") == [("big_pub",)]
    assert len(shop.sql("SELECT * FROM pgtrickle.check_cdc_health()")) == 1
    assert len(shop.sql("SELECT * FROM pgtrickle.circuit_breaker_status()")) == 2
    assert shop.sql("SELECT name, schedule FROM pgtrickle.stream_tables_info ORDER BY 1") == [
        ("public.big", "1m"),
        ("public.by_customer", "2m"),
    ]
    # Capture triggers and refreshes work from this session too.
    shop.sql("INSERT INTO orders VALUES (11, 'c9', 11)")
    shop.sql("UPDATE orders SET amount = amount + 1 WHERE id <= 3")
    # (The oracle below is plain SQL of the test's own, not the API: give it a clean session.)
    shop.sql("RESET search_path")
    shop.sql("DISCARD TEMP")
    refresh_and_check(shop, "by_customer", "big")
    _plant_temp_tables(shop)
    shop.sql("SET search_path = public, evil, pg_catalog")
    shop.sql("SELECT pgtrickle.drop_stream_table('by_customer')")
    shop.sql("SELECT pgtrickle.drop_stream_table('big')")
    shop.sql("RESET search_path")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    assert shop.scalar("SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = 'orders'::regclass") == 0


def test_unqualified_names_still_follow_the_callers_search_path(shop: Database) -> None:
    """The fixed search_path applies inside the API; the names a caller passes mean what they mean to the caller."""
    shop.sql("CREATE SCHEMA app")
    shop.sql("CREATE TABLE app.items (id int PRIMARY KEY, n int)")
    shop.sql("SET search_path = app, public")
    try:
        create_st(shop, "item_totals", "SELECT id, n FROM items")  # created in app, reading app.items
        assert shop.scalar("SELECT name FROM pgtrickle.stream_tables_info") == "app.item_totals"
        shop.sql("SELECT pgtrickle.alter_stream_table('item_totals', schedule => '5m')")
        shop.sql("SELECT pgtrickle.drop_stream_table('item_totals')")
    finally:
        shop.sql("RESET search_path")
    with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist"):
        shop.sql("SELECT pgtrickle.drop_stream_table('item_totals')")


def test_hostile_identifiers_are_quoted_end_to_end(shop: Database, spark) -> None:  # type: ignore[no-untyped-def]
    """Schema, table and column names with quotes, semicolons, dots, spaces and mixed case: create, capture,
    refresh on Spark, check, drop."""
    shop.sql('CREATE SCHEMA "s.""; DROP SCHEMA public CASCADE; --"')
    src = '"s.""; DROP SCHEMA public CASCADE; --"."T ""x""; DELETE FROM orders"'
    shop.sql(f'CREATE TABLE {src} ("Id" int PRIMARY KEY, "v"";--" int, "Group Name" text)')
    shop.sql(f"INSERT INTO {src} SELECT g, g * 10, 'g' || (g % 2) FROM generate_series(1, 6) g")
    st = '"s.""; DROP SCHEMA public CASCADE; --"."Sum ""; TRUNCATE orders; --"'
    create_st(
        shop,
        st,
        f'SELECT "Group Name", count(*) AS "n;", sum("v"";--") AS "Total ""v""" FROM {src} '
        'GROUP BY "Group Name"',
        refresh_mode="DIFFERENTIAL",
    )
    refresh_and_check(shop, st)
    shop.sql(f'UPDATE {src} SET "v"";--" = 0 WHERE "Id" = 1')
    shop.sql(f'DELETE FROM {src} WHERE "Id" = 2')
    refresh_and_check(shop, st)
    shop.sql("SELECT pgtrickle.drop_stream_table(%s)", (st,))
    assert shop.scalar("SELECT count(*) FROM orders") == 10
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_change_sources") == 0


# ------------------------------------------------------------------ roles


def test_install_creates_the_nologin_roles(shop: Database) -> None:
    rows = shop.sql("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'pgtrickle\\_%' ORDER BY 1")
    assert rows == [("pgtrickle_admin", False), ("pgtrickle_user", False)]
    assert shop.scalar("SELECT pg_has_role('pgtrickle_admin', 'pgtrickle_user', 'MEMBER')")
    # Nobody else may touch pgtrickle's schemas.
    # Anyone may look up the API (each function checks its caller); the tables and buffers are another matter.
    assert shop.scalar("SELECT has_schema_privilege('public', 'pgtrickle', 'USAGE')") is True
    assert (
        shop.scalar("SELECT has_table_privilege('public', 'pgtrickle.pgt_stream_tables', 'SELECT')") is False
    )
    assert shop.scalar("SELECT has_schema_privilege('public', 'pgtrickle_changes', 'USAGE')") is False


def test_a_pgtrickle_user_owns_its_stream_table_and_reading_follows_grants(
    shop: Database, roles: dict[str, str], spark
) -> None:  # type: ignore[no-untyped-def]
    alice, bob = roles["alice"], roles["bob"]
    with acting_as(shop, alice):
        create_st(shop, "alice_totals", "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer")
    # alice owns it in pgtrickle's terms; the table itself stays pgtrickle's, so that alice cannot make the
    # daemon's writes run her code (triggers, rules, index expressions, checks need the table's owner).
    assert shop.scalar("SELECT created_by FROM pgtrickle.pgt_stream_tables") == alice
    assert shop.sql("SELECT tableowner FROM pg_tables WHERE tablename = 'alice_totals'") == [("postgres",)]
    shop.sql(f"GRANT CREATE ON SCHEMA public TO {alice}")
    with acting_as(shop, alice):
        shop.sql(
            "CREATE FUNCTION public.alices_trigger() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN RAISE NOTICE 'running as %', current_user; RETURN NULL; END$$"
        )
    for ddl in (
        "CREATE TRIGGER t AFTER INSERT ON alice_totals FOR EACH ROW EXECUTE FUNCTION public.alices_trigger()",
        "CREATE INDEX ON alice_totals ((customer || 'x'))",
        "CREATE RULE r AS ON INSERT TO alice_totals DO ALSO NOTIFY x",
        "ALTER TABLE alice_totals ADD CHECK (total > 0)",
    ):
        _denied(shop, alice, ddl)
    refresh_and_check(shop, "alice_totals")  # the daemon maintains it
    with acting_as(shop, alice):
        assert len(shop.sql("SELECT * FROM alice_totals")) == 3
    # bob may see that it exists (the catalog), not what it holds.
    with acting_as(shop, bob):
        assert shop.scalar("SELECT name FROM pgtrickle.stream_tables_info") == "public.alice_totals"
    err = _denied(shop, bob, "SELECT * FROM alice_totals")
    assert "permission denied for table alice_totals" in str(err)
    with acting_as(shop, alice):
        shop.sql(f"GRANT SELECT ON alice_totals TO {bob}")
    with acting_as(shop, bob):
        assert len(shop.sql("SELECT * FROM alice_totals")) == 3
    # Neither PUBLIC nor bob got anything else.
    assert (
        shop.scalar(
            f"SELECT has_table_privilege('{bob}', 'alice_totals', 'INSERT, UPDATE, DELETE, TRUNCATE')"
        )
        is False
    )


def test_only_the_owner_or_an_admin_may_change_a_stream_table(shop: Database, roles: dict[str, str]) -> None:
    alice, bob, ada = roles["alice"], roles["bob"], roles["ada"]
    with acting_as(shop, alice):
        create_st(shop, "mine", "SELECT id, amount FROM orders")
    before = catalog_fingerprint(shop)
    for call, what in (
        ("SELECT pgtrickle.alter_stream_table('mine', schedule => '5m')", "alter"),
        ("SELECT pgtrickle.refresh_stream_table('mine')", "refresh"),
        ("SELECT pgtrickle.drop_stream_table('mine')", "drop"),
        ("SELECT pgtrickle.resume_stream_table('mine')", "resume"),
        ("SELECT pgtrickle.reset_circuit_breaker('mine')", "reset the circuit breaker of"),
        ("SELECT * FROM pgtrickle.inspect_circuit_breaker('mine')", "inspect the circuit breaker of"),
        ("SELECT pgtrickle.set_user_triggers('mine', 'on')", "change the user triggers of"),
        ("SELECT pgtrickle.publish_stream_table('mine', 'p')", "publish"),
    ):
        err = _denied(shop, bob, call)
        assert f"role {bob} may not {what} stream table public.mine, which is owned by {alice}" in str(err), (
            call
        )
        assert "pgtrickle_admin" in (err.diag.message_hint or "")
        assert catalog_fingerprint(shop) == before, call
    # Nor behind the API's back: the catalog and the change buffers are pgtrickle's own.
    for sql in (
        "UPDATE pgtrickle.pgt_stream_tables SET schedule = '1s'",
        "DELETE FROM pgtrickle.pgt_refresh_requests",
        "INSERT INTO pgtrickle.pgt_refresh_requests (pgt_id, kind) VALUES (1, 'REFRESH')",
        "SELECT * FROM pgtrickle.pgt_quarantine",
        "SELECT * FROM pgtrickle_changes.changes_" + str(shop.scalar("SELECT 'orders'::regclass::oid")),
        f"SELECT * FROM {shop.scalar('SELECT def_view::regclass::text FROM pgtrickle.pgt_stream_tables')}",
    ):
        _denied(shop, alice, sql)
    assert catalog_fingerprint(shop) == before
    # The owner may; so may an admin, who owns nothing.
    with acting_as(shop, alice):
        shop.sql("SELECT pgtrickle.alter_stream_table('mine', schedule => '5m')")
        shop.sql("SELECT pgtrickle.refresh_stream_table('mine')")
    with acting_as(shop, ada):
        shop.sql("SELECT pgtrickle.alter_stream_table('mine', schedule => '7m')")
        shop.sql("SELECT pgtrickle.drop_stream_table('mine')")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0


def test_drop_cascade_follows_postgresql(shop: Database, roles: dict[str, str]) -> None:
    """As DROP TABLE ... CASCADE: the owner of a stream table may drop those built on it; not the reverse."""
    alice, bob = roles["alice"], roles["bob"]
    with acting_as(shop, alice):
        create_st(shop, "base", "SELECT id, amount FROM orders")
        shop.sql(f"GRANT SELECT ON base TO {bob}")
    with acting_as(shop, bob):
        create_st(shop, "downstream", "SELECT count(*) AS n FROM base")
    before = catalog_fingerprint(shop)
    err = _denied(shop, bob, "SELECT pgtrickle.drop_stream_table('base', cascade => true)")
    assert f"may not drop stream table public.base, which is owned by {alice}" in str(err)
    assert catalog_fingerprint(shop) == before
    with acting_as(shop, alice):
        shop.sql("SELECT pgtrickle.drop_stream_table('base', cascade => true)")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0


def test_creating_needs_pgtrickle_user_select_and_create_in_the_schema(
    shop: Database, roles: dict[str, str]
) -> None:
    carol, bob = roles["carol"], roles["bob"]
    before = catalog_fingerprint(shop)
    err = _denied(shop, carol, "SELECT pgtrickle.create_stream_table('c', 'SELECT id FROM orders')")
    assert f"role {carol} may not create stream tables" in str(err)
    assert f"GRANT pgtrickle_user TO {carol};" in (err.diag.message_hint or "")
    shop.sql("CREATE SCHEMA locked")
    err = _denied(shop, bob, "SELECT pgtrickle.create_stream_table('locked.b', 'SELECT id FROM orders')")
    assert f"role {bob} may not create tables in schema locked" in str(err)
    assert f"GRANT CREATE ON SCHEMA locked TO {bob}" in (err.diag.message_hint or "")
    # A function the caller owns would run with pgtrickle's rights: refused, for anyone but a superuser's.
    shop.sql(f"GRANT CREATE ON SCHEMA public TO {bob}")
    with acting_as(shop, bob):
        shop.sql("CREATE FUNCTION public.bobs_fn(int) RETURNS int LANGUAGE sql AS 'SELECT $1 + 1'")
    err = _denied(
        shop, bob, "SELECT pgtrickle.create_stream_table('b', 'SELECT public.bobs_fn(id) AS x FROM orders')"
    )
    assert "calls public.bobs_fn(integer), which is owned by" in str(err)
    assert catalog_fingerprint(shop)[0] == before[0]


def test_configuration_needs_pgtrickle_admin(shop: Database, roles: dict[str, str]) -> None:
    bob, ada = roles["bob"], roles["ada"]
    shop.sql("CREATE TABLE feed_a (id int)")
    shop.sql("CREATE TABLE feed_b (id int)")
    shop.sql(f"GRANT SELECT ON feed_a, feed_b TO {bob}")
    err = _denied(shop, bob, "UPDATE pgtrickle.pgt_settings SET value = '5s' WHERE name = 'default_schedule'")
    assert "permission denied for table pgt_settings" in str(err)
    for call, what in (
        (
            "SELECT pgtrickle.create_watermark_group('g', ARRAY['feed_a', 'feed_b'])",
            "create watermark groups",
        ),
        ("SELECT pgtrickle.set_cdc_mode('orders', 'wal')", "change the change capture mode"),
    ):
        err = _denied(shop, bob, call)
        assert f"only members of pgtrickle_admin may {what}" in str(err), call
        assert f"GRANT pgtrickle_admin TO {bob};" in (err.diag.message_hint or "")
    with acting_as(shop, ada):
        shop.sql("UPDATE pgtrickle.pgt_settings SET value = '5s' WHERE name = 'default_schedule'")
        shop.sql("SELECT pgtrickle.create_watermark_group('g', ARRAY['feed_a', 'feed_b'])")
    err = _denied(shop, bob, "SELECT pgtrickle.drop_watermark_group('g')")
    assert "only members of pgtrickle_admin may drop watermark groups" in str(err)
    # A watermark is said by the source's loader (who may write it) or an admin.
    err = _denied(shop, bob, "SELECT pgtrickle.advance_watermark('feed_a', now())")
    assert f"role {bob} may not advance the watermark of public.feed_a, which it may not write" in str(err)
    shop.sql(f"GRANT INSERT ON feed_a TO {bob}")
    with acting_as(shop, bob):
        shop.sql("SELECT pgtrickle.advance_watermark('feed_a', now())")
        shop.sql("SELECT pgtrickle.advance_watermark('feed_a'::regclass, now() + interval '1 minute')")
    with acting_as(shop, ada):
        shop.sql("SELECT pgtrickle.advance_watermark('feed_b', now())")
        shop.sql("SELECT pgtrickle.drop_watermark_group('g')")


def test_a_writer_without_pgtrickle_rights_is_still_captured(
    shop: Database, roles: dict[str, str], pg_server
) -> None:  # type: ignore[no-untyped-def]
    """The capture trigger writes the change buffer with pgtrickle's rights: a role that may only write
    the source (logged in as itself, not through SET ROLE) needs nothing of pgtrickle."""
    wally = roles["wally"]
    create_st(shop, "s", "SELECT id, amount FROM orders")
    shop.sql(f"ALTER ROLE {wally} LOGIN PASSWORD 'wally-pw'")
    params = conninfo_to_dict(shop.dsn)
    params.update(user=wally, password="wally-pw")
    with psycopg.connect(make_conninfo("", **params), autocommit=True) as conn:
        conn.execute("INSERT INTO orders VALUES (42, 'w', 1)")
        conn.execute("UPDATE orders SET amount = 2 WHERE id = 42")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pgtrickle.refresh_stream_table('s')")
    buffer = shop.scalar(
        "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_relid = 'orders'::regclass"
    )
    assert shop.sql(f"SELECT action, new_id FROM pgtrickle_changes.{buffer} ORDER BY change_id") == [
        ("I", 42),
        ("U", 42),
    ]


# ------------------------------------------------------------------ passwords


def _cli(dsn: str, *args: str, tmp: str) -> subprocess.CompletedProcess[str]:
    """``pgtrickle`` in a process of its own, so its stderr includes the Spark JVM's."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "PGTRICKLE_DATA_DIR": tmp,
        "PGTRICKLE_SPARK_MASTER": "local[1]",
        "COLUMNS": "250",
    }
    env.pop("PGTRICKLE_DSN", None)
    return subprocess.run(
        [sys.executable, "-m", "pgtrickle", "--verbose", "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp,
        check=False,
    )


def test_passwords_never_appear_in_output_logs_errors_or_the_catalog(shop: Database, tmp_path: Path) -> None:
    params = conninfo_to_dict(shop.dsn)
    password = str(params["password"])
    assert len(password) >= 8
    # 1. A wrong password: psycopg's connection error.
    wrong = "Wr0ng-" + password[::-1]
    result = _cli(make_conninfo("", **{**params, "password": wrong}), "status", tmp=str(tmp_path))
    assert result.returncode == 1
    assert "password authentication failed" in result.stderr
    assert wrong not in result.stdout + result.stderr
    # 2. A DSN that reaches PostgreSQL (hostaddr) while Spark's JDBC connection fails (host does not
    #    resolve): the failure travels through the JVM, Py4J, the refresh engine, the catalog, the logs.
    create_st(shop, "s", "SELECT id, amount FROM orders")
    jdbc_breaking = make_conninfo(
        "", **{**params, "host": "pgtrickle-no-such-host.invalid", "hostaddr": "127.0.0.1"}
    )
    result = _cli(jdbc_breaking, "refresh", "s", tmp=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "refresh of public.s failed" in output
    assert "FAILED_JDBC.CONNECTION" in output, output[-3000:]  # it did reach Spark's JDBC connection
    assert password not in output
    status = _cli(jdbc_breaking, "status", tmp=str(tmp_path))
    assert status.returncode == 0 and "public.s" in status.stdout
    assert password not in status.stdout + status.stderr
    recorded = shop.sql(
        "SELECT coalesce(last_error, '') FROM pgtrickle.pgt_stream_tables"
        " UNION ALL SELECT coalesce(error_message, '') FROM pgtrickle.pgt_refresh_history"
        " UNION ALL SELECT payload::text FROM pgtrickle.alerts"
    )
    assert any(r[0] for r in recorded)
    assert all(password not in r[0] for r in recorded)
    # Spark's own work files and logs in the data directory do not hold it either.
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert password not in path.read_text(errors="replace"), path


def test_a_source_owner_without_catalog_rights_can_still_alter_and_drop_its_table(
    shop: Database, roles: dict[str, str]
) -> None:
    """DDL on a source fires pgtrickle's event triggers, which keep the catalog in step with pgtrickle's rights."""
    alice = roles["alice"]
    with acting_as(shop, alice):
        shop.sql("CREATE TABLE alice_src (id int PRIMARY KEY, v int)")
        shop.sql("INSERT INTO alice_src VALUES (1, 10)")
        create_st(shop, "alice_st", "SELECT id, v FROM alice_src")
        shop.sql("ALTER TABLE alice_src RENAME COLUMN v TO value")
        shop.sql("INSERT INTO alice_src VALUES (2, 20)")
        shop.sql("DROP TABLE alice_src CASCADE")
    status, error = shop.sql("SELECT status, last_error FROM pgtrickle.pgt_stream_tables")[0]
    assert status == "ERROR" and "was dropped" in error
    with acting_as(shop, alice):
        shop.sql("SELECT pgtrickle.drop_stream_table('alice_st')")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_change_sources") == 0


def test_a_revoked_source_stops_the_refreshes_until_granted_again(
    shop: Database, roles: dict[str, str], spark
) -> None:  # type: ignore[no-untyped-def]
    """The daemon's rights never become the owner's: losing SELECT on a source after creation fails the
    refresh (as REFRESH MATERIALIZED VIEW would) instead of showing the owner new rows it may not read."""
    alice = roles["alice"]
    with acting_as(shop, alice):
        create_st(shop, "alice_totals", "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer")
    refresh_and_check(shop, "alice_totals")
    before = shop.sql("SELECT * FROM alice_totals ORDER BY 1")
    shop.sql(f"REVOKE SELECT ON orders FROM {alice}")
    shop.sql("INSERT INTO orders VALUES (100, 'c9', 1000)")
    with pytest.raises(
        PgTrickleError,
        match=f"{alice}, the owner of stream table public.alice_totals, may no "
        "longer read public.orders; GRANT SELECT ON public.orders",
    ):
        refresh(shop, "alice_totals")
    assert shop.sql("SELECT * FROM alice_totals ORDER BY 1") == before
    assert shop.scalar("SELECT consecutive_errors FROM pgtrickle.pgt_stream_tables") == 1
    shop.sql(f"GRANT SELECT (customer, amount) ON orders TO {alice}")  # the columns it reads are enough
    refresh_and_check(shop, "alice_totals")


WHOLE_ROW_QUERIES = [
    "SELECT o::text AS r FROM orders o",
    "SELECT o AS r FROM orders o",
    "SELECT o.id, o::text AS r FROM orders o",
    "SELECT id, row_to_json(orders) AS r FROM orders",
    "SELECT o.id, to_jsonb(o) AS r FROM orders o",
    "SELECT id FROM orders o WHERE o::text LIKE '%c1%'",
    "SELECT o.id, (SELECT count(*) FROM orders i WHERE i::text <> o.id::text) AS n FROM orders o",
    "SELECT x.id, x.r FROM (SELECT o.id, o AS r FROM orders o) x",
    "SELECT o.id, hashtext(o.*::text) AS h FROM orders o",
    "SELECT id FROM orders o GROUP BY id, o",
    "SELECT o.id, o.ctid::text AS t FROM orders o",
]


@pytest.mark.parametrize("query", WHOLE_ROW_QUERIES)
def test_a_whole_row_reference_needs_select_on_every_column(
    shop: Database, roles: dict[str, str], query: str
) -> None:
    """Column privileges: a whole-row reference (or a system column) reads columns beyond those named."""
    bob = roles["bob"]
    shop.sql(f"REVOKE SELECT ON orders FROM {bob}")
    shop.sql(f"GRANT SELECT (id, customer) ON orders TO {bob}")
    before = catalog_fingerprint(shop)
    err = _denied(shop, bob, "SELECT pgtrickle.create_stream_table('peek', %s)", (query,))
    assert f"role {bob} may not read public.orders" in str(err)
    assert catalog_fingerprint(shop) == before
    # PostgreSQL itself agrees: the same query run by bob is refused.
    _denied(shop, bob, query)


def test_column_privileges_still_allow_the_columns_granted(
    shop: Database, roles: dict[str, str], spark
) -> None:  # type: ignore[no-untyped-def]
    bob = roles["bob"]
    shop.sql(f"REVOKE SELECT ON orders FROM {bob}")
    shop.sql(f"GRANT SELECT (id, customer) ON orders TO {bob}")
    with acting_as(shop, bob):
        create_st(shop, "mine", "SELECT o.id, o.customer FROM orders o WHERE o.id > 2", schedule="1m")
        create_st(
            shop,
            "per_customer",
            "SELECT customer, count(*) AS n FROM orders GROUP BY customer",
            schedule="1m",
        )
    refresh_and_check(shop, "mine", "per_customer")
    # Once bob may read every column, a whole-row reference is his to make.
    shop.sql(f"GRANT SELECT (amount) ON orders TO {bob}")
    with acting_as(shop, bob):
        create_st(shop, "rows", "SELECT o.id, o::text AS r FROM orders o", schedule="1m", initialize=False)


def test_revoking_a_column_stops_the_refreshes_of_a_whole_row_reader(
    shop: Database, roles: dict[str, str], spark
) -> None:  # type: ignore[no-untyped-def]
    bob = roles["bob"]
    with acting_as(shop, bob):
        create_st(shop, "rows", "SELECT o.id, o::text AS r FROM orders o", schedule="1m", initialize=False)
    shop.sql(f"REVOKE SELECT ON orders FROM {bob}")
    shop.sql(f"GRANT SELECT (id, customer) ON orders TO {bob}")
    shop.sql("UPDATE orders SET amount = amount + 1 WHERE id = 1")
    with pytest.raises(
        PgTrickleError, match=f"{bob}, the owner of stream table public.rows, may no longer read"
    ):
        refresh(shop, "rows")

"""The SQL API on a real PostgreSQL: create / alter / drop, and bad input.

No Spark here: these are the catalog's rules. Every bad input must raise a
clear error and leave the catalog (and the database's relations, triggers and
capture functions) exactly as it was.
"""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.conftest import Database
from tests.integration.helpers import create_st, catalog_fingerprint

pytestmark = pytest.mark.integration


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric)")
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 3), g FROM generate_series(1, 10) g")
    return db


def test_create_records_catalog_storage_and_capture(shop: Database) -> None:
    create_st(
        shop,
        "order_summary",
        "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer",
        schedule="30s",
    )
    info = shop.sql(
        "SELECT name, status, refresh_mode, schedule, needs_reinit FROM pgtrickle.stream_tables_info"
    )
    assert info == [("public.order_summary", "INITIALIZING", "AUTO", "30s", True)]
    cols = shop.sql(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'order_summary'::regclass AND attnum > 0 ORDER BY attnum"
    )
    assert cols == [("customer", "text"), ("total", "numeric"), ("__pgt_row_id", "bigint")]
    deps = shop.sql(
        "SELECT c.source_name, c.source_kind, d.columns_used FROM pgtrickle.pgt_dependencies d "
        "JOIN pgtrickle.pgt_change_sources c USING (source_relid)"
    )
    assert deps == [("orders", "TABLE", ["amount", "customer"])]
    triggers = {r[0] for r in shop.sql("SELECT tgname FROM pg_trigger WHERE tgrelid = 'orders'::regclass")}
    assert triggers == {"pgt_capture_ins", "pgt_capture_upd", "pgt_capture_del", "pgt_capture_trunc"}
    assert shop.sql("SELECT kind FROM pgtrickle.pgt_refresh_requests") == [("INITIALIZE",)]


def test_capture_records_inserts_updates_deletes_truncate_with_xids(shop: Database) -> None:
    create_st(shop, "s", "SELECT customer, amount FROM orders")
    buffer = shop.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'")
    shop.sql("INSERT INTO orders VALUES (100, 'x', 1), (101, 'y', 2)")
    shop.sql("UPDATE orders SET amount = amount * 2 WHERE id = 100")
    shop.sql("UPDATE orders SET id = 200 WHERE id = 101")  # key change: a delete and an insert
    shop.sql("DELETE FROM orders WHERE id = 1")
    shop.sql("TRUNCATE orders")
    rows = shop.sql(
        f"SELECT action, new_id, old_id, new_amount, old_amount, xid::text::bigint "
        f"FROM pgtrickle_changes.{buffer} ORDER BY change_id"
    )
    actions = [(r[0], r[1], r[2]) for r in rows]
    assert actions[:2] == [("I", 100, None), ("I", 101, None)]
    assert actions[2] == ("U", 100, 100)
    assert sorted(actions[3:5], key=str) == sorted([("D", None, 101), ("I", 200, None)], key=str)
    assert actions[5] == ("D", None, 1)
    assert actions[6] == ("T", None, None)
    xids = [r[5] for r in rows]
    assert xids == sorted(xids) and len(set(xids)) == 5  # one xid per statement's transaction


def test_schema_qualified_and_quoted_names(shop: Database) -> None:
    shop.sql('CREATE SCHEMA "Weird Schema"')
    shop.sql('CREATE TABLE "Weird Schema"."Odd ""Table"" ; --" ("Col; DROP" int, "MiXeD" text)')
    name = '"Weird Schema"."Summary; DROP TABLE orders; --"'
    create_st(
        shop,
        name,
        'SELECT "MiXeD", count(*) AS n, sum("Col; DROP") AS s '
        'FROM "Weird Schema"."Odd ""Table"" ; --" GROUP BY "MiXeD"',
    )
    assert shop.scalar("SELECT name FROM pgtrickle.stream_tables_info") == name
    assert shop.scalar("SELECT to_regclass('orders') IS NOT NULL")
    shop.sql("SELECT pgtrickle.alter_stream_table(%s, schedule => '5m')", (name,))
    shop.sql("SELECT pgtrickle.drop_stream_table(%s)", (name,))
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0


def test_alter_changes_schedule_mode_status(shop: Database) -> None:
    create_st(shop, "s", "SELECT id FROM orders")
    shop.sql("SELECT pgtrickle.alter_stream_table('s', schedule => '*/5 * * * *', refresh_mode => 'full')")
    shop.sql("SELECT pgtrickle.alter_stream_table('s', status => 'suspended')")
    assert shop.sql("SELECT schedule, refresh_mode, status FROM pgtrickle.pgt_stream_tables") == [
        ("*/5 * * * *", "FULL", "SUSPENDED")
    ]
    shop.sql("SELECT pgtrickle.alter_stream_table('s', status => 'ACTIVE')")
    assert shop.scalar("SELECT status FROM pgtrickle.pgt_stream_tables") == "INITIALIZING"


def test_drop_removes_capture_only_when_unused(shop: Database) -> None:
    create_st(shop, "a", "SELECT id, amount FROM orders")
    create_st(shop, "b", "SELECT customer FROM orders")
    shop.sql("SELECT pgtrickle.drop_stream_table('a')")
    assert shop.scalar("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass") == 4
    shop.sql("SELECT pgtrickle.drop_stream_table('b')")
    assert shop.scalar("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass") == 0
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_change_sources") == 0
    assert (
        shop.scalar(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'pgtrickle_changes'"
        )
        == 0
    )


def test_drop_refuses_with_dependents_unless_cascade(shop: Database) -> None:
    create_st(shop, "a", "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer")
    create_st(shop, "b", "SELECT customer FROM a WHERE total > 1")
    create_st(shop, "c", "SELECT count(*) AS n FROM b")
    before = catalog_fingerprint(shop)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist, match="public.b"):
        shop.sql("SELECT pgtrickle.drop_stream_table('a')")
    assert catalog_fingerprint(shop) == before
    shop.sql("SELECT pgtrickle.drop_stream_table('a', cascade => true)")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    assert shop.scalar("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgt_%'") == 0


def test_creating_needs_select_on_every_source(shop: Database) -> None:
    """The daemon fills a stream table with its own rights: a role that may not read a source may not
    create a stream table over it (else the stream table would show it what it may not read)."""
    shop.sql("CREATE TABLE secret (id int PRIMARY KEY, pin text, owner_name text)")
    shop.sql("INSERT INTO secret VALUES (1, '0000', 'a')")
    role = f"mallory_{os.getpid()}"
    shop.sql(f"DROP ROLE IF EXISTS {role}")
    shop.sql(f"CREATE ROLE {role}")
    try:
        # A pgtrickle user (docs/SECURITY.md) with the orders table — but nothing of secret's contents.
        shop.sql(f"GRANT pgtrickle_user TO {role}")
        shop.sql(f"GRANT CREATE ON SCHEMA public TO {role}")
        shop.sql(f"GRANT SELECT, TRIGGER ON orders TO {role}")
        shop.sql(f"GRANT TRIGGER, REFERENCES ON secret TO {role}")
        shop.sql(f"GRANT SELECT (id) ON secret TO {role}")
        before = catalog_fingerprint(shop)
        for query, column in (
            ("SELECT id, pin FROM secret", "pin"),
            ("SELECT count(*) AS n FROM secret", None),
            ("SELECT o.id FROM orders o JOIN secret s ON s.id = o.id WHERE s.pin = '0000'", "pin"),
        ):
            shop.sql(f"SET ROLE {role}")
            try:
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
                    shop.sql("SELECT pgtrickle.create_stream_table('leak', %s)", (query,))
            finally:
                shop.sql("RESET ROLE")
            assert f"role {role} may not read public.secret" in str(info.value), (query, str(info.value))
            assert f"GRANT SELECT ON public.secret TO {role}" in (info.value.diag.message_hint or "")
            assert catalog_fingerprint(shop) == before, (query, column)
        assert shop.scalar("SELECT count(*) FROM pg_class WHERE relname = 'leak'") == 0
    finally:
        shop.sql(f"DROP OWNED BY {role}")
        shop.sql(f"DROP ROLE {role}")


def test_dropping_a_source_is_refused_and_cascade_marks_error(shop: Database) -> None:
    create_st(shop, "s", "SELECT id FROM orders")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        shop.sql("DROP TABLE orders")
    shop.sql("DROP TABLE orders CASCADE")
    status, error = shop.sql("SELECT status, last_error FROM pgtrickle.pgt_stream_tables")[0]
    assert status == "ERROR" and "was dropped" in error


def test_dropping_storage_by_hand_forgets_the_stream_table(shop: Database) -> None:
    create_st(shop, "s", "SELECT id FROM orders")
    shop.sql("DROP TABLE s")
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    assert shop.scalar("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass") == 0


def test_renamed_source_column_keeps_capture_working(shop: Database) -> None:
    create_st(shop, "s", "SELECT customer FROM orders")
    shop.sql("ALTER TABLE orders RENAME COLUMN customer TO client")
    shop.sql("ALTER TABLE orders ADD COLUMN note text")
    shop.sql("INSERT INTO orders VALUES (500, 'z', 1, 'n')")
    buffer = shop.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'")
    assert shop.sql(f"SELECT new_customer FROM pgtrickle_changes.{buffer}") == [("z",)]


BAD_CREATES = [
    # (name, query, extra args, error class, message fragment)
    ("s", "SELEC customer FROM orders", {}, psycopg.errors.SyntaxError, "syntax error"),
    ("s", "SELECT * FROM no_such_table", {}, psycopg.errors.UndefinedTable, "no_such_table"),
    ("s", "SELECT nope FROM orders", {}, psycopg.errors.UndefinedColumn, "nope"),
    ("s", "", {}, psycopg.errors.InvalidParameterValue, "must not be NULL or empty"),
    ("s", "DELETE FROM orders RETURNING id", {}, psycopg.errors.SyntaxError, "invalid defining query"),
    ("s", "SELECT 1 AS x FROM orders; DROP TABLE orders", {}, psycopg.errors.SyntaxError, "single SELECT"),
    (
        "s",
        "SELECT 1 AS x FROM orders; -- ok\n; DELETE FROM orders",
        {},
        psycopg.errors.SyntaxError,
        "single SELECT",
    ),
    (
        "s",
        "WITH d AS (DELETE FROM orders RETURNING id) SELECT id FROM d",
        {},
        psycopg.errors.FeatureNotSupported,
        "data-modifying",
    ),
    ("s", "SELECT customer, customer FROM orders", {}, psycopg.errors.DuplicateColumn, "customer"),
    ("s", "SELECT amount + 1 FROM orders", {}, psycopg.errors.InvalidColumnReference, "needs a name"),
    ("s", "SELECT 1 AS one", {}, psycopg.errors.InvalidParameterValue, "reads no table"),
    ("s", "SELECT * FROM s", {}, psycopg.errors.InvalidRecursion, "itself"),
    ("orders", "SELECT id FROM orders", {}, psycopg.errors.DuplicateTable, "already exists"),
    (
        "s",
        "SELECT id FROM orders",
        {"schedule": "5 minutes"},
        psycopg.errors.InvalidParameterValue,
        "invalid schedule",
    ),
    ("s", "SELECT id FROM orders", {"schedule": "0s"}, psycopg.errors.InvalidParameterValue, "out of range"),
    (
        "s",
        "SELECT id FROM orders",
        {"schedule": "61 * * * *"},
        psycopg.errors.InvalidParameterValue,
        "invalid schedule",
    ),
    (
        "s",
        "SELECT id FROM orders",
        {"schedule": "1m'; DROP TABLE orders; --"},
        psycopg.errors.InvalidParameterValue,
        "invalid schedule",
    ),
    (
        "s",
        "SELECT id FROM orders",
        {"refresh_mode": "SOMETIMES"},
        psycopg.errors.InvalidParameterValue,
        "invalid refresh_mode",
    ),
    ("nosuchschema.s", "SELECT id FROM orders", {}, psycopg.errors.InvalidSchemaName, "does not exist"),
    ("a.b.c", "SELECT id FROM orders", {}, psycopg.errors.InvalidName, "schema.name"),
    ('"unterminated', "SELECT id FROM orders", {}, psycopg.errors.InvalidName, "invalid stream table name"),
    ("x" * 64, "SELECT id FROM orders", {}, psycopg.errors.NameTooLong, "too long"),
    ("pgtrickle.s", "SELECT id FROM orders", {}, psycopg.errors.InvalidSchemaName, "cannot be created"),
    (
        "s",
        "SELECT id, __pgt_row_id FROM (SELECT id, 1 AS __pgt_row_id FROM orders) q",
        {},
        psycopg.errors.InvalidColumnReference,
        "reserved",
    ),
    (
        "s",
        "SELECT * FROM pgtrickle.pgt_stream_tables",
        {},
        psycopg.errors.FeatureNotSupported,
        "pgtrickle's own",
    ),
    ("s", "SELECT * FROM v", {}, psycopg.errors.FeatureNotSupported, "is a view"),
]


@pytest.mark.parametrize(
    ("name", "query", "extra", "error", "fragment"),
    BAD_CREATES,
    ids=[f"{i}:{c[1][:30]}" for i, c in enumerate(BAD_CREATES)],
)
def test_bad_create_is_refused_and_changes_nothing(
    shop: Database, name: str, query: str, extra: dict, error: type, fragment: str
) -> None:
    shop.sql("CREATE VIEW v AS SELECT id FROM orders")
    before = catalog_fingerprint(shop)
    with pytest.raises(error) as info:
        create_st(shop, name, query, **extra)
    full = str(info.value) + " " + (info.value.diag.message_hint or "")
    assert fragment.lower() in full.lower()
    assert catalog_fingerprint(shop) == before
    assert shop.scalar("SELECT count(*) FROM orders") == 10


def test_duplicate_name_is_refused(shop: Database) -> None:
    create_st(shop, "s", "SELECT id FROM orders")
    before = catalog_fingerprint(shop)
    with pytest.raises(psycopg.errors.DuplicateObject, match="already exists"):
        create_st(shop, "s", "SELECT customer FROM orders")
    assert catalog_fingerprint(shop) == before


@pytest.mark.parametrize(
    "call",
    [
        "SELECT pgtrickle.alter_stream_table('s', schedule => 'often')",
        "SELECT pgtrickle.alter_stream_table('s', refresh_mode => 'x')",
        "SELECT pgtrickle.alter_stream_table('s', status => 'ERROR')",
        "SELECT pgtrickle.alter_stream_table('nope', schedule => '1m')",
        "SELECT pgtrickle.alter_stream_table(NULL, schedule => '1m')",
        "SELECT pgtrickle.drop_stream_table('nope')",
        "SELECT pgtrickle.drop_stream_table('s', cascade => NULL)",
        "SELECT pgtrickle.refresh_stream_table('nope')",
        "SELECT pgtrickle.refresh_stream_table(NULL)",
        "SELECT * FROM pgtrickle.get_refresh_history('s', 0)",
        "SELECT * FROM pgtrickle.get_refresh_history('nope')",
    ],
)
def test_bad_alter_drop_refresh_change_nothing(shop: Database, call: str) -> None:
    create_st(shop, "s", "SELECT id FROM orders")
    before = catalog_fingerprint(shop)
    with pytest.raises(psycopg.Error) as info:
        shop.sql(call)
    assert info.value.sqlstate and info.value.sqlstate[:2] in ("22", "42", "2B")
    assert catalog_fingerprint(shop) == before


def test_create_inside_rolled_back_transaction_leaves_nothing(shop: Database) -> None:
    before = catalog_fingerprint(shop)
    with pytest.raises(RuntimeError), shop.conn.transaction():
        create_st(shop, "s", "SELECT id FROM orders")
        raise RuntimeError("roll back")
    assert catalog_fingerprint(shop) == before


def test_unqualified_lookup_follows_search_path(shop: Database) -> None:
    shop.sql("CREATE SCHEMA other")
    shop.sql("CREATE TABLE other.t (x int)")
    create_st(shop, "other.s", "SELECT x FROM other.t")
    shop.sql("SET search_path = other, public")
    shop.sql("SELECT pgtrickle.alter_stream_table('s', schedule => '2m')")
    assert shop.scalar("SELECT schedule FROM pgtrickle.pgt_stream_tables") == "2m"
    shop.sql("SET search_path = public")
    with pytest.raises(psycopg.errors.UndefinedObject):
        shop.sql("SELECT pgtrickle.alter_stream_table('s', schedule => '3m')")


def test_retyped_captured_key_column_follows_and_reinitializes(shop: Database) -> None:
    create_st(shop, "s", "SELECT customer FROM orders")  # id is captured as the key, not read
    shop.sql("UPDATE pgtrickle.pgt_stream_tables SET needs_reinit = false")
    shop.sql("ALTER TABLE orders ALTER COLUMN id TYPE bigint")
    shop.sql("INSERT INTO orders VALUES (9000000000, 'big', 1)")
    buffer = shop.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'")
    assert shop.sql(f"SELECT new_id FROM pgtrickle_changes.{buffer}") == [(9000000000,)]
    assert shop.scalar("SELECT needs_reinit FROM pgtrickle.pgt_stream_tables")


def test_added_and_dropped_unused_columns_change_nothing(shop: Database) -> None:
    create_st(shop, "s", "SELECT customer FROM orders")
    shop.sql("ALTER TABLE orders ADD COLUMN extra int, DROP COLUMN amount")
    shop.sql("INSERT INTO orders (id, customer, extra) VALUES (77, 'x', 1)")
    buffer = shop.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'")
    assert shop.sql(f"SELECT new_id, new_customer FROM pgtrickle_changes.{buffer}") == [(77, "x")]
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        shop.sql("ALTER TABLE orders DROP COLUMN customer")

"""pgtrickle.normalize_query and pgtrickle.stream_table_query_changed on a real PostgreSQL.

No Spark: these decide whether a tool (the dbt materialization) must replace a
stream table because its query changed, or may alter it in place.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import Database
from tests.integration.helpers import catalog_fingerprint, create_st

pytestmark = pytest.mark.integration


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE SCHEMA \"Sales 'EU'\"")
    db.sql("CREATE TABLE \"Sales 'EU'\".orders (id int PRIMARY KEY, customer text, amount numeric)")
    db.sql("INSERT INTO \"Sales 'EU'\".orders SELECT g, 'c' || (g % 3), g FROM generate_series(1, 10) g")
    create_st(
        db,
        '"Sales \'EU\'"."Order ""Totals"""',
        "SELECT customer, sum(amount) AS total FROM \"Sales 'EU'\".orders GROUP BY customer",
    )
    return db


def test_normalized_form_is_the_catalogs(shop: Database) -> None:
    stored = shop.scalar("SELECT normalized_query FROM pgtrickle.pgt_stream_tables")
    # Spelling, case, whitespace, comments, a trailing semicolon and the search_path do not matter.
    shop.sql("SET search_path = \"Sales 'EU'\", public")
    assert (
        shop.scalar(
            "SELECT pgtrickle.normalize_query(%s)",
            ("select customer,\n  SUM(amount)  as total -- per customer\nfrom orders group by 1;",),
        )
        == stored
    )
    assert (
        shop.scalar(
            "SELECT pgtrickle.normalize_query(%s)",
            ("SELECT customer, sum(amount) AS total FROM orders GROUP BY customer",),
        )
        == stored
    )
    assert "\"Sales 'EU'\".orders" in str(stored)
    # Nothing is left behind (the candidate is a temporary view, dropped again).
    assert shop.scalar("SELECT count(*) FROM pg_class WHERE relname LIKE 'pgt_normalize_%'") == 0


def test_query_changed(shop: Database) -> None:
    name = '"Sales \'EU\'"."Order ""Totals"""'
    same = "select customer, sum(amount) as total from \"Sales 'EU'\".orders group by customer"
    assert shop.scalar("SELECT pgtrickle.stream_table_query_changed(%s, %s)", (name, same)) is False
    other = (
        "SELECT customer, sum(amount) AS total FROM \"Sales 'EU'\".orders WHERE amount > 1 GROUP BY customer"
    )
    assert shop.scalar("SELECT pgtrickle.stream_table_query_changed(%s, %s)", (name, other)) is True
    renamed = "SELECT customer, max(amount) AS total FROM \"Sales 'EU'\".orders GROUP BY customer"
    assert shop.scalar("SELECT pgtrickle.stream_table_query_changed(%s, %s)", (name, renamed)) is True
    # A source renamed since creation: the stream table's query follows it, so the query
    # written against the new name is unchanged.
    shop.sql("ALTER TABLE \"Sales 'EU'\".orders RENAME TO purchases")
    renamed_src = "SELECT customer, sum(amount) AS total FROM \"Sales 'EU'\".purchases GROUP BY customer"
    assert shop.scalar("SELECT pgtrickle.stream_table_query_changed(%s, %s)", (name, renamed_src)) is False


@pytest.mark.parametrize(
    ("query", "sqlstate"),
    [
        (None, "22023"),
        ("  ", "22023"),
        ("SELECT nope FROM \"Sales 'EU'\".orders", "42703"),
        ("SELECT * FROM missing_table", "42P01"),
        ("SELECT 1 AS a; DROP TABLE \"Sales 'EU'\".orders", "42601"),
        ("DELETE FROM \"Sales 'EU'\".orders RETURNING id", "42601"),
        ("SELEC 1", "42601"),
        ("WITH d AS (DELETE FROM \"Sales 'EU'\".orders RETURNING id) SELECT id FROM d", "0A000"),
    ],
)
def test_bad_queries_are_refused_and_change_nothing(shop: Database, query: str | None, sqlstate: str) -> None:
    before = catalog_fingerprint(shop)
    with pytest.raises(psycopg.Error) as err:
        shop.sql("SELECT pgtrickle.normalize_query(%s)", (query,))
    assert err.value.sqlstate == sqlstate, err.value
    assert shop.scalar("SELECT count(*) FROM \"Sales 'EU'\".orders") == 10
    assert catalog_fingerprint(shop) == before
    assert shop.scalar("SELECT count(*) FROM pg_class WHERE relname LIKE 'pgt_normalize_%'") == 0


def test_unknown_stream_table(shop: Database) -> None:
    with pytest.raises(psycopg.errors.UndefinedObject):
        shop.sql("SELECT pgtrickle.stream_table_query_changed('nope', 'SELECT 1 AS a')")

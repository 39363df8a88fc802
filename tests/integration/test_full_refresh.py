"""FULL refresh on real Spark and real PostgreSQL, checked by the oracle.

Every refresh is followed by the two-way EXCEPT ALL check against the
defining query run in PostgreSQL.
"""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import create_st, assert_oracle, refresh, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(12,2), "
        "status text, placed date)"
    )
    db.sql("CREATE TABLE order_lines (order_id int, product text, qty int, price double precision)")
    db.sql("""INSERT INTO orders
              SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'c' || (g % 5) END,
                     CASE WHEN g % 11 = 0 THEN NULL ELSE (g * 3.25)::numeric(12,2) END,
                     (ARRAY['open', 'paid', 'shipped'])[1 + g % 3], date '2024-01-01' + g
              FROM generate_series(1, 300) g""")
    db.sql("""INSERT INTO order_lines
              SELECT 1 + (g % 320), (ARRAY['apple', 'pear', NULL, 'fig'])[1 + g % 4], g % 6, (g % 9) * 0.5
              FROM generate_series(1, 900) g""")
    # exact duplicate rows
    db.sql("INSERT INTO order_lines SELECT * FROM order_lines WHERE order_id % 10 = 0")
    return db


def churn(db: Database, seed: int) -> None:
    db.sql(
        "INSERT INTO orders SELECT g, 'c' || (g %% 4), g, 'open', date '2024-06-01' FROM "
        "generate_series(%s::int, %s::int) g",
        (1000 + seed * 10, 1005 + seed * 10),
    )
    db.sql(
        "UPDATE orders SET amount = amount + 1, customer = NULLIF(customer, 'c1') WHERE id %% 13 = %s",
        (seed % 13,),
    )
    db.sql("DELETE FROM order_lines WHERE order_id %% 17 = %s", (seed % 17,))
    db.sql(
        "INSERT INTO order_lines VALUES (1, 'kiwi', 2, 1.5), (1, 'kiwi', 2, 1.5), (%s, NULL, NULL, NULL)",
        (seed,),
    )


QUERIES = {
    "projection_filter": "SELECT id, customer, amount * 2 AS twice FROM orders WHERE status <> 'paid'",
    "group_by": "SELECT customer, count(*) AS n, sum(amount) AS total, min(amount) AS lo, max(amount) AS hi "
    "FROM orders GROUP BY customer",
    "aggregate_no_group": "SELECT count(*) AS n, count(amount) AS with_amount, sum(qty) AS q "
    "FROM orders o JOIN order_lines l ON l.order_id = o.id",
    "inner_join": "SELECT o.id, o.customer, l.product, l.qty FROM orders o JOIN order_lines l "
    "ON l.order_id = o.id",
    "left_join": "SELECT o.id, l.product FROM orders o LEFT JOIN order_lines l ON l.order_id = o.id "
    "AND l.qty > 2",
    "join_group_having": "SELECT o.customer, sum(l.qty) AS items, count(DISTINCT l.product) AS products "
    "FROM orders o JOIN order_lines l ON l.order_id = o.id GROUP BY o.customer "
    "HAVING sum(l.qty) > 10",
    "distinct": "SELECT DISTINCT product, qty FROM order_lines",
    "union_all": "SELECT customer AS who FROM orders UNION ALL SELECT product FROM order_lines",
    "union": "SELECT customer AS who FROM orders UNION SELECT product FROM order_lines",
    "subquery_from": "SELECT t.customer, t.total FROM (SELECT customer, sum(amount) AS total FROM orders "
    "GROUP BY customer) t WHERE t.total > 100",
    "in_subquery": "SELECT id FROM orders WHERE id IN (SELECT order_id FROM order_lines WHERE qty >= 4)",
    "exists": "SELECT o.id FROM orders o WHERE NOT EXISTS (SELECT 1 FROM order_lines l "
    "WHERE l.order_id = o.id)",
    "cte": "WITH big AS (SELECT * FROM orders WHERE amount > 500) SELECT status, count(*) AS n FROM big "
    "GROUP BY status",
    "case_coalesce": "SELECT id, COALESCE(customer, 'unknown') AS customer, CASE WHEN amount IS NULL THEN "
    "'none' WHEN amount > 400 THEN 'big' ELSE 'small' END AS size FROM orders",
    "duplicates": "SELECT order_id, product FROM order_lines WHERE order_id % 10 = 0",
    "integer_division": "SELECT order_id, qty / 4 AS quarter, qty % 4 AS rest FROM order_lines",
    "dates_text": "SELECT id, placed + 1 AS next_day, upper(status) || '-' || id AS label FROM orders",
    "float_sum": "SELECT product, sum(price) AS revenue FROM order_lines GROUP BY product",
}


@pytest.mark.parametrize("shape", list(QUERIES))
def test_query_shapes_match_postgres_after_each_refresh(shop: Database, shape: str) -> None:
    create_st(shop, "st", QUERIES[shape])
    outcomes = refresh_and_check(shop, "st")
    assert outcomes[0].action is Action.FULL
    for seed in (1, 2):
        churn(shop, seed)
        refresh_and_check(shop, "st")


def test_chain_three_deep_and_fan_in(shop: Database) -> None:
    create_st(
        shop,
        "order_summary",
        "SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer",
    )
    create_st(
        shop,
        "line_summary",
        "SELECT o.customer, sum(l.qty) AS qty FROM order_lines l "
        "JOIN orders o ON o.id = l.order_id GROUP BY o.customer",
    )
    create_st(
        shop,
        "order_report",
        "SELECT os.customer, os.total, ls.qty FROM order_summary os "
        "JOIN line_summary ls ON ls.customer IS NOT DISTINCT FROM os.customer",
    )
    create_st(shop, "top_report", "SELECT customer, total FROM order_report WHERE total > 1000")
    outcomes = refresh(shop)
    order = [o.st.name for o in outcomes]
    assert order.index("order_summary") < order.index("order_report") < order.index("top_report")
    assert order.index("line_summary") < order.index("order_report")
    assert_oracle(shop)
    churn(shop, 3)
    refresh(shop)
    assert_oracle(shop)


def test_no_pending_changes_means_no_spark_job(shop: Database) -> None:
    create_st(shop, "st", "SELECT customer, count(*) AS n FROM orders GROUP BY customer")
    refresh_and_check(shop, "st")
    frontier_before = shop.scalar("SELECT frontier::text FROM pgtrickle.pgt_stream_tables")
    history_before = shop.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE action = 'FULL'")
    [outcome] = refresh(shop, "st")
    assert outcome.action is Action.NO_DATA
    assert outcome.spark_seconds == 0
    assert (
        shop.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE action = 'FULL'")
        == history_before
    )
    assert shop.scalar("SELECT frontier::text FROM pgtrickle.pgt_stream_tables") != frontier_before
    # a write to a column the query does not read still counts as a change (captured columns are a superset)
    shop.sql("UPDATE orders SET status = 'x' WHERE id = 1")
    [outcome] = refresh(shop, "st")
    assert outcome.action is Action.DIFFERENTIAL, outcome.reason
    assert_oracle(shop, "st")


def test_uncommitted_and_long_transactions_are_not_lost(shop: Database) -> None:
    create_st(shop, "st", "SELECT count(*) AS n, sum(amount) AS total FROM orders")
    refresh_and_check(shop, "st")
    with psycopg.connect(shop.dsn) as long_tx:
        long_tx.execute("INSERT INTO orders VALUES (5000, 'late', 10, 'open', '2024-01-01')")
        shop.sql("INSERT INTO orders VALUES (5001, 'early', 20, 'open', '2024-01-01')")
        refresh(shop, "st")  # sees 5001, not the uncommitted 5000
        assert shop.scalar("SELECT n FROM st") == 301
        long_tx.commit()
    [outcome] = refresh(shop, "st")
    assert outcome.action is Action.DIFFERENTIAL, "the long transaction committed after the frontier: pending"
    assert shop.scalar("SELECT n FROM st") == 302
    assert_oracle(shop, "st")
    with psycopg.connect(shop.dsn) as aborted:
        aborted.execute("DELETE FROM orders")
        aborted.rollback()
    [outcome] = refresh(shop, "st")
    assert outcome.action is Action.NO_DATA


def test_truncate_of_a_source_is_refreshed(shop: Database) -> None:
    create_st(shop, "st", "SELECT product, count(*) AS n FROM order_lines GROUP BY product")
    refresh_and_check(shop, "st")
    shop.sql("TRUNCATE order_lines")
    [outcome] = refresh(shop, "st")
    assert "truncated" in outcome.reason
    assert shop.scalar("SELECT count(*) FROM st") == 0
    assert_oracle(shop, "st")


def test_history_and_info_record_the_refresh(shop: Database) -> None:
    create_st(shop, "st", "SELECT id FROM orders WHERE amount > 100", refresh_mode="FULL")
    refresh(shop, "st")
    churn(shop, 1)
    refresh(shop, "st")
    history = shop.sql(
        "SELECT action, status, initiated_by, rows_inserted, rows_deleted, delta_row_count "
        "FROM pgtrickle.get_refresh_history('st') ORDER BY refresh_id"
    )
    assert [h[:3] for h in history] == [("FULL", "COMPLETED", "INITIAL"), ("FULL", "COMPLETED", "MANUAL")]
    assert history[0][3] == shop.scalar("SELECT count(*) FROM orders WHERE amount > 100") or history[1]
    assert history[1][4] == history[0][3]
    assert history[1][5] > 0
    info = shop.sql(
        "SELECT status, last_refresh_at IS NOT NULL, staleness < interval '1 minute', "
        "frontier IS NOT NULL FROM pgtrickle.stream_tables_info"
    )
    assert info == [("ACTIVE", True, True, True)]
    assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_requests") == 0


def test_large_source_goes_through_partitioned_jdbc_and_staging(shop: Database) -> None:
    shop.sql("CREATE TABLE big (id bigint, grp int, v numeric(10,2), note text)")
    shop.sql(
        "INSERT INTO big SELECT g, g % 1000, (g % 977) / 10.0, md5(g::text) FROM generate_series(1, 300000) g"
    )
    shop.sql("ANALYZE big")
    create_st(shop, "big_st", "SELECT id, grp, v FROM big WHERE grp < 900")
    [outcome] = refresh(shop, "big_st")
    assert outcome.rows_inserted == 270000
    assert shop.scalar("SELECT to_regclass('pgtrickle_changes.stage_1') IS NULL")
    assert_oracle(shop, "big_st")


def test_a_failing_refresh_keeps_contents_and_records_the_error(shop: Database) -> None:
    create_st(shop, "st", "SELECT id, 100 / (amount - 3.25)::int AS r FROM orders WHERE amount IS NOT NULL")
    with pytest.raises(Exception, match=r"(?i)divide|division"):
        refresh(shop, "st")
    row = shop.sql(
        "SELECT consecutive_errors, last_error IS NOT NULL, status FROM pgtrickle.pgt_stream_tables"
    )
    assert row[0][:2] == (1, True)
    history = shop.sql("SELECT status, error_message FROM pgtrickle.pgt_refresh_history")
    assert history[0][0] == "FAILED" and history[0][1]
    assert shop.scalar("SELECT count(*) FROM st") == 0

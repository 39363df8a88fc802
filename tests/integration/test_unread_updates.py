"""Updates of columns the query does not read (refresh/unread_updates.py): a source whose window
holds only such updates has no change, so its terms and their reads are left out.

Real PostgreSQL and Spark; the oracle after every refresh, and the stored text of the values
where the oracle cannot see a difference (EXCEPT ALL finds -0 = 0).
"""

from __future__ import annotations

import pytest

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.buffers import updates_change
from pgtrickle.refresh.shared_reads import buffer_columns
from tests.conftest import Database
from tests.integration.helpers import create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

QUERY = (
    "SELECT c.region, count(*) AS n, sum(o.amount) AS total FROM customers c"
    " JOIN orders o ON o.cust = c.cid GROUP BY c.region"
)


def _schema(db: Database) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE customers (cid int PRIMARY KEY, region text, balance numeric(10,2), note text)")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, cust int, amount numeric, priority text)")
    db.sql(
        "INSERT INTO customers SELECT g, (ARRAY['N','S','E'])[1 + g % 3], g * 10.5, 'c' || g"
        " FROM generate_series(1, 30) g"
    )
    db.sql("INSERT INTO orders SELECT g, 1 + g % 30, g * 1.5, 'low' FROM generate_series(1, 200) g")
    create_st(db, "by_region", QUERY, refresh_mode="DIFFERENTIAL")
    refresh_and_check(db, "by_region")


def test_updates_of_unread_columns_only_run_no_spark_job(db: Database) -> None:
    _schema(db)
    db.sql("UPDATE customers SET balance = balance + 1, note = 'changed' WHERE cid % 4 = 0")
    db.sql("UPDATE orders SET priority = 'high' WHERE id % 3 = 0")
    # Read columns set to what they were: the stored image is the same, no change either.
    db.sql("UPDATE customers SET region = region WHERE cid = 5")
    db.sql("UPDATE orders SET amount = amount WHERE id = 7")
    [outcome] = refresh_and_check(db, "by_region")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.spark_jobs == 0, outcome
    assert outcome.timings.get("updates_not_read") == 7 + 66 + 1 + 1, outcome.timings
    # The window was consumed: the next refresh has nothing pending.
    [again] = refresh_and_check(db, "by_region")
    assert again.action.value == "NO_DATA", again.reason


def test_a_source_with_a_read_column_changed_keeps_its_change(db: Database) -> None:
    _schema(db)
    db.sql("UPDATE customers SET balance = 0 WHERE cid < 10")  # not read
    db.sql("UPDATE customers SET region = 'W' WHERE cid = 3")  # read: customers changed
    db.sql("UPDATE orders SET priority = 'x' WHERE id < 50")  # not read: orders left out
    [outcome] = refresh_and_check(db, "by_region")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.spark_jobs, outcome
    assert outcome.timings.get("updates_not_read") == 49, outcome.timings
    assert db.sql("SELECT n FROM by_region WHERE region = 'W'") == [(7,)]


def test_a_change_equal_by_operator_or_from_null_is_a_change(db: Database) -> None:
    _schema(db)
    db.sql("ALTER TABLE orders ADD COLUMN w float8 NOT NULL DEFAULT 0")
    create_st(db, "weights", "SELECT o.id, o.w FROM orders o", refresh_mode="DIFFERENTIAL")
    refresh_and_check(db, "weights")
    frontier = db.scalar("SELECT frontier::text FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'weights'")
    db.sql("UPDATE orders SET w = '-0' WHERE id = 2")  # 0 -> -0: equal by =, not by image
    db.sql("UPDATE orders SET priority = 'p' WHERE id = 3")
    relid, buffer = db.sql(
        "SELECT source_relid::bigint, buffer_name FROM pgtrickle.pgt_change_sources"
        " WHERE source_relid = 'orders'::regclass"
    )[0]
    orders = Source(relid, "public", "orders", "TABLE", buffer)
    carried = buffer_columns(db.conn, [relid])[relid]
    now = db.scalar("SELECT pg_current_snapshot()::text")
    assert updates_change(db.conn, orders, [carried["w"]], str(frontier), str(now))
    assert not updates_change(db.conn, orders, [carried["id"], carried["amount"]], str(frontier), str(now))
    assert "priority" not in carried  # no stream table reads it: the buffer does not carry it
    db.sql("UPDATE customers SET region = NULL WHERE cid = 4")
    refresh_and_check(db, "by_region")
    db.sql("UPDATE customers SET region = NULL WHERE cid = 4")  # NULL to NULL: no change
    [outcome] = refresh_and_check(db, "by_region")
    assert outcome.timings.get("updates_not_read") == 1 and outcome.spark_jobs == 0, outcome
    db.sql("UPDATE customers SET region = 'N' WHERE cid = 4")  # NULL to a value: a change
    [outcome] = refresh_and_check(db, "by_region")
    assert "updates_not_read" not in outcome.timings and outcome.spark_jobs, outcome


def test_inserts_beside_unread_updates_keep_the_source(db: Database) -> None:
    _schema(db)
    db.sql("UPDATE orders SET priority = 'y' WHERE id < 20")
    db.sql("INSERT INTO orders VALUES (1000, 2, 99.5, 'low')")
    db.sql("DELETE FROM orders WHERE id = 150")
    [outcome] = refresh_and_check(db, "by_region")
    assert outcome.action.value == "DIFFERENTIAL" and "updates_not_read" not in outcome.timings, outcome


def test_unread_updates_beside_real_changes_bound_no_reads(db: Database) -> None:
    """An update that leaves every read column as it was is left out of its source's change even
    when the source has real changes too: the keys that bound the other side's read (the lines
    of the changed orders) are those of the real changes only. Control: updates of a read
    column add their keys."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, cust int, priority text)")
    db.sql("CREATE TABLE lines (oid int, qty int)")
    db.sql("INSERT INTO orders SELECT g, 1 + g % 30, 'low' FROM generate_series(1, 3000) g")
    db.sql("INSERT INTO lines SELECT 1 + g % 3000, g % 7 FROM generate_series(1, 12000) g")
    db.sql("CREATE INDEX ON lines (oid)")
    db.sql("ANALYZE orders, lines")
    create_st(
        db,
        "by_customer",
        "SELECT o.cust, sum(l.qty) AS qty, count(*) AS n FROM orders o JOIN lines l ON l.oid = o.id"
        " GROUP BY o.cust",
        refresh_mode="DIFFERENTIAL",
    )
    refresh_and_check(db, "by_customer")
    db.sql("INSERT INTO orders VALUES (3001, 7, 'low'), (3002, 8, 'low')")
    db.sql("INSERT INTO lines VALUES (3001, 5), (3002, 6)")
    db.sql("UPDATE orders SET priority = 'high' WHERE id % 10 = 0")  # 300 updates, none read
    db.sql("UPDATE orders SET cust = cust WHERE id % 10 = 1")  # 300 more, each column as it was
    db.sql("DELETE FROM orders WHERE id = 5")
    [outcome] = refresh_and_check(db, "by_customer")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert 1 <= outcome.timings.get("pushed_down_keys", 0) <= 6, outcome.timings
    db.sql("UPDATE orders SET cust = cust % 29 + 2 WHERE id % 10 = 0")  # a read column: 300 keys
    [outcome] = refresh_and_check(db, "by_customer")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.timings.get("pushed_down_keys", 0) >= 300, outcome.timings

"""A read bounded by a change's keys on several columns reads by the most selective one
(refresh/key_bounds.narrowest, by pg_stats), and stays exact. Real PostgreSQL and Spark, the
oracle after every refresh."""

from __future__ import annotations

import random

import pytest

from pgtrickle.refresh.engine import RefreshOutcome
from tests.conftest import Database
from tests.integration.helpers import create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

QUERY = (
    "SELECT p.id, s.a, s.b, s.n, s.total FROM pairs p JOIN (SELECT l.a, l.b, count(*) AS n,"
    " sum(l.qty) AS total FROM lines l GROUP BY l.a, l.b) s ON s.a = p.a AND s.b = p.b"
)


def test_the_selective_column_bounds_the_read(db: Database) -> None:
    """``lines.a`` has 10 values (2,000 lines each), ``lines.b`` 5,000 (4 each). Three pairs of
    one ``a`` change: by ``a`` the read would hold 2,000 lines for 1 key; by ``b``, 12 lines for
    3 keys; by the (a, b) tuples the change holds (the join is on both: a composite key), the
    same 12 lines — the tuples chosen, as a tie keeps the composite key. With ``a`` compared by
    ``IS NOT DISTINCT FROM`` (which a tuple test cannot express) ``b`` alone bounds the read."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE pairs (id int PRIMARY KEY, a int, b int)")
    # No autovacuum: its ANALYZE could bring back the statistics the test deletes below.
    db.sql("CREATE TABLE lines (a int, b int, qty int) WITH (autovacuum_enabled = false)")
    db.sql("INSERT INTO lines SELECT g % 10, g % 5000, g % 7 FROM generate_series(1, 20000) g")
    db.sql("INSERT INTO pairs SELECT g, g % 10, g % 5000 FROM generate_series(1, 500) g")
    db.sql("ANALYZE lines, pairs")
    create_st(db, "joined", QUERY, refresh_mode="DIFFERENTIAL")
    null_safe = QUERY.replace("s.a = p.a", "s.a IS NOT DISTINCT FROM p.a")
    create_st(db, "joined_on_b", null_safe, refresh_mode="DIFFERENTIAL")
    for name in ("joined", "joined_on_b"):
        refresh_and_check(db, name)
    db.sql("UPDATE pairs SET b = b + 1000 WHERE id IN (1, 11, 21)")  # a = 1 for all three
    [outcome] = refresh_and_check(db, "joined")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    # Old and new (a, b) of three pairs: six tuples (one key on a would have been 1).
    assert outcome.timings.get("pushed_down_keys") == 6, outcome.timings
    assert outcome.timings.get("composite_key_bounds") == 1, outcome.timings
    assert outcome.timings.get("key_filtered_reads") == 1, outcome.timings
    [outcome] = refresh_and_check(db, "joined_on_b")
    assert outcome.timings.get("pushed_down_keys") == 6, outcome.timings  # six values of b
    assert "composite_key_bounds" not in outcome.timings, outcome.timings
    # Without statistics every column counts as the whole table: the first candidate stays,
    # the composite key.
    db.sql("DELETE FROM pg_catalog.pg_statistic WHERE starelid = 'lines'::regclass")
    db.sql("UPDATE pairs SET b = b + 1000 WHERE id IN (2, 12)")
    [outcome] = refresh_and_check(db, "joined")
    assert outcome.timings.get("pushed_down_keys") == 4, outcome.timings
    assert outcome.timings.get("composite_key_bounds") == 1, outcome.timings
    [outcome] = refresh_and_check(db, "joined_on_b")
    assert outcome.timings.get("pushed_down_keys") == 4, outcome.timings  # b alone bounds it
    assert "composite_key_bounds" not in outcome.timings, outcome.timings


def test_a_composite_key_reads_the_pairs_a_change_holds(db: Database) -> None:
    """TPC-H Q9's part-suppliers: lines joined to them on (part, supplier). The changed lines'
    pairs bound the read — not all the suppliers of their parts — including a NULL supplier
    (no part-supplier matches it) and pairs from deleted and updated lines; exact throughout."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE partsupp (part int, supp int, cost numeric(8,2), PRIMARY KEY (part, supp))")
    db.sql("CREATE TABLE lines (id int PRIMARY KEY, part int, supp int, qty int)")
    db.sql(
        "INSERT INTO partsupp SELECT p, s, (p * 7 + s) % 100 FROM generate_series(1, 5000) p, generate_series(1, 4) s"
    )
    db.sql("INSERT INTO lines SELECT g, 1 + g % 5000, 1 + g % 4, g % 9 FROM generate_series(1, 20000) g")
    db.sql("ANALYZE partsupp, lines")
    query = (
        "SELECT l.supp, sum(l.qty * ps.cost) AS value, count(*) AS n FROM lines l"
        " JOIN partsupp ps ON ps.part = l.part AND ps.supp = l.supp GROUP BY l.supp"
    )
    create_st(db, "by_supp", query, refresh_mode="DIFFERENTIAL")
    refresh_and_check(db, "by_supp")
    rng = random.Random(9)
    for round_ in range(3):
        ids = rng.sample(range(1, 20001), 6)
        db.sql(f"UPDATE lines SET qty = qty + 1 WHERE id IN ({ids[0]}, {ids[1]})")
        db.sql(f"UPDATE lines SET supp = 1 + (supp % 4) WHERE id = {ids[2]}")
        db.sql(f"DELETE FROM lines WHERE id = {ids[3]}")
        db.sql(f"INSERT INTO lines VALUES ({30000 + round_}, {ids[4] % 5000 + 1}, NULL, 3)")
        db.sql(f"INSERT INTO lines VALUES ({40000 + round_}, {ids[5] % 5000 + 1}, 2, 4)")
        [outcome] = refresh_and_check(db, "by_supp")
        assert outcome.action.value == "DIFFERENTIAL", outcome.reason
        assert outcome.timings.get("composite_key_bounds") == 1, outcome.timings
        # At most 2 + 2 + 1 + 1 + 1 tuples, none with a NULL: a handful of part-suppliers read.
        assert 1 <= outcome.timings.get("pushed_down_keys", 0) <= 7, outcome.timings


def test_uses_bounded_by_different_columns_read_their_or(db: Database) -> None:
    """TPC-H Q9's lines: one term joins them to the changed orders (by ``oid``), another to the
    changed parts (by ``part``); no one column bounds both, so the read is bounded by
    ``oid = ANY(…) OR part = ANY(…)`` instead of reading every line."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, day int)")
    db.sql("CREATE TABLE parts (id int PRIMARY KEY, cost numeric(8,2))")
    db.sql("CREATE TABLE lines (oid int, part int, qty int)")
    db.sql("INSERT INTO orders SELECT g, g % 7 FROM generate_series(1, 3000) g")
    db.sql("INSERT INTO parts SELECT g, g * 0.5 FROM generate_series(1, 500) g")
    db.sql("INSERT INTO lines SELECT 1 + g % 3000, 1 + g % 500, g % 9 FROM generate_series(1, 20000) g")
    db.sql("ANALYZE orders, parts, lines")
    create_st(
        db,
        "by_day",
        "SELECT o.day, sum(l.qty * p.cost) AS value, count(*) AS n FROM lines l"
        " JOIN orders o ON o.id = l.oid JOIN parts p ON p.id = l.part GROUP BY o.day",
        refresh_mode="DIFFERENTIAL",
    )
    refresh_and_check(db, "by_day")
    db.sql("UPDATE orders SET day = day + 1 WHERE id IN (10, 20, 30)")
    db.sql("UPDATE parts SET cost = cost + 1 WHERE id IN (7, 8)")
    [outcome] = refresh_and_check(db, "by_day")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.timings.get("key_filtered_reads") == 1, outcome.timings  # the lines
    assert outcome.timings.get("pushed_down_keys") == 3 + 2, outcome.timings


def _chain_sources(db: Database, analyse: bool = True) -> None:
    """Customers, their orders, the orders' lines: large enough for key-bounded reads. Without
    ``analyse`` the tables are never analysed (autovacuum off for them): ``reltuples`` stays -1."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    options = "" if analyse else " WITH (autovacuum_enabled = false)"
    db.sql(f"CREATE TABLE customers (id int PRIMARY KEY, bal numeric(10,2)){options}")
    db.sql(f"CREATE TABLE orders (id int PRIMARY KEY, cust int){options}")
    db.sql(f"CREATE TABLE lines (id int PRIMARY KEY, oid int, qty int, flag text){options}")
    db.sql("INSERT INTO customers SELECT g, g * 1.25 FROM generate_series(1, 12000) g")
    db.sql("INSERT INTO orders SELECT g, nullif(g % 3000, 0) FROM generate_series(1, 12000) g")
    db.sql(
        "INSERT INTO lines SELECT g, 1 + g % 12000, g % 11,"
        " CASE WHEN g % 3 = 0 THEN 'R' ELSE 'N' END FROM generate_series(1, 40000) g"
    )
    if analyse:
        db.sql("ANALYZE customers, orders, lines")
    else:
        db.sql("SELECT pg_stat_force_next_flush()")  # the live-row counts, now rather than in 10 s


CHAIN_QUERY = (
    "SELECT c.id, c.bal, sum(l.qty) AS qty, count(*) AS n FROM customers c JOIN orders o ON o.cust = c.id"
    " JOIN lines l ON l.oid = o.id WHERE l.flag = 'R' GROUP BY c.id, c.bal"
)


def _three_customers_changed(db: Database) -> RefreshOutcome:
    """The chain's stream table created and populated, three customers changed, refreshed: the
    orders by the three customers, the lines by the orders read; nothing read whole."""
    create_st(db, "revenue", CHAIN_QUERY, refresh_mode="DIFFERENTIAL")
    refresh_and_check(db, "revenue")
    db.sql("UPDATE customers SET bal = bal + 1 WHERE id IN (5, 6, 7)")
    [outcome] = refresh_and_check(db, "revenue")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.timings.get("key_filtered_reads") == 2, outcome.timings
    assert "whole_table_reads" not in outcome.timings, outcome.timings
    return outcome


def test_a_read_reached_through_another_read_is_bounded_by_its_rows(db: Database) -> None:
    """TPC-H Q10's shape: changed customers reach their orders by key, and the orders' lines
    only through the orders read. The lines are bounded by the order keys of the orders read
    (``oid IN (SELECT id FROM orders WHERE cust = ANY(…))``, a derived bound), not read whole;
    then random changes to all three tables stay exact."""
    _chain_sources(db)
    outcome = _three_customers_changed(db)
    assert outcome.timings.get("derived_bounds", 0) >= 1, outcome.timings
    # Changed lines reach their orders by key, and the orders' customers (a nullable column:
    # some orders have none) through the orders read.
    db.sql("UPDATE lines SET qty = qty + 1 WHERE id IN (3, 6, 9)")
    [outcome] = refresh_and_check(db, "revenue")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.timings.get("derived_bounds", 0) >= 1, outcome.timings
    assert "whole_table_reads" not in outcome.timings, outcome.timings

    rng = random.Random(17)
    next_id = [20000]
    for round_ in range(6):
        for _ in range(rng.randint(1, 4)):
            db.sql("UPDATE customers SET bal = bal + 1 WHERE id = %s", (rng.randint(1, 3000),))
        for _ in range(rng.randint(0, 3)):
            next_id[0] += 1
            order = next_id[0]
            db.sql("INSERT INTO orders VALUES (%s, %s)", (order, rng.randint(1, 3000)))
            db.sql(
                "INSERT INTO lines SELECT %s * 10 + g, %s, g, 'R' FROM generate_series(1, 3) g",
                (order, order),
            )
        db.sql("DELETE FROM orders WHERE id = %s", (rng.randint(1, 12000),))
        db.sql("UPDATE lines SET qty = qty + 1 WHERE id = %s", (rng.randint(1, 40000),))
        if round_ % 2:
            db.sql("UPDATE orders SET cust = %s WHERE id = %s", (rng.randint(1, 3000), rng.randint(1, 12000)))
        [outcome] = refresh_and_check(db, "revenue")
        assert outcome.action.value == "DIFFERENTIAL", outcome.reason


def test_tables_never_analysed_are_read_by_key(db: Database) -> None:
    """Right after a bulk load ``reltuples`` is -1: taken as 0, the 40,000 lines and 12,000 orders
    looked empty and were read whole. Their live-row counts size them now."""
    _chain_sources(db, analyse=False)
    assert (
        db.scalar("SELECT max(reltuples) FROM pg_class WHERE relname IN ('customers', 'orders', 'lines')")
        == -1
    )
    _three_customers_changed(db)


CHEAPEST_QUERY = (
    "SELECT ps.part, ps.supp, ps.cost, s.name FROM part_suppliers ps JOIN suppliers s ON s.id = ps.supp"
    " WHERE s.region = 'EU' AND ps.cost = (SELECT min(ps2.cost) FROM part_suppliers ps2"
    " JOIN suppliers s2 ON s2.id = ps2.supp WHERE ps2.part = ps.part AND s2.region = 'EU')"
)


def test_a_read_bounded_by_its_own_rows_under_a_change_key_is_not_read_whole(db: Database) -> None:
    """TPC-H Q2's shape: the cheapest European supplier per part. A changed supplier touches the
    parts of its part-suppliers, and every read of part-suppliers is bounded by those parts —
    values of its own rows, which its own read cannot give (a cycle: it was read whole). The rows
    of the part-suppliers *of the changed suppliers* do (``part IN (SELECT part FROM
    part_suppliers WHERE supp = ANY(…))``): nothing large is read whole; then a round of random
    changes to both tables stays exact."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE suppliers (id int PRIMARY KEY, name text, region text)")
    db.sql("CREATE TABLE part_suppliers (part int, supp int, cost numeric(8,2), PRIMARY KEY (part, supp))")
    db.sql("CREATE INDEX ON part_suppliers (supp)")
    db.sql(
        "INSERT INTO suppliers SELECT g, 'S' || g, CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END"
        " FROM generate_series(1, 12000) g"
    )
    db.sql(
        "INSERT INTO part_suppliers SELECT p, 1 + (p * 7 + k * 3001) % 12000, ((p * 13 + k * 29) % 1000) / 10.0"
        " FROM generate_series(1, 10000) p, generate_series(0, 3) k"
    )
    db.sql("ANALYZE suppliers, part_suppliers")
    create_st(db, "cheapest", CHEAPEST_QUERY, refresh_mode="DIFFERENTIAL")
    refresh_and_check(db, "cheapest")
    db.sql(
        "UPDATE suppliers SET region = CASE region WHEN 'EU' THEN 'US' ELSE 'EU' END WHERE id IN (10, 11, 12)"
    )
    [outcome] = refresh_and_check(db, "cheapest")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert outcome.timings.get("derived_bounds", 0) >= 1, outcome.timings
    # The part-suppliers (40,000 rows) and the suppliers (12,000) by key: nothing read whole.
    assert "whole_table_reads" not in outcome.timings, outcome.timings

    # One round of random changes to both tables (each refresh plans ~270 operators: ~8 s here).
    rng = random.Random(5)
    for _ in range(rng.randint(1, 3)):
        db.sql("UPDATE suppliers SET region = 'EU' WHERE id = %s", (rng.randint(1, 12000),))
        db.sql("UPDATE suppliers SET region = 'US' WHERE id = %s", (rng.randint(1, 12000),))
    for _ in range(rng.randint(0, 3)):
        db.sql(
            "UPDATE part_suppliers SET cost = %s WHERE part = %s",
            (rng.randint(0, 999) / 10, rng.randint(1, 10000)),
        )
    db.sql(
        "INSERT INTO part_suppliers VALUES (%s, %s, 0.5) ON CONFLICT DO NOTHING",
        (rng.randint(1, 10000), rng.randint(1, 12000)),
    )
    [outcome] = refresh_and_check(db, "cheapest")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason

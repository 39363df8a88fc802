"""Queries that keep inner nodes in hidden state tables refresh DIFFERENTIAL, exactly.

An aggregate of an aggregate (TPC-H Q13's shape), an aggregate joined on its value (Q22's), and
the input of ORDER BY … LIMIT each keep a node in a hidden table (dvm/kept.py): the first
refresh (FULL) fills it, every later refresh reads it as stored and applies its change in the
same transaction. Random DML rounds; after every refresh the oracle, the history says
DIFFERENTIAL and one Spark job (the hidden tables' changes and the stream table's delta are one
plan). Dropping the stream table drops its hidden tables.
"""

from __future__ import annotations

import random

import pytest

from pgtrickle.dvm import materialize
from pgtrickle.refresh import differential
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import action_jobs, create_st, refresh_and_check

QUERIES = {
    "orders_per_customer_count": (
        "SELECT n, count(*) AS customers FROM (SELECT c.id, count(o.id) AS n FROM hs.customers c"
        " LEFT JOIN hs.orders o ON o.customer = c.id GROUP BY c.id) per_customer GROUP BY n"
    ),
    "above_average": (
        "SELECT c.region, count(*) AS n, sum(c.balance) AS total FROM hs.customers c"
        " WHERE c.balance > (SELECT avg(balance) FROM hs.customers WHERE balance > 0) GROUP BY c.region"
    ),
    "top_spenders": (
        "SELECT c.id, c.region, sum(o.amount) AS spent FROM hs.customers c JOIN hs.orders o"
        " ON o.customer = c.id GROUP BY c.id, c.region ORDER BY spent DESC, c.id LIMIT 5"
    ),
}


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE SCHEMA hs")
    db.sql("CREATE TABLE hs.customers (id int PRIMARY KEY, region text, balance numeric(12,2))")
    db.sql("CREATE TABLE hs.orders (id int PRIMARY KEY, customer int, amount numeric(12,2))")
    db.sql(
        "INSERT INTO hs.customers SELECT g, 'r' || (g % 4), (g * 7 % 23 - 5)::numeric(12,2)"
        " FROM generate_series(1, 40) g"
    )
    db.sql(
        "INSERT INTO hs.orders SELECT g, g % 37 + 1, (g % 11 + 0.5)::numeric(12,2) FROM generate_series(1, 120) g"
    )
    return db


def _dml(db: Database, rng: random.Random, next_id: list[int]) -> None:
    next_id[0] += 1
    db.sql("INSERT INTO hs.orders VALUES (%s, %s, 3.25)", (next_id[0], rng.randint(1, 40)))
    db.sql("UPDATE hs.customers SET balance = balance + 1.5 WHERE id = %s", (rng.randint(1, 40),))
    for _ in range(rng.randint(1, 6)):
        choice = rng.randrange(5)
        if choice == 0:
            next_id[0] += 1
            db.sql(
                "INSERT INTO hs.orders VALUES (%s, %s, %s)",
                (next_id[0], rng.randint(1, 45), round(rng.uniform(0, 20), 2)),
            )
        elif choice == 1:
            db.sql("DELETE FROM hs.orders WHERE id = (SELECT id FROM hs.orders ORDER BY random() LIMIT 1)")
        elif choice == 2:
            db.sql(
                "UPDATE hs.orders SET customer = %s WHERE id = (SELECT id FROM hs.orders ORDER BY random()"
                " LIMIT 1)",
                (rng.randint(1, 45),),
            )
        elif choice == 3:
            db.sql(
                "UPDATE hs.customers SET balance = %s WHERE id = %s",
                (round(rng.uniform(-10, 30), 2), rng.randint(1, 40)),
            )
        else:
            next_id[0] += 1
            db.sql(
                "INSERT INTO hs.customers VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (1000 + next_id[0], f"r{rng.randint(0, 4)}", round(rng.uniform(-5, 25), 2)),
            )


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_kept_nodes_refresh_differential_and_exact(shop: Database, name: str) -> None:
    db = shop
    create_st(db, name, QUERIES[name], refresh_mode="DIFFERENTIAL")
    assert [o.action for o in refresh_and_check(db, name)] == [Action.FULL]
    kept = db.sql("SELECT relid::regclass::text, reason FROM pgtrickle.pgt_state_tables")
    assert kept, "the query keeps a node in a hidden state table"
    if name == "orders_per_customer_count":
        # The inner count per customer, and the root's count per count as its state.
        assert sorted(reason for _, reason in kept) == sorted(
            [materialize.AGGREGATE_OF_AGGREGATE, materialize.ROOT_STATE]
        )
    rng = random.Random(name)
    next_id = [10_000]
    for _ in range(4):
        _dml(db, rng, next_id)
        outcomes = refresh_and_check(db, name)
        assert [o.action for o in outcomes] == [Action.DIFFERENTIAL], [o.reason for o in outcomes]
        # One Spark job computes the hidden tables' changes and the stream table's delta (a small
        # table the plan broadcasts would be a job of Spark's own, run first: not counted).
        assert action_jobs(db, name) == 1, db.sql(
            "SELECT spark_jobs, spark_jobs_why FROM pgtrickle.get_refresh_history(%s, 1)", (name,)
        )
        assert outcomes[0].spark_jobs == db.scalar(
            "SELECT spark_jobs FROM pgtrickle.get_refresh_history(%s, 1)", (name,)
        )
    db.sql("SELECT pgtrickle.drop_stream_table(%s)", (name,))
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_state_tables") == 0
    for relname, _ in kept:
        assert db.scalar("SELECT to_regclass(%s)", (relname,)) is None


@pytest.mark.parametrize("name", ["orders_per_customer_count", "top_spenders"])
def test_kept_shapes_read_their_sources_by_the_touched_keys(shop: Database, name: str) -> None:
    """The hidden table's change and the stream table's plan read ``customers`` and ``orders``
    only for the customers the changes touch (dvm/keyed.py): both reads are key-filtered in
    PostgreSQL, none whole, and the result is exact."""
    db = shop
    db.sql(
        "INSERT INTO hs.customers SELECT g, 'r' || (g % 4), (g % 23)::numeric(12,2) FROM generate_series(41, 12000) g"
    )
    db.sql(
        "INSERT INTO hs.orders SELECT g, g % 11999 + 1, (g % 11 + 0.5)::numeric(12,2)"
        " FROM generate_series(121, 40000) g"
    )
    db.sql("ANALYZE hs.customers")
    db.sql("ANALYZE hs.orders")
    create_st(db, name, QUERIES[name], refresh_mode="DIFFERENTIAL")
    assert [o.action for o in refresh_and_check(db, name)] == [Action.FULL]
    for round_ in range(2):
        db.sql(
            "INSERT INTO hs.orders VALUES (%s, 7, 99.5), (%s, 12001, 1.25)",
            (50_000 + 2 * round_, 50_001 + 2 * round_),
        )
        db.sql("UPDATE hs.orders SET customer = 8 WHERE id = %s", (300 + round_,))
        db.sql("DELETE FROM hs.orders WHERE id = %s", (400 + round_,))
        db.sql("INSERT INTO hs.customers VALUES (%s, 'r9', 1)", (12_001 + round_,))
        db.sql("UPDATE hs.customers SET region = 'r7' WHERE id = %s", (9 + round_,))
        [outcome] = refresh_and_check(db, name)
        assert outcome.action is Action.DIFFERENTIAL, outcome.reason
        assert outcome.timings.get("key_filtered_reads") == 2, outcome.timings
        assert "whole_table_reads" not in outcome.timings, outcome.timings


def test_a_kept_change_over_the_copy_limit_still_refreshes_exactly(
    shop: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A union of the hidden tables' changes and the delta over COPY_MAX_ROWS rows (here 4): each
    hidden table's change (the count per customer: 2 rows; the root's state: 4) is collected on
    its own, then the delta (4 rows) - more jobs, still DIFFERENTIAL and exact. (A delta over the
    limit is staged by JDBC: test_differential.py.)"""
    db = shop
    name = "orders_per_customer_count"
    create_st(db, name, QUERIES[name], refresh_mode="DIFFERENTIAL")
    assert [o.action for o in refresh_and_check(db, name)] == [Action.FULL]
    monkeypatch.setattr(differential, "COPY_MAX_ROWS", 4)
    # Customer 11 (3 orders) gains one: the kept count changes by 2 rows (its old and new count),
    # the histogram and its state by 4 each (customers with 3 orders one fewer, with 4 one more):
    # a union of 10.
    db.sql("INSERT INTO hs.orders VALUES (90001, 11, 1.5)")
    [outcome] = refresh_and_check(db, name)
    assert outcome.action is Action.DIFFERENTIAL, outcome.reason
    assert outcome.spark_jobs is not None and outcome.spark_jobs > 1, outcome.timings

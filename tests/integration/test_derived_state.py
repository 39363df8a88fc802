"""Columns computed from a stored aggregate state (dvm/stored.py, ``Derived``): a ratio of sums
(TPC-H Q8, Q14), a sum over a constant (Q17's ``sum(x) / 7.0``), arithmetic over an AVG.

Each stream table refreshes DIFFERENTIAL by the algebraic rule (the history says so) under rounds
of random inserts, updates (values, the CASE's condition, a row moving group) and deletes, one of
which removes every row of a group's CASE branch (a recomputed sum of zeros only has a smaller
display scale than the stored one; the quotient's value must not change). After every refresh
the oracle holds: EXCEPT ALL compares numeric values, so a quotient computed at another scale
than PostgreSQL's (its digits depend on its operands' display scales) fails it.
"""

from __future__ import annotations

import random

import pytest

from tests.conftest import Database
from tests.integration.helpers import create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

QUERIES = {
    # Q8: the share of one nation per year, a ratio of a CASE sum and a sum, over a join
    "share": "SELECT extract(year FROM o.d) AS yr, sum(CASE WHEN c.nation = 'BR' THEN o.amount * (1 - o.disc)"
    " ELSE 0 END) / sum(o.amount * (1 - o.disc)) AS share FROM orders o JOIN customers c ON c.cid = o.cust"
    " GROUP BY extract(year FROM o.d)",
    # Q8 as TPC-H writes it: the sums read columns of a derived table
    "share_dt": "SELECT yr, sum(CASE WHEN nation = 'BR' THEN volume ELSE 0 END) / sum(volume) AS share"
    " FROM (SELECT extract(year FROM o.d) AS yr, o.amount * (1 - o.disc) AS volume, c.nation"
    " FROM orders o, customers c WHERE c.cid = o.cust) AS all_nations GROUP BY yr",
    # Q14: one row, no group key
    "promo": "SELECT 100.00 * sum(CASE WHEN o.qty > 5 THEN o.amount ELSE 0 END) / sum(o.amount) AS promo"
    " FROM orders o",
    # Q17: a sum over a constant, beside a count and an arithmetic over an AVG
    "yearly": "SELECT o.cust, sum(o.amount) / 7.0 AS avg_yearly, count(*) AS n, avg(o.qty) * 2 - 1 AS a2"
    " FROM orders o GROUP BY o.cust",
}


def _schema(db: Database) -> None:
    db.sql("CREATE TABLE customers (cid int PRIMARY KEY, nation text)")
    db.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, cust int, d date, amount numeric(10,2), disc numeric(4,2),"
        " qty int)"
    )
    db.sql("INSERT INTO customers SELECT g, (ARRAY['BR','US','FR'])[1 + g % 3] FROM generate_series(1, 12) g")
    db.sql(
        "INSERT INTO orders SELECT g, 1 + g % 12, DATE '1995-01-01' + (g * 37) % 700, 10 + (g * 7) % 90 + 0.25,"
        " (g % 10) / 100.0, g % 9 FROM generate_series(1, 80) g"
    )


def _round(db: Database, rng: random.Random, next_id: int) -> int:
    for _ in range(rng.randint(1, 4)):
        db.sql(
            "INSERT INTO orders VALUES (%s, %s, DATE '1995-01-01' + %s, %s, %s, %s)",
            (
                next_id,
                rng.randint(1, 12),
                rng.randrange(700),
                rng.randint(1, 500) + 0.5,
                rng.randint(0, 9) / 100,
                rng.randint(0, 9),
            ),
        )
        next_id += 1
    db.sql("UPDATE orders SET amount = amount + 1.25 WHERE id %% 11 = %s", (rng.randrange(11),))
    db.sql("UPDATE orders SET qty = qty + 3 WHERE id %% 13 = %s", (rng.randrange(13),))
    db.sql("UPDATE orders SET cust = %s WHERE id = %s", (rng.randint(1, 12), rng.randint(1, next_id)))
    db.sql("UPDATE customers SET nation = 'BR' WHERE cid = %s", (rng.randint(1, 12),))
    db.sql("UPDATE customers SET nation = 'US' WHERE cid = %s", (rng.randint(1, 12),))
    db.sql("DELETE FROM orders WHERE id %% 17 = %s", (rng.randrange(17),))
    return next_id


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_columns_computed_from_the_stored_state_stay_exact(db: Database, name: str) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    _schema(db)
    create_st(db, name, QUERIES[name])
    refresh_and_check(db, name)
    rng = random.Random(name)
    next_id = 1000
    for i in range(4):
        if i == 2:
            # Every Brazilian order of 1995 goes: that year's CASE sum is a sum of zeros only now.
            db.sql(
                "DELETE FROM orders o USING customers c WHERE c.cid = o.cust AND c.nation = 'BR'"
                " AND o.d < DATE '1996-01-01'"
            )
        next_id = _round(db, rng, next_id)
        [outcome] = refresh_and_check(db, name)
        assert outcome.action.value == "DIFFERENTIAL", outcome.reason
        assert "algebraic over stored state" in outcome.reason, outcome.reason

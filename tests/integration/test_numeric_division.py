"""PostgreSQL's numeric division: the pure function against the server itself, and the refreshes.

``pgtrickle.sql.numeric_division.divide`` must print exactly what ``SELECT a / b`` prints, and
every stream table holding a quotient (FULL and DIFFERENTIAL) must equal its defining query
(two-way EXCEPT ALL), or refuse the refresh with SQLSTATE 22003 and keep its contents.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from pgtrickle.sql.numeric_division import divide
from tests.conftest import Database

pytestmark = pytest.mark.spark


def _random_numeric(rng: random.Random) -> str:
    integer_digits = rng.choice([0, 0, 1, 2, 4, 5, 8, 12, 20])
    scale = rng.choice([0, 0, 1, 2, 3, 4, 5, 8, 17, 25])
    digits = "".join(rng.choice("0123456789") for _ in range(integer_digits)) or "0"
    fraction = "".join(rng.choice("0123456789") for _ in range(scale))
    sign = rng.choice(["", "", "-"])
    return f"{sign}{digits}.{fraction}" if scale else f"{sign}{digits}"


def _scale(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def test_pure_division_prints_what_postgresql_prints(db: Database) -> None:
    rng = random.Random(20261127)
    pairs = []
    while len(pairs) < 3000:
        a, b = _random_numeric(rng), _random_numeric(rng)
        if Decimal(b) != 0:
            pairs.append((a, b))
    pairs += [("1", "3"), ("0", "7"), ("1.7", "1.5"), ("-1", "8"), ("0.0000000000000000000000000001", "3")]
    pairs += [
        ("0.000000000000000000000000000001", "3"),
        ("99999999999999999999", "0.0001"),
        ("12345.6", "0.001"),
    ]
    pairs += [("123456789012345678901234567890", "7"), ("12345678901234567890123456789012345678", "3")]
    rows = db.sql(
        "SELECT a, b, (a::numeric / b::numeric)::text FROM unnest(%s::text[], %s::text[]) AS t(a, b)",
        ([a for a, _ in pairs], [b for _, b in pairs]),
    )
    wrong = [
        (a, b, expected, format(divide(Decimal(a), Decimal(b), _scale(a), _scale(b)), "f"))
        for a, b, expected in rows
        if format(divide(Decimal(a), Decimal(b), _scale(a), _scale(b)), "f") != expected
    ]
    assert not wrong, wrong[:10]

"""Which column bounds a key-pushed read (pure: refresh/key_bounds.py)."""

from __future__ import annotations

import pytest

from pgtrickle.dvm.keyed import KeySource, Restriction
from pgtrickle.refresh.key_bounds import PUSHDOWN_MIN_ROWS, narrowest, should_push_down

LINES = 6_000_000
BY_SUPPLIER = Restriction("l_suppkey", (KeySource("partsupp", "ps_suppkey"),))
BY_PART = Restriction("l_partkey", (KeySource("lineitem", "l_partkey"), KeySource("partsupp", "ps_partkey")))
CANDIDATES = (BY_SUPPLIER, BY_PART)


def test_the_column_selecting_fewer_rows_wins() -> None:
    """TPC-H Q20: ~7,000 suppliers of 600 lines each against ~8,000 parts of 30 lines each."""
    per_value = {"l_suppkey": 600.0, "l_partkey": 30.0}
    assert narrowest(CANDIDATES, {"l_suppkey": 7_000, "l_partkey": 8_000}, per_value, LINES) is BY_PART
    # Few enough suppliers and the supplier column wins.
    assert narrowest(CANDIDATES, {"l_suppkey": 10, "l_partkey": 8_000}, per_value, LINES) is BY_SUPPLIER


def test_unknowns_keep_the_first_candidate() -> None:
    """No statistics: every column counts as the whole table, so the first (fewest key sources)
    stays; too many keys to list rules a candidate out."""
    assert narrowest(CANDIDATES, {"l_suppkey": 5, "l_partkey": 5}, {}, LINES) is BY_SUPPLIER
    assert (
        narrowest(CANDIDATES, {"l_suppkey": None, "l_partkey": 8_000}, {"l_partkey": 30.0}, LINES) is BY_PART
    )
    assert narrowest(CANDIDATES, {"l_suppkey": None, "l_partkey": None}, {}, LINES) is BY_SUPPLIER


def test_a_lone_candidate_is_itself() -> None:
    assert narrowest((BY_PART,), {"l_partkey": 1}, {}, LINES) is BY_PART


@pytest.mark.parametrize(
    ("rows", "keys", "expected"),
    [
        (PUSHDOWN_MIN_ROWS - 1, 1, False),
        (LINES, 100, True),
        (LINES, 2_000_000, False),
        (40_000, 10_000, False),
    ],
)
def test_should_push_down(rows: int, keys: int, expected: bool) -> None:
    assert should_push_down(rows, keys) is expected


BY_PAIR = Restriction(("l_partkey", "l_suppkey"), (KeySource("partsupp", ("ps_partkey", "ps_suppkey")),))


def test_a_composite_key_selects_no_more_than_its_columns() -> None:
    """Q20's lines by the changed (part, supplier) pairs: ~9,000 pairs, each in no more lines than
    one part is; never estimated above the part column's own candidate, and it comes first."""
    per_value = {"l_suppkey": 600.0, "l_partkey": 30.0}
    counts = {BY_PAIR.column: 9_000, "l_suppkey": 7_000, "l_partkey": 8_000}
    assert narrowest((BY_PAIR, *CANDIDATES), counts, per_value, LINES) is BY_PAIR
    # Too many pairs to list: a column bounds the read.
    counts[BY_PAIR.column] = None
    assert narrowest((BY_PAIR, *CANDIDATES), counts, per_value, LINES) is BY_PART
    # Without statistics the pairs still come first.
    assert (
        narrowest((BY_PAIR, *CANDIDATES), {BY_PAIR.column: 9_000, "l_partkey": 8_000}, {}, LINES) is BY_PAIR
    )

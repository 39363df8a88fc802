"""Chained batch members (refresh/chained.py): which columns cross in-plan, and the frontier."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.errors import RefreshError
from pgtrickle.refresh.chained import IN_PLAN_TYPES, chained_frontier, column_why_not


def test_a_column_crosses_in_plan_only_when_its_stored_value_is_the_computed_one() -> None:
    assert column_why_not("v", "integer", False, "int", "int") is None
    assert column_why_not("t", "text", False, "string", "string") is None
    for pg_type in (
        "numeric",
        "numeric(12,3)",
        "character varying(10)",
        "character(3)",
        "posint",
        "timestamp",
    ):
        why = column_why_not("c", pg_type, False, "string", "string")
        assert why is not None and pg_type in why
    assert "carry" in (column_why_not("f", "double precision", True, "double", "double") or "")
    why = column_why_not("v", "bigint", False, "int", "bigint")
    assert why is not None and "int in the upstream delta but bigint" in why
    assert "absent" in (column_why_not("v", "integer", False, "absent", "int") or "")


def test_the_frontier_makes_the_upstream_applies_visible_and_nothing_else() -> None:
    snapshot = "100:105:101,103"
    assert chained_frontier(snapshot, []) == snapshot
    assert chained_frontier(snapshot, [None]) == snapshot
    # 108 committed after the snapshot: 105..107 began meanwhile and stay invisible.
    assert chained_frontier(snapshot, [108]) == "100:109:101,103,105,106,107"
    assert chained_frontier(snapshot, [108, 106, None]) == "100:109:101,103,105,107"
    assert chained_frontier(snapshot, [106, 108]) == chained_frontier(snapshot, [108, 106])
    with pytest.raises(RefreshError, match="transactions started"):
        chained_frontier(snapshot, [105 + 10_000_000])


def visible(snapshot: str, xid: int) -> bool:
    xmin, xmax, xip = snapshot.split(":")
    return xid < int(xmin) or (xid < int(xmax) and str(xid) not in xip.split(","))


@given(
    st.integers(10, 50),
    st.sets(st.integers(0, 30)),
    st.sets(st.integers(0, 40), max_size=4),
)
def test_visible_exactly_what_the_snapshot_saw_plus_the_applies(
    start: int, running: set[int], applied: set[int]
) -> None:
    xmax = start + 20
    xip = sorted(start + r for r in running if start + r < xmax)
    snapshot = f"{start}:{xmax}:{','.join(map(str, xip))}"
    xids = [xmax + a for a in applied]
    frontier = chained_frontier(snapshot, xids)
    for xid in range(start - 5, xmax + 45):
        assert visible(frontier, xid) == (visible(snapshot, xid) or xid in xids)


def test_the_types_that_cross_in_plan_are_the_plain_ones() -> None:
    assert "numeric" not in IN_PLAN_TYPES and "integer" in IN_PLAN_TYPES

"""Splitting a tagged union's collected rows per target (refresh/tagged.py; pure, no JVM)."""

from __future__ import annotations

from pgtrickle.refresh.tagged import split_rows


def test_each_row_goes_to_its_tag_with_its_own_values() -> None:
    # rows: tag, then each part's values as one struct (None in the others' rows), weight, row id
    rows = [
        (7, ("a", 1), None, 1, 11),
        (3, None, (2.5,), -1, 12),
        (7, ("b", None), None, 2, 13),
    ]
    assert split_rows(rows, [7, 3]) == {7: [("a", 1, 1, 11), ("b", None, 2, 13)], 3: [(2.5, -1, 12)]}


def test_a_target_without_rows_gets_an_empty_list() -> None:
    assert split_rows([(2, None, None, ("x", "y"), 1, 5)], [0, 1, 2]) == {0: [], 1: [], 2: [("x", "y", 1, 5)]}

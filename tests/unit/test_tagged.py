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


def test_parts_of_one_known_type_share_a_slot_unknown_ones_get_their_own() -> None:
    from pgtrickle.refresh.tagged import shared_slots

    assert shared_slots([]) == []
    assert shared_slots([None, None]) == [0, 1]
    assert shared_slots(["a", "a", "a"]) == [0, 0, 0]
    assert shared_slots(["a", None, "b", "a", None, "b"]) == [0, 1, 2, 0, 3, 2]


def test_rows_of_parts_sharing_a_slot_go_to_their_own_tags() -> None:
    # parts 7 and 3 share slot 0, part 5 has slot 1
    rows = [
        (7, ("a", 1), None, 1, 11),
        (3, ("b", 2), None, -1, 12),
        (5, None, (2.5,), 1, 13),
    ]
    assert split_rows(rows, [7, 3, 5], [0, 0, 1]) == {
        7: [("a", 1, 1, 11)],
        3: [("b", 2, -1, 12)],
        5: [(2.5, 1, 13)],
    }

"""Atomic refresh groups: detection (scheduler.groups) and decisions (refresh.group_plan)."""

from __future__ import annotations

import pytest

from pgtrickle.errors import RefreshError
from pgtrickle.refresh.group_plan import MAX_SKIPPED_XIDS, frontier_with_own_xid, member_actions
from pgtrickle.refresh.plan import Action
from pgtrickle.scheduler.groups import GroupNode, diamond_members, in_group_upstream, refresh_groups

T1, T2 = 1001, 1002  # table relids


def nodes(*specs: tuple) -> dict[int, GroupNode]:
    out = {}
    for spec in specs:
        pgt_id, tables, ups = spec[:3]
        atomic = spec[3] if len(spec) > 3 else True
        out[pgt_id] = GroupNode(pgt_id, f"st{pgt_id}", frozenset(tables), frozenset(ups), atomic)
    return out


def test_classic_diamond() -> None:
    g = nodes((1, [T1], []), (2, [T1], []), (3, [], [1, 2]))
    assert diamond_members(g, 3) == {1, 2, 3}
    assert diamond_members(g, 1) == frozenset()


def test_two_sources_that_share_nothing_are_no_diamond() -> None:
    g = nodes((1, [T1], []), (2, [T2], []), (3, [], [1, 2]))
    assert diamond_members(g, 3) == frozenset()
    assert refresh_groups(g) == []


def test_a_table_read_directly_and_through_a_stream_table_is_a_diamond() -> None:
    g = nodes((1, [T1], []), (2, [T1], [1]))
    assert diamond_members(g, 2) == {1, 2}


def test_a_stream_table_read_directly_and_through_another() -> None:
    g = nodes((1, [T1], []), (2, [], [1]), (3, [], [1, 2]))
    assert diamond_members(g, 3) == {1, 2, 3}


def test_members_are_only_the_paths_from_the_shared_ancestor() -> None:
    # 4 reads T2 only: not on a path from the shared T1, so it refreshes on its own.
    g = nodes((1, [T1], []), (2, [T1], []), (4, [T2], []), (3, [], [1, 2, 4]))
    assert diamond_members(g, 3) == {1, 2, 3}


def test_deeper_paths_are_members() -> None:
    g = nodes((1, [T1], []), (5, [], [1]), (2, [T1], []), (3, [], [5, 2]))
    assert diamond_members(g, 3) == {1, 2, 3, 5}


def test_none_turns_detection_off_and_explicit_groups_merge_with_overlapping_diamonds() -> None:
    g = nodes((1, [T1], []), (2, [T1], []), (3, [], [1, 2], False), (7, [T2], []))
    assert refresh_groups(g) == []
    g = nodes((1, [T1], []), (2, [T1], []), (3, [], [1, 2]), (7, [T2], []), (8, [T2], []))
    groups = refresh_groups(g, {"extra": [3, 7], "other": [8, 99]})
    assert [(x.name, set(x.members)) for x in groups] == [("extra, diamond at st3", {1, 2, 3, 7})]
    assert in_group_upstream(g, groups[0]) == {1: frozenset(), 2: frozenset(), 3: {1, 2}, 7: frozenset()}


def test_member_actions_roots_keep_their_plan_downstream_recompute() -> None:
    ups = {1: frozenset(), 2: frozenset(), 3: frozenset({1, 2}), 4: frozenset({3})}
    order = [1, 2, 3, 4]
    nothing = dict.fromkeys(order, Action.NO_DATA)
    assert member_actions(order, ups, nothing) == nothing
    got = member_actions(order, ups, {**nothing, 2: Action.DIFFERENTIAL})
    assert got == {1: Action.NO_DATA, 2: Action.DIFFERENTIAL, 3: Action.FULL, 4: Action.FULL}
    got = member_actions(order, ups, {**nothing, 4: Action.DIFFERENTIAL})
    assert got == {1: Action.NO_DATA, 2: Action.NO_DATA, 3: Action.NO_DATA, 4: Action.FULL}


@pytest.mark.parametrize(
    "snapshot, xid, expected",
    [
        ("100:105:100,102", 107, "100:108:100,102,105,106"),
        ("100:100:", 100, "100:101:"),
        ("100:100:", 103, "100:104:100,101,102"),
        ("100:105:100,102", 102, "100:105:100"),  # already in progress in the snapshot: made visible
        ("100:105:100,102", 101, "100:105:100,102"),  # already visible
    ],
)
def test_frontier_with_own_xid(snapshot: str, xid: int, expected: str) -> None:
    assert frontier_with_own_xid(snapshot, xid) == expected


def test_frontier_with_own_xid_refuses_garbage_and_huge_gaps() -> None:
    with pytest.raises(ValueError, match="not a pg_snapshot"):
        frontier_with_own_xid("nonsense", 5)
    with pytest.raises(RefreshError, match="retried"):
        frontier_with_own_xid("1:2:", 3 + MAX_SKIPPED_XIDS)

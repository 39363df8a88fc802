"""Atomic refresh groups: detection (scheduler.groups) and decisions (refresh.group_plan)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtrickle.errors import RefreshError
from pgtrickle.refresh.group_plan import (
    MAX_SKIPPED_XIDS,
    MemberInputs,
    MemberPlan,
    frontier_with_own_xid,
    member_action,
    member_actions,
)
from pgtrickle.refresh.plan import Action
from pgtrickle.scheduler.groups import GroupNode, diamond_members, in_group_upstream, refresh_groups
from tests.hypothesis_profiles import examples

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


def plans_of(order, ups, own, **kw) -> dict[int, MemberPlan]:
    inputs = {
        m: MemberInputs(own[m], kw.get("blocked", {}).get(m), kw.get("untaken", {}).get(m, {})) for m in order
    }
    return member_actions(order, ups, inputs, {m: f"st{m}" for m in order})


def actions_of(plans: dict[int, MemberPlan]) -> dict[int, Action]:
    return {m: p.action for m, p in plans.items()}


UPS = {1: frozenset(), 2: frozenset(), 3: frozenset({1, 2}), 4: frozenset({3})}
ORDER = [1, 2, 3, 4]
NOTHING = dict.fromkeys(ORDER, Action.NO_DATA)


def test_nothing_anywhere_is_no_data() -> None:
    assert actions_of(plans_of(ORDER, UPS, NOTHING)) == NOTHING


def test_downstream_members_take_the_upstream_change_differentially() -> None:
    got = plans_of(ORDER, UPS, {**NOTHING, 2: Action.DIFFERENTIAL})
    assert actions_of(got) == {
        1: Action.NO_DATA,
        2: Action.DIFFERENTIAL,
        3: Action.DIFFERENTIAL,
        4: Action.DIFFERENTIAL,
    }
    assert got[2].why is None, "a root keeps its own plan and reason"
    assert got[3].why == "the change of upstream member st2 computed in this refresh"
    assert got[4].why == "the change of upstream member st3 computed in this refresh"


def test_a_member_with_changes_of_its_own_under_an_idle_upstream_keeps_its_plan() -> None:
    got = plans_of(ORDER, UPS, {**NOTHING, 4: Action.DIFFERENTIAL})
    assert actions_of(got) == {**NOTHING, 4: Action.DIFFERENTIAL}
    assert got[4].why is None


def test_an_upstream_full_refresh_makes_every_member_below_it_full_and_says_why() -> None:
    got = plans_of(ORDER, UPS, {1: Action.FULL, 2: Action.DIFFERENTIAL, 3: Action.NO_DATA, 4: Action.NO_DATA})
    assert actions_of(got) == {1: Action.FULL, 2: Action.DIFFERENTIAL, 3: Action.FULL, 4: Action.FULL}
    assert got[3].why is not None and "upstream member st1 refreshes FULL" in got[3].why
    assert got[4].why is not None and "upstream member st3 refreshes FULL" in got[4].why


def test_a_member_that_has_not_taken_an_upstream_change_yet_is_recomputed() -> None:
    got = plans_of(
        ORDER, UPS, {**NOTHING, 1: Action.DIFFERENTIAL, 3: Action.DIFFERENTIAL}, untaken={3: {1: 7, 2: 0}}
    )
    assert actions_of(got) == {1: Action.DIFFERENTIAL, 2: Action.NO_DATA, 3: Action.FULL, 4: Action.FULL}
    assert got[3].why is not None and "7 changes of upstream member st1" in got[3].why


def test_a_member_that_cannot_refresh_differentially_says_why() -> None:
    got = plans_of(ORDER, UPS, {**NOTHING, 1: Action.DIFFERENTIAL}, blocked={3: "refresh_mode is FULL"})
    assert actions_of(got) == {1: Action.DIFFERENTIAL, 2: Action.NO_DATA, 3: Action.FULL, 4: Action.FULL}
    assert got[3].why == "refresh_mode is FULL"
    assert "upstream member st3 refreshes FULL" in (got[4].why or "")


def test_a_member_full_on_its_own_keeps_its_own_reason() -> None:
    got = plans_of(ORDER, UPS, {**NOTHING, 1: Action.DIFFERENTIAL, 3: Action.FULL})
    assert got[3] == MemberPlan(Action.FULL)


def test_decided_again_when_an_upstream_member_fell_back_to_full() -> None:
    inputs = MemberInputs(Action.NO_DATA)
    assert member_action(inputs, {1: Action.DIFFERENTIAL}, {}).action is Action.DIFFERENTIAL
    assert member_action(inputs, {1: Action.FULL}, {}).action is Action.FULL


ACTIONS = st.sampled_from([Action.NO_DATA, Action.DIFFERENTIAL, Action.FULL])


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data(), n=st.integers(1, 6))
def test_member_actions_properties(data: st.DataObject, n: int) -> None:
    """Over random DAGs: a member is FULL iff its own plan is, an upstream member is, it has untaken
    upstream changes, or it cannot run differentially while something changes; DIFFERENTIAL needs
    a change of its own or upstream; FULL never appears below a root's DIFFERENTIAL without a reason."""
    order = list(range(1, n + 1))
    ups = {
        m: frozenset(data.draw(st.sets(st.sampled_from(order[: m - 1]))) if m > 1 else frozenset())
        for m in order
    }
    own = {m: data.draw(ACTIONS) for m in order}
    blocked = {m: "no rule" for m in order if own[m] is not Action.DIFFERENTIAL and data.draw(st.booleans())}
    untaken = {m: {u: data.draw(st.integers(0, 2)) for u in ups[m]} for m in order}
    got = plans_of(order, ups, own, blocked=blocked, untaken=untaken)
    for m in order:
        action, why = got[m].action, got[m].why
        if not ups[m]:
            assert got[m] == MemberPlan(own[m])
            continue
        up = {got[u].action for u in ups[m]}
        changes = own[m] is not Action.NO_DATA or Action.DIFFERENTIAL in up
        must_full = (
            own[m] is Action.FULL
            or Action.FULL in up
            or any(untaken[m].values())
            or (changes and m in blocked)
        )
        if must_full:
            assert action is Action.FULL
            assert why is not None or own[m] is Action.FULL
        elif changes:
            assert action is Action.DIFFERENTIAL
        else:
            assert action is Action.NO_DATA


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

"""Unit tests for pgtrickle.scheduler.dag."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import DependencyCycleError, PgTrickleError, ScheduleError
from pgtrickle.scheduler.cron import CronSpec
from pgtrickle.scheduler.dag import (
    DEFAULT_CALCULATED_SCHEDULE,
    StreamTableNode,
    downstream_closure,
    resolve_calculated,
    topological_order,
    upstream_closure,
    would_create_cycle,
)
from pgtrickle.scheduler.schedule import (
    CalculatedSchedule,
    CronSchedule,
    IntervalSchedule,
    Schedule,
)
from tests.hypothesis_profiles import examples

NOW = datetime(2024, 5, 17, 12, 0, tzinfo=UTC)
CALC = CalculatedSchedule()
EVERY_5_MINUTES = CronSchedule(CronSpec.of(minute=range(0, 60, 5)))
EVERY_10_MINUTES = CronSchedule(CronSpec.of(minute=range(0, 60, 10)))
# The schedules the nodes below use, by the text they stand for (the grammar is the catalog's).
SCHEDULES: dict[str, Schedule] = {
    "1s": IntervalSchedule(1),
    "30s": IntervalSchedule(30),
    "1m": IntervalSchedule(60),
    "2m": IntervalSchedule(120),
    "5m": IntervalSchedule(300),
    "10m": IntervalSchedule(600),
    "1h": IntervalSchedule(3600),
    "*/5 * * * *": EVERY_5_MINUTES,
    "*/10 * * * *": EVERY_10_MINUTES,
    "@hourly": CronSchedule(CronSpec.of(minute=[0])),
    "@daily": CronSchedule(CronSpec.of(minute=[0], hour=[0])),
}


def node(
    pgt_id: int, *upstream: int, schedule: Schedule | str = "1m", name: str | None = None
) -> StreamTableNode:
    """A node named ``st<pgt_id>`` unless named otherwise."""
    if isinstance(schedule, str):
        schedule = SCHEDULES[schedule]
    return StreamTableNode(
        pgt_id=pgt_id,
        name=name or f"st{pgt_id}",
        schedule=schedule,
        upstream=frozenset(upstream),
    )


def chain(*ids: int) -> list[StreamTableNode]:
    """Nodes where each id reads the one before it: ids[0] -> ids[1] -> ..."""
    return [node(ids[0])] + [node(pgt_id, prev) for prev, pgt_id in pairwise(ids)]


# Diamond: 1 feeds 2 and 3, which both feed 4.
DIAMOND = [node(1), node(2, 1), node(3, 1), node(4, 2, 3)]


# --- StreamTableNode --------------------------------------------------------------


def test_node_is_frozen_and_hashable() -> None:
    n = node(1, 2)
    with pytest.raises(AttributeError):
        n.name = "other"  # type: ignore[misc]
    assert {n, node(1, 2)} == {n}


# --- topological_order ----------------------------------------------------------------


def test_empty() -> None:
    assert topological_order([]) == []


def test_independent_nodes_in_id_order() -> None:
    assert topological_order([node(3), node(1), node(2)]) == [1, 2, 3]


def test_chain_upstream_first() -> None:
    nodes = chain(40, 30, 20, 10)  # 40 feeds 30 feeds 20 feeds 10
    assert topological_order(reversed(nodes)) == [40, 30, 20, 10]


def test_diamond() -> None:
    assert topological_order(DIAMOND) == [1, 2, 3, 4]
    assert topological_order(reversed(DIAMOND)) == [1, 2, 3, 4]


def test_ties_broken_by_pgt_id_once_ready() -> None:
    # 5 has no upstream; 2 waits for 9. Ready sets: {5, 9} -> 5, 9, then 2.
    nodes = [node(2, 9), node(9), node(5)]
    assert topological_order(nodes) == [5, 9, 2]


def test_unknown_upstream_ids_are_ignored() -> None:
    # 100 and 200 are plain source tables, not stream tables.
    nodes = [node(2, 1, 100), node(1, 200)]
    assert topological_order(nodes) == [1, 2]


def test_accepts_any_iterable() -> None:
    assert topological_order(n for n in DIAMOND) == [1, 2, 3, 4]


def test_two_node_cycle_is_named() -> None:
    nodes = [node(1, 2, name="public.a"), node(2, 1, name="public.b")]
    with pytest.raises(DependencyCycleError, match=r"public\.a -> public\.b -> public\.a"):
        topological_order(nodes)


def test_three_node_cycle_in_data_flow_order() -> None:
    # a reads c, b reads a, c reads b: data flows a -> b -> c -> a.
    nodes = [node(1, 3, name="a"), node(2, 1, name="b"), node(3, 2, name="c")]
    with pytest.raises(DependencyCycleError, match="a -> b -> c -> a"):
        topological_order(nodes)


def test_self_cycle() -> None:
    with pytest.raises(DependencyCycleError, match="loop -> loop"):
        topological_order([node(1), node(7, 1, 7, name="loop")])


def test_cycle_behind_acyclic_part_is_found() -> None:
    # 1 -> 2 -> 3 is fine; 3 feeds a cycle 4 <-> 5, which feeds 6.
    nodes = [node(1), node(2, 1), node(3, 2), node(4, 3, 5), node(5, 4), node(6, 5)]
    with pytest.raises(DependencyCycleError) as excinfo:
        topological_order(nodes)
    assert "st4 -> st5 -> st4" in str(excinfo.value)
    assert "st6" not in str(excinfo.value)
    assert isinstance(excinfo.value, PgTrickleError)


def test_duplicate_ids_rejected() -> None:
    with pytest.raises(ValueError, match="pgt_id 1"):
        topological_order([node(1, name="a"), node(1, name="b")])


@st.composite
def random_dags(draw: st.DrawFn) -> list[StreamTableNode]:
    """A random acyclic graph: each node reads only nodes earlier in a hidden order.

    pgt_ids are shuffled so the hidden order is not simply id order, and some
    upstream ids name plain source tables outside the graph.
    """
    size = draw(st.integers(min_value=0, max_value=15))
    ids = draw(st.permutations(range(1, size + 1)))
    nodes = []
    for position, pgt_id in enumerate(ids):
        upstream = draw(st.sets(st.sampled_from(ids[:position]))) if position else set()
        sources = draw(st.sets(st.integers(min_value=1000, max_value=1010), max_size=2))
        nodes.append(node(pgt_id, *(upstream | sources)))
    return draw(st.permutations(nodes))


@settings(max_examples=examples(150))
@given(random_dags())
def test_random_dags_upstream_before_downstream(nodes: list[StreamTableNode]) -> None:
    order = topological_order(nodes)
    assert sorted(order) == sorted(n.pgt_id for n in nodes)
    position = {pgt_id: index for index, pgt_id in enumerate(order)}
    for n in nodes:
        for upstream_id in n.upstream & position.keys():
            assert position[upstream_id] < position[n.pgt_id]
    assert topological_order(reversed(nodes)) == order  # deterministic


@settings(max_examples=examples(100))
@given(random_dags())
def test_random_dags_keep_their_edges_without_cycles(nodes: list[StreamTableNode]) -> None:
    for n in nodes:
        assert would_create_cycle(nodes, n.pgt_id, n.upstream) is None


@settings(max_examples=examples(100))
@given(random_dags(), st.data())
def test_random_back_edge_reports_a_real_cycle(nodes: list[StreamTableNode], data: st.DataObject) -> None:
    with_ancestors = [n for n in nodes if upstream_closure(nodes, [n.pgt_id])]
    assume(with_ancestors)
    descendant = data.draw(st.sampled_from(with_ancestors))
    ancestor_id = data.draw(st.sampled_from(sorted(upstream_closure(nodes, [descendant.pgt_id]))))
    by_name = {n.name: n for n in nodes}
    new_upstream = by_name[f"st{ancestor_id}"].upstream | {descendant.pgt_id}

    cycle = would_create_cycle(nodes, ancestor_id, new_upstream)

    assert cycle is not None
    assert cycle[0] == cycle[-1] == f"st{ancestor_id}"
    assert len(set(cycle)) == len(cycle) - 1
    for feeder, reader in pairwise(cycle):
        upstream = new_upstream if reader == cycle[0] else by_name[reader].upstream
        assert by_name[feeder].pgt_id in upstream


# --- would_create_cycle ----------------------------------------------------------------


def test_no_cycle_for_new_node() -> None:
    assert would_create_cycle(DIAMOND, 5, [4, 1]) is None


def test_no_cycle_when_rewiring_without_loop() -> None:
    assert would_create_cycle(DIAMOND, 4, [1]) is None


def test_cycle_when_upstream_reads_downstream() -> None:
    nodes = chain(1, 2, 3)  # 1 feeds 2 feeds 3
    assert would_create_cycle(nodes, 1, [3]) == ["st1", "st2", "st3", "st1"]


def test_shortest_cycle_reported() -> None:
    # 1 feeds 2 and 3 directly, and 3 also through 2: making 1 read 3 gives 1 -> 3 -> 1.
    nodes = [node(1), node(2, 1), node(3, 1, 2)]
    assert would_create_cycle(nodes, 1, [3]) == ["st1", "st3", "st1"]


def test_self_reference() -> None:
    assert would_create_cycle(DIAMOND, 2, [2]) == ["st2", "st2"]


def test_self_reference_of_unknown_node_uses_placeholder_name() -> None:
    assert would_create_cycle(DIAMOND, 9, [9]) == ["<pgt_id 9>", "<pgt_id 9>"]


def test_existing_cycle_elsewhere_not_reported() -> None:
    nodes = [node(1, 2), node(2, 1), node(3)]
    assert would_create_cycle(nodes, 4, [3]) is None


def test_unknown_upstream_ignored_in_cycle_check() -> None:
    assert would_create_cycle(DIAMOND, 1, [999]) is None


# --- resolve_calculated -----------------------------------------------------------------


def test_non_calculated_map_to_themselves() -> None:
    nodes = [node(1, schedule="5m"), node(2, 1, schedule="*/10 * * * *")]
    assert resolve_calculated(nodes, NOW) == {
        1: IntervalSchedule(300),
        2: EVERY_10_MINUTES,
    }


def test_calculated_takes_tightest_downstream() -> None:
    nodes = [
        node(1, schedule=CALC),
        node(2, 1, schedule="10m"),
        node(3, 1, schedule="*/5 * * * *"),
        node(4, 1, schedule="@hourly"),
    ]
    assert resolve_calculated(nodes, NOW)[1] == EVERY_5_MINUTES


def test_calculated_tie_goes_to_smallest_downstream_id() -> None:
    nodes = [node(1, schedule=CALC), node(3, 1, schedule="@hourly"), node(2, 1, schedule="1h")]
    assert resolve_calculated(nodes, NOW)[1] == IntervalSchedule(3600)


def test_calculated_chain_resolves_transitively() -> None:
    # 1 (calc) -> 2 (calc) -> 3 (calc) -> 4 (30s)
    nodes = [
        node(1, schedule=CALC),
        node(2, 1, schedule=CALC),
        node(3, 2, schedule=CALC),
        node(4, 3, schedule="30s"),
    ]
    assert resolve_calculated(nodes, NOW) == {i: IntervalSchedule(30) for i in (1, 2, 3, 4)}


def test_calculated_without_downstream_gets_default() -> None:
    nodes = [node(1, schedule=CALC), node(2, 1, schedule=CALC), node(3, schedule=CALC)]
    assert resolve_calculated(nodes, NOW) == dict.fromkeys((1, 2, 3), DEFAULT_CALCULATED_SCHEDULE)
    assert IntervalSchedule(60) == DEFAULT_CALCULATED_SCHEDULE
    custom = IntervalSchedule(900)
    assert resolve_calculated(nodes, NOW, default=custom) == dict.fromkeys((1, 2, 3), custom)


def test_calculated_leaf_downstream_counts_with_its_default() -> None:
    # 1 (calc) feeds 2 (calc, nothing downstream -> default 1m) and 3 (5m).
    nodes = [node(1, schedule=CALC), node(2, 1, schedule=CALC), node(3, 1, schedule="5m")]
    resolved = resolve_calculated(nodes, NOW)
    assert resolved[2] == IntervalSchedule(60)
    assert resolved[1] == IntervalSchedule(60)
    resolved = resolve_calculated(nodes, NOW, default=IntervalSchedule(3600))
    assert resolved[1] == IntervalSchedule(300)


def test_calculated_diamond() -> None:
    # 1 (calc) feeds 2 (calc) and 3 (10m); 2 and 3 feed 4 (2m). 1 takes 2m through 2.
    nodes = [
        node(1, schedule=CALC),
        node(2, 1, schedule=CALC),
        node(3, 1, schedule="10m"),
        node(4, 2, 3, schedule="2m"),
    ]
    resolved = resolve_calculated(nodes, NOW)
    assert resolved == {
        1: IntervalSchedule(120),
        2: IntervalSchedule(120),
        3: IntervalSchedule(600),
        4: IntervalSchedule(120),
    }


def test_calculated_ignores_upstream_schedules() -> None:
    nodes = [node(1, schedule="1s"), node(2, 1, schedule=CALC)]
    assert resolve_calculated(nodes, NOW)[2] == DEFAULT_CALCULATED_SCHEDULE


def test_resolve_calculated_rejects_cycles() -> None:
    nodes = [node(1, 2, schedule=CALC), node(2, 1)]
    with pytest.raises(DependencyCycleError):
        resolve_calculated(nodes, NOW)


def test_resolve_calculated_rejects_calculated_default() -> None:
    with pytest.raises(ScheduleError, match="default"):
        resolve_calculated(DIAMOND, NOW, default=CALC)


def test_resolve_calculated_rejects_naive_now() -> None:
    nodes = [node(1, schedule=CALC), node(2, 1, schedule="@daily"), node(3, 1, schedule="1h")]
    with pytest.raises(ValueError, match="timezone-aware"):
        resolve_calculated(nodes, datetime(2024, 5, 17))


# --- closures ------------------------------------------------------------------------------


def test_downstream_closure_chain() -> None:
    nodes = chain(1, 2, 3, 4)
    assert downstream_closure(nodes, [1]) == {2, 3, 4}
    assert downstream_closure(nodes, [3]) == {4}
    assert downstream_closure(nodes, [4]) == set()


def test_upstream_closure_chain() -> None:
    nodes = chain(1, 2, 3, 4)
    assert upstream_closure(nodes, [4]) == {1, 2, 3}
    assert upstream_closure(nodes, [2]) == {1}
    assert upstream_closure(nodes, [1]) == set()


def test_closures_on_diamond() -> None:
    assert downstream_closure(DIAMOND, [1]) == {2, 3, 4}
    assert downstream_closure(DIAMOND, [2]) == {4}
    assert upstream_closure(DIAMOND, [4]) == {1, 2, 3}
    assert upstream_closure(DIAMOND, [3]) == {1}


def test_closures_exclude_start_ids() -> None:
    nodes = chain(1, 2, 3)
    assert downstream_closure(nodes, [1, 2]) == {3}
    assert upstream_closure(nodes, {2, 3}) == {1}


def test_closures_ignore_unknown_ids() -> None:
    nodes = [node(2, 1, 100), node(1)]
    assert downstream_closure(nodes, [100, 999]) == set()
    assert upstream_closure(nodes, [2]) == {1}
    assert upstream_closure(nodes, []) == set()


@settings(max_examples=examples(100))
@given(random_dags())
def test_closures_are_mirror_images(nodes: list[StreamTableNode]) -> None:
    for n in nodes:
        for other in downstream_closure(nodes, [n.pgt_id]):
            assert n.pgt_id in upstream_closure(nodes, [other])

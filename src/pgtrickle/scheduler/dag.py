"""The dependency graph between stream tables.

A stream table that reads another stream table is *downstream* of it and must be
refreshed after it. Plain source tables are not part of the graph: an upstream
id that names no node is ignored everywhere here.

Cycles are reported in data-flow order, each stream table feeding the next, and
starting and ending with the same table: ``a -> b -> a``.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pgtrickle.errors import DependencyCycleError, ScheduleError
from pgtrickle.scheduler.schedule import (
    CalculatedSchedule,
    IntervalSchedule,
    Schedule,
    interval_seconds,
)

Graph = Mapping[int, frozenset[int]]
"""Each node's pgt_id mapped to the pgt_ids of the nodes on the other end of its edges."""

DEFAULT_CALCULATED_SCHEDULE = IntervalSchedule(60)
"""What a calculated stream table with nothing downstream of it falls back to."""


@dataclass(frozen=True)
class StreamTableNode:
    """One stream table as the scheduler sees it.

    Attributes:
        pgt_id: The stream table's catalog id.
        name: Its qualified display name, used in error messages.
        schedule: Its schedule as declared (possibly :class:`CalculatedSchedule`).
        upstream: The pgt_ids of the stream tables its query reads.
    """

    pgt_id: int
    name: str
    schedule: Schedule
    upstream: frozenset[int] = frozenset()


def topological_order(nodes: Iterable[StreamTableNode]) -> list[int]:
    """The pgt_ids in refresh order: every stream table after all its upstreams.

    Among stream tables that are ready at the same time, the smallest pgt_id
    comes first, so the order is deterministic.

    Raises:
        DependencyCycleError: naming the stream tables of a cycle, in order.
        ValueError: if two nodes share a pgt_id.
    """
    by_id = _index(nodes)
    upstream = _upstream_graph(by_id)
    downstream = _reverse(upstream)
    waiting = {pgt_id: len(ids) for pgt_id, ids in upstream.items()}
    ready = [pgt_id for pgt_id, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        pgt_id = heapq.heappop(ready)
        order.append(pgt_id)
        for child in downstream[pgt_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(by_id):
        cycles = (_cycle_through(upstream, pgt_id) for pgt_id in sorted(by_id.keys() - order))
        cycle = next(cycle for cycle in cycles if cycle is not None)
        names = " -> ".join(by_id[pgt_id].name for pgt_id in cycle)
        raise DependencyCycleError(
            f"stream tables depend on each other in a cycle: {names}; "
            "change one of their defining queries to break it"
        )
    return order


def would_create_cycle(
    nodes: Iterable[StreamTableNode], new_id: int, new_upstream: Iterable[int]
) -> list[str] | None:
    """The cycle that giving ``new_id`` the upstreams ``new_upstream`` would create.

    ``new_id`` may be a new stream table or an existing one whose upstreams are
    replaced. Returns the names along the shortest such cycle, in data-flow order,
    starting and ending with ``new_id`` (e.g. ``["a", "b", "a"]``), or ``None`` if
    the change creates no cycle. Cycles that do not pass through ``new_id`` are
    not reported.
    """
    by_id = _index(nodes)
    graph = _upstream_graph(by_id)
    known = set(graph) | {new_id}
    graph[new_id] = frozenset(pgt_id for pgt_id in new_upstream if pgt_id in known)
    cycle = _cycle_through(graph, new_id)
    if cycle is None:
        return None
    return [by_id[pgt_id].name if pgt_id in by_id else f"<pgt_id {pgt_id}>" for pgt_id in cycle]


def resolve_calculated(
    nodes: Iterable[StreamTableNode],
    now: datetime,
    default: Schedule = DEFAULT_CALCULATED_SCHEDULE,
) -> dict[int, Schedule]:
    """Every stream table's effective schedule, keyed by pgt_id.

    A non-calculated schedule is its own effective schedule. A calculated one
    takes the tightest (smallest :func:`interval_seconds` at ``now``) effective
    schedule among its direct downstreams, so it resolves through calculated
    downstreams transitively; ties go to the downstream with the smallest
    pgt_id. A calculated stream table with no downstream gets ``default``, and
    so, through it, does any calculated chain that ends there.

    Raises:
        DependencyCycleError: if the stream tables depend on each other in a cycle.
        ScheduleError: if ``default`` is itself calculated.
        ValueError: if ``now`` is naive or two nodes share a pgt_id.
    """
    if isinstance(default, CalculatedSchedule):
        raise ScheduleError("the default for calculated schedules cannot itself be 'calculated'")
    by_id = _index(nodes)
    downstream = _reverse(_upstream_graph(by_id))
    effective: dict[int, Schedule] = {}
    for pgt_id in reversed(topological_order(by_id.values())):
        schedule = by_id[pgt_id].schedule
        if isinstance(schedule, CalculatedSchedule):
            candidates = [effective[child] for child in sorted(downstream[pgt_id])]
            schedule = min(candidates, key=lambda s: interval_seconds(s, now), default=default)
        effective[pgt_id] = schedule
    return {pgt_id: effective[pgt_id] for pgt_id in by_id}


def downstream_closure(nodes: Iterable[StreamTableNode], ids: Iterable[int]) -> set[int]:
    """The pgt_ids that read, directly or transitively, from any of ``ids``.

    The start ``ids`` themselves are excluded; ids that name no node are ignored.
    """
    return _reachable(_reverse(_upstream_graph(_index(nodes))), ids)


def upstream_closure(nodes: Iterable[StreamTableNode], ids: Iterable[int]) -> set[int]:
    """The pgt_ids that any of ``ids`` read from, directly or transitively.

    The start ``ids`` themselves are excluded; ids that name no node are ignored.
    """
    return _reachable(_upstream_graph(_index(nodes)), ids)


def _index(nodes: Iterable[StreamTableNode]) -> dict[int, StreamTableNode]:
    """Map each node's pgt_id to the node, rejecting duplicate ids."""
    by_id: dict[int, StreamTableNode] = {}
    for node in nodes:
        if node.pgt_id in by_id:
            raise ValueError(
                f"pgt_id {node.pgt_id} is used by both {by_id[node.pgt_id].name!r} and {node.name!r}"
            )
        by_id[node.pgt_id] = node
    return by_id


def _upstream_graph(by_id: Mapping[int, StreamTableNode]) -> dict[int, frozenset[int]]:
    """Each node's upstream ids, restricted to ids that are nodes."""
    return {pgt_id: node.upstream & by_id.keys() for pgt_id, node in by_id.items()}


def _reverse(graph: Graph) -> dict[int, frozenset[int]]:
    """The same graph with every edge turned around."""
    reversed_edges: dict[int, set[int]] = {pgt_id: set() for pgt_id in graph}
    for pgt_id, targets in graph.items():
        for target in targets:
            reversed_edges[target].add(pgt_id)
    return {pgt_id: frozenset(sources) for pgt_id, sources in reversed_edges.items()}


def _reachable(graph: Graph, ids: Iterable[int]) -> set[int]:
    """The nodes reachable from ``ids`` along ``graph``'s edges, without ``ids``."""
    start = {pgt_id for pgt_id in ids if pgt_id in graph}
    seen: set[int] = set()
    pending = list(start)
    while pending:
        for target in graph[pending.pop()]:
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return seen - start


def _cycle_through(upstream: Graph, start: int) -> list[int] | None:
    """The shortest cycle through ``start``, in data-flow order, or ``None``.

    Walks ``upstream`` edges breadth-first, smallest ids first, back to ``start``,
    then reads the path back through the search tree, which is data-flow order.
    """
    came_from: dict[int, int] = {}
    pending = deque([start])
    while pending:
        pgt_id = pending.popleft()
        for parent in sorted(upstream[pgt_id]):
            if parent == start:
                path = [start, pgt_id]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path
            if parent not in came_from:
                came_from[parent] = pgt_id
                pending.append(parent)
    return None

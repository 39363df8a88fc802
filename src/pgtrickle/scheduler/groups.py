"""Atomic refresh groups: which stream tables must refresh together, at one snapshot.

A *diamond* is a stream table D whose sources reach one common ancestor (a
table or a stream table) along two or more paths::

        orders                     orders
        /    \\                     /    \\
    by_day  by_region          by_day    |
        \\    /                     \\    /
        report                    report

Refreshed one by one, ``by_day`` and ``by_region`` may reflect ``orders`` at
two different points in time (or one of them may have failed), and
``report`` then joins two different versions of ``orders``. With
``diamond_consistency = 'atomic'`` (the default) D and every stream table
between the shared ancestor and D form one group: all refreshed from one
snapshot, all committed in one transaction, or none.

Explicit groups (``pgtrickle.create_refresh_group``) name their members.
Groups that share a member are one group.

Everything here is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Node = tuple[str, int]
"""('t', relid) for a plain table, ('s', pgt_id) for a stream table."""


@dataclass(frozen=True)
class GroupNode:
    """One stream table as group detection sees it.

    Attributes:
        pgt_id: The stream table's catalog id.
        name: Its display name, for messages.
        tables: relids of the plain tables it reads directly.
        upstream: pgt_ids of the stream tables it reads directly.
        atomic: Its ``diamond_consistency`` is ``'atomic'``.
    """

    pgt_id: int
    name: str
    tables: frozenset[int] = frozenset()
    upstream: frozenset[int] = frozenset()
    atomic: bool = True


@dataclass(frozen=True)
class RefreshGroup:
    """Stream tables refreshed together: one snapshot, one transaction.

    Attributes:
        name: For messages and history: the explicit group names, or
            ``diamond at <fan-in>``.
        members: The members' pgt_ids.
        explicit: Names of the explicit groups merged into this one.
        fan_ins: pgt_ids of the diamonds' fan-in stream tables merged into it.
    """

    name: str
    members: frozenset[int]
    explicit: tuple[str, ...] = ()
    fan_ins: tuple[int, ...] = field(default=())


def diamond_members(nodes: Mapping[int, GroupNode], fan_in: int) -> frozenset[int]:
    """The atomic group a diamond at ``fan_in`` needs, or an empty set if it is no diamond.

    The group is the fan-in and every stream table upstream of it that is, or
    reads (transitively), an ancestor reached along two or more of the
    fan-in's direct sources.
    """
    node = nodes[fan_in]
    reach: list[set[Node]] = [{("t", relid)} for relid in node.tables]
    for up in node.upstream:
        if up in nodes:
            reach.append({("s", up)} | _ancestors(nodes, up))
    seen: set[Node] = set()
    shared: set[Node] = set()
    for ancestors in reach:
        shared |= seen & ancestors
        seen |= ancestors
    if not shared:
        return frozenset()
    members = {fan_in}
    for pgt_id in _upstream_sts(nodes, fan_in):
        if ("s", pgt_id) in shared or shared & _ancestors(nodes, pgt_id):
            members.add(pgt_id)
    return frozenset(members)


def refresh_groups(
    nodes: Mapping[int, GroupNode], explicit: Mapping[str, Iterable[int]] | None = None
) -> list[RefreshGroup]:
    """Every atomic group: diamonds of ``atomic`` fan-ins and explicit groups, overlapping ones merged.

    Member ids that name no stream table are ignored; a group left with fewer
    than two members is no group. Sorted by smallest member id.
    """
    parts: list[tuple[frozenset[int], str | None, int | None]] = []
    for pgt_id in sorted(nodes):
        if nodes[pgt_id].atomic:
            members = diamond_members(nodes, pgt_id)
            if members:
                parts.append((members, None, pgt_id))
    for name, ids in sorted((explicit or {}).items()):
        members = frozenset(i for i in ids if i in nodes)
        if len(members) >= 2:
            parts.append((members, name, None))
    merged: list[tuple[set[int], list[str], list[int]]] = []
    for part, part_name, fan_in in parts:
        into = (set(part), [part_name] if part_name else [], [fan_in] if fan_in is not None else [])
        for other in [m for m in merged if m[0] & part]:
            merged.remove(other)
            into[0].update(other[0])
            into[1].extend(other[1])
            into[2].extend(other[2])
        merged.append(into)
    groups = []
    for merged_members, names, fan_ins in merged:
        names.sort()
        fan_ins.sort()
        label = ", ".join(names + [f"diamond at {nodes[f].name}" for f in fan_ins])
        groups.append(RefreshGroup(label, frozenset(merged_members), tuple(names), tuple(fan_ins)))
    return sorted(groups, key=lambda g: min(g.members))


def in_group_upstream(nodes: Mapping[int, GroupNode], group: RefreshGroup) -> dict[int, frozenset[int]]:
    """Each member's direct upstream stream tables that are members too (empty for the group's roots)."""
    return {m: nodes[m].upstream & group.members for m in group.members}


def _ancestors(nodes: Mapping[int, GroupNode], pgt_id: int) -> set[Node]:
    """Every table and stream table ``pgt_id`` reads, directly or transitively (not itself)."""
    found: set[Node] = set()
    pending = [pgt_id]
    while pending:
        node = nodes[pending.pop()]
        found.update(("t", relid) for relid in node.tables)
        for up in node.upstream:
            if up in nodes and ("s", up) not in found:
                found.add(("s", up))
                pending.append(up)
    return found


def _upstream_sts(nodes: Mapping[int, GroupNode], pgt_id: int) -> set[int]:
    return {i for kind, i in _ancestors(nodes, pgt_id) if kind == "s"}

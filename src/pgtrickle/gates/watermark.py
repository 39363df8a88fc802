"""Watermark gating: the decisions, pure (no database, no clock).

An external loader advances a source's *watermark* ("complete through T").
A *watermark group* couples sources whose data must be consumed together;
it is **aligned** when max − min of its members' watermarks ≤ tolerance, and
**bootstrapping** until every member has a first watermark (it gates nothing
then). Each time a group becomes (or stays) aligned, the SQL API records the
group's *effective watermark* (its minimum then) and each member's advancement
at that moment: the group's last aligned point.

Which groups apply to a stream table is decided from its **transitive** base
sources (through intermediate stream tables): a group applies when the
stream table depends on at least one of its members. Its mode:

``none``       refresh as usual.
``gate``       skip while any applicable group is misaligned.
``hold_back``  refresh, but read every grouped source as of its advancement
               at its group's last aligned point; a stream table source that
               depends on a group must itself be held back to the same point.
``inferred``   (the setting's default) ``gate`` when the stream table depends
               on two or more members of one group, else ``none``.

Snapshots are ``pg_snapshot`` text, ``xmin:xmax:xip,...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

MODES = ("none", "gate", "hold_back")
SETTINGS = ("inferred", *MODES)

BOOTSTRAPPING = "bootstrapping"
ALIGNED = "aligned"
MISALIGNED = "misaligned"


@dataclass(frozen=True)
class Advancement:
    """One call of advance_watermark: the value, and the advancing transaction's xid and snapshot."""

    advancement_id: int
    source: int
    watermark: datetime
    xid: int
    snapshot: str


@dataclass(frozen=True)
class Group:
    group_id: int
    name: str
    sources: frozenset[int]
    tolerance: timedelta
    watermarks: Mapping[int, datetime]
    """Current watermark of each member that has one."""
    effective_watermark: datetime | None = None
    """The minimum watermark the last time the group was aligned (None: never aligned)."""
    aligned: Mapping[int, Advancement] = field(default_factory=dict)
    """Each member's advancement at that moment."""
    stale_after: timedelta | None = None


@dataclass(frozen=True)
class GroupState:
    state: str  # bootstrapping | aligned | misaligned
    min_watermark: datetime | None
    max_watermark: datetime | None

    @property
    def lag(self) -> timedelta | None:
        if self.min_watermark is None or self.max_watermark is None:
            return None
        return self.max_watermark - self.min_watermark


def group_state(group: Group) -> GroupState:
    """Is the group aligned (max − min ≤ tolerance), misaligned, or still bootstrapping?"""
    values = [group.watermarks[s] for s in group.sources if s in group.watermarks]
    low = min(values) if values else None
    high = max(values) if values else None
    if len(values) < len(group.sources):
        return GroupState(BOOTSTRAPPING, low, high)
    assert low is not None and high is not None
    return GroupState(ALIGNED if high - low <= group.tolerance else MISALIGNED, low, high)


# ----------------------------------------------------------------- which groups


def base_sources(
    pgt_id: int, direct: Mapping[int, Iterable[int]], st_relids: Mapping[int, int]
) -> frozenset[int]:
    """The plain tables a stream table reads, directly or through other stream tables.

    ``direct``: each stream table's direct source relids; ``st_relids``: the
    relid of each stream table's storage mapped to its pgt_id.
    """
    seen_sts = {pgt_id}
    todo = [pgt_id]
    tables: set[int] = set()
    while todo:
        current = todo.pop()
        for relid in direct.get(current, ()):
            upstream = st_relids.get(relid)
            if upstream is None:
                tables.add(relid)
            elif upstream not in seen_sts:
                seen_sts.add(upstream)
                todo.append(upstream)
    return frozenset(tables)


def applicable_groups(sources: frozenset[int], groups: Iterable[Group]) -> list[Group]:
    """The groups with at least one member among ``sources`` (a stream table's base sources)."""
    return sorted((g for g in groups if g.sources & sources), key=lambda g: g.name)


def inferred_mode(sources: frozenset[int], groups: Iterable[Group]) -> str:
    """``gate`` for a stream table that converges two or more members of one group, else ``none``."""
    return "gate" if any(len(g.sources & sources) >= 2 for g in groups) else "none"


def effective_mode(setting: str, sources: frozenset[int], groups: Iterable[Group]) -> tuple[str, str]:
    """(mode, 'set' | 'inferred'): an explicit setting wins."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown watermark_gating {setting!r}")
    if setting == "inferred":
        return inferred_mode(sources, groups), "inferred"
    return setting, "set"


# ---------------------------------------------------------------------- gate


@dataclass(frozen=True)
class GateDecision:
    blocked: bool
    reason: str
    effective_watermark: datetime | None


def interval_text(value: timedelta) -> str:
    """An interval as PostgreSQL prints it: ``00:10:00``, ``2 days 01:00:00``, ``-00:00:05``."""
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    days, rest = value.days, value.seconds
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    if value.microseconds:
        clock += f".{value.microseconds:06d}".rstrip("0")
    prefix = f"{days} day{'s' if days != 1 else ''} " if days else ""
    return f"{sign}{prefix}{clock}"


def _describe(group: Group, state: GroupState) -> str:
    if state.state == BOOTSTRAPPING:
        missing = len(group.sources) - len([s for s in group.sources if s in group.watermarks])
        return f"watermark group {group.name} is bootstrapping ({missing} source(s) without a watermark)"
    lag = state.lag
    assert state.min_watermark is not None and state.max_watermark is not None and lag is not None, (
        "a group past bootstrapping has watermarks"
    )
    return (
        f"watermark group {group.name} is {state.state}: min {state.min_watermark.isoformat()}, "
        f"max {state.max_watermark.isoformat()}, lag {interval_text(lag)} "
        f"{'<=' if state.state == ALIGNED else '>'} tolerance {interval_text(group.tolerance)}"
    )


def gate_decision(mode: str, groups: Sequence[Group]) -> GateDecision:
    """May a stream table in ``mode`` with these applicable groups refresh now?

    Only ``gate`` blocks (``hold_back`` is decided by :func:`hold_back_plan`).
    Bootstrapping groups never block. The effective watermark of an allowed
    gated refresh is the minimum of its groups' minimum watermarks.
    """
    if mode != "gate" or not groups:
        return GateDecision(
            False, "no watermark gating" if mode == "none" else "no watermark group applies", None
        )
    states = [(g, group_state(g)) for g in groups]
    active = [(g, s) for g, s in states if s.state != BOOTSTRAPPING]
    misaligned = [(g, s) for g, s in active if s.state == MISALIGNED]
    if misaligned:
        return GateDecision(True, "gated: " + "; ".join(_describe(g, s) for g, s in misaligned), None)
    if not active:
        return GateDecision(
            False, "; ".join(_describe(g, s) for g, s in states) + " (it gates nothing yet)", None
        )
    effective = min(s.min_watermark for _, s in active if s.min_watermark is not None)
    return GateDecision(False, "; ".join(_describe(g, s) for g, s in active), effective)


# ----------------------------------------------------------------- hold_back


@dataclass(frozen=True)
class UpstreamMark:
    """What a stream table source of a hold_back stream table says about itself."""

    relid: int
    name: str
    base_sources: frozenset[int]
    mode: str
    group_points: Mapping[int, datetime]
    """group_id → the group's watermark it was held back to at its last refresh."""


@dataclass(frozen=True)
class HoldBackPlan:
    skip_reason: str | None = None
    caps: Mapping[int, Advancement] = field(default_factory=dict)
    """Direct plain-table source → the advancement it is read as of."""
    group_points: Mapping[int, datetime] = field(default_factory=dict)
    effective_watermark: datetime | None = None
    reason: str = ""


def hold_back_plan(
    groups: Sequence[Group], direct_tables: Iterable[int], upstream: Iterable[UpstreamMark]
) -> HoldBackPlan:
    """Where does a hold_back stream table read each grouped source?

    Every applicable group that is past bootstrapping is read at its last
    aligned point: each member that is a direct source as of its advancement
    at that point (a source in two groups: the earlier of the two). Stream
    table sources that depend on such a group must have been held back to the
    same point (they refresh first in the DAG); otherwise this refresh waits.
    """
    direct_tables = set(direct_tables)
    upstream = list(upstream)
    points: dict[int, datetime] = {}
    caps: dict[int, Advancement] = {}
    described = []
    for group in groups:
        state = group_state(group)
        if state.state == BOOTSTRAPPING:
            continue
        if group.effective_watermark is None or any(s not in group.aligned for s in group.sources):
            return HoldBackPlan(
                skip_reason=(
                    f"hold_back: watermark group {group.name} has not been aligned yet "
                    f"({_describe(group, state)})"
                )
            )
        point = group.effective_watermark
        for up in upstream:
            if not (up.base_sources & group.sources):
                continue
            held = up.group_points.get(group.group_id)
            if held != point:
                if up.mode != "hold_back":
                    why = f"it is in watermark_gating '{up.mode}'; set it to 'hold_back' too"
                elif held is None:
                    why = "it has not been held back to that group yet"
                else:
                    why = f"it is held back to {held.isoformat()}"
                return HoldBackPlan(
                    skip_reason=(
                        f"hold_back: source stream table {up.name} does not reflect watermark group "
                        f"{group.name} at {point.isoformat()} ({why})"
                    )
                )
        points[group.group_id] = point
        described.append(f"{group.name} at {point.isoformat()}")
        for source in group.sources & direct_tables:
            adv = group.aligned[source]
            if source not in caps or (adv.watermark, adv.advancement_id) < (
                caps[source].watermark,
                caps[source].advancement_id,
            ):
                caps[source] = adv
    if not points:
        return HoldBackPlan(reason="hold_back: no watermark group past bootstrapping applies")
    return HoldBackPlan(
        caps=caps,
        group_points=points,
        effective_watermark=min(points.values()),
        reason="hold_back: sources read as of watermark group " + ", ".join(described),
    )


# ----------------------------------------------------------------- snapshots


def parse_snapshot(snapshot: str) -> tuple[int, int, tuple[int, ...]]:
    xmin, xmax, xip = snapshot.split(":")
    return int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x)


def format_snapshot(xmin: int, xmax: int, xip: Iterable[int]) -> str:
    return f"{xmin}:{xmax}:{','.join(str(x) for x in sorted(set(xip)))}"


def visible_in(snapshot: str, xid: int) -> bool:
    """``pg_visible_in_snapshot(xid, snapshot)``: the transaction had completed when it was taken."""
    xmin, xmax, xip = parse_snapshot(snapshot)
    if xid < xmin:
        return True
    if xid >= xmax:
        return False
    return xid not in xip


def including(snapshot: str, xid: int) -> str:
    """The snapshot with transaction ``xid`` visible too (and nothing else changed).

    An advancing transaction's own snapshot does not show its own writes
    (``xid`` is at or above its xmax, or in progress); the source "as of the
    advancement" is that snapshot plus the advancing transaction. The xids
    between the old xmax and ``xid`` had not completed, so they stay invisible.
    """
    xmin, xmax, xip = parse_snapshot(snapshot)
    if visible_in(snapshot, xid):
        return snapshot
    if xid >= xmax:
        return format_snapshot(xmin, xid + 1, set(xip) | set(range(xmax, xid)))
    return format_snapshot(xmin, xmax, set(xip) - {xid})


def cap_snapshot(advancement: Advancement) -> str:
    """The snapshot a hold_back refresh reads a source at, for one advancement."""
    return including(advancement.snapshot, advancement.xid)


def snapshot_xmin(snapshot: str) -> int:
    return parse_snapshot(snapshot)[0]


# --------------------------------------------------------------- stale alerts


def stuck_due(last_advanced: datetime, stale_after: timedelta | None, now: datetime, alerted: bool) -> bool:
    """Send ``watermark_stuck`` now? Once per stall: not again until the watermark has moved."""
    return stale_after is not None and not alerted and now - last_advanced >= stale_after

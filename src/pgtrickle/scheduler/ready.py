"""Which refreshes of a tick may start now: a ready-set scheduler over the DAG.

A tick's work is a list of *units*: one stream table, or one atomic refresh
group (its members refresh together, so the group is one unit). A unit may
start once every unit it reads from (directly) has finished in this tick —
refreshed, found not due, skipped or failed — so a downstream stream table
always sees what its upstreams committed in the same tick. Independent units
run side by side, at most ``limit`` at once (a batch of units started together,
scheduler/batches.py, counts once); among the units ready together
the one earliest in dependency order (:func:`~pgtrickle.scheduler.dag.topological_order`)
starts first, so with ``limit`` 1 the order is exactly the sequential one.

Everything here is pure: no I/O, no clock, no threads.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Unit:
    """One refresh of a tick: a stream table, or an atomic group's members in dependency order.

    Attributes:
        key: The unit's id: its last member in dependency order (where the sequential
            daemon refreshed a group).
        members: pgt_ids of its stream tables, upstream first.
        group: Whether it is an atomic group.
    """

    key: int
    members: tuple[int, ...]
    group: bool = False


def plan_units(order: Sequence[int], groups: Iterable[frozenset[int]]) -> list[Unit]:
    """The tick's units in dependency order: each group once, where its last member comes.

    ``order`` is every stream table in dependency order; ``groups`` the atomic groups'
    member sets (members not in ``order`` are ignored).
    """
    group_of: dict[int, frozenset[int]] = {}
    for members in groups:
        for m in members:
            group_of[m] = members
    position = {pgt_id: i for i, pgt_id in enumerate(order)}
    units: list[Unit] = []
    for pgt_id in order:
        group = group_of.get(pgt_id)
        if group is None:
            units.append(Unit(pgt_id, (pgt_id,)))
            continue
        present = sorted((m for m in group if m in position), key=position.__getitem__)
        if present[-1] == pgt_id:
            units.append(Unit(pgt_id, tuple(present), group=True))
    return units


def unit_dependencies(
    units: Sequence[Unit], upstream: Mapping[int, frozenset[int]]
) -> dict[int, frozenset[int]]:
    """Each unit's key mapped to the keys of the units it reads from directly (never itself).

    ``upstream`` maps a stream table to the stream tables its query reads; ids
    that belong to no unit (plain tables, dropped stream tables) are ignored.
    """
    unit_of = {m: u.key for u in units for m in u.members}
    deps: dict[int, frozenset[int]] = {}
    for unit in units:
        reads = {unit_of[up] for m in unit.members for up in upstream.get(m, ()) if up in unit_of}
        reads.discard(unit.key)
        deps[unit.key] = frozenset(reads)
    return deps


@dataclass
class ReadySet:
    """The progress of one tick's units: which are done, running, and may start next.

    Attributes:
        units: The tick's units in dependency order.
        deps: :func:`unit_dependencies` of them.
        limit: How many units may run at once (at least 1).
    """

    units: Sequence[Unit]
    deps: Mapping[int, frozenset[int]]
    limit: int
    done: set[int] = field(default_factory=set)
    running: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"at least one refresh must be allowed to run, got limit {self.limit}")
        self._by_key = {u.key: u for u in self.units}
        self._slot_of: dict[int, int] = {}
        """Each running unit's slot: the first key of the batch it started with."""
        unknown = {d for ds in self.deps.values() for d in ds} - self._by_key.keys()
        if unknown:
            raise ValueError(f"dependencies name units that are not in the tick: {sorted(unknown)}")

    def waiting(self) -> list[Unit]:
        """Every unit that may start now (its upstream units finished), whatever the free slots,
        in dependency order: they never read each other, so they may share a batch
        (scheduler/batches.py)."""
        return [
            unit
            for unit in self.units
            if unit.key not in self.done
            and unit.key not in self.running
            and self.deps.get(unit.key, frozenset()) <= self.done
        ]

    def startable(self) -> list[Unit]:
        """The units to start now, earliest in dependency order first, within the free slots."""
        return self.waiting()[: max(0, self.limit - self.slots_used)]

    @property
    def slots_used(self) -> int:
        """Refreshes running: a batch of units started together takes one slot."""
        return len(set(self._slot_of.values()))

    def start(self, key: int) -> None:
        self.start_together([key])

    def can_follow(self, key: int, batch: Collection[int]) -> bool:
        """Whether unit ``key`` may join ``batch`` (units about to start together) as a follower:
        not started, reading at least one unit of ``batch``, and every unit it reads from either
        finished or in ``batch`` (its batch computes it from their deltas: refresh/chained.py)."""
        if key in self.done or key in self.running or key in batch:
            return False
        deps = self.deps.get(key, frozenset())
        return bool(deps & set(batch)) and deps <= self.done | set(batch)

    def start_together(self, keys: Sequence[int]) -> None:
        """Start ``keys`` as one refresh (a batch): they take one slot between them. A unit may
        read units before it in ``keys`` (a follower, :meth:`can_follow`)."""
        if not keys:
            raise ValueError("nothing to start")
        for i, key in enumerate(keys):
            if key in self.done or key in self.running:
                raise ValueError(f"unit {key} was already started")
            if not self.deps.get(key, frozenset()) <= self.done | set(keys[:i]):
                raise ValueError(f"unit {key} cannot start before the units it reads from finished")
        if self.slots_used >= self.limit:
            raise ValueError(f"{self.limit} refresh(es) already running")
        for key in keys:
            self.running.add(key)
            self._slot_of[key] = keys[0]

    def finish(self, key: int) -> None:
        if key not in self.running:
            raise ValueError(f"unit {key} is not running")
        self.running.remove(key)
        del self._slot_of[key]
        self.done.add(key)

    def skip_rest(self) -> None:
        """Nothing more starts (stopping): every unit not started counts as done."""
        self.done |= self._by_key.keys() - self.running

    @property
    def finished(self) -> bool:
        return not self.running and len(self.done) == len(self._by_key)

"""Batched refresh: which stream tables ready together refresh as one batch (pure).

A *batch* is several stream tables refreshed together: one exported snapshot, one Spark
action computing every member's delta (their plans unioned, each row tagged with its
member's pgt_id), then one PostgreSQL transaction per member applying its own rows with its
own frontier and history row (refresh/batch.py). It saves the fixed cost of a Spark job
(analysis, planning, scheduling: ~0.5 s, docs/BENCHMARKS.md) for every member but one.

The units ready at the same time in a tick (:meth:`~pgtrickle.scheduler.ready.ReadySet.waiting`)
never read each other, so any of them may share a snapshot. Two decisions, both here:

1. :func:`why_alone`, before the refresh, from the catalog row: a unit that cannot join a
   batch, and why. An atomic group commits its members in one transaction of its own; a
   ``FULL`` stream table, and one that is not populated yet or waits for a reinitialization,
   runs a FULL refresh (its whole query, written in place: nothing to share); with Spark
   Connect every table refreshes on its own (the shared job's count and its failure are
   not visible to the client: see spark/jobs.py).
2. :func:`member_why_alone`, once a member is planned at the batch's snapshot (gates and the
   mode decision passed): only a DIFFERENTIAL plan without hidden state tables is computed by
   the shared job. One with hidden state tables (``dvm/kept.py``) runs several jobs of its own
   in order (each table's change before the plans that read it); a member the plan turned
   FULL (AUTO decided so, a fallback) refreshes on its own after the batch; a SKIP or
   NO_DATA member was recorded by its gates and drops out.

:func:`batches` cuts the ready units into batches of at most ``max_batch_size`` members, and
:func:`spread_size` makes those batches spread over the free refresh slots: with two slots, the 20
stream tables of one level of a fan run as two batches of 10 side by side (two Spark jobs at once,
and each member's PostgreSQL work — gates, apply — on two connections) rather than one batch of
20 while the other slot stays idle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgtrickle.scheduler.ready import Unit

ATOMIC_GROUP = "an atomic group refreshes its members in one transaction of its own"
FULL_MODE = "refresh_mode FULL: a FULL refresh has no delta to share"
NOT_POPULATED = "not populated yet: its first refresh is FULL"
NEEDS_REINIT = "waits for a reinitialization: its next refresh is FULL"
SPARK_CONNECT = "Spark Connect: the shared job's count and failure are not visible to the client"
BATCHING_OFF = "max_batch_size is 1: every stream table refreshes on its own"
KEEPS_STATE = "keeps hidden state tables: their changes run as Spark jobs of their own, in order"
NOT_DIFFERENTIAL = "its refresh is not DIFFERENTIAL"


@dataclass(frozen=True)
class BatchFacts:
    """What the catalog says of a stream table before its refresh (from its catalog row)."""

    refresh_mode: str
    """AUTO | FULL | DIFFERENTIAL."""
    populated: bool
    """It has a frontier (its first refresh is done)."""
    needs_reinit: bool


def why_alone(unit: Unit, facts: BatchFacts | None, max_batch_size: int, spark_connect: bool) -> str | None:
    """Why ``unit`` refreshes on its own (``None``: it may join a batch)."""
    if max_batch_size <= 1:
        return BATCHING_OFF
    if spark_connect:
        return SPARK_CONNECT
    if unit.group or len(unit.members) != 1:
        return ATOMIC_GROUP
    if facts is None:
        raise ValueError(f"no catalog facts for stream table {unit.key}")
    if facts.refresh_mode == "FULL":
        return FULL_MODE
    if not facts.populated:
        return NOT_POPULATED
    if facts.needs_reinit:
        return NEEDS_REINIT
    return None


def member_why_alone(differential: bool, state_tables: int) -> str | None:
    """Why a member planned at the batch's snapshot is not computed by the shared job (``None``: it is).

    ``differential``: its plan is a DIFFERENTIAL refresh; ``state_tables``: the hidden state
    tables its layout keeps.
    """
    if not differential:
        return NOT_DIFFERENTIAL
    if state_tables:
        return KEEPS_STATE
    return None


def spread_size(batchable: int, alone: int, free_slots: int, max_batch_size: int) -> int:
    """The batch size that spreads ``batchable`` units over the free slots the ``alone`` units
    (each a job of its own) leave, at most ``max_batch_size``, at least 1.

    >>> spread_size(20, 0, 2, 32), spread_size(20, 1, 2, 32), spread_size(100, 0, 2, 32)
    (10, 20, 32)
    """
    slots = max(1, free_slots - alone)
    return max(1, min(max_batch_size, -(-batchable // slots)))


def batches(
    ready: Sequence[Unit], alone: Callable[[Unit], str | None], max_batch_size: int
) -> list[list[Unit]]:
    """``ready`` (in dependency order) as batches: runs of units that may batch, cut at
    ``max_batch_size``, and every other unit as a batch of its own, in the order of its first unit.

    >>> u = [Unit(1, (1,)), Unit(2, (2,)), Unit(3, (3, 4), group=True), Unit(5, (5,))]
    >>> [[x.key for x in b] for b in batches(u, lambda x: "group" if x.group else None, 2)]
    [[1, 2], [3], [5]]
    """
    if max_batch_size < 1:
        raise ValueError(f"a batch holds at least one stream table, got max_batch_size {max_batch_size}")
    out: list[list[Unit]] = []
    open_batch: list[Unit] | None = None
    for unit in ready:
        if alone(unit) is not None:
            out.append([unit])
            continue
        if open_batch is None or len(open_batch) >= max_batch_size:
            open_batch = []
            out.append(open_batch)
        open_batch.append(unit)
    return out

"""Pure decisions of a refresh: which action runs, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from pgtrickle.cdc.buffers import PendingChanges


class Action(str, Enum):
    FULL = "FULL"
    DIFFERENTIAL = "DIFFERENTIAL"
    NO_DATA = "NO_DATA"
    SKIP = "SKIP"  # a gate (circuit breaker) held the refresh back


@dataclass(frozen=True)
class RefreshPlan:
    action: Action
    reason: str
    delta_rows: int
    delta_deletes: int = 0


def plan_refresh(refresh_mode: str, frontier: str | None, needs_reinit: bool,
                 pending: Sequence[PendingChanges] | None) -> RefreshPlan:
    """Decide how to bring a stream table up to date.

    ``pending`` is ``None`` when the stream table has no frontier yet.
    """
    if frontier is None or pending is None:
        return RefreshPlan(Action.FULL, "initial population", 0)
    delta = sum(p.rows for p in pending)
    deletes = sum(p.deletes for p in pending)
    if needs_reinit:
        return RefreshPlan(Action.FULL, "reinitialization requested", delta, deletes)
    truncated = [p.source for p in pending if p.truncated]
    if truncated:
        names = ", ".join(f"{s.schema}.{s.name}" for s in truncated)
        kind = "refreshed in full" if all(s.kind == "STREAM_TABLE" for s in truncated) else "truncated"
        return RefreshPlan(Action.FULL, f"source {names} was {kind}", delta, deletes)
    if delta == 0:
        return RefreshPlan(Action.NO_DATA, "no pending changes", 0)
    if refresh_mode == "FULL":
        return RefreshPlan(Action.FULL, "refresh_mode is FULL", delta, deletes)
    return RefreshPlan(Action.FULL, "differential refresh is not available in this version", delta, deletes)

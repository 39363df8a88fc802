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


@dataclass(frozen=True)
class RefreshPlan:
    action: Action
    reason: str
    delta_rows: int


def plan_refresh(refresh_mode: str, frontier: str | None, needs_reinit: bool,
                 pending: Sequence[PendingChanges] | None) -> RefreshPlan:
    """Decide how to bring a stream table up to date.

    ``pending`` is ``None`` when the stream table has no frontier yet.
    """
    if frontier is None or pending is None:
        return RefreshPlan(Action.FULL, "initial population", 0)
    delta = sum(p.rows for p in pending)
    if needs_reinit:
        return RefreshPlan(Action.FULL, "reinitialization requested", delta)
    truncated = [p.source for p in pending if p.truncated]
    if truncated:
        names = ", ".join(f"{s.schema}.{s.name}" for s in truncated)
        kind = "refreshed in full" if all(s.kind == "STREAM_TABLE" for s in truncated) else "truncated"
        return RefreshPlan(Action.FULL, f"source {names} was {kind}", delta)
    if delta == 0:
        return RefreshPlan(Action.NO_DATA, "no pending changes", 0)
    if refresh_mode == "FULL":
        return RefreshPlan(Action.FULL, "refresh_mode is FULL", delta)
    return RefreshPlan(Action.FULL, "differential refresh is not available in this version", delta)

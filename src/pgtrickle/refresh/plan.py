"""Pure decisions of a refresh: which action runs, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

DEFAULT_FALLBACK_RATIO = 0.15


class Action(StrEnum):
    FULL = "FULL"
    DIFFERENTIAL = "DIFFERENTIAL"
    NO_DATA = "NO_DATA"
    SKIP = "SKIP"  # a gate (circuit breaker) held the refresh back


class SourceRef(Protocol):
    """What a decision reads of a source (``catalog.store.Source``)."""

    @property
    def schema(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...


class PendingChanges(Protocol):
    """What a decision reads of one source's pending changes (``cdc.buffers.PendingChanges``)."""

    @property
    def source(self) -> SourceRef: ...
    @property
    def rows(self) -> int: ...
    @property
    def deletes(self) -> int: ...
    @property
    def truncated(self) -> bool: ...


@dataclass(frozen=True)
class RefreshPlan:
    action: Action
    reason: str
    delta_rows: int
    delta_deletes: int = 0
    was_full_fallback: bool = False


@dataclass(frozen=True)
class ModeContext:
    """What the mode decision needs besides the pending changes."""

    differential: bool = False
    """The query has a delta rule for every operator (and refresh_mode allows it)."""
    reason: str = "differential refresh is not available for this query"
    source_rows: float = 0.0
    """Rows of all sources (planner estimates)."""
    fallback_ratio: float = DEFAULT_FALLBACK_RATIO
    layout_changed: bool = False
    """The table's hidden state columns were (re)built: its contents must be recomputed."""
    reads_clock: bool = False
    """The query reads the clock (now(), current_date, ...): its result changes without any source change."""


READS_CLOCK_REASON = (
    "the query reads the clock (now(), current_date, ...): it is recomputed in full at every "
    "scheduled refresh, with or without source changes, with the clock read at the refresh's "
    "snapshot"
)


def plan_refresh(
    refresh_mode: str,
    frontier: str | None,
    needs_reinit: bool,
    pending: Sequence[PendingChanges] | None,
    mode: ModeContext | None = None,
    reinit_reason: str | None = None,
) -> RefreshPlan:
    """Decide how to bring a stream table up to date.

    ``pending`` is ``None`` when the stream table has no frontier yet;
    ``reinit_reason`` says why reinitialization was requested, when known.
    """
    mode = mode or ModeContext()
    if frontier is None or pending is None:
        return RefreshPlan(Action.FULL, "initial population", 0)
    delta = sum(p.rows for p in pending)
    deletes = sum(p.deletes for p in pending)
    if needs_reinit:
        return RefreshPlan(Action.FULL, reinit_text(reinit_reason), delta, deletes)
    truncated = [p.source for p in pending if p.truncated]
    if truncated:
        names = ", ".join(f"{s.schema}.{s.name}" for s in truncated)
        kind = "refreshed in full" if all(s.kind == "STREAM_TABLE" for s in truncated) else "truncated"
        return RefreshPlan(Action.FULL, f"source {names} was {kind}", delta, deletes)
    if mode.reads_clock and refresh_mode != "DIFFERENTIAL":
        # Its result moves with time: skipping it when the sources are idle would leave it stale.
        return RefreshPlan(Action.FULL, READS_CLOCK_REASON, delta, deletes)
    if delta == 0:
        return RefreshPlan(Action.NO_DATA, "no pending changes", 0)
    blocker = differential_blocker(refresh_mode, mode)
    if blocker is not None:
        return RefreshPlan(Action.FULL, blocker, delta, deletes)
    if fallback_needed(delta, mode.source_rows, mode.fallback_ratio):
        return RefreshPlan(
            Action.FULL,
            f"{delta:,} pending changes exceed {mode.fallback_ratio:.0%} of the sources' "
            f"~{int(mode.source_rows):,} rows (differential_fallback_ratio)",
            delta,
            deletes,
            was_full_fallback=True,
        )
    return RefreshPlan(Action.DIFFERENTIAL, mode.reason, delta, deletes)


def differential_blocker(refresh_mode: str, mode: ModeContext) -> str | None:
    """Why a stream table with changes to apply cannot refresh differentially (``None``: it can,
    the adaptive fallback aside)."""
    if mode.layout_changed:
        return "the stream table's state columns were rebuilt"
    if refresh_mode == "FULL":
        return "refresh_mode is FULL"
    if not mode.differential:
        return mode.reason
    return None


def fallback_needed(changes: int, source_rows: float, ratio: float) -> bool:
    """Adaptive fallback: are there so many changes that recomputing is cheaper?"""
    return changes > ratio * max(source_rows, 1.0)


def reinit_text(reason: str | None) -> str:
    """The reason of a FULL refresh that reinitializes a stream table."""
    return f"reinitialization requested: {reason}" if reason else "reinitialization requested"

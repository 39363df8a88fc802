"""Is a stream table due, and why? Pure: no clock, no database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pgtrickle.scheduler.schedule import Schedule, is_due, next_due


class DueReason(StrEnum):
    INITIALIZE = "INITIALIZE"  # never populated
    REQUESTED = "REQUESTED"  # refresh_stream_table() or a queued initialization
    SCHEDULED = "SCHEDULED"  # its schedule says so


@dataclass(frozen=True)
class DueState:
    """What the decision needs to know about one stream table."""

    status: str
    has_frontier: bool
    last_refresh_at: datetime | None
    last_attempt_at: datetime | None
    requested: bool
    created_at: datetime
    manual_request: bool = False
    """One of the queued requests is an explicit refresh (``refresh_stream_table``), not the
    initialization queued by ``create_stream_table``."""


STOPPED_STATUSES = ("SUSPENDED", "ERROR")
"""Statuses in which nothing is attempted automatically (until ``resume_stream_table``)."""


def due_reason(state: DueState, schedule: Schedule, now: datetime) -> DueReason | None:
    """Why the stream table should refresh now, or ``None``.

    * ``SUSPENDED`` and ``ERROR`` stream tables are not refreshed automatically:
      not on schedule, and not for a queued initialization. Only an explicit
      refresh request (by the owner, after the suspension) runs, once.
    * Otherwise a queued request is honoured at once: it is an explicit ask.
    * A failed attempt waits one schedule interval before it is retried, so a
      broken stream table does not spin.
    """
    if state.status in STOPPED_STATUSES:
        return DueReason.REQUESTED if state.requested and state.manual_request else None
    if state.requested:
        return DueReason.REQUESTED
    attempts = [t for t in (state.last_refresh_at, state.last_attempt_at) if t is not None]
    last = max(attempts) if attempts else None
    if not state.has_frontier:
        # Created with initialize => false: populate at the first scheduled time.
        if is_due(schedule, last or state.created_at, now):
            return DueReason.INITIALIZE
        return None
    if is_due(schedule, last, now):
        return DueReason.SCHEDULED
    return None


def next_due_at(state: DueState, schedule: Schedule, now: datetime) -> datetime | None:
    """When the stream table falls due by its schedule (``now`` or earlier: already due), or ``None``
    when nothing is attempted automatically (SUSPENDED / ERROR).

    The same rule as :func:`due_reason` without requests: a never-populated stream table counts from
    its creation, a failed attempt waits one interval like a success.
    """
    if state.status in STOPPED_STATUSES:
        return None
    attempts = [t for t in (state.last_refresh_at, state.last_attempt_at) if t is not None]
    last = max(attempts) if attempts else None
    if not state.has_frontier:
        return next_due(schedule, last or state.created_at, now)
    return next_due(schedule, last, now)


def stopped_note(display: str, status: str) -> str | None:
    """What an explicit refresh of a stopped (SUSPENDED / ERROR) stream table says; ``None`` otherwise."""
    if status not in STOPPED_STATUSES:
        return None
    return (
        f"{display} is {status}: refreshing it once, as asked; it is not refreshed automatically "
        "until pgtrickle.resume_stream_table"
    )


RECONNECT_FIRST_DELAY = 0.5
RECONNECT_MAX_DELAY = 30.0


def reconnect_delay(
    attempt: int, first: float = RECONNECT_FIRST_DELAY, cap: float = RECONNECT_MAX_DELAY
) -> float:
    """Seconds to wait before reconnection attempt ``attempt`` (0 = the first) after losing PostgreSQL.

    Exponential (0.5, 1, 2, 4, … s) and capped at ``cap``, so a server that
    stays down is retried every ``cap`` seconds for as long as it takes,
    never in a tight loop.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be 0 or more, got {attempt}")
    return min(cap, first * 2.0 ** min(attempt, 32))

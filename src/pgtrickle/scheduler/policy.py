"""Is a stream table due, and why? Pure: no clock, no database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pgtrickle.scheduler.schedule import IntervalSchedule, Schedule, is_due, next_due


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
    new_input: bool = False
    """The daemon knows of input it has not refreshed yet: a source notified a change, or an
    upstream stream table committed rows."""
    last_applied_at: datetime | None = None
    """When its last refresh that applied rows (FULL or DIFFERENTIAL) ended, as far as the daemon
    knows (``None``: not known, e.g. not since the daemon started)."""


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
    last = _counted_from(state, schedule)
    if not state.has_frontier:
        # Created with initialize => false: populate at the first scheduled time.
        if is_due(schedule, last or state.created_at, now):
            return DueReason.INITIALIZE
        return None
    if is_due(schedule, last, now):
        return DueReason.SCHEDULED
    return None


def _counted_from(state: DueState, schedule: Schedule) -> datetime | None:
    """The time the schedule counts from: the last refresh or attempt, whichever came last.

    With new input, an interval schedule counts from the last refresh that *applied rows* (or a
    failed or skipped attempt after it) instead: a pass that found nothing to apply (``NO_DATA``,
    which a ``1s`` schedule makes every second) does not hold back the change that comes just
    after it. So the schedule still bounds how often rows are applied, and a change to an idle
    source is refreshed at once, not up to one interval later. When the daemon does not know
    that time (not since it started), the last refresh or attempt counts, as without new input.
    A cron schedule fires at its times whatever happened between them.
    """
    attempts = [t for t in (state.last_refresh_at, state.last_attempt_at) if t is not None]
    last = max(attempts) if attempts else None
    applied = state.last_applied_at
    if applied is not None and state.last_refresh_at is not None:
        applied = min(applied, state.last_refresh_at)  # never after the last refresh the catalog knows
    if not (state.new_input and applied and state.has_frontier and isinstance(schedule, IntervalSchedule)):
        return last
    attempt = state.last_attempt_at
    unfinished = attempt is not None and (state.last_refresh_at is None or attempt > state.last_refresh_at)
    return max(applied, attempt) if unfinished and attempt is not None else applied


def next_due_at(state: DueState, schedule: Schedule, now: datetime) -> datetime | None:
    """When the stream table falls due by its schedule (``now`` or earlier: already due), or ``None``
    when nothing is attempted automatically (SUSPENDED / ERROR).

    The same rule as :func:`due_reason` without requests: a never-populated stream table counts from
    its creation, a failed attempt waits one interval like a success.
    """
    if state.status in STOPPED_STATUSES:
        return None
    last = _counted_from(state, schedule)
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

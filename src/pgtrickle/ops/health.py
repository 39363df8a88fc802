"""Operational decisions about stream tables. Pure: no clock, no database.

* :func:`after_failure` — what a failed refresh does to a stream table's
  status (auto-suspension, ``ERROR``) and which alerts it sends;
* :func:`staleness_check` — is a stream table's data too old for its
  schedule, and is a ``stale_data`` alert (or its all-clear) due;
* :func:`skip_category` — a skip reason as a short label (for metrics).

The edges that read the catalog and send the alerts are
:mod:`pgtrickle.ops.alerts` and the refresh engine / daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pgtrickle.errors import UnsupportedQueryError

DEFAULT_AUTO_SUSPEND_AFTER = 3
DEFAULT_STALE_DATA_FACTOR = 3.0

STATUSES = ("INITIALIZING", "ACTIVE", "SUSPENDED", "ERROR")
SCHEDULED_STATUSES = ("INITIALIZING", "ACTIVE")
"""Statuses the scheduler keeps fresh (SUSPENDED and ERROR stream tables are not refreshed on schedule)."""


@dataclass(frozen=True)
class FailureVerdict:
    """What follows from one failed refresh."""

    status: str
    """The stream table's status after the failure."""
    events: tuple[str, ...] = field(default=())
    """Alert events to send, in order (``refresh_failed`` always comes first)."""


def is_fatal(exc: BaseException) -> bool:
    """Whether a refresh error can never succeed by retrying (the query no longer compiles)."""
    return isinstance(exc, UnsupportedQueryError)


def after_failure(status: str, consecutive_errors: int, threshold: int, fatal: bool) -> FailureVerdict:
    """The status after a failed refresh, and the alerts it sends.

    ``consecutive_errors`` counts this failure. ``threshold`` is the
    ``auto_suspend_after`` setting; 0 or less means never suspend.

    * A fatal error (the query cannot run any more) puts the stream table in
      ``ERROR`` at once: retrying cannot help.
    * Otherwise an ``ACTIVE`` or ``INITIALIZING`` stream table becomes
      ``SUSPENDED`` when the failures reach the threshold (``auto_suspended``).
    * A stream table already ``SUSPENDED`` or in ``ERROR`` keeps its status
      (a requested refresh of it can still fail); it is not alerted twice.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown stream table status {status!r}")
    if consecutive_errors < 1:
        raise ValueError(f"a failure counts at least 1 consecutive error, got {consecutive_errors}")
    events: list[str] = ["refresh_failed"]
    if fatal:
        return FailureVerdict("ERROR", tuple(events))
    if status in SCHEDULED_STATUSES and threshold > 0 and consecutive_errors >= threshold:
        events.append("auto_suspended")
        return FailureVerdict("SUSPENDED", tuple(events))
    return FailureVerdict(status, tuple(events))


@dataclass(frozen=True)
class StalenessVerdict:
    stale: bool
    age: timedelta | None
    """How old the data is (``None``: never refreshed)."""
    threshold: timedelta | None
    """The age above which the data is stale (``None``: not checked)."""
    event: str | None = None
    """``stale_data``, ``stale_data_resolved`` or ``None``."""


def stale_threshold(period_seconds: float, factor: float) -> timedelta | None:
    """``factor`` × the schedule's period; ``None`` (never stale) when the factor is 0 or less."""
    if factor <= 0 or period_seconds <= 0:
        return None
    return timedelta(seconds=period_seconds * factor)


def staleness_check(
    *,
    status: str,
    data_timestamp: datetime | None,
    created_at: datetime,
    period_seconds: float,
    factor: float,
    alerted: bool,
    now: datetime,
) -> StalenessVerdict:
    """Is the data older than ``factor`` × its schedule's period, and which alert is due?

    A stream table never refreshed is measured from its creation (it has been
    waiting for its first data that long). Only stream tables the scheduler
    keeps fresh (``INITIALIZING``, ``ACTIVE``) alert: a ``SUSPENDED`` or
    ``ERROR`` one has had its own alert. ``stale_data`` is sent once per
    episode (``alerted`` says it was); ``stale_data_resolved`` when fresh again.
    """
    age = None if data_timestamp is None else now - data_timestamp
    threshold = stale_threshold(period_seconds, factor)
    measured = now - (data_timestamp or created_at)
    stale = threshold is not None and measured > threshold
    event = None
    if stale and not alerted and status in SCHEDULED_STATUSES:
        event = "stale_data"
    elif not stale and alerted:
        event = "stale_data_resolved"
    return StalenessVerdict(stale, age, threshold, event)


def skip_category(reason: str) -> str:
    """A skip reason as a stable, low-cardinality label: ``circuit_breaker``, ``watermark`` or ``other``."""
    text = reason.lower()
    if "circuit breaker" in text:
        return "circuit_breaker"
    if "watermark" in text:
        return "watermark"
    return "other"

"""Refresh schedules: parsing, normalizing and due-time arithmetic.

A stream table's schedule is one of three things:

* a duration such as ``30s``, ``5m``, ``1h30m`` or ``1h 30m``: refresh that
  long after the previous refresh (:class:`IntervalSchedule`);
* a 5-field cron expression such as ``*/5 * * * *``, or one of ``@hourly``,
  ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly``: refresh at each fire
  time (:class:`CronSchedule`);
* ``calculated``: refresh as often as the stream tables that read this one
  need (:class:`CalculatedSchedule`, resolved by
  :func:`pgtrickle.scheduler.dag.resolve_calculated`).

This is the daemon's half of pgtrickle's one schedule grammar (docs/SQL_API.md,
"Schedules"); the SQL API's half (``pgtrickle._validate_schedule``) accepts exactly
the same strings and stores their canonical form, which this module parses back to
the same schedule (proved by ``tests/integration/test_schedule_grammar.py``).

Everything here is pure: no I/O, no clock. Callers pass ``now`` in, always as a
timezone-aware datetime; results are in UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pgtrickle.errors import ScheduleError
from pgtrickle.scheduler.cron import ALIASES, WHITESPACE, CronSpec, parse_cron, split_fields

MIN_INTERVAL_SECONDS = 1.0
MAX_INTERVAL_SECONDS = 366 * 24 * 3600.0

_MAX_TEXT_LENGTH = 200
_SHOWN_LENGTH = 80

# Duration units, largest first, with their length in milliseconds.
_UNIT_MS: dict[str, int] = {
    "w": 7 * 24 * 3600 * 1000,
    "d": 24 * 3600 * 1000,
    "h": 3600 * 1000,
    "m": 60 * 1000,
    "s": 1000,
    "ms": 1,
}
_WS = f"[{re.escape(WHITESPACE)}]*"
# A duration: <number><unit> parts, whitespace allowed around units ('30s', '30 s', '1h 30m').
_DURATION = re.compile(
    "".join(rf"(?:(?P<{unit}>[0-9]+){_WS}{unit}{_WS})?" for unit in _UNIT_MS),
    re.ASCII | re.IGNORECASE,
)
# Looks like a duration (for the error message): numbers each followed by a word.
_DURATION_LIKE = re.compile(rf"(?:[0-9]+{_WS}[a-z]+{_WS})+", re.ASCII | re.IGNORECASE)

_ACCEPTED_FORMS = (
    "expected a duration such as '30s', '5m', '1h30m' or '2d' "
    "(units ms, s, m, h, d, w; between 1s and 366d), "
    "a 5-field cron expression such as '*/5 * * * *', "
    "one of '@hourly', '@daily', '@weekly', '@monthly', '@yearly', "
    "or 'calculated'"
)


@dataclass(frozen=True)
class IntervalSchedule:
    """Refresh a fixed number of seconds after the previous refresh.

    Build it with :func:`parse_schedule`, which enforces the 1s..366d range.
    """

    seconds: float

    def canonical(self) -> str:
        """The normalized duration text, largest units first (``5400`` -> ``1h30m``)."""
        remaining = round(self.seconds * 1000)
        parts = []
        for unit, unit_ms in _UNIT_MS.items():
            count, remaining = divmod(remaining, unit_ms)
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts) or "0s"

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True)
class CronSchedule:
    """Refresh at each fire time of a 5-field cron expression (or ``@`` alias), in UTC.

    Build it with :func:`parse_schedule`, which validates the expression.
    """

    expression: str

    def canonical(self) -> str:
        """The expression lower-cased, with fields separated by single spaces."""
        return _normalize_cron(self.expression)

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True)
class CalculatedSchedule:
    """Refresh as often as the tightest schedule among the downstream stream tables."""

    def canonical(self) -> str:
        """Always ``calculated``."""
        return "calculated"

    def __str__(self) -> str:
        return self.canonical()


Schedule = IntervalSchedule | CronSchedule | CalculatedSchedule


def parse_schedule(text: str | None) -> Schedule:
    """Parse a schedule string into a :data:`Schedule`.

    Accepts durations (``30s``, ``5m``, ``1h30m``, ``1h 30m``; units ``ms``, ``s``,
    ``m``, ``h``, ``d``, ``w``, each at most once, largest first, between 1s and
    366d), 5-field cron expressions, the aliases ``@hourly``, ``@daily``,
    ``@weekly``, ``@monthly``, ``@yearly``, and ``calculated``. Matching ignores
    case and surrounding whitespace.

    Raises:
        ScheduleError: for anything else, quoting the input and listing the
            accepted forms.
    """
    if not isinstance(text, str):
        raise _schedule_error(text, "the schedule must be text")
    stripped = text.strip(WHITESPACE)
    if not stripped:
        raise _schedule_error(text, "the schedule is empty")
    if len(stripped) > _MAX_TEXT_LENGTH:
        raise _schedule_error(text, f"the schedule is longer than {_MAX_TEXT_LENGTH} characters")
    if not stripped.isascii():
        raise _schedule_error(text, "it is not a duration, a cron expression or 'calculated'")
    if stripped.lower() == "calculated":
        return CalculatedSchedule()
    if stripped.startswith("@"):
        return _parse_cron_alias(text, stripped)
    if _DURATION_LIKE.fullmatch(stripped):
        return _parse_duration(text, stripped)
    fields = split_fields(stripped)
    if len(fields) > 1:
        return _parse_cron(text, fields)
    raise _schedule_error(text, "it is not a duration, a cron expression or 'calculated'")


def next_due(schedule: Schedule, last_refresh_at: datetime | None, now: datetime) -> datetime:
    """When the next refresh is due, in UTC.

    A stream table that was never refreshed is due ``now``. Otherwise an interval
    schedule is due ``interval`` after the last refresh, and a cron schedule at its
    first fire time strictly after the last refresh.

    Raises:
        ValueError: if a datetime is naive.
        ScheduleError: for a :class:`CalculatedSchedule`; resolve it first with
            :func:`pgtrickle.scheduler.dag.resolve_calculated`.
    """
    now = _as_utc(now, "now")
    last = None if last_refresh_at is None else _as_utc(last_refresh_at, "last_refresh_at")
    if isinstance(schedule, CalculatedSchedule):
        raise _unresolved_error()
    if last is None:
        return now
    if isinstance(schedule, IntervalSchedule):
        return last + timedelta(seconds=schedule.seconds)
    return _next_fire(schedule, last)


def is_due(schedule: Schedule, last_refresh_at: datetime | None, now: datetime) -> bool:
    """Whether a refresh is due at ``now``, i.e. ``next_due(...) <= now``."""
    return next_due(schedule, last_refresh_at, now) <= _as_utc(now, "now")


def interval_seconds(schedule: Schedule, now: datetime) -> float:
    """A schedule's refresh period in seconds, for comparing schedules.

    For an interval schedule this is its length; for a cron schedule, the gap
    between its next two fire times after ``now``.

    Raises:
        ValueError: if ``now`` is naive.
        ScheduleError: for a :class:`CalculatedSchedule`.
    """
    now = _as_utc(now, "now")
    if isinstance(schedule, CalculatedSchedule):
        raise _unresolved_error()
    if isinstance(schedule, IntervalSchedule):
        return schedule.seconds
    first = _next_fire(schedule, now)
    return (_next_fire(schedule, first) - first).total_seconds()


def _parse_duration(text: str, stripped: str) -> IntervalSchedule:
    """Parse a duration already known to look like ``<number><unit>...``."""
    match = _DURATION.fullmatch(stripped)
    if match is None:
        raise _schedule_error(
            text,
            "a duration is one or more <number><unit> parts with units "
            "ms, s, m, h, d, w, each used at most once, largest first",
        )
    total_ms = sum(
        int(count) * _UNIT_MS[unit.lower()] for unit, count in match.groupdict().items() if count is not None
    )
    seconds = total_ms / 1000
    if not MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        raise _schedule_error(text, "the interval must be between 1s and 366d")
    return IntervalSchedule(seconds)


def _parse_cron_alias(text: str, stripped: str) -> CronSchedule:
    """Parse one of the supported ``@`` cron aliases."""
    alias = stripped.lower()
    if alias not in ALIASES:
        raise _schedule_error(text, "it is not a supported cron alias")
    return CronSchedule(alias)


def _parse_cron(text: str, fields: list[str]) -> CronSchedule:
    """Validate cron fields (already split) with the one cron grammar (:mod:`pgtrickle.scheduler.cron`)."""
    try:
        parse_cron(fields)
    except ScheduleError as exc:
        raise _schedule_error(text, str(exc)) from None
    return CronSchedule(_normalize_cron(" ".join(fields)))


def _normalize_cron(expression: str) -> str:
    """Lower-case a cron expression and separate its fields by single spaces."""
    return " ".join(split_fields(expression)).lower()


def _spec(schedule: CronSchedule) -> CronSpec:
    expression = schedule.canonical()
    return parse_cron(split_fields(ALIASES.get(expression, expression)))


def _next_fire(schedule: CronSchedule, after: datetime) -> datetime:
    """The first fire time of ``schedule`` strictly after ``after`` (a UTC datetime)."""
    return _spec(schedule).next_fire(after)


def _as_utc(value: datetime, name: str) -> datetime:
    """Convert an aware datetime to UTC; reject naive ones."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _schedule_error(text: object, reason: str) -> ScheduleError:
    """A ScheduleError quoting ``text`` (repr, at most 80 characters) and the accepted forms."""
    shown = repr(text)
    if len(shown) > _SHOWN_LENGTH:
        shown = shown[: _SHOWN_LENGTH - 3] + "..."
    return ScheduleError(f"invalid schedule {shown}: {reason}; {_ACCEPTED_FORMS}")


def _unresolved_error() -> ScheduleError:
    """The error for using a calculated schedule before resolving it."""
    return ScheduleError(
        "a 'calculated' schedule has no due time of its own; resolve it with "
        "pgtrickle.scheduler.dag.resolve_calculated() first"
    )

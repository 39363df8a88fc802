"""Refresh schedules: the catalog's parsed form, decoded, and due-time arithmetic.

A stream table's schedule is one of three things:

* a duration such as ``30s``, ``5m`` or ``1h30m``: refresh that long after the previous
  refresh (:class:`IntervalSchedule`);
* a 5-field cron expression such as ``*/5 * * * *``, or an alias like ``@hourly``: refresh at
  each fire time, in UTC (:class:`CronSchedule`);
* ``calculated``: refresh as often as the stream tables that read this one need
  (:class:`CalculatedSchedule`, resolved by :func:`pgtrickle.scheduler.dag.resolve_calculated`).

pgtrickle has one schedule grammar: ``pgtrickle._parse_schedule`` in the catalog
(``catalog/sql/api/05_schedules.sql``; docs/SQL_API.md, "Schedules: one grammar"). It accepts or
refuses the text and returns its parsed form, which the catalog stores beside the text
(``pgt_stream_tables.schedule_parsed``). The daemon never parses schedule text: it decodes that
form with :func:`schedule_from_parsed` and decides here when a refresh is due.

Everything here is pure: no I/O, no clock. Callers pass ``now`` in, always as a timezone-aware
datetime; results are in UTC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeGuard

from pgtrickle.errors import ScheduleError
from pgtrickle.scheduler.cron import FIELD_RANGES, CronSpec

MIN_INTERVAL_MS = 1000
MAX_INTERVAL_MS = 366 * 24 * 3600 * 1000


@dataclass(frozen=True)
class IntervalSchedule:
    """Refresh a fixed number of seconds after the previous refresh."""

    seconds: float


@dataclass(frozen=True)
class CronSchedule:
    """Refresh at each fire time of a cron expression (given as its fire-time sets), in UTC."""

    fires: CronSpec


@dataclass(frozen=True)
class CalculatedSchedule:
    """Refresh as often as the tightest schedule among the downstream stream tables."""


Schedule = IntervalSchedule | CronSchedule | CalculatedSchedule


def schedule_from_parsed(parsed: Mapping[str, Any] | None) -> Schedule:
    """The schedule of a parsed form, as ``pgtrickle._parse_schedule`` returns it.

    The forms (see ``catalog/sql/api/05_schedules.sql``): ``{"kind": "calculated"}``;
    ``{"kind": "interval", "interval_ms": n}``; ``{"kind": "cron", "minute": [...], "hour":
    [...], "day_of_month": [...], "month": [...], "day_of_week": [...], "day_or": bool}``; and,
    from ``pgtrickle._parse_schedule_or_error``, ``{"kind": "invalid", "error": ..., "hint": ...}``
    for a stored text the grammar refuses. Each carries the canonical text as ``"schedule"``.

    Raises:
        ScheduleError: for the ``invalid`` form (with the parser's message and hint), for a
            missing form, and for one this version cannot read (written by hand, or by another
            version), naming what is wrong.
    """
    if parsed is None:
        raise ScheduleError(
            "the schedule has no parsed form in the catalog; run `pgtrickle install`, "
            "or set it again with pgtrickle.alter_stream_table(name, schedule => ...)"
        )
    if not isinstance(parsed, Mapping):
        raise ScheduleError(f"a parsed schedule is a JSON object, not {type(parsed).__name__}")
    kind = parsed.get("kind")
    if kind == "invalid":
        error, hint = parsed.get("error"), parsed.get("hint")
        raise ScheduleError(f"{error} ({hint})" if hint else str(error))
    if kind == "calculated":
        return CalculatedSchedule()
    if kind == "interval":
        ms = parsed.get("interval_ms")
        if not _is_int(ms) or not MIN_INTERVAL_MS <= ms <= MAX_INTERVAL_MS:
            raise ScheduleError(
                f"the parsed schedule's interval_ms must be an integer {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}, "
                f"got {ms!r}"
            )
        return IntervalSchedule(ms / 1000)
    if kind == "cron":
        sets: dict[str, list[Any]] = {}
        for name in FIELD_RANGES:
            values = parsed.get(name)
            if not isinstance(values, list):
                raise ScheduleError(f"the parsed cron schedule's {name} must be a list, got {values!r}")
            sets[name] = values
        day_or = parsed.get("day_or")
        if not isinstance(day_or, bool):
            raise ScheduleError(f"the parsed cron schedule's day_or must be true or false, got {day_or!r}")
        spec = CronSpec.of(
            minute=sets["minute"],
            hour=sets["hour"],
            day_of_month=sets["day_of_month"],
            month=sets["month"],
            day_of_week=sets["day_of_week"],
            day_or=day_or,
        )
        return CronSchedule(spec)
    raise ScheduleError(f"unknown kind of parsed schedule: {kind!r}")


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
    return schedule.fires.next_fire(last)


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
    first = schedule.fires.next_fire(now)
    return (schedule.fires.next_fire(first) - first).total_seconds()


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_utc(value: datetime, name: str) -> datetime:
    """Convert an aware datetime to UTC; reject naive ones."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _unresolved_error() -> ScheduleError:
    """The error for using a calculated schedule before resolving it."""
    return ScheduleError(
        "a 'calculated' schedule has no due time of its own; resolve it with "
        "pgtrickle.scheduler.dag.resolve_calculated() first"
    )

"""Cron fire times in UTC, from the fire-time sets the catalog's parser gives.

pgtrickle has one schedule grammar, and it is SQL's: ``pgtrickle._parse_schedule``
(``catalog/sql/api/05_schedules.sql``) accepts or refuses a cron expression and turns it into
the set of values of each field (docs/SQL_API.md, "Schedules: one grammar"). Nothing here reads
cron text. :class:`CronSpec` holds those sets and finds the next fire time:

* a minute fires when its minute, hour and month are in their sets and its day matches;
* the day matches when the day of month and the day of week both do, except when neither
  field was ``*`` (``day_or``): then either one matching is enough (as in Vixie cron).

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pgtrickle.errors import ScheduleError

# 29 February comes back within 8 years (2096 -> 2104): a search longer than that finds nothing.
_SEARCH_DAYS = 9 * 366

# Each set's name in the parsed form, and its range.
FIELD_RANGES: dict[str, tuple[int, int]] = {
    "minute": (0, 59),
    "hour": (0, 23),
    "day_of_month": (1, 31),
    "month": (1, 12),
    "day_of_week": (0, 6),  # 0 = Sunday
}


@dataclass(frozen=True)
class CronSpec:
    """The fire times of a cron expression, as sets of field values.

    Build it with :meth:`of` (which checks the ranges), or get it from the catalog through
    :func:`pgtrickle.scheduler.schedule.schedule_from_parsed`.
    """

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    day_or: bool  # neither day field is '*': either matching is enough

    @classmethod
    def of(
        cls,
        *,
        minute: Iterable[int] = range(60),
        hour: Iterable[int] = range(24),
        day_of_month: Iterable[int] = range(1, 32),
        month: Iterable[int] = range(1, 13),
        day_of_week: Iterable[int] = range(7),
        day_or: bool = False,
    ) -> CronSpec:
        """A spec from each field's values (every value by default).

        Raises:
            ScheduleError: if a set is empty or holds a value outside its field's range.
        """
        fields = {
            "minute": minute,
            "hour": hour,
            "day_of_month": day_of_month,
            "month": month,
            "day_of_week": day_of_week,
        }
        sets: dict[str, frozenset[int]] = {}
        for name, values in fields.items():
            low, high = FIELD_RANGES[name]
            chosen = frozenset(values)
            # type() is int: not bool, not float (a bool or 1.0 would hash equal to an int).
            if (
                not chosen
                or not all(type(v) is int for v in chosen)
                or min(chosen) < low
                or max(chosen) > high
            ):
                raise ScheduleError(f"the {name} set must be a non-empty set of integers {low}..{high}")
            sets[name] = chosen
        return cls(
            sets["minute"], sets["hour"], sets["day_of_month"], sets["month"], sets["day_of_week"], day_or
        )

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        return (by_date or by_weekday) if self.day_or else (by_date and by_weekday)

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (an aware datetime), in UTC.

        Raises:
            ScheduleError: if it never fires (the catalog's parser refuses such expressions).
        """
        after = after.astimezone(UTC)
        start = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        times = sorted(h * 60 + m for h in self.hours for m in self.minutes)
        day = start.date()
        first = start.hour * 60 + start.minute
        for _ in range(_SEARCH_DAYS):
            if self.day_matches(day):
                at = bisect_left(times, first)
                if at < len(times):
                    hour, minute = divmod(times[at], 60)
                    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
            day += timedelta(days=1)
            first = 0
        raise ScheduleError("the cron expression never fires")

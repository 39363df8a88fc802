"""5-field cron expressions: pgtrickle's one cron grammar, and fire times in UTC.

The SQL API validates schedules with the same grammar (``pgtrickle._validate_schedule``
and ``pgtrickle._cron_field`` in ``catalog/sql/api/05_schedules.sql``) and stores the canonical form;
``tests/integration/test_schedule_grammar.py`` feeds random strings to both and checks
they agree. The grammar (docs/SQL_API.md, "Schedules"):

* exactly 5 fields separated by whitespace: minute (0-59), hour (0-23), day of month
  (1-31), month (1-12 or ``jan``..``dec``), day of week (0-7 or ``sun``..``sat``; 0 and 7
  are Sunday);
* a field is a comma-separated list of items; an item is ``*``, ``n`` or ``a-b``
  (``a <= b``), optionally followed by ``/step`` (1 <= step <= the field's maximum);
  ``n/step`` means ``n-max/step``. Names are accepted only in their own field, in any case;
* the day matches when the day of month and the day of week both match, except when
  neither field is ``*``: then either one matching is enough (as in Vixie cron);
* an expression that can never fire (``0 0 31 4 *``: April has no 31st) is refused.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pgtrickle.errors import ScheduleError

# Whitespace of the grammar: ASCII only, the same set on the SQL side.
WHITESPACE = " \t\n\r\f\v"
_SPLIT = re.compile(f"[{re.escape(WHITESPACE)}]+")
_ITEM = re.compile(r"(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?", re.ASCII)

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, minimum, maximum, names)
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
# The longest month each month can be (February: 29, in leap years).
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# 29 February comes back within 8 years (2096 -> 2104): a search longer than that finds nothing.
_SEARCH_DAYS = 9 * 366

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}


@dataclass(frozen=True)
class CronSpec:
    """The fire times of a cron expression, as sets of field values."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    day_or: bool  # neither day field is '*': either matching is enough

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        return (by_date or by_weekday) if self.day_or else (by_date and by_weekday)

    def can_fire(self) -> bool:
        """Whether some date matches (only a day-of-month that no chosen month has can fail)."""
        if self.day_or:
            return True
        return any(day <= _MONTH_DAYS[month - 1] for month in self.months for day in self.days)

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (an aware datetime), in UTC."""
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


def split_fields(text: str) -> list[str]:
    """The whitespace-separated fields of ``text`` (already stripped)."""
    return [field for field in _SPLIT.split(text) if field]


def parse_cron(fields: list[str]) -> CronSpec:
    """Parse 5 cron fields (any case) into a :class:`CronSpec`.

    Raises:
        ScheduleError: naming the first field that is not valid, or saying the
            expression never fires. The message is a reason, without the input.
    """
    if len(fields) != len(_FIELDS):
        raise ScheduleError(
            "a cron expression has exactly 5 fields (minute hour day-of-month month day-of-week)"
        )
    values = []
    for text, (name, low, high, names) in zip(fields, _FIELDS, strict=True):
        parsed = _parse_field(text.lower(), low, high, names)
        if parsed is None:
            raise ScheduleError(
                f"the {name} field {text!r} is not valid ({low}-{high}"
                f"{', names' if names else ''}; items *, n, a-b, with /step)"
            )
        values.append(parsed)
    minutes, hours, days, months, weekdays = values
    spec = CronSpec(
        frozenset(minutes),
        frozenset(hours),
        frozenset(days),
        frozenset(months),
        frozenset(d % 7 for d in weekdays),
        fields[2] != "*" and fields[4] != "*",
    )
    if not spec.can_fire():
        raise ScheduleError("the cron expression never fires (no chosen month has that day)")
    return spec


def _parse_field(text: str, low: int, high: int, names: tuple[str, ...] | None) -> set[int] | None:
    """The values of one field, or ``None`` when it is not valid."""
    result: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            return None
        body, step_text = match.groups()
        step = 1
        if step_text is not None:
            step = int(step_text)
            if not 1 <= step <= high:
                return None
        if body == "*":
            first, last = low, high
        else:
            values = [_value(side, low, high, names) for side in body.split("-")]
            ends = [v for v in values if v is not None]
            if len(ends) != len(values):
                return None
            first = ends[0]
            last = ends[-1] if len(ends) == 2 else (high if step_text is not None else first)
            if last < first:
                return None
        result.update(range(first, last + 1, step))
    return result


def _value(token: str, low: int, high: int, names: tuple[str, ...] | None) -> int | None:
    if token.isdigit():
        value = int(token)
    elif names is not None and token in names:
        value = names.index(token) + low
    else:
        return None
    return value if low <= value <= high else None

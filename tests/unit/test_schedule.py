"""Unit tests for pgtrickle.scheduler.schedule: decoding the catalog's parsed form, and due times.

The grammar itself (what text is accepted, and its parsed form) is the catalog's
(``pgtrickle._parse_schedule``): tests/integration/test_schedule_grammar.py tests it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtrickle.errors import PgTrickleError, ScheduleError
from pgtrickle.scheduler.cron import CronSpec
from pgtrickle.scheduler.schedule import (
    CalculatedSchedule,
    CronSchedule,
    IntervalSchedule,
    Schedule,
    interval_seconds,
    is_due,
    next_due,
    schedule_from_parsed,
)
from tests.hypothesis_profiles import examples

NOW = datetime(2024, 5, 17, 12, 0, 0, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0, microsecond: int = 0) -> datetime:
    """A UTC datetime on NOW's day."""
    return NOW.replace(hour=hour, minute=minute, second=second, microsecond=microsecond)


def cron(**fields: Any) -> CronSchedule:
    return CronSchedule(CronSpec.of(**fields))


EVERY_5_MINUTES = cron(minute=range(0, 60, 5))  # */5 * * * *
HOURLY = cron(minute=[0])
DAILY = cron(minute=[0], hour=[0])
WEEKLY = cron(minute=[0], hour=[0], day_of_week=[0])
MONTHLY = cron(minute=[0], hour=[0], day_of_month=[1])
YEARLY = cron(minute=[0], hour=[0], day_of_month=[1], month=[1])
WEEKDAYS_AT_9 = cron(minute=[0], hour=[9], day_of_week=range(1, 6))  # 0 9 * * mon-fri
LEAP_DAY = cron(minute=[0], hour=[0], day_of_month=[29], month=[2])  # 0 0 29 2 *
TEXTS: dict[str, Schedule] = {
    "5m": IntervalSchedule(300),
    "30m": IntervalSchedule(1800),
    "1h30m": IntervalSchedule(5400),
    "1s500ms": IntervalSchedule(1.5),
    "*/5 * * * *": EVERY_5_MINUTES,
    "0,10 * * * *": cron(minute=[0, 10]),
    "@hourly": HOURLY,
    "@daily": DAILY,
    "@weekly": WEEKLY,
    "@monthly": MONTHLY,
    "@yearly": YEARLY,
    "0 9 * * mon-fri": WEEKDAYS_AT_9,
    "0 0 29 2 *": LEAP_DAY,
}


def schedule_for(text: str) -> Schedule:
    """The schedules these tests use, by the text they stand for (no parsing here)."""
    return TEXTS[text]


# --- schedule_from_parsed ---------------------------------------------------------------

FULL = {
    "minute": list(range(60)),
    "hour": list(range(24)),
    "day_of_month": list(range(1, 32)),
    "month": list(range(1, 13)),
    "day_of_week": list(range(7)),
}


def test_decodes_each_kind() -> None:
    assert schedule_from_parsed({"kind": "calculated", "schedule": "calculated"}) == CalculatedSchedule()
    assert schedule_from_parsed({"kind": "interval", "schedule": "1h30m", "interval_ms": 5_400_000}) == (
        IntervalSchedule(5400)
    )
    assert schedule_from_parsed({"kind": "interval", "schedule": "1s500ms", "interval_ms": 1500}) == (
        IntervalSchedule(1.5)
    )
    parsed = {
        **FULL,
        "kind": "cron",
        "schedule": "*/5 * * * *",
        "minute": list(range(0, 60, 5)),
        "day_or": False,
    }
    assert schedule_from_parsed(parsed) == EVERY_5_MINUTES
    either = {
        **FULL,
        "kind": "cron",
        "schedule": "0 0 13 * fri",
        "minute": [0],
        "hour": [0],
        "day_of_month": [13],
        "day_of_week": [5],
        "day_or": True,
    }
    assert schedule_from_parsed(either) == CronSchedule(
        CronSpec.of(minute=[0], hour=[0], day_of_month=[13], day_of_week=[5], day_or=True)
    )


def test_the_invalid_form_raises_the_parsers_message_and_hint() -> None:
    parsed = {
        "kind": "invalid",
        "schedule": "0 0 31 4 *",
        "error": "invalid schedule '0 0 31 4 *': never fires",
        "hint": "Use a duration",
    }
    with pytest.raises(
        ScheduleError, match=r"^invalid schedule '0 0 31 4 \*': never fires \(Use a duration\)$"
    ):
        schedule_from_parsed(parsed)
    with pytest.raises(ScheduleError, match=r"^invalid schedule 'x'$"):
        schedule_from_parsed({"kind": "invalid", "error": "invalid schedule 'x'", "hint": None})


def test_a_missing_form_says_how_to_repair_it() -> None:
    with pytest.raises(ScheduleError, match="pgtrickle install"):
        schedule_from_parsed(None)


@pytest.mark.parametrize(
    ("parsed", "reason"),
    [
        ([1, 2], "JSON object"),
        ({}, "unknown kind"),
        ({"kind": "weekly"}, "unknown kind"),
        ({"kind": "interval"}, "interval_ms"),
        ({"kind": "interval", "interval_ms": 999}, "interval_ms"),
        ({"kind": "interval", "interval_ms": 366 * 86_400_000 + 1}, "interval_ms"),
        ({"kind": "interval", "interval_ms": 1500.0}, "interval_ms"),
        ({"kind": "interval", "interval_ms": True}, "interval_ms"),
        ({"kind": "interval", "interval_ms": "60000"}, "interval_ms"),
        ({**FULL, "kind": "cron"}, "day_or"),
        ({**FULL, "kind": "cron", "day_or": "false"}, "day_or"),
        ({**FULL, "kind": "cron", "day_or": False, "minute": "0"}, "minute must be a list"),
        ({**FULL, "kind": "cron", "day_or": False, "hour": None}, "hour must be a list"),
        ({**FULL, "kind": "cron", "day_or": False, "minute": []}, "minute set"),
        ({**FULL, "kind": "cron", "day_or": False, "minute": [60]}, "minute set"),
        ({**FULL, "kind": "cron", "day_or": False, "day_of_month": [0]}, "day_of_month set"),
        ({**FULL, "kind": "cron", "day_or": False, "day_of_week": [7]}, "day_of_week set"),
        ({**FULL, "kind": "cron", "day_or": False, "month": [1.5]}, "month set"),
        ({**FULL, "kind": "cron", "day_or": False, "month": [True]}, "month set"),
    ],
)
def test_a_form_this_version_cannot_read_is_refused_naming_the_problem(parsed: Any, reason: str) -> None:
    with pytest.raises(ScheduleError, match=reason):
        schedule_from_parsed(parsed)


def test_schedule_error_is_a_value_error() -> None:
    assert issubclass(ScheduleError, PgTrickleError)
    assert issubclass(ScheduleError, ValueError)


# --- next_due / is_due: intervals ---------------------------------------------------


def test_interval_never_refreshed_is_due_now() -> None:
    schedule = schedule_for("5m")
    assert next_due(schedule, None, NOW) == NOW
    assert is_due(schedule, None, NOW)


def test_interval_next_due_is_last_plus_interval() -> None:
    schedule = schedule_for("1h30m")
    last = at(10, 0)
    assert next_due(schedule, last, NOW) == at(11, 30)
    assert is_due(schedule, last, NOW)


def test_interval_due_boundary() -> None:
    schedule = schedule_for("5m")
    last = NOW - timedelta(minutes=5)
    assert is_due(schedule, last, NOW)
    assert not is_due(schedule, last + timedelta(microseconds=1), NOW)


def test_interval_with_milliseconds() -> None:
    schedule = schedule_for("1s500ms")
    assert next_due(schedule, NOW, NOW) == NOW + timedelta(milliseconds=1500)


def test_results_are_utc_even_for_other_offsets() -> None:
    plus_two = timezone(timedelta(hours=2))
    last = datetime(2024, 5, 17, 14, 0, tzinfo=plus_two)  # 12:00 UTC
    due = next_due(schedule_for("30m"), last, NOW)
    assert due == at(12, 30)
    assert due.utcoffset() == timedelta(0)
    never_refreshed = next_due(schedule_for("30m"), None, NOW.astimezone(plus_two))
    assert never_refreshed == NOW
    assert never_refreshed.utcoffset() == timedelta(0)


# --- next_due / is_due: cron ---------------------------------------------------------


def test_cron_never_refreshed_is_due_now() -> None:
    schedule = schedule_for("*/5 * * * *")
    assert next_due(schedule, None, at(12, 3)) == at(12, 3)
    assert is_due(schedule, None, at(12, 3))


def test_cron_next_fire_after_last_refresh() -> None:
    schedule = schedule_for("*/5 * * * *")
    assert next_due(schedule, at(12, 3), NOW) == at(12, 5)


def test_cron_next_fire_is_strictly_after_last_refresh() -> None:
    schedule = schedule_for("*/5 * * * *")
    assert next_due(schedule, at(12, 5), NOW) == at(12, 10)
    assert next_due(schedule, at(12, 5, 0, 1), NOW) == at(12, 10)
    assert next_due(schedule, at(12, 4, 59, 999999), NOW) == at(12, 5)


def test_cron_due_around_fire_time() -> None:
    schedule = schedule_for("*/5 * * * *")
    last = at(12, 1)
    assert not is_due(schedule, last, at(12, 4, 59, 999999))
    assert is_due(schedule, last, at(12, 5))
    assert is_due(schedule, last, at(12, 7))
    # Refreshed right at the fire time: not due again until the next one.
    assert not is_due(schedule, at(12, 5), at(12, 9, 59))
    assert is_due(schedule, at(12, 5), at(12, 10))


def test_cron_missed_fire_times_make_it_due_once() -> None:
    schedule = schedule_for("@hourly")
    last = datetime(2024, 5, 16, 3, 30, tzinfo=UTC)
    assert next_due(schedule, last, NOW) == datetime(2024, 5, 16, 4, 0, tzinfo=UTC)
    assert is_due(schedule, last, NOW)


@pytest.mark.parametrize(
    ("text", "last", "expected"),
    [
        ("@daily", datetime(2024, 5, 17, 0, 0, tzinfo=UTC), datetime(2024, 5, 18, tzinfo=UTC)),
        ("@weekly", datetime(2024, 5, 17, tzinfo=UTC), datetime(2024, 5, 19, tzinfo=UTC)),
        ("@monthly", datetime(2024, 5, 17, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)),
        ("@yearly", datetime(2024, 1, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)),
        (
            "0 9 * * mon-fri",
            datetime(2024, 5, 17, 9, tzinfo=UTC),
            datetime(2024, 5, 20, 9, tzinfo=UTC),
        ),
        ("0 0 29 2 *", datetime(2024, 3, 1, tzinfo=UTC), datetime(2028, 2, 29, tzinfo=UTC)),
    ],
)
def test_cron_aliases_and_expressions(text: str, last: datetime, expected: datetime) -> None:
    assert next_due(schedule_for(text), last, NOW) == expected


def test_cron_interprets_times_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    last = datetime(2024, 5, 17, 1, 30, tzinfo=plus_two)  # 2024-05-16 23:30 UTC
    due = next_due(schedule_for("@daily"), last, NOW)
    assert due == datetime(2024, 5, 17, 0, 0, tzinfo=UTC)
    assert due.utcoffset() == timedelta(0)


# --- errors in due computation -------------------------------------------------------


@pytest.mark.parametrize("schedule", [IntervalSchedule(60), EVERY_5_MINUTES])
def test_naive_datetimes_rejected(schedule: Schedule) -> None:
    naive = datetime(2024, 5, 17, 12, 0)
    with pytest.raises(ValueError, match="timezone-aware"):
        next_due(schedule, None, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        next_due(schedule, naive, NOW)
    with pytest.raises(ValueError, match="timezone-aware"):
        is_due(schedule, naive, NOW)
    with pytest.raises(ValueError, match="timezone-aware"):
        interval_seconds(schedule, naive)


def test_calculated_must_be_resolved_first() -> None:
    with pytest.raises(ScheduleError, match="resolve_calculated"):
        next_due(CalculatedSchedule(), None, NOW)
    with pytest.raises(ScheduleError, match="resolve_calculated"):
        is_due(CalculatedSchedule(), at(11, 0), NOW)
    with pytest.raises(ScheduleError, match="resolve_calculated"):
        interval_seconds(CalculatedSchedule(), NOW)


# --- interval_seconds -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "now", "seconds"),
    [
        ("1h30m", NOW, 5400),
        ("1s500ms", NOW, 1.5),
        ("*/5 * * * *", NOW, 300),
        ("@hourly", NOW, 3600),
        ("@daily", NOW, 86400),
        ("0,10 * * * *", at(12, 5), 3000),  # next fires 12:10 and 13:00
        ("0,10 * * * *", at(12, 10), 600),  # next fires 13:00 and 13:10
        ("@monthly", datetime(2024, 1, 15, tzinfo=UTC), 29 * 86400),  # Feb 2024
    ],
)
def test_interval_seconds(text: str, now: datetime, seconds: float) -> None:
    assert interval_seconds(schedule_for(text), now) == seconds


# --- property-based tests --------------------------------------------------------------


def _oracle_next_fire(text: str, last: datetime) -> datetime:
    """The next fire time strictly after ``last``, computed by hand for two cron schedules."""
    step = {"*/5 * * * *": timedelta(minutes=5), "@hourly": timedelta(hours=1)}[text]
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    return epoch + ((last - epoch) // step + 1) * step


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(["*/5 * * * *", "@hourly"]),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_cron_next_due_is_first_fire_time_strictly_after_last(text: str, last: datetime) -> None:
    schedule = schedule_for(text)
    due = next_due(schedule, last, NOW)
    assert due == _oracle_next_fire(text, last)
    assert due > last
    assert is_due(schedule, last, due)
    assert not is_due(schedule, last, due - timedelta(microseconds=1))

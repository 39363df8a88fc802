"""Unit tests for pgtrickle.scheduler.schedule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import PgTrickleError, ScheduleError
from pgtrickle.scheduler.schedule import (
    CalculatedSchedule,
    CronSchedule,
    IntervalSchedule,
    Schedule,
    interval_seconds,
    is_due,
    next_due,
    parse_schedule,
)
from tests.hypothesis_profiles import examples

NOW = datetime(2024, 5, 17, 12, 0, 0, tzinfo=UTC)
ACCEPTED_FORMS_HINT = "expected a duration such as '30s'"


def at(hour: int, minute: int, second: int = 0, microsecond: int = 0) -> datetime:
    """A UTC datetime on NOW's day."""
    return NOW.replace(hour=hour, minute=minute, second=second, microsecond=microsecond)


# --- parse_schedule: durations ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1h\t30m ", 5400),
        ("2d", 172800),
        ("1w", 604800),
        ("1w2d3h4m5s6ms", 604800 + 2 * 86400 + 3 * 3600 + 4 * 60 + 5.006),
        ("1s500ms", 1.5),
        ("1000ms", 1),
        ("90m", 5400),
        ("1H30M", 5400),
        ("  30s  ", 30),
        ("0h1s", 1),
        ("007s", 7),
        ("30 s", 30),
        ("1 d", 86400),
        ("1 h 30 m", 5400),
        ("1s 5 MS", 1.005),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_schedule(text) == IntervalSchedule(seconds)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("30s", "30s"),
        ("90m", "1h30m"),
        ("1h 30m", "1h30m"),
        ("1000ms", "1s"),
        ("7d", "1w"),
        ("366d", "52w2d"),
        ("1s500ms", "1s500ms"),
        ("3600s", "1h"),
        ("0h1s", "1s"),
    ],
)
def test_duration_canonical(text: str, canonical: str) -> None:
    schedule = parse_schedule(text)
    assert schedule.canonical() == canonical
    assert str(schedule) == canonical


@pytest.mark.parametrize("text", ["1s", "1000ms", "366d", "52w2d", "8784h", "31622400s"])
def test_duration_boundaries_accepted(text: str) -> None:
    assert isinstance(parse_schedule(text), IntervalSchedule)


@pytest.mark.parametrize("text", ["0s", "999ms", "0ms", "5MS", "400d", "366d1ms", "367d", "53w"])
def test_duration_out_of_range(text: str) -> None:
    with pytest.raises(ScheduleError, match="between 1s and 366d") as excinfo:
        parse_schedule(text)
    assert repr(text) in str(excinfo.value)


@pytest.mark.parametrize("text", ["5x", "1m1h", "1h1h", "1s1m", "1ms1s", "5sec", "1y", "1 m 1 h"])
def test_malformed_duration(text: str) -> None:
    with pytest.raises(ScheduleError, match="largest first"):
        parse_schedule(text)


# --- parse_schedule: cron and calculated ------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("*/5 * * * *", "*/5 * * * *"),
        ("  */5   *  * * *  ", "*/5 * * * *"),
        ("0 0 * * MON-FRI", "0 0 * * mon-fri"),
        ("0 12 1 JAN *", "0 12 1 jan *"),
        ("0,30 9-17 * * 1-5", "0,30 9-17 * * 1-5"),
        ("0 0 29 2 *", "0 0 29 2 *"),
        ("@hourly", "@hourly"),
        ("@daily", "@daily"),
        ("@weekly", "@weekly"),
        ("@monthly", "@monthly"),
        ("@yearly", "@yearly"),
        (" @DAILY ", "@daily"),
    ],
)
def test_parse_cron(text: str, canonical: str) -> None:
    schedule = parse_schedule(text)
    assert schedule == CronSchedule(canonical)
    assert schedule.canonical() == canonical
    assert str(schedule) == canonical
    assert parse_schedule(canonical) == schedule


@pytest.mark.parametrize("text", ["calculated", "CALCULATED", " Calculated "])
def test_parse_calculated(text: str) -> None:
    schedule = parse_schedule(text)
    assert schedule == CalculatedSchedule()
    assert str(schedule) == schedule.canonical() == "calculated"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("* * *", "exactly 5 fields"),
        ("* * * * * *", "exactly 5 fields"),
        ("0 * * * * * 2024", "exactly 5 fields"),
        ("61 * * * *", "the minute field '61' is not valid"),
        ("* 24 * * *", "the hour field '24' is not valid"),
        ("*/0 * * * *", r"the minute field '\*/0' is not valid"),
        ("* * * 13 *", "the month field '13' is not valid"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 31 4 *", "never fires"),
        ("0 0 30,31 2 *", "never fires"),
        ("H * * * *", "the minute field 'H' is not valid"),
        ("R * * * *", "the minute field 'R' is not valid"),
        ("0 0 L * *", "day of month field 'L' is not valid"),
        ("0 0 * * 1#2", "day of week field '1#2' is not valid"),
        ("0 0 ? * *", r"day of month field '\?' is not valid"),
        ("0 0 * mon *", "the month field 'mon' is not valid"),
        ("5-1 * * * *", "the minute field '5-1' is not valid"),
        ("@reboot", "alias"),
        ("@annually", "alias"),
        ("@", "alias"),
    ],
)
def test_invalid_cron(text: str, reason: str) -> None:
    with pytest.raises(ScheduleError, match=reason):
        parse_schedule(text)


# --- parse_schedule: bad and hostile input ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "'",
        '"',
        ";",
        "1m; DROP TABLE x",
        "'; DROP TABLE pgtrickle.pgt_stream_tables; --",
        "5m' OR '1'='1",
        "* * * * *; SELECT 1",
        "* * * * ;",
        "1.5h",
        "-5m",
        "interval '5 minutes'",
        "5 minutes",
        "calculated; DROP TABLE x",
        "\x00",
        "\u0663\u0660s",  # 30s in Arabic-Indic digits: only ASCII digits count
        "x" * 300,
        "1" * 250 + "s",
    ],
)
def test_hostile_and_garbage_input(text: str) -> None:
    with pytest.raises(ScheduleError) as excinfo:
        parse_schedule(text)
    message = str(excinfo.value)
    assert ACCEPTED_FORMS_HINT in message
    assert "@hourly" in message
    assert "calculated" in message
    shown = repr(text)
    assert (shown if len(shown) <= 80 else shown[:77] + "...") in message


def test_error_quotes_long_input_truncated() -> None:
    text = "y" * 500
    with pytest.raises(ScheduleError) as excinfo:
        parse_schedule(text)
    message = str(excinfo.value)
    assert repr(text)[:77] + "..." in message
    assert "y" * 100 not in message


@pytest.mark.parametrize("value", [None, 5, b"5m"])
def test_non_text_input(value: object) -> None:
    with pytest.raises(ScheduleError, match="must be text"):
        parse_schedule(value)  # type: ignore[arg-type]


def test_schedule_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid schedule 'nope'"):
        parse_schedule("nope")
    assert issubclass(ScheduleError, PgTrickleError)


# --- next_due / is_due: intervals ---------------------------------------------------


def test_interval_never_refreshed_is_due_now() -> None:
    schedule = parse_schedule("5m")
    assert next_due(schedule, None, NOW) == NOW
    assert is_due(schedule, None, NOW)


def test_interval_next_due_is_last_plus_interval() -> None:
    schedule = parse_schedule("1h30m")
    last = at(10, 0)
    assert next_due(schedule, last, NOW) == at(11, 30)
    assert is_due(schedule, last, NOW)


def test_interval_due_boundary() -> None:
    schedule = parse_schedule("5m")
    last = NOW - timedelta(minutes=5)
    assert is_due(schedule, last, NOW)
    assert not is_due(schedule, last + timedelta(microseconds=1), NOW)


def test_interval_with_milliseconds() -> None:
    schedule = parse_schedule("1s500ms")
    assert next_due(schedule, NOW, NOW) == NOW + timedelta(milliseconds=1500)


def test_results_are_utc_even_for_other_offsets() -> None:
    plus_two = timezone(timedelta(hours=2))
    last = datetime(2024, 5, 17, 14, 0, tzinfo=plus_two)  # 12:00 UTC
    due = next_due(parse_schedule("30m"), last, NOW)
    assert due == at(12, 30)
    assert due.utcoffset() == timedelta(0)
    never_refreshed = next_due(parse_schedule("30m"), None, NOW.astimezone(plus_two))
    assert never_refreshed == NOW
    assert never_refreshed.utcoffset() == timedelta(0)


# --- next_due / is_due: cron ---------------------------------------------------------


def test_cron_never_refreshed_is_due_now() -> None:
    schedule = parse_schedule("*/5 * * * *")
    assert next_due(schedule, None, at(12, 3)) == at(12, 3)
    assert is_due(schedule, None, at(12, 3))


def test_cron_next_fire_after_last_refresh() -> None:
    schedule = parse_schedule("*/5 * * * *")
    assert next_due(schedule, at(12, 3), NOW) == at(12, 5)


def test_cron_next_fire_is_strictly_after_last_refresh() -> None:
    schedule = parse_schedule("*/5 * * * *")
    assert next_due(schedule, at(12, 5), NOW) == at(12, 10)
    assert next_due(schedule, at(12, 5, 0, 1), NOW) == at(12, 10)
    assert next_due(schedule, at(12, 4, 59, 999999), NOW) == at(12, 5)


def test_cron_due_around_fire_time() -> None:
    schedule = parse_schedule("*/5 * * * *")
    last = at(12, 1)
    assert not is_due(schedule, last, at(12, 4, 59, 999999))
    assert is_due(schedule, last, at(12, 5))
    assert is_due(schedule, last, at(12, 7))
    # Refreshed right at the fire time: not due again until the next one.
    assert not is_due(schedule, at(12, 5), at(12, 9, 59))
    assert is_due(schedule, at(12, 5), at(12, 10))


def test_cron_missed_fire_times_make_it_due_once() -> None:
    schedule = parse_schedule("@hourly")
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
    assert next_due(parse_schedule(text), last, NOW) == expected


def test_cron_interprets_times_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    last = datetime(2024, 5, 17, 1, 30, tzinfo=plus_two)  # 2024-05-16 23:30 UTC
    due = next_due(parse_schedule("@daily"), last, NOW)
    assert due == datetime(2024, 5, 17, 0, 0, tzinfo=UTC)
    assert due.utcoffset() == timedelta(0)


# --- errors in due computation -------------------------------------------------------


@pytest.mark.parametrize("schedule", [IntervalSchedule(60), CronSchedule("*/5 * * * *")])
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
    assert interval_seconds(parse_schedule(text), now) == seconds


# --- property-based tests --------------------------------------------------------------

UNITS_MS = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}

cron_like_text = st.lists(
    st.text(alphabet="0123456789*/,-#?LlWHRjanmonfri", min_size=1, max_size=6),
    min_size=1,
    max_size=7,
).map(" ".join)


@settings(max_examples=examples(500), deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="0123456789smhdwSMHDW @;' \t"), cron_like_text))
def test_fuzz_parse_returns_schedule_or_schedule_error(text: str) -> None:
    try:
        schedule = parse_schedule(text)
    except ScheduleError as error:
        message = str(error)
    else:
        assert isinstance(schedule, IntervalSchedule | CronSchedule | CalculatedSchedule)
        assert parse_schedule(schedule.canonical()) == schedule
        return
    assert ACCEPTED_FORMS_HINT in message


@st.composite
def valid_durations(draw: st.DrawFn) -> tuple[str, int]:
    """A valid duration string, in the 1s..366d range, and its length in milliseconds."""
    units = draw(st.lists(st.sampled_from(list(UNITS_MS)), min_size=1, unique=True))
    units.sort(key=lambda unit: -UNITS_MS[unit])
    counts = [draw(st.integers(min_value=0, max_value=400)) for _ in units]
    total_ms = sum(count * UNITS_MS[unit] for unit, count in zip(units, counts, strict=True))
    assume(1000 <= total_ms <= 366 * 86_400_000)
    separators = [draw(st.sampled_from(["", " ", "  ", "\t"])) for _ in units]
    text = "".join(
        f"{count}{draw(st.sampled_from([unit, unit.upper()]))}{separator}"
        for unit, count, separator in zip(units, counts, separators, strict=True)
    )
    return text, total_ms


@settings(max_examples=examples(300))
@given(valid_durations())
def test_valid_durations_round_trip_through_canonical(case: tuple[str, int]) -> None:
    text, total_ms = case
    schedule = parse_schedule(text)
    assert isinstance(schedule, IntervalSchedule)
    assert round(schedule.seconds * 1000) == total_ms
    canonical = schedule.canonical()
    assert parse_schedule(canonical) == schedule
    assert parse_schedule(canonical).canonical() == canonical
    assert canonical == canonical.strip().lower()
    assert " " not in canonical


def _oracle_next_fire(text: str, last: datetime) -> datetime:
    """The next fire time strictly after ``last``, computed by hand for two cron schedules."""
    step = {"*/5 * * * *": timedelta(minutes=5), "@hourly": timedelta(hours=1)}[text]
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    return epoch + ((last - epoch) // step + 1) * step


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(["*/5 * * * *", "@hourly"]),
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
)
def test_cron_next_due_is_first_fire_time_strictly_after_last(text: str, last: datetime) -> None:
    schedule = parse_schedule(text)
    due = next_due(schedule, last, NOW)
    assert due == _oracle_next_fire(text, last)
    assert due > last
    assert is_due(schedule, last, due)
    assert not is_due(schedule, last, due - timedelta(microseconds=1))

"""Unit tests for pgtrickle.scheduler.cron: fire times from the fire-time sets.

Which text means which sets is the catalog's grammar (pgtrickle._parse_schedule), tested in
tests/integration/test_schedule_grammar.py; each case here names the expression its sets stand for.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgtrickle.errors import ScheduleError
from pgtrickle.scheduler.cron import CronSpec


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


MIDNIGHT = {"minute": [0], "hour": [0]}


@pytest.mark.parametrize(
    ("expression", "spec", "after", "fire"),
    [
        (
            "*/15 * * * *",
            CronSpec.of(minute=range(0, 60, 15)),
            at(2024, 5, 17, 12, 7),
            at(2024, 5, 17, 12, 15),
        ),
        ("5/20 * * * *", CronSpec.of(minute=[5, 25, 45]), at(2024, 5, 17, 12, 46), at(2024, 5, 17, 13, 5)),
        (
            "0 9-17/4 * * *",
            CronSpec.of(minute=[0], hour=[9, 13, 17]),
            at(2024, 5, 17, 14, 0),
            at(2024, 5, 17, 17, 0),
        ),
        ("0 0 * * sun", CronSpec.of(**MIDNIGHT, day_of_week=[0]), at(2024, 5, 17), at(2024, 5, 19)),
        ("0 0 * * fri-sat", CronSpec.of(**MIDNIGHT, day_of_week=[5, 6]), at(2024, 5, 17), at(2024, 5, 18)),
        (
            "0 0 1 jan,jul *",
            CronSpec.of(**MIDNIGHT, day_of_month=[1], month=[1, 7]),
            at(2024, 5, 17),
            at(2024, 7, 1),
        ),
        (
            "0 0 29 2 *",
            CronSpec.of(**MIDNIGHT, day_of_month=[29], month=[2]),
            at(2024, 3, 1),
            at(2028, 2, 29),
        ),
        # 2100 is not a leap year
        (
            "0 0 29 2 *",
            CronSpec.of(**MIDNIGHT, day_of_month=[29], month=[2]),
            at(2096, 3, 1),
            at(2104, 2, 29),
        ),
        # Neither day field is '*': either one matching is enough.
        (
            "0 0 13 * fri",
            CronSpec.of(**MIDNIGHT, day_of_month=[13], day_of_week=[5], day_or=True),
            at(2024, 5, 1),
            at(2024, 5, 3),
        ),
        (
            "0 0 13 * fri",
            CronSpec.of(**MIDNIGHT, day_of_month=[13], day_of_week=[5], day_or=True),
            at(2024, 5, 10),
            at(2024, 5, 13),
        ),
        # One of them is '*': both must match.
        ("0 0 13 * *", CronSpec.of(**MIDNIGHT, day_of_month=[13]), at(2024, 5, 1), at(2024, 5, 13)),
        ("0 0 * 5 fri", CronSpec.of(**MIDNIGHT, month=[5], day_of_week=[5]), at(2024, 5, 1), at(2024, 5, 3)),
        (
            "0 0 31 4,5 *",
            CronSpec.of(**MIDNIGHT, day_of_month=[31], month=[4, 5]),
            at(2024, 4, 1),
            at(2024, 5, 31),
        ),
        (
            "59 23 31 12 *",
            CronSpec.of(minute=[59], hour=[23], day_of_month=[31], month=[12]),
            at(2024, 12, 31, 23, 59),
            at(2025, 12, 31, 23, 59),
        ),
    ],
)
def test_next_fire(expression: str, spec: CronSpec, after: datetime, fire: datetime) -> None:
    assert spec.next_fire(after) == fire, expression


def test_next_fire_is_strictly_after_and_ignores_seconds() -> None:
    every_minute = CronSpec.of()
    assert every_minute.next_fire(at(2024, 5, 17, 12, 0)) == at(2024, 5, 17, 12, 1)
    assert every_minute.next_fire(at(2024, 5, 17, 12, 0, 59)) == at(2024, 5, 17, 12, 1)


def test_sets_that_never_fire_raise() -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        CronSpec.of(**MIDNIGHT, day_of_month=[31], month=[4]).next_fire(at(2024, 5, 17))


@pytest.mark.parametrize(
    "fields",
    [
        {"minute": []},
        {"minute": [60]},
        {"hour": [24]},
        {"hour": [-1]},
        {"day_of_month": [0]},
        {"day_of_month": [32]},
        {"month": [0]},
        {"month": [13]},
        {"day_of_week": [7]},
        {"minute": ["5"]},
        {"minute": [True]},
    ],
)
def test_values_out_of_range_are_refused(fields: dict[str, list[object]]) -> None:
    with pytest.raises(ScheduleError, match=f"the {next(iter(fields))} set must be"):
        CronSpec.of(**fields)  # type: ignore[arg-type]

"""Unit tests for pgtrickle.scheduler.cron: the one cron grammar and fire times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgtrickle.errors import ScheduleError
from pgtrickle.scheduler.cron import parse_cron, split_fields


def spec(text: str):  # type: ignore[no-untyped-def]
    return parse_cron(split_fields(text))


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "after", "fire"),
    [
        ("*/15 * * * *", at(2024, 5, 17, 12, 7), at(2024, 5, 17, 12, 15)),
        ("5/20 * * * *", at(2024, 5, 17, 12, 46), at(2024, 5, 17, 13, 5)),  # n/step: 5, 25, 45
        ("0 9-17/4 * * *", at(2024, 5, 17, 14, 0), at(2024, 5, 17, 17, 0)),
        ("0 0 * * 7", at(2024, 5, 17), at(2024, 5, 19)),  # 7 is Sunday
        ("0 0 * * sun", at(2024, 5, 17), at(2024, 5, 19)),
        ("0 0 * * FRI-sat", at(2024, 5, 17), at(2024, 5, 18)),
        ("0 0 1 JAN,jul *", at(2024, 5, 17), at(2024, 7, 1)),
        ("0 0 29 2 *", at(2024, 3, 1), at(2028, 2, 29)),
        ("0 0 29 2 *", at(2096, 3, 1), at(2104, 2, 29)),  # 2100 is not a leap year
        # Neither day field is '*': either one matching is enough.
        ("0 0 13 * fri", at(2024, 5, 1), at(2024, 5, 3)),
        ("0 0 13 * fri", at(2024, 5, 10), at(2024, 5, 13)),
        # One of them is '*': both must match.
        ("0 0 13 * *", at(2024, 5, 1), at(2024, 5, 13)),
        ("0 0 * 5 fri", at(2024, 5, 1), at(2024, 5, 3)),
        ("0 0 31 4,5 *", at(2024, 4, 1), at(2024, 5, 31)),
        ("59 23 31 12 *", at(2024, 12, 31, 23, 59), at(2025, 12, 31, 23, 59)),
    ],
)
def test_next_fire(text: str, after: datetime, fire: datetime) -> None:
    assert spec(text).next_fire(after) == fire


def test_next_fire_is_strictly_after_and_ignores_seconds() -> None:
    every_minute = spec("* * * * *")
    assert every_minute.next_fire(at(2024, 5, 17, 12, 0)) == at(2024, 5, 17, 12, 1)
    assert every_minute.next_fire(at(2024, 5, 17, 12, 0, 59)) == at(2024, 5, 17, 12, 1)


@pytest.mark.parametrize("text", ["0 0 31 4 *", "0 0 30 2 *", "0 0 30,31 feb *", "0 0 31 4,6,9,11 *",
                                  "0 0 31 2-2 *", "0 0 31/1 4 *"])
def test_never_firing_expressions_are_refused(text: str) -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        spec(text)


@pytest.mark.parametrize("text", ["0 0 31 4 mon", "0 0 30 2 */1", "0 0 31 * *", "0 0 29 2 *"])
def test_expressions_that_can_fire_are_accepted(text: str) -> None:
    spec(text)


@pytest.mark.parametrize(
    "text",
    ["60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 0 *", "* * * 13 *", "* * * * 8",
     "*/0 * * * *", "*/60 * * * *", "5-1 * * * *", "1,,2 * * * *", "1- * * * *", "-1 * * * *",
     "* * * * mon-", "* * * jan *x", "* * * * jan", "* * * mon *", "* * L * *", "* * ? * *",
     "* * * * 1#2", "* * * * 5L", "H * * * *", "1.5 * * * *", "* * * * * *", "* * * *"],
)
def test_invalid_expressions(text: str) -> None:
    with pytest.raises(ScheduleError):
        spec(text)

"""due_reason: is a stream table due, and why (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgtrickle.scheduler.cron import CronSpec
from pgtrickle.scheduler.policy import DueReason, DueState, due_reason
from pgtrickle.scheduler.schedule import CronSchedule, IntervalSchedule

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
MINUTE = IntervalSchedule(60)


def state(
    status: str = "ACTIVE",
    frontier: bool = True,
    last: datetime | None = None,
    attempt: datetime | None = None,
    requested: bool = False,
    created: datetime = NOW - timedelta(hours=1),
) -> DueState:
    return DueState(status, frontier, last, attempt, requested, created)


def test_request_wins_while_running() -> None:
    for status in ("ACTIVE", "INITIALIZING"):
        assert due_reason(state(status, requested=True, last=NOW), MINUTE, NOW) is DueReason.REQUESTED
        assert (
            due_reason(state(status, requested=True, last=NOW, attempt=NOW), MINUTE, NOW)
            is DueReason.REQUESTED
        )


def test_suspended_and_error_run_only_an_explicit_request() -> None:
    old = NOW - timedelta(hours=5)
    for status in ("SUSPENDED", "ERROR"):
        # A queued initialization (or any request that is not an explicit refresh) does not retry it.
        queued = DueState(status, False, None, NOW, True, old, manual_request=False)
        assert due_reason(queued, MINUTE, NOW) is None
        assert due_reason(DueState(status, True, old, old, True, old), MINUTE, NOW) is None
        explicit = DueState(status, True, old, NOW, True, old, manual_request=True)
        assert due_reason(explicit, MINUTE, NOW) is DueReason.REQUESTED


def test_suspended_and_error_are_not_scheduled() -> None:
    old = NOW - timedelta(hours=5)
    assert due_reason(state("SUSPENDED", last=old), MINUTE, NOW) is None
    assert due_reason(state("ERROR", last=old), MINUTE, NOW) is None


def test_interval_due_exactly_at_the_boundary() -> None:
    assert due_reason(state(last=NOW - timedelta(seconds=59)), MINUTE, NOW) is None
    assert due_reason(state(last=NOW - timedelta(seconds=60)), MINUTE, NOW) is DueReason.SCHEDULED


def test_failed_attempt_waits_one_interval() -> None:
    st = state(last=NOW - timedelta(hours=1), attempt=NOW - timedelta(seconds=10))
    assert due_reason(st, MINUTE, NOW) is None
    st = state(last=NOW - timedelta(hours=1), attempt=NOW - timedelta(seconds=61))
    assert due_reason(st, MINUTE, NOW) is DueReason.SCHEDULED


def test_never_populated_waits_for_its_first_scheduled_time() -> None:
    fresh = state("INITIALIZING", frontier=False, created=NOW - timedelta(seconds=5))
    assert due_reason(fresh, MINUTE, NOW) is None
    old = state("INITIALIZING", frontier=False, created=NOW - timedelta(minutes=2))
    assert due_reason(old, MINUTE, NOW) is DueReason.INITIALIZE


def test_cron_fires_after_the_fire_time() -> None:
    every5 = CronSchedule(CronSpec.of(minute=range(0, 60, 5)))  # */5 * * * *
    assert (
        due_reason(state(last=datetime(2026, 1, 1, 11, 56, tzinfo=UTC)), every5, NOW) is DueReason.SCHEDULED
    )
    assert due_reason(state(last=datetime(2026, 1, 1, 12, 0, tzinfo=UTC)), every5, NOW) is None


def test_reconnect_backoff_doubles_from_half_a_second_and_is_capped() -> None:
    from pgtrickle.scheduler.policy import reconnect_delay

    assert [reconnect_delay(a) for a in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert reconnect_delay(10_000) == 30.0
    assert reconnect_delay(3, first=1.0, cap=5.0) == 5.0
    with pytest.raises(ValueError):
        reconnect_delay(-1)


def test_an_explicit_refresh_of_a_stopped_table_says_so() -> None:
    from pgtrickle.scheduler.policy import stopped_note

    assert stopped_note("public.t", "ACTIVE") is None and stopped_note("public.t", "INITIALIZING") is None
    note = stopped_note("public.t", "SUSPENDED")
    assert note is not None and "once" in note and "resume_stream_table" in note

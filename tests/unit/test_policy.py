"""due_reason: is a stream table due, and why (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from pgtrickle.scheduler.cron import CronSpec
from pgtrickle.scheduler.policy import DueReason, DueState, due_reason, next_due_at
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


# ---------------------------------------------------------------- new input: NO_DATA passes do not count
SECOND = IntervalSchedule(1)


def changed(
    last: datetime, applied: datetime | None, attempt: datetime | None = None, new_input: bool = True
) -> DueState:
    """A populated stream table whose last refresh or pass ended at ``last``, whose last refresh
    that applied rows ended at ``applied``."""
    return replace(state(last=last, attempt=attempt or last), new_input=new_input, last_applied_at=applied)


def test_a_change_after_a_no_data_pass_is_refreshed_at_once() -> None:
    # A `1s` schedule passed 0.2 s ago with nothing to apply; rows were last applied 5 s ago.
    passed, applied = NOW - timedelta(seconds=0.2), NOW - timedelta(seconds=5)
    assert due_reason(changed(passed, applied), SECOND, NOW) is DueReason.SCHEDULED
    assert next_due_at(changed(passed, applied), SECOND, NOW) == applied + timedelta(seconds=1)
    # Without new input the pass counts: the next pass is one interval after it.
    quiet = changed(passed, applied, new_input=False)
    assert due_reason(quiet, SECOND, NOW) is None
    assert next_due_at(quiet, SECOND, NOW) == passed + timedelta(seconds=1)


def test_new_input_still_waits_one_interval_after_rows_were_applied() -> None:
    applied = NOW - timedelta(seconds=0.4)
    st = changed(NOW - timedelta(seconds=0.1), applied)
    assert due_reason(st, SECOND, NOW) is None
    assert next_due_at(st, SECOND, NOW) == applied + timedelta(seconds=1)
    assert due_reason(st, SECOND, applied + timedelta(seconds=1)) is DueReason.SCHEDULED


def test_new_input_after_a_failed_or_skipped_attempt_waits_one_interval_from_it() -> None:
    # A failure (or a skip: breaker, watermark gate) sets last_attempt_at only.
    last, applied = NOW - timedelta(seconds=30), NOW - timedelta(seconds=30)
    attempt = NOW - timedelta(seconds=0.5)
    st = changed(last, applied, attempt=attempt)
    assert due_reason(st, SECOND, NOW) is None
    assert next_due_at(st, SECOND, NOW) == attempt + timedelta(seconds=1)


def test_new_input_with_no_applied_refresh_known_counts_from_the_last_pass() -> None:
    # The daemon has not applied rows to it since it started: the schedule counts as without
    # new input (a `1h` stream table is not refreshed early after every restart).
    passed = NOW - timedelta(seconds=0.1)
    assert due_reason(changed(passed, None), SECOND, NOW) is None
    assert next_due_at(changed(passed, None), SECOND, NOW) == passed + timedelta(seconds=1)


def test_new_input_does_not_move_a_cron_schedule() -> None:
    every5 = CronSchedule(CronSpec.of(minute=range(0, 60, 5)))  # */5 * * * *
    passed = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    st = changed(passed, datetime(2026, 1, 1, 11, 0, tzinfo=UTC))
    assert due_reason(st, every5, NOW + timedelta(minutes=2)) is None
    assert next_due_at(st, every5, NOW) == datetime(2026, 1, 1, 12, 5, tzinfo=UTC)


def test_new_input_does_not_populate_early() -> None:
    fresh = replace(
        state("INITIALIZING", frontier=False, created=NOW - timedelta(seconds=0.2)), new_input=True
    )
    assert due_reason(fresh, SECOND, NOW) is None


def test_the_applied_time_is_never_after_the_catalogs_last_refresh() -> None:
    # The catalog's last refresh was moved back (an operator, a test): the daemon's memory of a
    # later applied refresh does not hold the stream table back.
    moved_back = NOW - timedelta(hours=2)
    st = changed(moved_back, NOW - timedelta(seconds=0.5))
    assert due_reason(st, SECOND, NOW) is DueReason.SCHEDULED

"""daemon/wake.Wakes.remember: the due times a change would wake the daemon at (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pgtrickle.daemon.wake import Wakes
from pgtrickle.scheduler.policy import DueState
from pgtrickle.scheduler.schedule import IntervalSchedule
from pgtrickle.scheduler.wake import changed_wake

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SECOND = IntervalSchedule(1)
SOURCE = 500


def remember(wakes: Wakes, ended: dict[int, datetime]) -> None:
    created = NOW - timedelta(hours=1)
    catalog = {pgt_id: NOW - timedelta(seconds=30) for pgt_id in (1, 2, 3)}

    def state(pgt_id: int) -> DueState:
        last = catalog[pgt_id]
        return DueState("ACTIVE", True, last, last, False, created, last_applied_at=wakes.applied.get(pgt_id))

    sts: dict[int, Any] = dict.fromkeys(catalog)
    schedules = dict.fromkeys(catalog, SECOND)
    readers = {SOURCE: frozenset(catalog)}
    wakes.remember(sts, schedules, state, ended, {}, readers, set(), NOW)


def test_a_change_after_a_no_data_pass_wakes_at_once_after_a_failure_one_interval_later() -> None:
    wakes = Wakes()
    wakes.applied = {1: NOW - timedelta(seconds=5), 2: NOW - timedelta(seconds=5), 99: NOW}
    passed = NOW - timedelta(seconds=0.1)
    # 1 passed with nothing to apply just now; 2 failed just now; 3 applied rows just now.
    for pgt_id, action in ((1, "NO_DATA"), (2, "FAILED"), (3, "DIFFERENTIAL")):
        wakes.ended(pgt_id, action, passed)
    remember(wakes, {1: passed, 2: passed, 3: passed})
    assert wakes.next_due[1] == NOW - timedelta(seconds=4), "counted from the rows applied 5 s ago"
    assert wakes.next_due[2] == passed + timedelta(seconds=1), "a failure waits one interval"
    assert wakes.next_due[3] == passed + timedelta(seconds=1)
    assert 99 not in wakes.applied, "a stream table gone is forgotten"
    assert not wakes.unfinished, "kept for one tick"
    wake, pending = changed_wake([SOURCE], wakes.readers, wakes.next_due, NOW)
    assert wake == NOW and pending == frozenset({1, 2, 3})

"""Parallel refresh scheduling (scheduler/ready.py, scheduler/wake.py, run_units): pure decisions."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtrickle.config import Settings, default_parallel_refreshes
from pgtrickle.daemon.units import TickReport
from pgtrickle.daemon.workers import run_units
from pgtrickle.errors import ConfigError
from pgtrickle.scheduler.policy import DueState, next_due_at
from pgtrickle.scheduler.ready import ReadySet, Unit, plan_units, unit_dependencies
from pgtrickle.scheduler.schedule import IntervalSchedule
from pgtrickle.scheduler.wake import changed_wake, parse_change, readers_of, wait_seconds

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)

# A fan: 1 -> 2 -> 3 and 4 -> 5 -> 6 (two independent branches), 7 reads 3 and 6.
FAN = {
    1: frozenset(),
    2: frozenset({1}),
    3: frozenset({2}),
    4: frozenset(),
    5: frozenset({4}),
    6: frozenset({5}),
    7: frozenset({3, 6}),
}
ORDER = [1, 4, 2, 5, 3, 6, 7]


def ready_set(limit: int, groups: list[frozenset[int]] | None = None) -> ReadySet:
    units = plan_units(ORDER, groups or [])
    return ReadySet(units, unit_dependencies(units, FAN), limit)


def test_units_are_stream_tables_and_groups_once_at_their_last_member() -> None:
    units = plan_units(ORDER, [frozenset({2, 5, 7})])
    assert [u.key for u in units] == [1, 4, 3, 6, 7]
    assert units[-1] == Unit(7, (2, 5, 7), group=True)
    deps = unit_dependencies(units, FAN)
    assert deps[7] == {1, 4, 3, 6}  # the group reads 1 and 4 (through 2 and 5) and 3 and 6 (through 7)
    assert deps[3] == {7}  # 3 reads 2, a member of the group
    assert deps[1] == frozenset()


def test_independent_branches_start_together_within_the_limit() -> None:
    ready = ready_set(limit=2)
    assert [u.key for u in ready.startable()] == [1, 4]
    ready.start(1)
    ready.start(4)
    assert ready.startable() == [], "both slots are taken"
    ready.finish(4)
    assert [u.key for u in ready.startable()] == [5], "2 waits for 1"
    ready.start(5)
    ready.finish(1)
    assert [u.key for u in ready.startable()] == [2]


def test_limit_one_is_the_sequential_order() -> None:
    ready = ready_set(limit=1)
    seen = []
    while not ready.finished:
        (unit,) = ready.startable()
        ready.start(unit.key)
        ready.finish(unit.key)
        seen.append(unit.key)
    assert seen == ORDER


def test_a_downstream_never_starts_before_its_upstreams_finished() -> None:
    ready = ready_set(limit=4)
    with pytest.raises(ValueError, match="cannot start before"):
        ready.start(7)
    for key in (1, 4, 2, 5, 3):
        ready.start(key)
        ready.finish(key)
    assert 7 not in [u.key for u in ready.startable()]
    with pytest.raises(ValueError, match="already started"):
        ready.start(3)
    with pytest.raises(ValueError, match="not running"):
        ready.finish(6)


def test_bad_limits_and_unknown_dependencies_are_refused() -> None:
    units = plan_units([1, 2], [])
    with pytest.raises(ValueError, match="at least one"):
        ReadySet(units, {}, 0)
    with pytest.raises(ValueError, match=r"not in the tick: \[9\]"):
        ReadySet(units, {2: frozenset({9})}, 1)


def test_skip_rest_finishes_the_tick_once_running_units_are_done() -> None:
    ready = ready_set(limit=2)
    ready.start(1)
    ready.skip_rest()
    assert not ready.finished and ready.startable() == []
    ready.finish(1)
    assert ready.finished


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_run_units_keeps_dependency_order_and_the_bound_on_random_dags(data: st.DataObject) -> None:
    """Random DAGs, limits and skip decisions, on real threads: every unit runs once, after its
    upstreams, never more than ``limit`` at once."""
    n = data.draw(st.integers(1, 12))
    upstream = {
        i: frozenset(data.draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()) for i in range(n)
    }
    limit = data.draw(st.integers(1, 4))
    skipped = data.draw(st.sets(st.integers(0, n - 1)))
    units = plan_units(list(range(n)), [])
    ready = ReadySet(units, unit_dependencies(units, upstream), limit)
    lock = threading.Lock()
    active, peak, finished_at, started_at = [0], [0], {}, {}
    clock = [0]

    def job_for(unit: Unit):
        def job(_worker: object) -> TickReport:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
                clock[0] += 1
                started_at[unit.key] = clock[0]
            with lock:
                active[0] -= 1
                clock[0] += 1
                finished_at[unit.key] = clock[0]
            return TickReport()

        return job

    def prepare(unit: Unit):
        with lock:
            clock[0] += 1
            started_at[unit.key] = clock[0]
            if unit.key in skipped:
                finished_at[unit.key] = clock[0]
                return None
        return job_for(unit)

    done: list[int] = []
    with ThreadPoolExecutor(limit) as pool:

        def submit(job) -> Future[TickReport]:  # type: ignore[no-untyped-def]
            return pool.submit(job, None)

        run_units(ready, prepare, lambda unit, _r: done.append(unit.key), lambda: False, submit)
    assert sorted(done) == sorted(set(range(n)) - skipped)
    assert peak[0] <= limit
    for i in range(n):
        for up in upstream[i]:
            assert finished_at[up] < started_at[i], (i, up)


def test_run_units_raises_a_jobs_error_after_the_running_ones_finish() -> None:
    units = plan_units([1, 2, 3], [])
    ready = ReadySet(units, unit_dependencies(units, {3: frozenset({1})}), 2)
    done: list[int] = []

    def prepare(unit: Unit):
        def job(_w: object) -> TickReport:
            if unit.key == 1:
                raise RuntimeError("connection lost")
            return TickReport()

        return job

    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(RuntimeError, match="connection lost"):
            run_units(
                ready,
                prepare,
                lambda u, _r: done.append(u.key),
                lambda: False,
                lambda job: pool.submit(job, None),
            )
    assert done == [2], "2 ran beside 1; 3 (downstream of the failure) never started"


def test_stop_lets_running_units_finish_and_starts_nothing_more() -> None:
    units = plan_units([1, 2, 3], [])
    ready = ReadySet(units, {}, 1)
    stop = [False]
    done: list[int] = []

    def prepare(unit: Unit):
        def job(_w: object) -> TickReport:
            stop[0] = True
            return TickReport()

        return job

    def submit(job) -> Future[TickReport]:  # type: ignore[no-untyped-def]
        future: Future[TickReport] = Future()
        future.set_result(job(None))
        return future

    run_units(ready, prepare, lambda u, _r: done.append(u.key), lambda: stop[0], submit)
    assert done == [1]


# ------------------------------------------------------------------ wake on change
def test_readers_and_change_payloads() -> None:
    readers = readers_of({10: [100, 101], 11: [100]})
    assert readers == {100: frozenset({10, 11}), 101: frozenset({10})}
    assert parse_change("16384") == 16384
    for bad in ("", "x", "-1", "0", "1.5", str(2**32), "١٢"):
        assert parse_change(bad) is None, bad


def test_a_change_wakes_at_the_first_due_reader_and_never_before_now() -> None:
    readers = {100: frozenset({10, 11}), 101: frozenset({12})}
    next_due = {10: NOW + timedelta(seconds=5), 11: NOW + timedelta(seconds=2), 12: None}
    assert changed_wake([100], readers, next_due, NOW) == (NOW + timedelta(seconds=2), frozenset({10, 11}))
    assert changed_wake([101], readers, next_due, NOW) == (None, frozenset()), "a suspended reader sleeps"
    overdue = {10: NOW - timedelta(seconds=3), 11: None, 12: None}
    assert changed_wake([100], readers, overdue, NOW) == (NOW, frozenset({10}))
    assert changed_wake([999], readers, next_due, NOW)[0] == NOW, "an unknown source: tick and see"
    assert changed_wake([None], readers, next_due, NOW)[0] == NOW


def test_wait_is_the_tick_or_sooner_for_a_pending_due_time() -> None:
    assert wait_seconds(NOW, 30.0, []) == 30.0
    assert wait_seconds(NOW, 30.0, [NOW + timedelta(seconds=0.4), NOW + timedelta(seconds=9)]) == 0.4
    assert wait_seconds(NOW, 30.0, [NOW - timedelta(seconds=1)]) == 0.0


def test_next_due_at_follows_the_schedule_and_skips_stopped_tables() -> None:
    second = IntervalSchedule(1)
    done = DueState("ACTIVE", True, NOW, None, False, NOW - timedelta(hours=1))
    assert next_due_at(done, second, NOW) == NOW + timedelta(seconds=1)
    failed_later = DueState("ACTIVE", True, NOW, NOW + timedelta(seconds=3), False, NOW)
    assert next_due_at(failed_later, second, NOW) == NOW + timedelta(seconds=4)
    never = DueState("ACTIVE", False, None, None, False, NOW - timedelta(seconds=10))
    assert next_due_at(never, IntervalSchedule(60), NOW) == NOW + timedelta(seconds=50)
    for status in ("SUSPENDED", "ERROR"):
        assert next_due_at(DueState(status, True, NOW, None, False, NOW), second, NOW) is None


# ------------------------------------------------------------------ the setting
def test_max_parallel_refreshes_default_env_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 1 <= default_parallel_refreshes() <= 4
    monkeypatch.setenv("PGTRICKLE_MAX_PARALLEL_REFRESHES", "3")
    assert Settings.from_env().max_parallel_refreshes == 3
    assert Settings.from_env().with_overrides(max_parallel_refreshes=1).max_parallel_refreshes == 1
    monkeypatch.setenv("PGTRICKLE_MAX_PARALLEL_REFRESHES", "many")
    with pytest.raises(ConfigError, match="PGTRICKLE_MAX_PARALLEL_REFRESHES must be an integer"):
        Settings.from_env()
    for bad in (0, -2, 65):
        with pytest.raises(ConfigError, match="max_parallel_refreshes must be between 1 and 64"):
            Settings(max_parallel_refreshes=bad)


# ------------------------------------------------------------------ Spark sessions of the workers
class _Context:
    def __init__(self) -> None:
        self.properties: dict[str, str] = {}

    def setLocalProperty(self, key: str, value: str) -> None:  # noqa: N802 - Spark's name
        self.properties[key] = value


class _LocalSession:
    def __init__(self) -> None:
        self.sparkContext = _Context()
        self.children: list[_LocalSession] = []

    def newSession(self) -> _LocalSession:  # noqa: N802 - Spark's name
        child = _LocalSession()
        child.sparkContext = self.sparkContext
        self.children.append(child)
        return child


class _ConnectSession:
    pass


_ConnectSession.__module__ = "pyspark.sql.connect.session"  # what is_connect looks at


def test_a_worker_gets_a_child_session_and_a_fair_pool_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgtrickle.spark import connect
    from pgtrickle.spark.session import child_session, use_pool

    local = _LocalSession()
    child = child_session(local, Settings())
    assert local.children == [child], "a local child shares the SparkContext, not the temporary views"
    assert use_pool(child, "pgtrickle-1") is True
    assert local.sparkContext.properties == {"spark.scheduler.pool": "pgtrickle-1"}

    opened: list[dict[str, str]] = []
    remote = _ConnectSession()
    monkeypatch.setattr(connect, "open_session", lambda settings, defaults: opened.append(defaults) or remote)
    assert child_session(_ConnectSession(), Settings(spark_remote="sc://spark:15002")) is remote
    assert opened and opened[0]["spark.sql.caseSensitive"] == "true", (
        "a Connect child gets pgtrickle's settings"
    )
    assert use_pool(remote, "pgtrickle-0") is False, "no thread-local properties on Spark Connect"

"""Batched refresh decisions (scheduler/batches.py) and their use by run_units: pure, no database."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.config import DEFAULT_MAX_BATCH_SIZE, Settings
from pgtrickle.daemon.units import TickReport
from pgtrickle.daemon.workers import Batching, run_units
from pgtrickle.errors import ConfigError
from pgtrickle.scheduler import batches as b
from pgtrickle.scheduler.batches import BatchFacts, batches, member_why_alone, spread_size, why_alone
from pgtrickle.scheduler.ready import ReadySet, Unit, plan_units, unit_dependencies

READY = BatchFacts("AUTO", populated=True, needs_reinit=False)


def test_who_may_batch_and_why_not() -> None:
    one = Unit(1, (1,))
    assert why_alone(one, READY, 32, spark_connect=False) is None
    assert why_alone(one, BatchFacts("DIFFERENTIAL", True, False), 32, False) is None
    assert why_alone(one, BatchFacts("FULL", True, False), 32, False) == b.FULL_MODE
    assert why_alone(one, BatchFacts("AUTO", False, False), 32, False) == b.NOT_POPULATED
    assert why_alone(one, BatchFacts("AUTO", True, True), 32, False) == b.NEEDS_REINIT
    assert why_alone(Unit(3, (2, 3), group=True), READY, 32, False) == b.ATOMIC_GROUP
    assert why_alone(one, READY, 32, spark_connect=True) == b.SPARK_CONNECT
    assert why_alone(one, READY, 1, False) == b.BATCHING_OFF
    with pytest.raises(ValueError, match="no catalog facts"):
        why_alone(one, None, 32, False)


def test_a_planned_member_joins_the_shared_job_only_when_differential_without_hidden_tables() -> None:
    assert member_why_alone(differential=True, state_tables=0) is None
    assert member_why_alone(differential=True, state_tables=2) == b.KEEPS_STATE
    assert member_why_alone(differential=False, state_tables=0) == b.NOT_DIFFERENTIAL


def test_batches_are_bounded_and_keep_units_that_cannot_batch_alone() -> None:
    units = [Unit(i, (i,)) for i in range(1, 8)] + [Unit(9, (8, 9), group=True), Unit(10, (10,))]
    cut = batches(units, lambda u: "group" if u.group else None, 3)
    assert [[u.key for u in x] for x in cut] == [[1, 2, 3], [4, 5, 6], [7, 10], [9]]
    with pytest.raises(ValueError):
        batches(units, lambda u: None, 0)


@given(st.lists(st.booleans(), max_size=40), st.integers(1, 9))
def test_every_unit_is_in_exactly_one_batch_within_the_bound(alone: list[bool], size: int) -> None:
    units = [Unit(i, (i,)) for i in range(len(alone))]
    cut = batches(units, lambda u: "no" if alone[u.key] else None, size)
    assert sorted(u.key for x in cut for u in x) == list(range(len(alone)))
    for x in cut:
        assert 1 <= len(x) <= size
        assert len(x) == 1 or not any(alone[u.key] for u in x)


def test_the_batch_size_setting() -> None:
    assert Settings().max_batch_size == DEFAULT_MAX_BATCH_SIZE
    with pytest.raises(ConfigError, match="max_batch_size"):
        Settings(max_batch_size=0)


# A fan: 1..4 independent, 5 reads 1, 6 reads 2; 7 is FULL (never batched).
FAN = {
    1: frozenset(),
    2: frozenset(),
    3: frozenset(),
    4: frozenset(),
    5: frozenset({1}),
    6: frozenset({2}),
    7: frozenset(),
}


def run(
    limit: int, size: int, not_due: frozenset[int] = frozenset(), not_following: frozenset[int] | None = None
) -> list[list[int]]:
    units = plan_units([1, 2, 3, 4, 7, 5, 6], [])
    ready = ReadySet(units, unit_dependencies(units, FAN), limit)
    jobs: list[list[int]] = []

    def job_of(keys: list[int]):  # type: ignore[no-untyped-def]
        def job(_w: object) -> TickReport:
            jobs.append(keys)
            return TickReport()

        return job

    def prepare(unit: Unit):  # type: ignore[no-untyped-def]
        return None if unit.key in not_due else job_of([unit.key])

    def submit(job) -> Future[TickReport]:  # type: ignore[no-untyped-def]
        future: Future[TickReport] = Future()
        future.set_result(job(None))
        return future

    def follow(unit: Unit):  # type: ignore[no-untyped-def]
        assert not_following is not None
        return None if unit.key in not_following else prepare(unit)

    batching = Batching(
        lambda u: "full" if u.key == 7 else None,
        lambda us: job_of([u.key for u in us]),
        size,
        None if not_following is None else follow,
    )
    run_units(ready, prepare, lambda u, r: None, lambda: False, submit, batching)
    assert ready.finished
    return jobs


def test_run_units_runs_a_level_and_its_due_followers_as_one_batch() -> None:
    """5 and 6 read 1 and 2: they follow them into their batch (computed from their deltas in the
    same job, refresh/chained.py); the batch size bounds the followers too."""
    assert run(limit=1, size=32) == [[1, 2, 3, 4, 5, 6], [7]]
    assert run(limit=1, size=5) == [[1, 2, 3, 4, 5], [7], [6]]
    assert run(limit=2, size=2) == [[1, 2], [3, 4], [7], [5, 6]]


def test_a_level_spreads_over_the_free_slots() -> None:
    """Two slots and four batchable units (7 is FULL, alone): 7 takes one slot, the four (and
    their followers) share the other."""
    assert run(limit=2, size=32) == [[1, 2, 3, 4, 5, 6], [7]]
    # Three slots: 7 in one, 1..4 over the two others; 5 and 6 follow 1 and 2.
    assert run(limit=3, size=32) == [[1, 2, 5, 6], [3, 4], [7]]
    assert [
        spread_size(n, a, f, 32) for n, a, f in ((20, 0, 2), (21, 0, 2), (3, 0, 8), (0, 2, 2), (99, 0, 1))
    ] == [
        10,
        11,
        1,
        1,
        32,
    ]


def test_units_not_due_leave_the_batch_and_only_units_reading_the_batch_follow_it() -> None:
    # 6 reads 2, which is not due: 6 is not a follower of 1's batch; it runs once 2 is done.
    assert run(limit=1, size=32, not_due=frozenset({2, 3, 4})) == [[1, 5], [7], [6]]
    assert run(limit=1, size=32, not_due=frozenset({2, 3, 4, 6})) == [[1, 5], [7]]
    # A unit not due does not follow, and a lone refresh stays one.
    assert run(limit=1, size=32, not_due=frozenset({2, 3, 4, 5, 6})) == [[1], [7]]


def test_a_follower_is_asked_through_the_follow_decision_when_there_is_one() -> None:
    """The daemon's ``follow`` looks one tick ahead (daemon/loop.py): a unit it refuses waits for
    its upstream units and is then asked as any unit is."""
    assert run(limit=1, size=32, not_following=frozenset({6})) == [[1, 2, 3, 4, 5], [7], [6]]
    assert run(limit=1, size=32, not_following=frozenset()) == [[1, 2, 3, 4, 5, 6], [7]]


def test_a_follower_reads_only_finished_units_or_units_of_its_batch() -> None:
    # 1 -> 2 -> 3, and 4 reads 1 and 5.
    deps = {1: frozenset(), 2: frozenset({1}), 3: frozenset({2}), 4: frozenset({1, 5}), 5: frozenset()}
    units = [Unit(k, (k,)) for k in (1, 5, 2, 3, 4)]
    ready = ReadySet(units, deps, 2)
    assert ready.can_follow(2, [1]) and not ready.can_follow(3, [1])
    assert ready.can_follow(3, [1, 2])
    assert not ready.can_follow(4, [1]), "5 is neither finished nor in the batch"
    assert not ready.can_follow(5, [1]), "reads nothing of the batch: not a follower"
    assert not ready.can_follow(1, [1])
    with pytest.raises(ValueError, match="cannot start before"):
        ready.start_together([1, 3, 2])  # 3 before the unit it reads
    ready.start_together([1, 2, 3])
    assert ready.slots_used == 1 and not ready.can_follow(2, [5])
    ready.start_together([5])
    ready.finish(5)
    assert not ready.can_follow(4, [5]), "1 is running, not finished"
    for key in (1, 2, 3):
        ready.finish(key)
    assert [u.key for u in ready.waiting()] == [4]


def test_a_batch_takes_one_slot() -> None:
    units = [Unit(i, (i,)) for i in range(1, 5)]
    ready = ReadySet(units, {u.key: frozenset() for u in units}, 2)
    ready.start_together([1, 2, 3])
    assert ready.slots_used == 1
    assert [u.key for u in ready.startable()] == [4]
    with pytest.raises(ValueError, match="already started"):
        ready.start_together([3])
    for key in (1, 2, 3):
        ready.finish(key)
    assert ready.slots_used == 0

"""Parallel refreshes and wake-on-change in the daemon (issue 18): real PostgreSQL and Spark."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from pgtrickle.daemon.loop import Scheduler
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import DML_ROUNDS, assert_oracle, create_st

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

BRANCHES = 4


def build_fan(db: Database, schedule: str = "1h") -> list[str]:
    """src -> b1_j -> b2_j for j in 1..BRANCHES (independent branches of depth 2)."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL)")
    db.sql("INSERT INTO src SELECT g, g % 5, g FROM generate_series(1, 300) g")
    names = []
    for j in range(1, BRANCHES + 1):
        create_st(
            db,
            f"b1_{j}",
            f"SELECT grp, sum(v + {j}) AS total, count(*) AS n FROM src "
            f"WHERE id % {BRANCHES} <> {j - 1} GROUP BY grp",
            schedule=schedule,
        )
        create_st(db, f"b2_{j}", f"SELECT grp, total * 2 AS twice FROM b1_{j} WHERE n > 0", schedule=schedule)
        names += [f"b1_{j}", f"b2_{j}"]
    return names


def time_passes(db: Database) -> None:
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '2 hours', "
        "last_attempt_at = last_attempt_at - interval '2 hours'"
    )


@contextmanager
def running(scheduler: Scheduler, dsn: str) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=scheduler.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        scheduler.stop_requested = True
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("NOTIFY pgtrickle_refresh")
        thread.join(timeout=120)
        scheduler.close()


def wait_for(predicate, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_fan_refreshed_in_parallel_stays_exact_under_random_dml(db: Database) -> None:
    names = build_fan(db)
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=3), db.dsn)
    try:
        report = scheduler.tick()
        assert sorted(o.st.name for o in report.refreshed) == sorted(names), report.failed
        assert len(scheduler.pool.workers) == 3, "the tick ran on the worker pool"
        positions = {o.st.name: i for i, o in enumerate(report.refreshed)}
        assert all(positions[f"b1_{j}"] < positions[f"b2_{j}"] for j in range(1, BRANCHES + 1)), (
            "the report lists upstreams first"
        )
        assert_oracle(db)
        next_id = [1000]

        @settings(max_examples=examples(3), deadline=None, suppress_health_check=list(HealthCheck))
        @given(DML_ROUNDS)
        def round_of(dml: list[tuple[str, int, int]]) -> None:
            for kind, key, value in dml:
                if kind == "insert":
                    next_id[0] += 1
                    db.sql("INSERT INTO src VALUES (%s, %s, %s)", (next_id[0], key % 7, value))
                elif kind == "update":
                    db.sql(
                        "UPDATE src SET v = v + %s, grp = (grp + 1) %% 7 WHERE id %% 37 = %s",
                        (value, key % 37),
                    )
                else:
                    db.sql("DELETE FROM src WHERE id %% 53 = %s", (key % 53,))
            time_passes(db)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert sorted(o.st.name for o in report.refreshed) == sorted(names)
            assert_oracle(db)

        round_of()
    finally:
        scheduler.close()


def test_a_failed_refresh_leaves_the_others_refreshed(db: Database) -> None:
    names = build_fan(db)
    create_st(db, "fragile", "SELECT id, 1000 / v AS inv FROM src", schedule="1h")
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=3), db.dsn)
    try:
        assert not scheduler.tick().failed
        db.sql("INSERT INTO src VALUES (5000, 1, 0)")  # 1000 / 0: fragile's refresh fails
        time_passes(db)
        report = scheduler.tick()
        assert [f[0].name for f in report.failed] == ["fragile"]
        assert sorted(o.st.name for o in report.refreshed) == sorted(names)
        assert all(o.action is not Action.NO_DATA for o in report.refreshed if o.st.name.startswith("b1_")), (
            "every first-level branch applied the new row"
        )
        assert_oracle(db, *names)
        assert (
            db.scalar(
                "SELECT h.status FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s "
                "USING (pgt_id) WHERE s.pgt_name = 'fragile' ORDER BY h.refresh_id DESC LIMIT 1"
            )
            == "FAILED"
        )
    finally:
        scheduler.close()


def test_two_parallel_daemons_never_refresh_one_stream_table_at_once(db: Database) -> None:
    names = build_fan(db, schedule="1s")
    parallel = db.settings.with_overrides(max_parallel_refreshes=2, tick_seconds=0.1)
    first, second = Scheduler(parallel, db.dsn), Scheduler(parallel, db.dsn)
    with running(first, db.dsn), running(second, db.dsn):
        wait_for(
            lambda: (
                db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE frontier IS NOT NULL")
                == len(names)
            ),
            300,
            "the daemons to populate the fan",
        )
        deadline = time.monotonic() + 8
        k = 0
        while time.monotonic() < deadline:
            k += 1
            db.sql("INSERT INTO src VALUES (%s, %s, %s)", (10_000 + k, k % 5, k))
            db.sql("UPDATE src SET v = v + 1 WHERE id = %s", (k % 300 + 1,))
            time.sleep(0.15)
    overlaps = db.sql(
        """
        SELECT s.pgt_name, a.refresh_id, b.refresh_id
          FROM pgtrickle.pgt_refresh_history a
          JOIN pgtrickle.pgt_refresh_history b ON a.pgt_id = b.pgt_id AND a.refresh_id < b.refresh_id
          JOIN pgtrickle.pgt_stream_tables s ON s.pgt_id = a.pgt_id
         WHERE a.action <> 'NO_DATA' AND b.action <> 'NO_DATA'
           AND tstzrange(a.start_time, a.end_time) && tstzrange(b.start_time, b.end_time)
        """
    )
    assert overlaps == []
    refreshes = db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE action <> 'NO_DATA'")
    assert refreshes > len(names), "the daemons kept refreshing while the source changed"
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE status <> 'COMPLETED'") == 0
    # Changes made after the last refreshes: one more (single) tick catches up; then exact.
    time_passes(db)
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert not report.failed, report.failed
    assert_oracle(db)


def test_a_downstream_refreshes_in_the_same_tick_as_its_upstream_once_its_schedule_allows(
    db: Database,
) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 100) g")
    create_st(db, "up", "SELECT id, v * 2 AS v2 FROM src", schedule="1s")
    create_st(db, "down", "SELECT sum(v2) AS total FROM up", schedule="1s")
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=2), db.dsn)
    try:
        scheduler.tick()
        db.sql("INSERT INTO src VALUES (500, 500)")
        # up is due; down refreshed 0.98 s ago: not due when the tick starts, due once up has committed.
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '10 s', "
            "last_attempt_at = NULL WHERE pgt_name = 'up'"
        )
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '980 ms', "
            "last_attempt_at = NULL WHERE pgt_name = 'down'"
        )
        report = scheduler.tick()
        assert [o.st.name for o in report.refreshed] == ["up", "down"]
        assert [o.action for o in report.refreshed] != [Action.NO_DATA, Action.NO_DATA]
        assert_oracle(db)
        # Not due yet (its schedule, counted from the refresh that just applied rows, does not allow
        # it): it is pending, and the daemon wakes when it falls due. (A `1s` schedule would allow it
        # whenever the tick above took over a second: a change is held back only by an apply.)
        db.sql("SELECT pgtrickle.alter_stream_table('down', schedule => '1h')")
        db.sql("INSERT INTO src VALUES (501, 501)")
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = now() - interval '10 s', "
            "last_attempt_at = NULL WHERE pgt_name = 'up'"
        )
        report = scheduler.tick()
        assert [o.st.name for o in report.refreshed] == ["up"]
        down = db.scalar("SELECT pgt_id FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'down'")
        assert down in scheduler.pending, "down has new input and waits only for its schedule"
    finally:
        scheduler.close()


def test_an_insert_into_an_idle_source_wakes_the_daemon_before_its_tick(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 100) g")
    create_st(db, "st", "SELECT id, v FROM src", schedule="1s")
    create_st(db, "st2", "SELECT count(*) AS n FROM st", schedule="1s")
    tick = 60.0
    scheduler = Scheduler(db.settings.with_overrides(tick_seconds=tick), db.dsn)
    with running(scheduler, db.dsn):
        wait_for(
            lambda: (
                db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE frontier IS NOT NULL") == 2
            ),
            300,
            "the daemon to populate the stream tables",
        )
        time.sleep(2.5)  # idle: past the schedules, waiting for its 60 s tick
        db.sql("INSERT INTO src VALUES (1000, 7)")
        latency = wait_for(lambda: db.scalar("SELECT n FROM st2") == 101, tick / 2, "the change to reach st2")
    assert latency < tick / 2
    print(f"commit -> downstream of the idle source: {latency:.2f}s with a {tick:.0f}s tick")
    assert_oracle(db)
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE status <> 'COMPLETED'") == 0


def test_a_change_just_after_a_pass_with_nothing_to_apply_is_not_held_back(db: Database) -> None:
    """A `5s` schedule passes every 5 s with nothing to apply (NO_DATA); a change committed just
    after such a pass is refreshed at once (the interval counts from the last refresh that applied
    rows), not at the next pass."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 100) g")
    create_st(db, "st", "SELECT id, v FROM src", schedule="5s")
    scheduler = Scheduler(db.settings.with_overrides(tick_seconds=0.2), db.dsn)
    last_pass = "SELECT last_refresh_at FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'st'"
    with running(scheduler, db.dsn):
        wait_for(lambda: db.scalar("SELECT count(*) FROM st") == 100, 300, "the daemon to populate st")
        latencies = []
        for k in range(2):
            before = db.scalar(last_pass)
            wait_for(lambda b=before: db.scalar(last_pass) != b, 30, "a pass of the 5s schedule")
            db.sql("INSERT INTO src VALUES (%s, 7)", (1000 + k,))
            latencies.append(
                wait_for(
                    lambda k=k: db.scalar("SELECT count(*) FROM st") == 101 + k, 30, "the change to reach st"
                )
            )
    print(
        f"commit just after a NO_DATA pass -> st: {', '.join(f'{s:.2f}s' for s in latencies)} (5s schedule)"
    )
    assert max(latencies) < 3.5, "the change waited for the schedule's next pass"
    assert_oracle(db)
    actions = db.sql(
        "SELECT action FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE s.pgt_name = 'st' AND action <> 'NO_DATA' ORDER BY refresh_id"
    )
    assert [a for (a,) in actions] == ["FULL", "DIFFERENTIAL", "DIFFERENTIAL"]


def test_a_change_after_passes_with_nothing_to_apply_reaches_a_chain_in_one_batch(db: Database) -> None:
    """After `1s` passes that found nothing to apply, a change is refreshed in the tick its
    notification wakes, and the chain below the notified stream table follows in the same batch
    (one Spark job): they all have new input, and rows were last applied over a second ago."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 100) g")
    create_st(db, "c1", "SELECT id, v FROM src", schedule="1s", initialize=False)
    create_st(db, "c2", "SELECT id, v + 1 AS v FROM c1", schedule="1s", initialize=False)
    create_st(db, "c3", "SELECT id, v FROM c2 WHERE v > 10", schedule="1s", initialize=False)
    relid = db.scalar("SELECT 'src'::regclass::oid::bigint")
    scheduler = Scheduler(db.settings.with_overrides(max_parallel_refreshes=1), db.dsn)
    try:
        db.sql("UPDATE pgtrickle.pgt_stream_tables SET created_at = now() - interval '1 min'")
        for _ in range(3):  # populated (each FULL once), in dependency order
            scheduler.tick()
        assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE frontier IS NULL") == 0
        time.sleep(1.2)
        report = scheduler.tick()  # every schedule passes: nothing to apply
        assert {o.action for o in report.refreshed} == {Action.NO_DATA}, report.refreshed
        db.sql("INSERT INTO src VALUES (1000, 1000)")
        report = scheduler.tick([relid])  # the notification's tick, just after the passes
        assert [(o.st.name, o.action) for o in report.refreshed] == [
            ("c1", Action.DIFFERENTIAL),
            ("c2", Action.DIFFERENTIAL),
            ("c3", Action.DIFFERENTIAL),
        ]
        batches = db.sql(
            "SELECT count(DISTINCT batch_id), count(*) FILTER (WHERE batch_id IS NULL), sum(spark_jobs)"
            " FROM pgtrickle.pgt_refresh_history WHERE action = 'DIFFERENTIAL'"
        )
        assert batches == [(1, 0, 1)], "one batch, one Spark job"
        assert_oracle(db)
    finally:
        scheduler.close()

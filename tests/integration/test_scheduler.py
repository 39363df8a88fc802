"""The daemon: due stream tables in DAG order, LISTEN wake-ups, locks, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import LOCK_NAMESPACE, Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, store_unparsed_schedule

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


@pytest.fixture
def chain(db: Database) -> Database:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int, v int)")
    db.sql("INSERT INTO src SELECT g, g % 10, g FROM generate_series(1, 200) g")
    db.sql(
        "SELECT pgtrickle.create_stream_table('a', 'SELECT grp, sum(v) AS total FROM src GROUP BY grp', "
        "schedule => '1h')"
    )
    db.sql(
        "SELECT pgtrickle.create_stream_table('b', 'SELECT grp, total * 2 AS twice FROM a', schedule => '1h')"
    )
    db.sql(
        "SELECT pgtrickle.create_stream_table('c', 'SELECT count(*) AS n, sum(twice) AS s FROM b', "
        "schedule => '1h')"
    )
    return db


def time_passes(db: Database, interval: str = "2 hours") -> None:
    """Move every stream table's last refresh into the past (deterministic schedules)."""
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - %s::interval, "
        "last_attempt_at = last_attempt_at - %s::interval",
        (interval, interval),
    )


def names(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [o.st.name for o in report.refreshed]


def test_tick_refreshes_due_tables_upstream_first_then_waits_for_schedules(chain: Database) -> None:
    scheduler = Scheduler(chain.settings, chain.dsn)
    try:
        report = scheduler.tick()
        assert names(report) == ["a", "b", "c"], (report.failed, report.locked_elsewhere)
        assert all(o.action is Action.FULL for o in report.refreshed)
        assert_oracle(chain)
        assert names(scheduler.tick()) == [], "nothing is due right after a refresh"
        chain.sql("UPDATE src SET v = v + 1 WHERE id < 50")
        time_passes(chain)
        report = scheduler.tick()
        assert names(report) == ["a", "b", "c"]
        assert all(o.action in (Action.FULL, Action.DIFFERENTIAL) for o in report.refreshed)
        assert_oracle(chain)
        time_passes(chain)
        report = scheduler.tick()
        assert [o.action for o in report.refreshed] == [Action.NO_DATA] * 3
        assert all(o.spark_seconds == 0 for o in report.refreshed)
    finally:
        scheduler.close()


def test_suspended_tables_are_skipped_and_requests_still_honoured(chain: Database) -> None:
    scheduler = Scheduler(chain.settings, chain.dsn)
    try:
        scheduler.tick()
        chain.sql("SELECT pgtrickle.alter_stream_table('c', status => 'SUSPENDED')")
        chain.sql("INSERT INTO src VALUES (1000, 1, 1)")
        time_passes(chain)
        assert names(scheduler.tick()) == ["a", "b"]
        chain.sql("SELECT pgtrickle.refresh_stream_table('c')")
        assert names(scheduler.tick()) == ["c"]
        assert_oracle(chain)
    finally:
        scheduler.close()


def test_a_stream_table_locked_by_another_process_is_left_alone(chain: Database) -> None:
    with psycopg.connect(chain.dsn, autocommit=True) as other:
        a_id = chain.scalar("SELECT pgt_id FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'a'")
        other.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, a_id))
        scheduler = Scheduler(chain.settings, chain.dsn)
        try:
            report = scheduler.tick()
            assert [st.name for st in report.locked_elsewhere] == ["a"]
            assert "a" not in names(report)
        finally:
            scheduler.close()


def test_refresh_request_wakes_the_daemon_promptly(chain: Database) -> None:
    settings = chain.settings.with_overrides(tick_seconds=30.0)
    scheduler = Scheduler(settings, chain.dsn)
    thread = threading.Thread(target=scheduler.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while chain.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE status = 'ACTIVE'") < 3:
            assert time.monotonic() < deadline, "initialization did not happen"
            time.sleep(0.2)
        chain.sql("INSERT INTO src VALUES (2000, 3, 3)")
        chain.sql("SELECT pgtrickle.refresh_stream_table('a')")
        asked = time.monotonic()
        while (
            chain.scalar(
                "SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE initiated_by = 'MANUAL' AND status = 'COMPLETED'"
            )
            < 1
        ):
            assert time.monotonic() - asked < 20, "the NOTIFY did not wake the daemon (tick is 30 s)"
            time.sleep(0.1)
        assert_oracle(chain, "a")
    finally:
        scheduler.stop_requested = True
        chain.sql("NOTIFY pgtrickle_refresh")
        thread.join(timeout=60)
        scheduler.close()
    assert not thread.is_alive()


def test_calculated_schedule_follows_its_downstream(db: Database) -> None:
    db.sql("CREATE TABLE src (id int, v int)")
    db.sql("INSERT INTO src VALUES (1, 1)")
    db.sql(
        "SELECT pgtrickle.create_stream_table('up', 'SELECT sum(v) AS s FROM src', schedule => 'calculated')"
    )
    db.sql("SELECT pgtrickle.create_stream_table('down', 'SELECT s + 1 AS s1 FROM up', schedule => '1h')")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        assert names(scheduler.tick()) == ["up", "down"]
        assert names(scheduler.tick()) == []
        db.sql("INSERT INTO src VALUES (2, 2)")
        time_passes(db, "59 minutes")
        assert names(scheduler.tick()) == []
        time_passes(db, "2 minutes")
        assert names(scheduler.tick()) == ["up", "down"]
        assert db.scalar("SELECT s1 FROM down") == 4
        assert_oracle(db)
    finally:
        scheduler.close()


def test_unparseable_stored_schedule_puts_the_table_in_error(chain: Database) -> None:
    # a cron that never fires, refused by the grammar, stored by an older version
    store_unparsed_schedule(chain, "0 0 31 2 *", "c")
    scheduler = Scheduler(chain.settings, chain.dsn)
    try:
        assert names(scheduler.tick()) == ["a", "b"]
    finally:
        scheduler.close()
    status, error = chain.sql(
        "SELECT status, last_error FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'c'"
    )[0]
    assert status == "ERROR" and "0 0 31 2 *" in error


def test_stale_running_history_is_marked_abandoned(chain: Database) -> None:
    a_id = chain.scalar("SELECT pgt_id FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'a'")
    chain.sql(
        "INSERT INTO pgtrickle.pgt_refresh_history (pgt_id, action, status, initiated_by) "
        "VALUES (%s, 'FULL', 'RUNNING', 'SCHEDULER')",
        (a_id,),
    )
    scheduler = Scheduler(chain.settings, chain.dsn)
    try:
        assert scheduler.abandon_stale_history() == 1
    finally:
        scheduler.close()
    assert chain.scalar("SELECT status FROM pgtrickle.pgt_refresh_history") == "ABANDONED"


def test_sigterm_lets_the_daemon_finish_and_exit(chain: Database, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PGTRICKLE_DSN=chain.dsn,
        PGTRICKLE_DATA_DIR=str(tmp_path),
        PGTRICKLE_SPARK_MASTER="local[1]",
        PGTRICKLE_TICK_SECONDS="0.5",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtrickle", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # A JVM start and the first jobs of a fresh process: minutes on a loaded 2-core machine.
        deadline = time.monotonic() + 300
        while chain.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE status = 'ACTIVE'") < 3:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the daemon did not initialize the stream tables"
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "stopped" in output
    assert_oracle(chain)
    assert chain.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history WHERE status = 'RUNNING'") == 0

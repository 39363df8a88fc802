"""Spark failures: an executor lost mid-job, a job that fails, a Spark that cannot start.

The executor test runs ``pgtrickle run`` on ``local-cluster[2,1,1024]`` (two
executor JVMs below the daemon's driver):

1. an executor lost mid-job: the source is wide enough that each JDBC
   partition takes a while to read, and an executor JVM is SIGKILLed while
   ``pg_stat_activity`` shows a read of the refresh running (a lock on the
   source cannot hold the reads: the catalog reads before the job would wait
   on it too). Spark runs the lost task again on the other executor, the
   refresh completes and equals its query;
2. a job that fails (a division by zero in a task on an executor, after
   Spark's task retries): the refresh is recorded FAILED with the reason,
   nothing is applied, the queued request is retried by the daemon and
   completes once the data is fixed, equal to its query.

And a Spark that cannot start (bad master, unreachable standalone master,
no Java) is a clear error from ``pgtrickle run`` and ``pgtrickle refresh``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_JVM_CONF, Database
from tests.integration.faultkit import SRC, DaemonProcess, poll
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK_HOME = str(Path(__import__("pyspark").__file__).parent)


def _history(db: Database, name: str, after: int) -> list[tuple[int, str, str | None]]:
    return [
        (int(r[0]), str(r[1]), r[2])
        for r in db.sql(
            "SELECT h.refresh_id, h.status, h.error_message FROM pgtrickle.pgt_refresh_history h"
            " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = %s AND h.refresh_id > %s"
            " ORDER BY h.refresh_id",
            (name, after),
        )
    ]


def _last_refresh_id(db: Database) -> int:
    return int(db.scalar("SELECT coalesce(max(refresh_id), 0) FROM pgtrickle.pgt_refresh_history") or 0)


def _active_reads(db: Database, since: float) -> int:
    """Executor JDBC reads of ``big`` under way, on connections opened after ``since`` (epoch seconds).

    A read fetches 10,000 rows at a time: between fetches its backend is ``idle in transaction``
    with the read's query, while the executor works on the rows.
    """
    return int(
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtrickle-spark'"
            " AND state IN ('active', 'idle in transaction') AND query LIKE '%%big%%' AND query NOT LIKE '%%1=0%%' AND backend_start > to_timestamp(%s)",
            (since,),
        )
        or 0
    )


def _executors(daemon: DaemonProcess) -> list[int]:
    return [pid for pid, cmd in daemon.descendants() if "CoarseGrainedExecutorBackend" in cmd]


def _kill_an_executor_while_reading(db: Database, daemon: DaemonProcess) -> None:
    """Request a refresh and SIGKILL one executor JVM while a JDBC read of the refresh runs."""
    since = time.time() - 1
    db.sql("SELECT pgtrickle.refresh_stream_table('per_k')")
    poll(
        lambda: _active_reads(db, since) >= 1,
        "an executor's JDBC read",
        300,
        daemon.check_alive,
        interval=0.02,
    )
    executors = _executors(daemon)
    assert executors, "no executor JVM below the daemon"
    os.kill(executors[0], signal.SIGKILL)


def test_executor_lost_mid_job_is_retried_and_a_failed_job_is_recorded_then_retried(
    db: Database, tmp_path: Path
) -> None:
    # Wide enough that each JDBC partition takes a while to read: the kills land mid-read.
    db.sql("CREATE TABLE big (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL, pad text NOT NULL)")
    db.sql(
        "INSERT INTO big SELECT g, g % 50, g % 1000, repeat(md5(g::text), 4) FROM generate_series(1, 600000) g"
    )
    db.sql("ANALYZE big")
    create_st(
        db,
        "per_k",
        "SELECT k, count(*) AS n, sum(v) AS total, max(pad) AS top, "
        "sum(1000 / (v + 1)) AS inv FROM big GROUP BY k",
        schedule="1h",
        refresh_mode="FULL",
    )
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '0' WHERE name = 'auto_suspend_after'")
    daemon = DaemonProcess(
        db.dsn,
        tmp_path,
        PGTRICKLE_SPARK_MASTER="local-cluster[2,1,1024]",
        PGTRICKLE_JDBC_PARTITION_ROWS="150000",
        SPARK_HOME=SPARK_HOME,
        PGTRICKLE_SPARK_CONF=f"{FAST_JVM_CONF},spark.executor.memory=512m",
        PGTRICKLE_JDBC_JAR=db.settings.jdbc_jar,
    )
    started = time.monotonic()
    try:
        daemon.start()
        poll(
            lambda: db.scalar("SELECT frontier IS NOT NULL FROM pgtrickle.pgt_stream_tables") is True,
            "the initial refresh on the cluster",
            300,
            daemon.check_alive,
            interval=0.5,
        )
        assert_oracle(db, "per_k")
        poll(lambda: len(_executors(daemon)) == 2, "two executor JVMs", 120, daemon.check_alive)

        # 1. One executor lost mid-read: Spark reruns its task, the refresh completes.
        db.sql("UPDATE big SET v = v + 1 WHERE id % 10 = 0")
        before = _last_refresh_id(db)
        _kill_an_executor_while_reading(db, daemon)
        poll(
            lambda: any(s != "RUNNING" for _, s, _ in _history(db, "per_k", before)),
            "the refresh to end",
            300,
            daemon.check_alive,
            interval=0.5,
        )
        assert [s for _, s, _ in _history(db, "per_k", before)] == ["COMPLETED"], _history(
            db, "per_k", before
        )
        assert_oracle(db, "per_k")

        # 2. A job that fails (a task's division by zero, on an executor): recorded FAILED, nothing
        #    applied; the request stays queued and the daemon retries it until the data is fixed.
        db.sql("UPDATE big SET v = -1 WHERE id = 7")
        contents = sorted(db.sql("SELECT k, n, total, top, inv FROM per_k"))
        before = _last_refresh_id(db)
        db.sql("SELECT pgtrickle.refresh_stream_table('per_k')")
        poll(
            lambda: "FAILED" in [s for _, s, _ in _history(db, "per_k", before)],
            "the refresh to fail",
            300,
            daemon.check_alive,
            interval=0.5,
        )
        assert sorted(db.sql("SELECT k, n, total, top, inv FROM per_k")) == contents
        db.sql("UPDATE big SET v = 5 WHERE id = 7")
        poll(
            lambda: "COMPLETED" in [s for _, s, _ in _history(db, "per_k", before)],
            "the retried refresh to complete",
            300,
            daemon.check_alive,
            interval=0.5,
        )
        history = _history(db, "per_k", before)
        statuses = [s for _, s, _ in history]
        assert statuses[-1] == "COMPLETED" and set(statuses[:-1]) == {"FAILED"}, history
        assert re.search(r"(?i)divi(de|sion) by zero", str(history[0][2])), history[0]
        assert "An error occurred while calling" not in str(history[0][2]), history[0]
        assert_oracle(db, "per_k")
        assert db.sql("SELECT status, consecutive_errors FROM pgtrickle.pgt_stream_tables") == [("ACTIVE", 0)]
        daemon.check_alive()
    finally:
        if daemon.proc is not None and daemon.alive():
            daemon.kill()
    print(
        f"\nexecutor loss: retried by Spark; job failure: recorded FAILED ({len(statuses) - 1}x) and retried; "
        f"{time.monotonic() - started:.0f}s"
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_spark_that_cannot_start_is_a_clear_error_and_changes_nothing(db: Database, tmp_path: Path) -> None:
    db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    create_st(db, "st", "SELECT id, v FROM t", schedule="1s")
    refresh(db, "st")
    db.sql("UPDATE t SET v = v + 1")
    catalog = db.sql("SELECT status, consecutive_errors, frontier::text FROM pgtrickle.pgt_stream_tables")
    history = _last_refresh_id(db)
    # COLUMNS: the console does not wrap a long temporary path (an xdist worker's is longer) mid-word.
    env = dict(
        os.environ,
        COLUMNS="1000",
        PYTHONPATH=SRC,
        PGTRICKLE_DSN=db.dsn,
        PGTRICKLE_DATA_DIR=str(tmp_path / "data"),
        PGTRICKLE_JDBC_JAR=db.settings.jdbc_jar,
    )
    no_java = Path(tmp_path / "jdk")
    no_java.mkdir()
    cases = [
        (
            {"PGTRICKLE_SPARK_MASTER": "local[two]"},
            "'local[two]' is not a Spark master URL; use local, local[N]",
        ),
        (
            {"PGTRICKLE_SPARK_MASTER": f"spark://127.0.0.1:{_closed_port()}"},
            "no Spark master answers at spark://",
        ),
        ({"JAVA_HOME": str(no_java)}, f"JAVA_HOME={no_java} has no bin/java"),
    ]

    def pgtrickle(command: list[str], extra: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pgtrickle", *command],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
        )
        output = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 1 and "Traceback" not in output, (command, extra, output[-2000:])
        return output

    # The daemon refuses to run, before it refreshes anything.
    for extra, message in cases:
        assert message in pgtrickle(["run"], extra)
    assert _history(db, "st", history) == []
    assert (
        db.sql("SELECT status, consecutive_errors, frontier::text FROM pgtrickle.pgt_stream_tables")
        == catalog
    )
    # `pgtrickle refresh` says the same, and the failed attempt is in the history; nothing applied.
    for extra, message in cases[:2]:
        assert message in pgtrickle(["refresh", "st"], extra)
    failed = _history(db, "st", history)
    assert [s for _, s, _ in failed] == ["FAILED", "FAILED"], failed
    assert all(message in str(e) for (_, _, e), (_, message) in zip(failed, cases, strict=False)), failed
    assert db.sql("SELECT frontier::text FROM pgtrickle.pgt_stream_tables") == [(catalog[0][2],)]
    refresh(db, "st")  # a working Spark (this process's) catches up
    assert_oracle(db, "st")

"""Refreshes whose Spark work runs in separate executor JVMs, not in the driver.

``pgtrickle refresh`` runs as its own process with ``PGTRICKLE_SPARK_MASTER``
set: once to ``local-cluster[2,1,1024]`` (two executor JVMs started by the
driver) and once to a standalone master with two workers started here from
the installed PySpark on 127.0.0.1. The JDBC driver reaches the executors
through ``spark.jars`` only; every refresh is checked with the oracle.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FAST_JVM
from tests.integration.helpers import assert_oracle, create_st

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK_HOME = Path(__import__("pyspark").__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refresh(db, master: str, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    env = dict(
        os.environ,
        PGTRICKLE_SPARK_MASTER=master,
        PGTRICKLE_DSN=db.dsn,
        PGTRICKLE_DATA_DIR=str(tmp_path / "data"),
        PGTRICKLE_JDBC_JAR=db.settings.jdbc_jar,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_HOME=str(SPARK_HOME),
        # several JDBC partitions per table read, so both executors take part
        PGTRICKLE_JDBC_PARTITION_ROWS="20000",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pgtrickle", "refresh", "--all"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _workload(db, master: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric(10,2))")
    db.sql("CREATE TABLE customers (id int PRIMARY KEY, region text)")
    db.sql(
        "INSERT INTO customers SELECT g, (ARRAY['n','s','e','w'])[1 + g % 4] FROM generate_series(0, 99) g"
    )
    db.sql("INSERT INTO orders SELECT g, g % 100, g * 0.25 FROM generate_series(1, 60000) g")
    db.sql("ANALYZE orders, customers")
    create_st(
        db,
        "per_region",
        "SELECT c.region, count(*) AS n, sum(o.amount) AS total "
        "FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.region",
    )
    create_st(
        db, "big_orders", "SELECT id, customer, amount FROM orders WHERE amount > 10000", refresh_mode="FULL"
    )
    out = _refresh(db, master, tmp_path)
    assert "FULL" in out, out
    assert_oracle(db)
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id % 97 = 0")
    db.sql("DELETE FROM orders WHERE id % 101 = 0")
    db.sql("INSERT INTO orders SELECT g, g % 100, 5 FROM generate_series(60001, 61000) g")
    out = _refresh(db, master, tmp_path)
    assert "DIFFERENTIAL" in out, out
    assert_oracle(db)


def test_refresh_on_local_cluster_executors(db, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _workload(db, "local-cluster[2,1,1024]", tmp_path)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A standalone Spark master and two one-core workers on 127.0.0.1."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = dict(
        os.environ,
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(tmp_path / "logs"),
        SPARK_WORKER_DIR=str(tmp_path / "work"),
        SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
    )  # the master's and workers' JVMs (tests/conftest.py)
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = [
        subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        procs[0].kill()
        pytest.fail("the standalone Spark master did not start")
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(_free_port()),
                    "--work-dir",
                    str(tmp_path / "work"),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        yield url, ui
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_refresh_on_a_standalone_master_with_two_workers(db, standalone, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, ui = standalone
    _workload(db, url, tmp_path)
    # The master saw both workers and ran both `pgtrickle refresh` processes as applications.
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=10) as response:
        state = json.load(response)
    assert sum(1 for w in state["workers"] if w["state"] == "ALIVE") == 2, state["workers"]
    assert len(state["completedapps"]) == 2, state

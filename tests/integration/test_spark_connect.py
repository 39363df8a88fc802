"""Refreshes through a Spark Connect server (``--spark-remote``), checked by the oracle.

The server is started from the installed PySpark on loopback
(tests/integration/connect_server.py); the refreshes in this process run
through a Spark Connect client session, the JDBC reads and writes on the
server, at the same exported snapshots.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pgtrickle
from pgtrickle.cli.main import app
from pgtrickle.config import Settings
from pgtrickle.errors import PgTrickleError, SparkConnectUnreachableError, ValueNotCarriedError
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from pgtrickle.spark.capabilities import capabilities, is_connect
from pgtrickle.spark.session import get_spark
from tests.conftest import Database, _free_port
from tests.integration import connect_server
from tests.integration.helpers import assert_oracle, create_st, refresh, refresh_and_check

# One worker runs them all under pytest-xdist (tests/conftest.py, XDIST_GROUPS): one server per run.
pytestmark = [pytest.mark.integration, pytest.mark.spark_connect]

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="session")
def connect_url(base_settings: Settings) -> Iterator[str]:
    """A Spark Connect server for the session: fails the tests in CI when it cannot start, else skips."""
    try:
        server = connect_server.start(base_settings.jdbc_jar)
    except connect_server.ConnectServerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the Spark Connect server could not start: {exc}")
        pytest.skip(f"the Spark Connect server could not start: {exc}")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def cdb(db: Database, connect_url: str) -> Database:
    """A fresh database whose settings refresh through the Spark Connect server."""
    db.settings = replace(db.settings, spark_remote=connect_url)
    return db


def _orders(db: Database, rows: int = 300) -> None:
    db.sql("CREATE TABLE customers (id int PRIMARY KEY, region text)")
    db.sql("INSERT INTO customers SELECT g, 'r' || (g % 5) FROM generate_series(1, 40) g")
    db.sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount numeric(12,2), "
        "placed timestamptz NOT NULL DEFAULT '2026-01-01 00:00:00+00')"
    )
    db.sql(
        "INSERT INTO orders SELECT g, 1 + g % 45, (g * 7 % 1000) / 10.0, "
        f"'2026-01-01 00:00:00+00'::timestamptz + g * interval '1 hour' FROM generate_series(1, {rows}) g"
    )


def _random_dml(db: Database, rng: random.Random, next_id: int) -> int:
    for _ in range(rng.randint(1, 4)):
        db.sql(
            "INSERT INTO orders VALUES (%s, %s, %s)",
            (next_id, rng.randint(1, 45), rng.randint(0, 9999) / 100),
        )
        next_id += 1
    db.sql(
        "UPDATE orders SET amount = amount + 1, customer = %s WHERE id = %s",
        (rng.randint(1, 45), rng.randint(1, next_id)),
    )
    db.sql("DELETE FROM orders WHERE id IN (%s, %s)", (rng.randint(1, next_id), rng.randint(1, next_id)))
    if rng.random() < 0.5:
        db.sql(
            "UPDATE customers SET region = %s WHERE id = %s", (f"r{rng.randint(0, 6)}", rng.randint(1, 40))
        )
    return next_id


QUERIES = {
    # aggregate (algebraic: SUM / COUNT / AVG from the delta)
    "by_customer": (
        "SELECT customer, sum(amount) AS total, count(*) AS n, avg(amount) AS mean "
        "FROM orders GROUP BY customer"
    ),
    # aggregate over a join, MIN / MAX (a rescan of the touched groups)
    "by_region": (
        "SELECT c.region, max(o.amount) AS top, min(o.placed) AS first FROM orders o "
        "JOIN customers c ON c.id = o.customer GROUP BY c.region"
    ),
    # inner join (the telescoping join rule)
    "joined": "SELECT o.id, o.amount, c.region, o.placed FROM orders o JOIN customers c ON c.id = o.customer",
    # outer join
    "with_customers": (
        "SELECT c.id AS cid, c.region, o.id AS oid, o.amount FROM customers c "
        "LEFT JOIN orders o ON o.customer = c.id"
    ),
    # set operation
    "ids": (
        "SELECT customer AS id FROM orders WHERE amount > 50 "
        "EXCEPT SELECT id FROM customers WHERE region = 'r1'"
    ),
}


def test_full_and_differential_refreshes_through_spark_connect(cdb: Database) -> None:
    db = cdb
    _orders(db)
    for name, query in QUERIES.items():
        create_st(db, name, query, refresh_mode="AUTO")
    outcomes = refresh(db)
    assert {o.action for o in outcomes} == {Action.FULL}
    assert_oracle(db)
    spark = get_spark(db.settings)
    assert is_connect(spark) and capabilities(spark).parallelism >= 1
    rng = random.Random(20)
    next_id = 10_000
    for _ in range(3):
        next_id = _random_dml(db, rng, next_id)
        outcomes = refresh(db)
        assert_oracle(db)
        actions = {o.st.name: o.action for o in outcomes}
        assert actions["by_customer"] is Action.DIFFERENTIAL, actions
        assert actions["joined"] is Action.DIFFERENTIAL, actions
    history = db.sql(
        "SELECT count(*) FILTER (WHERE action = 'DIFFERENTIAL'), "
        "count(*) FILTER (WHERE status <> 'COMPLETED') FROM pgtrickle.pgt_refresh_history"
    )
    assert history[0][0] >= 6 and history[0][1] == 0, history
    # A Spark Connect client cannot count the server's jobs: NULL, never a wrong number (spark/jobs.py).
    counted = db.sql(
        "SELECT count(*) FILTER (WHERE spark_jobs IS NOT NULL), count(*) FILTER (WHERE"
        " action IN ('FULL', 'DIFFERENTIAL')) FROM pgtrickle.pgt_refresh_history"
    )
    assert counted[0][0] == 0 and counted[0][1] >= 6, counted
    assert all(o.spark_jobs is None for o in outcomes if o.action in (Action.FULL, Action.DIFFERENTIAL))


@pytest.mark.parametrize("mode", ["FULL", "DIFFERENTIAL"])
def test_a_value_spark_cannot_carry_is_refused_through_spark_connect(cdb: Database, mode: str) -> None:
    """The server's error carries no SQLSTATE: the refusal is found in PostgreSQL, typed as on a local JVM."""
    db = cdb
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v numeric, t time)")
    db.sql("INSERT INTO src VALUES (1, 1.5, '23:59:59.999999')")
    create_st(db, "st", "SELECT id, v, t FROM src", refresh_mode=mode)
    refresh_and_check(db, "st")
    db.sql("INSERT INTO src VALUES (2, 'NaN', '12:00')")
    before = db.sql("SELECT * FROM st ORDER BY 1")
    with pytest.raises(ValueNotCarriedError) as err:
        refresh(db, "st")
    assert err.value.sqlstate == "22003" and "public.src.v" in str(err.value), str(err.value)
    assert db.sql("SELECT * FROM st ORDER BY 1") == before, "a refused refresh changes nothing"
    db.sql("DELETE FROM src WHERE id = 2")
    refresh_and_check(db, "st")  # (DIFFERENTIAL: the window still holds the NaN's insert: FULL instead)
    db.sql("INSERT INTO src VALUES (3, 2.25, '00:00:00.000001')")
    outcomes = refresh_and_check(db, "st")
    assert [o.action for o in outcomes] == [Action.FULL if mode == "FULL" else Action.DIFFERENTIAL]


def test_atomic_group_and_daemon_through_spark_connect(cdb: Database) -> None:
    """A diamond (one snapshot for three members) refreshed by the daemon's scheduler on Spark Connect."""
    db = cdb
    _orders(db, rows=100)
    create_st(
        db,
        "totals",
        "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer",
        refresh_mode="DIFFERENTIAL",
    )
    create_st(
        db,
        "counts",
        "SELECT customer, count(*) AS n FROM orders GROUP BY customer",
        refresh_mode="DIFFERENTIAL",
    )
    create_st(db, "report", "SELECT a.customer, a.total, b.n FROM totals a JOIN counts b USING (customer)")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        first = scheduler.tick()
        assert not first.failed
        assert_oracle(db)
        db.sql("INSERT INTO orders VALUES (5001, 3, 10.5), (5002, 44, 1)")
        db.sql("DELETE FROM orders WHERE id BETWEEN 10 AND 20")
        for name in ("totals", "counts", "report"):
            db.sql("SELECT pgtrickle.refresh_stream_table(%s)", (name,))
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert not report.failed
    assert sorted(o.st.name for o in report.refreshed) == ["counts", "report", "totals"]
    assert_oracle(db)
    frontiers = db.sql("SELECT DISTINCT split_part(frontier::text, ':', 1) FROM pgtrickle.pgt_stream_tables")
    assert len(frontiers) == 1, "the members read one snapshot"


def test_cli_refresh_and_run_with_spark_remote(db: Database, connect_url: str) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    _orders(db, rows=50)
    create_st(db, "by_customer", QUERIES["by_customer"])
    result = runner.invoke(
        app,
        ["--dsn", db.dsn, "refresh", "--spark-remote", connect_url, "by_customer"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "FULL" in result.output
    assert_oracle(db)
    db.sql("UPDATE orders SET amount = amount * 2 WHERE id < 10")
    db.sql("SELECT pgtrickle.refresh_stream_table('by_customer')")
    result = runner.invoke(
        app, ["--dsn", db.dsn, "run", "--once", "--spark-remote", connect_url], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "Spark Connect server sc://127.0.0.1:" in result.output and "DIFFERENTIAL" in result.output
    assert_oracle(db)


def test_an_unreachable_server_is_a_clear_error_and_changes_nothing(cdb: Database) -> None:
    db = cdb
    _orders(db, rows=20)
    create_st(db, "by_customer", QUERIES["by_customer"])
    refresh(db)
    db.sql("INSERT INTO orders VALUES (9001, 1, 5)")
    before = (
        db.sql("SELECT frontier::text FROM pgtrickle.pgt_stream_tables"),
        db.sql("SELECT * FROM by_customer ORDER BY 1"),
    )
    url = f"sc://127.0.0.1:{_free_port()}"
    with pytest.raises(SparkConnectUnreachableError) as caught:
        get_spark(replace(db.settings, spark_remote=url))
    assert caught.value.url == url and url in str(caught.value)
    with pytest.raises(SparkConnectUnreachableError):
        refresh(replace(db, settings=replace(db.settings, spark_remote=url)), "by_customer")
    after = (
        db.sql("SELECT frontier::text FROM pgtrickle.pgt_stream_tables"),
        db.sql("SELECT * FROM by_customer ORDER BY 1"),
    )
    assert after == before, "a refresh that could not reach Spark changed nothing"
    # The daemon says so before it starts, naming the URL (a token in the URL is not shown).
    result = runner.invoke(app, ["--dsn", db.dsn, "run", "--once", "--spark-remote", f"{url}/;token=s3cret"])
    assert result.exit_code == 1
    assert url in result.output and "s3cret" not in result.output
    result = runner.invoke(app, ["--dsn", db.dsn, "refresh", "--spark-remote", "http://nowhere:1", "--all"])
    assert result.exit_code == 1 and "not a Spark Connect URL" in result.output


def test_a_session_the_server_lost_is_replaced(cdb: Database) -> None:
    """A server that no longer knows the session (restarted, expired): a refresh fails, the next one works."""
    db = cdb
    _orders(db, rows=20)
    create_st(db, "by_customer", QUERIES["by_customer"])
    refresh_and_check(db, "by_customer")
    spark = get_spark(db.settings)
    spark.client.release_session()  # the server closes it
    db.sql("INSERT INTO orders VALUES (9101, 1, 5)")
    before = db.sql("SELECT * FROM by_customer ORDER BY 1")
    with pytest.raises(PgTrickleError):
        refresh(db, "by_customer")
    assert db.sql("SELECT * FROM by_customer ORDER BY 1") == before
    assert get_spark(db.settings) is not spark
    refresh_and_check(db, "by_customer")


def test_a_cancelled_refresh_on_spark_connect_is_abandoned(cdb: Database) -> None:
    """The second stop signal's cancel reaches the server (interruptAll) and nothing is applied."""
    from pgtrickle.catalog.store import load_stream_tables
    from pgtrickle.refresh.engine import Cancelled, Refresher

    db = cdb
    _orders(db, rows=20)
    create_st(db, "joined", QUERIES["joined"], refresh_mode="FULL")
    refresh_and_check(db, "joined")
    db.sql("UPDATE orders SET amount = amount + 1 WHERE id < 5")
    before = db.sql("SELECT * FROM joined ORDER BY 1")
    refresher = Refresher(db.settings, db.dsn, progress=lambda msg: refresher.cancel())
    try:
        [st] = load_stream_tables(db.conn).values()
        with pytest.raises(Cancelled):
            refresher.refresh(st, "MANUAL")
    finally:
        refresher.close()
    assert db.sql("SELECT status FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id DESC LIMIT 1") == [
        ("ABANDONED",)
    ]
    assert db.sql("SELECT * FROM joined ORDER BY 1") == before
    refresh_and_check(db, "joined")


def test_the_client_needs_no_java(db: Database, connect_url: str, tmp_path: Path) -> None:
    """``pgtrickle refresh --spark-remote`` with no Java anywhere: no JVM starts, the refresh is exact."""
    _orders(db, rows=50)
    create_st(db, "joined", QUERIES["joined"], refresh_mode="DIFFERENTIAL")
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "PGTRICKLE_"))}
    env.update(
        PATH=bin_dir,
        JAVA_HOME=str(tmp_path / "no-java"),
        HOME=str(tmp_path),
        PYTHONPATH=str(Path(pgtrickle.__file__).parents[1]),
        PGTRICKLE_DATA_DIR=str(tmp_path / "data"),
    )
    assert shutil.which("java", path=bin_dir) is None
    program = (
        "import json, os, sys\n"
        "from pgtrickle.cli.main import app\n"
        "codes = []\n"
        "try:\n"
        "    app(['--dsn', sys.argv[1], 'refresh', '--spark-remote', sys.argv[2], *sys.argv[3:]])\n"
        "except SystemExit as done:\n"
        "    codes.append(done.code)\n"
        "me = str(os.getpid())\n"
        "children = [open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')[0].decode()\n"
        "            for p in os.listdir('/proc') if p.isdigit() and os.path.exists(f'/proc/{p}/stat')\n"
        "            and open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1] == me]\n"
        "from pyspark.core.context import SparkContext\n"
        "gateway = SparkContext._gateway is not None\n"
        "print(json.dumps({'codes': codes, 'children': children, 'gateway': gateway}))\n"
    )
    first = subprocess.run(
        [sys.executable, "-c", program, db.dsn, connect_url, "joined"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout.strip().splitlines()[-1])
    assert report["codes"] in ([0], [None]), (report, first.stdout[-2000:])
    assert not report["gateway"] and not any("java" in c for c in report["children"]), report
    assert_oracle(db)
    db.sql("INSERT INTO orders VALUES (7001, 2, 1.5), (7002, 99, 2.5)")
    db.sql("UPDATE customers SET region = 'moved' WHERE id = 2")
    second = subprocess.run(
        [sys.executable, "-c", program, db.dsn, connect_url, "joined"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert_oracle(db)
    last = db.sql("SELECT action, status FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id DESC LIMIT 1")
    assert last == [("DIFFERENTIAL", "COMPLETED")], last

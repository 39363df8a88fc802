"""Shared fixtures: a real PostgreSQL (embedded, PostgreSQL 18) and a real SparkSession.

The server is started once per test session (once per pytest-xdist worker) in a
temporary directory on a free port; each integration test gets its own database
cloned from a template that has pgtrickle installed, so tests cannot see each
other. The SparkSession is one per session too (pgtrickle's own, cached in the
process). Tests that need a server or a JVM of their own (PostgreSQL restarts,
daemons killed with SIGKILL) start them themselves; their Spark JVMs start with C1-only JIT and
the serial GC (:data:`FAST_JVM`). Under pytest-xdist the heaviest tests are handed out first
(:func:`pytest_collection_modifyitems`). docs/TESTING.md has the figures.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest

from pgtrickle.config import Settings
from tests import hypothesis_profiles

try:
    hypothesis_profiles.load()
except hypothesis_profiles.UnknownProfileError as exc:
    raise pytest.UsageError(str(exc)) from None

#: JVM options for the Spark JVMs the tests' subprocesses start (`pgtrickle run` / `refresh`
#: daemons, their executors): C1-only JIT and the serial GC. A daemon's JVM start and first
#: queries took 19-20 s of CPU this way against 33-36 s with the defaults (measured on this
#: machine, docs/TESTING.md); the tests' jobs are small, so the slower steady state of C1 code
#: does not show. Spark *prepends* ``defaultJavaOptions`` to pgtrickle's own ``extraJavaOptions``
#: (time zone, Derby home), which stay as they are.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
FAST_JVM_CONF = f"spark.driver.defaultJavaOptions={FAST_JVM},spark.executor.defaultJavaOptions={FAST_JVM}"
# Inherited by every subprocess a test starts with os.environ (a test that sets PGTRICKLE_SPARK_CONF
# itself adds FAST_JVM_CONF to it). The tests' own SparkSession (base_settings) is not built from
# the environment: it lives for the whole run, where C2's faster code pays.
os.environ.setdefault("PGTRICKLE_SPARK_CONF", FAST_JVM_CONF)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment. The CLI's
    # module-level rich Console, created when the test modules are imported, would keep that width
    # for good, and a test's CliRunner(env={"COLUMNS": ...}) would no longer widen it: the worker's
    # environment is made the one a serial run has.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


#: Seconds a test takes (a serial run on the shared machine, docs/TESTING.md), by node-id prefix; the
#: longest matching prefix counts, other integration tests 5 s, unit tests 0. Under pytest-xdist the
#: tests are handed out heaviest first (longest processing time first): a worker that drew a
#: five-minute test last would finish minutes after the others. The figures only order the run.
EXPECTED_SECONDS = {
    "tests/integration/test_cluster.py": 370,
    "tests/integration/test_crash_consistency.py::test_sigkill_at_refresh_points": 390,
    "tests/integration/test_crash_consistency.py::test_a_layout_change": 210,
    "tests/integration/test_cdc_stress.py::test_sigkill_while_the_decoder_streams": 290,
    "tests/integration/test_dbt.py": 130,
    "tests/integration/test_dbt.py::test_example_project": 280,
    "tests/integration/test_soak.py::test_soak": 280,
    "tests/integration/test_spark_connect.py": 240,  # one group (one server): its first test counts
    "tests/integration/test_postgres_restart.py": 200,
    "tests/integration/test_spark_failures.py::test_executor_lost": 150,
    "tests/integration/test_scheduler.py::test_sigterm": 130,
    "tests/integration/test_circuit_breaker.py::test_seed_scenario": 130,
    "tests/integration/test_security.py::test_passwords": 100,
    "tests/integration/test_schedule_grammar.py::test_any_text": 100,
    "tests/integration/test_operations.py::test_pgtrickle_run_serves_metrics": 60,
    "tests/integration/test_partition_capture.py::test_random_dml": 70,
    "tests/integration/test_monitoring.py": 60,
    "tests/integration/test_benchmarks.py::test_tpch": 60,
    "tests/integration/test_delta_engine_queries.py": 30,
    "tests/integration/test_cdc_stress.py": 25,
    "tests/integration/test_full_refresh.py": 15,
}


def expected_seconds(nodeid: str) -> float:
    """How long the test with this node id is expected to take (:data:`EXPECTED_SECONDS`)."""
    matches = [prefix for prefix in EXPECTED_SECONDS if nodeid.startswith(prefix)]
    if matches:
        return EXPECTED_SECONDS[max(matches, key=len)]
    return 5.0 if nodeid.startswith("tests/integration/") else 0.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (each worker collects): heaviest first; a serial run keeps the file order.

    Every worker sorts the same collection the same way (the sort is stable), as xdist requires;
    ``--dist loadgroup --no-loadscope-reorder`` (the Makefile) hands the tests out in this order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: -expected_seconds(item.nodeid))


#: Tests that share something expensive run on one pytest-xdist worker, one after the other: node-id
#: prefix -> group (the Makefile's ``--dist loadgroup``; :func:`pytest_xdist_make_scheduler`). xdist's
#: own ``xdist_group`` mark does not group under pytest 9: it renames the items through an attribute
#: (``_nodeid``) pytest no longer reads, so every marked test went to any worker.
XDIST_GROUPS = {
    "tests/integration/test_spark_connect.py": "spark_connect",  # one Spark Connect server
}


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test belongs to: its group (:data:`XDIST_GROUPS`), else the test alone."""
    for prefix, group in XDIST_GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return nodeid


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup``: xdist's scheduler by scope, the scopes being :func:`xdist_scope`'s."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return GroupScheduling(config, log)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PgServer:
    admin_dsn: str
    base_dsn: str  # without dbname
    data_dir: Path
    port: int

    def dsn_for(self, dbname: str) -> str:
        return f"{self.base_dsn}/{dbname}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    from pgtrickle.catalog.install import install
    from pgtrickle.db.embedded import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="pgtrickle-test-", dir="/tmp"))
    root.chmod(0o755)
    port = _free_port()
    server = EmbeddedPostgres(root, port)
    server.start()
    dsn = server.dsn()
    base = dsn.rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        # The test server keeps nothing that must survive a crash of the machine, so its commits
        # need not wait for the disk (10-17 ms per commit here with fsync, under 2 ms without).
        # A crash of PostgreSQL itself still loses no committed transaction (synchronous_commit
        # stays on: the WAL reaches the kernel before COMMIT returns).
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE DATABASE pgt_template")
    with psycopg.connect(f"{base}/pgt_template", autocommit=True) as conn:
        install(conn)
    try:
        yield PgServer(admin_dsn=f"{base}/postgres", base_dsn=base, data_dir=root, port=port)
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def base_settings(pg_server: PgServer) -> Settings:
    return Settings(
        dsn=None,
        data_dir=pg_server.data_dir,
        spark_master=os.environ.get("PGTRICKLE_TEST_SPARK_MASTER", "local[2]"),
        jdbc_jar=os.environ.get("PGTRICKLE_JDBC_JAR", "/usr/share/java/postgresql.jar"),
        tick_seconds=0.2,
    )


@pytest.fixture(scope="session")
def spark(base_settings: Settings):  # type: ignore[no-untyped-def]
    from pgtrickle.spark.session import get_spark

    return get_spark(base_settings)


_db_counter = itertools.count(1)


@dataclass
class Database:
    """One fresh database with pgtrickle installed."""

    dsn: str
    settings: Settings
    conn: psycopg.Connection

    def sql(self, query: str, params: object = None) -> list[tuple]:
        cur = self.conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []

    def scalar(self, query: str, params: object = None) -> object:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None


@pytest.fixture
def db(pg_server: PgServer, base_settings: Settings) -> Iterator[Database]:
    name = f"t_{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE pgt_template')
    dsn = pg_server.dsn_for(name)
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        yield Database(dsn=dsn, settings=replace(base_settings, dsn=dsn), conn=conn)
    finally:
        conn.close()
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            for _ in range(50):
                rows = admin.execute(
                    "SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall()
                if not any(active for _, active in rows):
                    break
                time.sleep(0.1)
            for slot, _ in rows:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

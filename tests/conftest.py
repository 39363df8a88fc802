"""Shared fixtures: a real PostgreSQL (embedded, PostgreSQL 18) and a real SparkSession.

The server is started once per test session (once per pytest-xdist worker) in a
temporary directory on a free port; each integration test gets its own database
cloned from a template that has pgtrickle installed, so tests cannot see each
other. The SparkSession is one per session too (pgtrickle's own, cached in the
process). Tests that need a server or a JVM of their own (PostgreSQL restarts,
daemons killed with SIGKILL) start them themselves.
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
                " WHERE database = %s AND active_pid IS NOT NULL", (name,))
            for _ in range(50):
                rows = admin.execute("SELECT slot_name, active FROM pg_replication_slots WHERE database = %s",
                                     (name,)).fetchall()
                if not any(active for _, active in rows):
                    break
                time.sleep(0.1)
            for slot, _ in rows:
                admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
